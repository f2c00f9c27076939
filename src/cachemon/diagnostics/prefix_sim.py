"""Replay vLLM V1's automatic prefix cache on token lists, one request at a time.

Each rule cites the vLLM source it mirrors (vllm-project/vllm, read, not copied):

* Only **full** blocks of ``block_size`` tokens are hashed and cached
  (``kv_cache_utils.py``: the request block hasher stops at the last full block).
* Block hashes form a **chain**: ``hash(parent_hash, block_tokens, extra_keys)``, the
  first block's parent being a fixed ``NONE_HASH`` (``kv_cache_utils.hash_block_tokens``,
  ``init_none_hash``). A change anywhere therefore changes every later block's hash.
* Extra keys: ``cache_salt`` goes into the **first** block only
  (``generate_block_hash_extra_keys``: salt only when the block starts at token 0), and the
  LoRA adapter into every block. Under a chain, a key in block 0 separates all later
  blocks too, so we put both into block 0 — same hits, one fewer tuple per block.
* A request can hit at most ``num_tokens - 1`` tokens, rounded down to whole blocks:
  the last token is always recomputed to get logits (``KVCacheManager.get_computed_blocks``:
  ``max_cache_hit_length = request.num_tokens - 1``; ``FullAttentionManager.
  find_longest_cache_hit`` takes ``max_length // block_size`` blocks and stops at the
  first miss).
* With a finite pool (``cache_blocks``): block 0 is reserved as the null block
  (``BlockPool.__init__``: ``null_block = free_block_queue.popleft()``); hit blocks are
  taken out of the free queue (``BlockPool.touch``) before new blocks are popped from
  its **front** (``get_new_blocks``), and popping a block that still carries a hash evicts
  that hash (``_maybe_evict_cached_block``). When a request finishes, its blocks go back
  to the **end** of the queue in **reverse** order, tail first
  (``SingleTypeKVCacheManager.free``), so the queue is LRU with chain tails evicted
  before their heads. vLLM does not de-duplicate equal blocks (``BlockHashToBlockMap``
  keeps several blocks per hash; ``get_one_block`` returns the earliest inserted), and
  neither do we.
* Requests run one at a time, in file order: each finishes (and frees its blocks)
  before the next is looked up. Generated (decode) tokens are not modelled: their blocks
  only matter for multi-turn reuse of the model's own output, and the request files do
  not carry the output tokens.

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

# Parent of a chain's first block (vLLM's NONE_HASH); any fixed value works.
NONE_HASH = 0x5F3759DF


def _raw(ids) -> bytes:
    # 4 bytes per token id; array() does the conversion in C, no per-token Python loop.
    return ids if isinstance(ids, bytes) else array("I", ids).tobytes()


def _seed(extra: Hashable) -> int:
    return hash((NONE_HASH, extra))


def block_hashes(ids: Sequence[int] | bytes, block_size: int, extra: Hashable = None) -> list[int]:
    """Chained hashes of the full blocks of `ids` (a token list, or its ``array('I')`` bytes)."""
    raw = _raw(ids)
    w = 4 * block_size
    # The extra keys are folded into the chain's seed: the same as hashing them with
    # block 0 (vLLM), since every later hash depends on block 0's.
    h = _seed(extra)
    return [h := hash((h, raw[i:i + w])) for i in range(0, (len(raw) // w) * w, w)]


class BlockHasher:
    """``block_hashes`` that skips re-hashing a prefix it has just seen.

    Real traffic repeats long prefixes (that is the point of a prefix cache). For each
    (extra key, first block) we remember the last request's bytes and hashes; a new
    request that starts with the same block is compared with it by memcmp (binary
    search over whole blocks) and the common blocks' hashes are reused — they are equal
    by construction, so the result is identical to ``block_hashes``, only cheaper."""

    def __init__(self, block_size: int, memo: int = 4096):
        self.block_size = block_size
        self._memo: OrderedDict = OrderedDict()
        self._max = memo

    def __call__(self, ids: Sequence[int] | bytes, extra: Hashable = None) -> list[int]:
        raw = _raw(ids)
        w = 4 * self.block_size
        end = (len(raw) // w) * w
        if end == 0:
            return []
        key = (extra, raw[:w])
        ref = self._memo.get(key)
        h, start, out = _seed(extra), 0, []
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


class PrefixCacheSim:
    """vLLM's prefix cache for requests run one at a time.

    ``cache_blocks=None``: unlimited pool (nothing is evicted). Otherwise the pool size
    as vLLM counts it (``num_gpu_blocks``, including the reserved null block)."""

    def __init__(self, block_size: int = 16, cache_blocks: int | None = None):
        if block_size < 1:
            raise ValueError("block_size must be at least 1")
        if cache_blocks is not None and cache_blocks < 2:
            raise ValueError("cache_blocks must be at least 2 (one is vLLM's reserved null block)")
        self.block_size = block_size
        self.cache_blocks = cache_blocks
        self.requests = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.oversized = 0          # requests needing more blocks than the pool has
        self.hasher = BlockHasher(block_size)
        if cache_blocks is None:
            self._seen: set[int] = set()
        else:
            usable = cache_blocks - 1
            self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(1, usable + 1))
            self._block_hash: list = [None] * (usable + 1)
            self._cached: dict[int, list[int]] = {}

    @property
    def hit_ratio(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def run(self, ids: Sequence[int], extra: Hashable = None, hashes: list[int] | None = None) -> int:
        """Look the request up, then cache its full blocks. Returns its cached tokens.
        `hashes`: the request's ``block_hashes(ids, block_size, extra)`` if already computed."""
        n = len(ids)
        self.requests += 1
        self.prompt_tokens += n
        if n == 0:
            return 0
        bs = self.block_size
        if hashes is None:
            hashes = self.hasher(ids, extra)
        max_blocks = min(len(hashes), (n - 1) // bs)
        if self.cache_blocks is None:
            hit = self._lookup_unlimited(hashes, max_blocks)
        else:
            hit = self._run_lru(hashes, max_blocks, -(-n // bs))
        cached = hit * bs
        self.cached_tokens += cached
        return cached

    def _lookup_unlimited(self, hashes: list[int], max_blocks: int) -> int:
        seen = self._seen
        # Nothing is ever evicted and every request caches all its full blocks, so if a
        # chain's block j is cached, blocks 0..j-1 are too: presence is monotone along
        # the chain and a binary search finds the first miss in O(log blocks) lookups.
        lo, hi = 0, max_blocks
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            if hashes[mid - 1] in seen:
                lo = mid
            else:
                hi = mid - 1
        seen.update(hashes)
        return lo

    def _run_lru(self, hashes: list[int], max_blocks: int, blocks_needed: int) -> int:
        free, cached, block_hash = self._free, self._cached, self._block_hash
        hit_ids = []
        for j in range(max_blocks):
            ids = cached.get(hashes[j])
            if ids is None:
                break
            hit_ids.append(ids[0])          # get_one_block: the earliest inserted block
        need = blocks_needed - len(hit_ids)
        if need > len(free):
            # vLLM refuses prompts that can never fit; count it, predict 0, cache nothing.
            self.oversized += 1
            return 0
        pop = free.pop
        for b in hit_ids:                    # touch: in use, out of the free queue
            pop(b)
        new = []
        for _ in range(need):                # get_new_blocks: pop from the LRU front
            b, _ = free.popitem(last=False)
            h = block_hash[b]
            if h is not None:                # evict the hash this block still carried
                lst = cached[h]
                lst.remove(b)
                if not lst:
                    del cached[h]
                block_hash[b] = None
            new.append(b)
        blocks = hit_ids + new
        for j in range(len(hit_ids), len(hashes)):   # cache the newly computed full blocks
            b = blocks[j]
            block_hash[b] = hashes[j]
            same = cached.get(hashes[j])
            if same is None:
                cached[hashes[j]] = [b]
            else:
                same.append(b)
        free.update(dict.fromkeys(reversed(blocks)))   # free: tail first, appended to the queue's end
        return len(hit_ids)
