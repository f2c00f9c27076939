"""Chained block hashes of a request's full blocks, as vLLM's prefix cache keys them (see
``prefix_sim.py`` for the rules).

Hash choice: Python's built-in ``hash`` of ``(parent, block_bytes)``, where the block's
bytes are a slice of the request's ``array('I', ids).tobytes()`` — SipHash in C over 4
bytes per token, no per-token Python loop, and faster per block than sha256 over a
pickle (vLLM's default) or blake2b (see ``benchmarks/bench_analyze.py``). Bytes hashes
are salted per process (PYTHONHASHSEED), which is fine: hashes are only compared within
one run. It is 64-bit: with B distinct blocks in
one run the chance of any collision is about B^2 / 2^65 — under 3e-6 for ten million
blocks. A collision can only create a false hit, never lose one. vLLM itself uses
sha256 since 0.10.2; we only need equality of chains within one run, not vLLM's bytes.
"""
from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Hashable, Sequence

# A block's key in a simulated pool: its chained content hash (``block_hashes``), or a placeholder for
# a generated block whose tokens are not known: ("generated", serial) when they never will be
# (``PrefixCacheSim.generated_hashes``: it takes room and never hits), ("generated", serial, chain
# position) when a later turn of the chat may show them (reply_inference.py; ``rename`` then gives the
# block its real hash).
Placeholder = tuple[str, int, int]
BlockKey = int | tuple[str, int] | Placeholder

# Parent of a chain's first block (vLLM's NONE_HASH); any fixed value works.
NONE_HASH = 0x5F3759DF


def raw_bytes(ids: Sequence[int] | bytes) -> bytes:
    # 4 bytes per token id; array() does the conversion in C, no per-token Python loop.
    return ids if isinstance(ids, bytes) else array("I", ids).tobytes()


def chain_seed(extra: Hashable) -> int:
    return hash((NONE_HASH, extra))


def block_hashes(ids: Sequence[int] | bytes, block_size: int, extra: Hashable = None) -> list[int]:
    """Chained hashes of the full blocks of `ids` (a token list, or its ``array('I')`` bytes)."""
    raw = raw_bytes(ids)
    w = 4 * block_size
    # The extra keys are folded into the chain's seed: the same as hashing them with
    # block 0 (vLLM), since every later hash depends on block 0's.
    h = chain_seed(extra)
    return [h := hash((h, raw[i:i + w])) for i in range(0, (len(raw) // w) * w, w)]


def extend_chain(h: int, raw: bytes, start: int, end: int, block_size: int) -> list[int]:
    """The hashes of blocks ``start``..``end - 1`` of ``raw`` (``array('I')`` bytes) below a chain whose
    block ``start - 1`` hashed to ``h`` (``chain_seed(extra)`` for ``start == 0``): ``block_hashes``'
    continuation, without hashing the blocks before again."""
    w = 4 * block_size
    return [h := hash((h, raw[i:i + w])) for i in range(start * w, end * w, w)]


class BlockHasher:
    """``block_hashes`` that skips re-hashing a prefix it has just seen.

    Real traffic repeats long prefixes (that is the point of a prefix cache). For each
    (extra key, first block) we remember the last request's bytes and hashes; a new
    request that starts with the same block is compared with it by memcmp (binary
    search over whole blocks) and the common blocks' hashes are reused — they are equal
    by construction, so the result is identical to ``block_hashes``, only cheaper."""

    def __init__(self, block_size: int, memo: int = 4096):
        self.block_size = block_size
        self._memo: OrderedDict[tuple[Hashable, bytes], tuple[bytes, list[int]]] = OrderedDict()
        self._max = memo

    def __call__(self, ids: Sequence[int] | bytes, extra: Hashable = None) -> list[int]:
        raw = raw_bytes(ids)
        w = 4 * self.block_size
        end = (len(raw) // w) * w
        if end == 0:
            return []
        key = (extra, raw[:w])
        ref = self._memo.get(key)
        h, start, out = chain_seed(extra), 0, []
        if ref is not None:
            rraw, rhashes = ref
            lo, hi = 1, min(end, (len(rraw) // w) * w) // w     # block 0 equal: it is the key
            while lo < hi:
                mid = (lo + hi + 1) >> 1
                if raw[lo * w:mid * w] == rraw[lo * w:mid * w]:
                    lo = mid
                else:
                    hi = mid - 1
            out = rhashes[:lo]
            h, start = out[-1], lo * w
            self._memo.move_to_end(key)
        out += [h := hash((h, raw[i:i + w])) for i in range(start, end, w)]
        self._memo[key] = (raw, out)
        if len(self._memo) > self._max:
            self._memo.popitem(last=False)
        return out


def extra_key(cache_salt: str | None = None, lora: str | None = None) -> Hashable:
    """Extra hash key for a request's first block (None when it has neither)."""
    if cache_salt is None and lora is None:
        return None
    return (("cache_salt", cache_salt) if cache_salt is not None else None,
            ("lora", lora) if lora is not None else None)

