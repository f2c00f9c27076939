"""A replica's other tiers (CPU offload, file system, object store), kept apart per medium.

vLLM's offloading connector (``distributed/kv_transfer/kv_connector/v1/offloading/events.py``) reports a
tier's blocks as BlockStored / BlockRemoved with ``medium`` CPU, STORAGE, ... and the GPU pool's block
hashes. What a tier holds tells a block loaded back from it (a hit of that tier) from one recomputed.

A tier can be emptied without a word: ``POST /reset_prefix_cache?reset_external=true`` clears the
offloading manager and publishes only the pool's ``AllBlocksCleared`` (the real capture
tests/fixtures/vllm-0.32.0-cpu-offloading/cpu_offload_hostcopy). The blocks vLLM then computes are stored
in the pool under the hashes the tier seemed to hold, and a moment later offloaded to the tier again:
a second store of a hash the tier holds. So a load is *pending* for ``SETTLE_S`` seconds: the tier's
store of the same hash in that time proves it was computed (its tokens go back to the reason it would
have had), and everything the tier held before is forgotten; otherwise it is the tier's hit.

A medium is a string the publisher chooses (the decoder bounds its length and folds its case, so that
vllm-ascend's ``cpu`` is vLLM's ``CPU``): at most ``MAX_TIERS`` media per replica are followed, and the
events of any further one are counted (``refused``: the ``tier_overflow`` anomaly) and not followed,
so that neither the series nor the cost of a GPU store (which looks in every tier) grow with them.
"""
from __future__ import annotations

from collections import deque

from cachemon.normalise.kv_batch import Hash, Removed, Stored
from cachemon.normalise.kv_limits import MAX_TIERS

# Seconds a load waits for the tier's word (its store of the same block: vLLM offloads a computed block
# one engine step after the pool stored it; the real capture: 1-40 ms) before it counts as the tier's hit.
SETTLE_S = 2.0


class _Load:
    """GPU-stored blocks tiers seemed to hold: hash -> (the reason code it would have had otherwise, the
    tier it came from)."""
    __slots__ = ("at", "block_size", "tenant", "blocks")

    def __init__(self, at: float, block_size: int, tenant: int, blocks: dict[Hash, tuple[int, str]]) -> None:
        self.at, self.block_size, self.tenant, self.blocks = at, block_size, tenant, blocks


