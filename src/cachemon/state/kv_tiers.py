"""A replica's other tiers (CPU offload, file system, object store), kept apart per medium.

vLLM's offloading connector (``distributed/kv_transfer/kv_connector/v1/offloading/events.py``) reports a
tier's blocks as BlockStored / BlockRemoved with ``medium`` CPU, STORAGE, ... and the GPU pool's block
hashes. What a tier holds tells a block loaded back from it (a hit of that tier) from one recomputed.
"""
from __future__ import annotations

from cachemon.normalise.kv_events import Hash, Removed, Stored


class Tiers:
    """Per medium: the hashes held now (bounded like the pool), blocks stored and removed, and the tokens
    of GPU stores loaded from the tier."""

    def __init__(self, max_blocks: int) -> None:
        self.max_blocks = max_blocks
        self.held: dict[str, dict[Hash, int]] = {}     # medium -> vLLM hash -> copies there
        self.stored: dict[str, int] = {}
        self.removed: dict[str, int] = {}
        self.hit_tokens: dict[str, int] = {}
        self.overflow = 0                              # hashes not held: over max_blocks

    def __bool__(self) -> bool:
        return bool(self.held)

    def on_stored(self, ev: Stored) -> None:
        m = str(ev.medium)
        held = self.held.setdefault(m, {})
        for h in ev.hashes:
            c = held.get(h)
            if c is not None:
                held[h] = c + 1
            elif len(held) < self.max_blocks:      # a tier is counted, not trusted: bounded
                held[h] = 1
            else:
                self.overflow += 1
        self.stored[m] = self.stored.get(m, 0) + len(ev.hashes)

    def on_removed(self, ev: Removed) -> None:
        m = str(ev.medium)
        held = self.held.get(m, {})
        for h in ev.hashes:
            c = held.pop(h, 0) - 1
            if c > 0:
                held[h] = c
        self.removed[m] = self.removed.get(m, 0) + len(ev.hashes)

    def cleared(self, medium: str | None) -> None:
        if medium is None:
            self.held.clear()
        else:
            self.held.pop(medium, None)

    def loaded(self, ev: Stored, cached: dict[Hash, int]) -> int:
        """How many leading blocks of a GPU store a tier holds: loaded from it by the KV connector, not
        computed (counted as the tier's hit). A connector's hit is a prefix of the request's new blocks;
        the blocks after it were computed, in the same store."""
        n = 0
        for h in ev.hashes:
            if h in cached:
                break
            for m, held in self.held.items():
                if h in held:
                    self.hit_tokens[m] = self.hit_tokens.get(m, 0) + ev.block_size
                    break
            else:
                break
            n += 1
        return n
