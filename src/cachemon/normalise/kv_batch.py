"""vLLM's KV-cache events in one typed form, whatever release published them.

The wire (``sources/kv_events``) hands over ZMQ frames; the per-release decoders turn a
payload into a ``KvBatch`` of the three event kinds below; the ledger (``state/kv_ledger``)
reads only these types. Era knowledge stays here, as data, like the metrics era table.

What the types keep, and why:

* ``hashes``: vLLM's block hashes, one per block, as the replica sent them (an ``int`` of up to
  64 bits, or ``bytes`` on releases that send digests). They identify a block *on that
  replica only*: processes with another PYTHONHASHSEED, xxhash or an older release hash the
  same content differently, so cross-replica identity is the ledger's content id, never these.
* ``tokens``: the token ids of the stored blocks, ``len(hashes) * block_size`` of them
  (generated tokens included): from the decoder still msgpack-encoded (``EncodedTokens``: making
  them Python ints was the decoder's floor at large block sizes; it reads as a sequence of ints on
  demand), from constructed events a tuple of ints. The ledger keys blocks on the canonical
  encoding either way (``normalise.kv_tokens.block_keys``). Prompt content: never logged, never
  exported.
* ``extra``: vLLM's per-block extra keys (LoRA name, cache_salt, multimodal ids), one entry per
  block or ``None``; they take part in the content id, as in vLLM's own block hash.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from cachemon.normalise.kv_tokens import EncodedTokens

Hash = int | bytes
# The media the engine's own block pool publishes ("GPU" also on CPU builds, None on releases before
# media); any other medium is another tier (CPU offload, ...), at most MAX_TIERS followed (kv_limits.py).
POOL_MEDIA = frozenset((None, "GPU"))


@dataclass(frozen=True, slots=True)
class Stored:
    """BlockStored: full blocks newly cached (prompt or generated tokens), chained below ``parent``."""
    hashes: tuple[Hash, ...]
    parent: Hash | None                 # None: the first block of a chain
    tokens: tuple[int, ...] | EncodedTokens   # len(hashes) * block_size token ids
    block_size: int
    lora: str | None = None             # lora_name (or str(lora_id) on releases without names)
    medium: str | None = None           # "GPU" (the pool's default, also on CPU), "CPU", ...
    extra: tuple[object, ...] | None = None   # per-block extra keys, or None
    group: int = 0                      # KV-cache group (hybrid models); 0 otherwise
    # vLLM >= 0.33.0 with lookahead hashing: per block, the tokens beyond it that its hash covers
    # (lookahead_token_ids); None otherwise. Prompt content, like ``tokens``.
    lookahead: tuple[tuple[int, ...], ...] | None = None
    # kv_cache_spec_kind (0.22+): "full_attention", "sliding_window", "mamba", ...; None before. A group of
    # another kind than full attention stores only the blocks it keeps (its token_ids still span the whole
    # range): the ledger follows the full-attention group.
    kind: str | None = None
    # kv_cache_spec_sliding_window (0.22+, sliding-window groups only): the window in tokens. A reuse report
    # of such a group needs only the blocks of the window before the hit point held (vLLM 0.32.0
    # single_type_kv_cache_manager.py, SlidingWindowManager.find_longest_cache_hit).
    window: int | None = None


@dataclass(frozen=True, slots=True, init=False)
class Removed:
    """BlockRemoved: cached blocks evicted (one per event on 0.32.0, sent just before the store
    that needed the space, in the same batch)."""
    hashes: tuple[Hash, ...]
    medium: str | None = None
    group: int = 0

    def __init__(self, hashes: tuple[Hash, ...], medium: str | None = None, group: int = 0) -> None:
        # The slots' own setters: a frozen dataclass's generated __init__ (object.__setattr__ by name)
        # cost 400 ns, this 250 ns, and there is one Removed per evicted block (half the events).
        _RM_SET[0](self, hashes)
        _RM_SET[1](self, medium)
        _RM_SET[2](self, group)


_RM_SET: tuple[Callable[[Removed, object], None], ...] = tuple(vars(Removed)[f].__set__ for f in ("hashes", "medium", "group"))


@dataclass(frozen=True, slots=True)
class Cleared:
    """AllBlocksCleared: a successful prefix-cache reset, published at the next engine step."""
    medium: str | None = None


KvEvent = Stored | Removed | Cleared


@dataclass(slots=True)
class KvBatch:
    """One published message: an engine step's events, in order."""
    seq: int                            # the publisher's sequence number (0 at each process start)
    ts: float                           # the publisher's unix time
    events: list[KvEvent]
    dp_rank: int | None = None
    unknown: int = 0                    # events of a type this release table does not know (counted, skipped)
    release: str = ""                   # which decoder read it (era name), for cachemon_kv_source_info
    skipped: dict[str, int] = field(default_factory=dict)   # events dropped while decoding, by reason
    sanitised: int = 0                  # label values (medium, LoRA name) whose non-printable characters were replaced