class Tiers:
    """Per medium: the hashes held now (bounded like the pool), blocks stored and removed, and the tokens
    of GPU stores loaded from the tier (settled: see the module's doc)."""

    def __init__(self, max_blocks: int) -> None:
        self.max_blocks = max_blocks
        self.held: dict[str, dict[Hash, int]] = {}     # medium -> vLLM hash -> copies there
        self.stored: dict[str, int] = {}
        self.removed: dict[str, int] = {}
        self.hit_tokens: dict[str, int] = {}
        self.overflow = 0                              # hashes not held: over max_blocks
        self.media: set[str] = set()                   # the media followed (at most MAX_TIERS)
        self.refused = 0                               # events of a medium beyond MAX_TIERS: not followed
        self.unannounced_clears = 0                    # a tier emptied without an event (seen on a store)
        self.pending: deque[_Load] = deque()           # loads not settled yet, oldest first
        self.pending_at: dict[Hash, _Load] = {}        # their blocks by hash (the latest load of each)
        # hash -> the tier it was promoted from: stored in a tier while another one held it (vLLM's tiering
        # spec copies a secondary tier's hit, e.g. a file, into its CPU tier before loading it from there,
        # and counts the hit as the secondary tier's); used up by the next load
        self.origin: dict[Hash, str] = {}

    def __bool__(self) -> bool:
        return bool(self.held)

    def on_stored(self, ev: Stored) -> list[tuple[int, int, int]]:
        """Count the tier's store. Returns the blocks it disproves as loads: (tenant code, reason code,
        tokens) each, to be counted in the pool's split after all."""
        m = str(ev.medium)
        back: list[tuple[int, int, int]] = []
        if not self._follows(m):
            return back
        held = self.held.setdefault(m, {})
        if self.pending_at:
            for h in ev.hashes:
                ld = self.pending_at.get(h)
                if ld is not None and ld.blocks[h][1] == m:   # offloaded after the pool stored it: computed
                    del self.pending_at[h]
                    back.append((ld.tenant, ld.blocks.pop(h)[0], ld.block_size))
        if any(h in held for h in ev.hashes):
            # vLLM's offloading manager stores only what it does not hold (cpu/manager.py prepare_store):
            # it was emptied without an event; what it held before is unknown now
            self.unannounced_clears += 1
            held.clear()
        others = [(om, oh) for om, oh in self.held.items() if om != m and oh]
        for h in ev.hashes:
            if others and len(self.origin) < self.max_blocks:
                src = next((om for om, oh in others if h in oh), None)
                if src is not None:
                    self.origin[h] = src
            c = held.get(h)
            if c is not None:
                held[h] = c + 1
            elif len(held) < self.max_blocks:      # a tier is counted, not trusted: bounded
                held[h] = 1
            else:
                self.overflow += 1
        self.stored[m] = self.stored.get(m, 0) + len(ev.hashes)
        return back

    def on_removed(self, ev: Removed) -> None:
        m = str(ev.medium)
        if not self._follows(m):
            return
        held = self.held.get(m, {})
        for h in ev.hashes:
            self.origin.pop(h, None)
            c = held.pop(h, 0) - 1
            if c > 0:
                held[h] = c
        self.removed[m] = self.removed.get(m, 0) + len(ev.hashes)

    def _follows(self, medium: str) -> bool:
        if medium in self.media:
            return True
        if len(self.media) < MAX_TIERS:
            self.media.add(medium)
            return True
        self.refused += 1
        return False

    def cleared(self, medium: str | None) -> None:
        if medium is None:
            self.held.clear()
            self.origin.clear()
            self.settle(float("inf"))
        else:
            self.held.pop(medium, None)

    def loaded(self, ev: Stored, cached: dict[Hash, int]) -> list[str]:
        """The tier each leading block of a GPU store came from, as far as tiers hold them: loaded by the
        KV connector, not computed (that tier's hit once settled). A connector's hit is a prefix of the
        request's new blocks; the blocks after it were computed, in the same store. A block promoted into a
        tier for this load counts for the tier it was promoted from."""
        media: list[str] = []
        for h in ev.hashes:
            if h in cached:
                break
            m = next((m for m, held in self.held.items() if h in held), "")
            if not m:
                break
            media.append(self.origin.pop(h, m))
        return media

    def hold(self, at: float, media: list[str], ev: Stored, reasons: list[int], tenant: int) -> None:
        """A load of ``ev``'s first ``len(media)`` blocks from those tiers, pending until settled."""
        ld = _Load(at, ev.block_size, tenant, {h: (r, m) for h, r, m in zip(ev.hashes, reasons, media, strict=False)})
        self.pending.append(ld)
        for h in ld.blocks:
            old = self.pending_at.get(h)
            if old is not None:                    # loaded again before settling: the older load is settled
                m = old.blocks.pop(h)[1]
                self.hit_tokens[m] = self.hit_tokens.get(m, 0) + old.block_size
            self.pending_at[h] = ld

    def settle(self, now: float) -> None:
        """Loads older than SETTLE_S (receive time) are the tier's hits."""
        pending = self.pending
        while pending and pending[0].at <= now - SETTLE_S:
            ld = pending.popleft()
            for h, (_, m) in ld.blocks.items():
                del self.pending_at[h]
                self.hit_tokens[m] = self.hit_tokens.get(m, 0) + ld.block_size

    def seen_tokens(self) -> int:
        """Tokens of the loads seen from every tier, settled or pending."""
        return sum(self.hit_tokens.values()) + self.pending_tokens()

    def pending_tokens(self) -> int:
        return sum(len(ld.blocks) * ld.block_size for ld in self.pending)
