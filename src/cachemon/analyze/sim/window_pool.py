"""A sliding-window model's prefix cache on a finite pool, block by block (``cachemon analyze`` with a window
and ``--cache-blocks``).

On a hybrid model both KV-cache groups take their blocks from one ``BlockPool`` (vLLM 0.32.0,
``v1/core/kv_cache_coordinator.py``: one pool of ``num_gpu_blocks``, block 0 the null block), so the
sliding-window group's blocks compete with the full-attention group's. The rules of window_sim.py decide
the hits; these decide what is evicted (read, not copied, in vllm-project/vllm v0.32.0):

* Admission (``KVCacheManager.allocate_slots``): the hit blocks of every group are touched first (taken
  out of the free queue; the sliding-window group touches only those inside the window before the hit,
  ``add_local_computed_blocks`` pads the skipped ones with the null block), then each group, in group
  order (the sliding-window group first, as on the real capture: group 0), takes
  ``cdiv(tokens, block) - its blocks`` new blocks from the queue's front (``get_new_blocks``), a block
  still carrying a hash losing it (``_maybe_evict_cached_block``).
* Caching (``cache_blocks``): the full-attention group caches every full block, the sliding-window group
  only the blocks before the replay point and the shared-prefix junction (window_sim.py).
* Every step (a prefill chunk of at most ``max_num_batched_tokens``, ``DEFAULT_CHUNK``, then one token
  a step) first frees the sliding-window blocks that left the window (``remove_skipped_blocks``: blocks
  below ``(computed - window + 1) // block``, from the highest down), then allocates the step's slots in
  each group, then caches the blocks it filled.
* ``BlockPool.free_blocks`` puts blocks without a hash at the queue's front and cached ones at its end,
  in the order given (releases before 0.24.0 all at its end: ``uncached_first``, normalise/eras.FREE_ORDERS);
  at the end of a request each group (group order) frees its blocks tail first (``KVCacheCoordinator.free``).

The split is taken as the live ledger sees the events: when the request stores its blocks, after the
blocks it took evicted what they held. So a block the full-attention group held at the lookup (the window
cut the hit before it) but that this request's own allocation evicted counts as ``capacity``, as its
BlockRemoved comes before the BlockStored (the real swa_pool_mix capture: 4 such blocks).

Requests run one at a time; each decode step's freeing is taken to follow the step before it (no
asynchronous-scheduling lag). Equal blocks are not de-duplicated: the earliest inserted copy serves.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

from cachemon.analyze.sim.block_hash import BlockKey, Placeholder
from cachemon.analyze.sim.window import WindowedPrefixCacheSim
from cachemon.state.ledger.reasons import Reason

_SLIDING, _RECOMPUTE, _CAPACITY, _FIRST = (r.label for r in (
    Reason.SLIDING_WINDOW, Reason.RECOMPUTE_LAST_BLOCK, Reason.CAPACITY, Reason.FIRST))
_W, _F = 0, 1          # the groups: sliding window, full attention
# Tokens a step prefills (--max-num-batched-tokens): vLLM 0.32.0's default for the API server on CPU
# (engine/arg_utils.py, get_batch_defaults) and on most GPUs: a longer prompt is prefilled in chunks, the
# window group freeing between them.
DEFAULT_CHUNK = 2048


class WindowedPoolSim(WindowedPrefixCacheSim):
    """``WindowedPrefixCacheSim`` on a pool of ``cache_blocks`` blocks (the null block included)."""

    _runs_pool = False          # departures are remembered in the history (``_depart``), not in run maps

    def __init__(self, block_size: int, window: int, cache_blocks: int, hybrid: bool = True,
                 chunk: int = DEFAULT_CHUNK, uncached_first: bool = True) -> None:
        if cache_blocks < 2:
            raise ValueError("cache_blocks must be at least 2 (one is vLLM's reserved null block)")
        if chunk < 1:
            raise ValueError("the prefill chunk must be at least 1 token")
        self._pool_size = cache_blocks
        self.chunk = chunk
        super().__init__(block_size, window, hybrid)
        self.uncached_first = uncached_first

    def _empty(self) -> None:
        super()._empty()
        n = self._pool_size
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, n))
        self._key: list[tuple[int, BlockKey] | None] = [None] * n
        self._ref = [0] * n
        self._index: dict[tuple[int, BlockKey], dict[int, None]] = {}

    def reset(self, kind: str = "reset_prefix_cache") -> None:
        if self.split is not None:
            why = "restart" if kind == "restart" else "reset"
            self._departed.update(dict.fromkeys(self._seen, why))    # the full group's (or known) content
            self._trim_history()
        self.resets += 1
        self._empty()

    def rename(self, mapping: dict[Placeholder, int]) -> None:
        """Generated blocks' placeholders get their real hashes (a later turn showed the reply): the
        full-attention copies still cached serve under the real hash, after any copy already there."""
        super().rename(mapping)
        for ph, real in mapping.items():
            copies = self._index.pop((_F, ph), None)
            if copies is None:
                continue
            into = self._index.setdefault((_F, real), {})
            for b in copies:
                into[b] = None
                self._key[b] = (_F, real)

    # -- the pool ---------------------------------------------------------------------------
    def _has(self, group: int, h: BlockKey) -> bool:
        return (group, h) in self._index

    def _touch(self, group: int, h: BlockKey) -> int:
        b = next(iter(self._index[(group, h)]))
        if self._ref[b] == 0:
            del self._free[b]
        self._ref[b] += 1
        return b

    def _take(self, k: int) -> list[int] | None:
        if k > len(self._free):
            return None
        out = []
        for _ in range(k):
            b, _v = self._free.popitem(last=False)
            key = self._key[b]
            if key is not None:
                self._uncache(b, key)
            self._ref[b] = 1
            out.append(b)
        return out

    def _uncache(self, b: int, key: tuple[int, BlockKey]) -> None:
        copies = self._index[key]
        del copies[b]
        self._key[b] = None
        if not copies:
            del self._index[key]
            if key[0] == _W:
                self._win.discard(key[1])
            else:
                self._seen.discard(key[1])
                if self.split is not None:
                    self._depart(key[1], _CAPACITY)
                    self._trim_history()

    def _cache(self, b: int, group: int, h: BlockKey) -> None:
        key = (group, h)
        self._key[b] = key
        self._index.setdefault(key, {})[b] = None
        (self._win if group == _W else self._seen).add(h)

    def _release(self, blocks: Sequence[int | None]) -> None:
        """``BlockPool.free_blocks``: `blocks` in eviction order (None: the null block)."""
        first: list[int] = []
        last: list[int] = []
        for b in blocks:
            if b is None:
                continue
            self._ref[b] -= 1
            if self._ref[b] == 0:
                # older releases (not uncached_first) append every freed block to the end, in the order given
                (first if self._key[b] is None and self.uncached_first else last).append(b)
        for b in reversed(first):
            self._free[b] = None
            self._free.move_to_end(b, last=False)
        for b in last:
            self._free[b] = None

    # -- one request ---------------------------------------------------------------------------
    def run(self, ids: Sequence[int], extra: Hashable = None, hashes: list[int] | None = None,
            completion_tokens: int | None = None, completion_ids: Sequence[int] | None = None,
            generated: list[BlockKey] | None = None) -> int:
        n = len(ids)
        self.requests += 1
        self.prompt_tokens += n
        if n == 0:
            return 0
        bs, w = self.block_size, self.window
        if hashes is None:
            hashes = self.hasher(ids, extra)
        max_blocks = min(len(hashes), (n - 1) // bs)
        held = 0
        while held < max_blocks and hashes[held] in self._seen:
            held += 1
        hit = self.window_hit(hashes, held if self.hybrid else max_blocks)
        held = max(held, hit)
        total = n + max((completion_tokens or 1) - 1, 0)     # the KV of every output token but the last
        if generated is None:        # placeholders where the output is unknown: cached, so evicted last
            generated = self.generated_hashes(ids, hashes, completion_tokens, completion_ids, extra)
        if -(-total // bs) > self._pool_size - 1:
            self.oversized += 1
            return 0
        self.cut_tokens += (held - hit) * bs
        skipped = max(0, hit * bs - w + 1) // bs
        win: list[int | None] = [None] * skipped + [self._touch(_W, h) for h in hashes[skipped:hit]]
        full: list[int | None] = [self._touch(_F, h) for h in hashes[:hit]] if self.hybrid else []
        chain = hashes + generated
        ends = {(n - 1) // bs}
        if self.hybrid and held > hit:
            ends.add(held)
        keep = {j for e in ends for j in range(max(hit, e - self.need), e)}
        cached_w = cached_f = hit
        computed = hit * bs
        first = True
        while computed < total:
            # a step (a prefill chunk, then one token a step): free what left the window, then the slots
            self._release(self._left_window(win, computed))
            computed += min(self.chunk, n - computed) if computed < n else 1
            if not self._grow(win, full, computed):     # both groups do not fit: vLLM could not run it
                self._release(list(reversed(win)))
                self._release(list(reversed(full)))
                self.oversized += 1
                return 0
            if first and self.split is not None:   # as stored: after its blocks evicted what they held
                self._split(hashes, generated, hit, held, max_blocks, n, completion_tokens)
            first = False
            cached_w = self._cache_upto(win, _W, chain, cached_w, computed, keep)
            if self.hybrid:
                cached_f = self._cache_upto(full, _F, chain, cached_f, computed, None)
        self._release(list(reversed(win)))
        if self.hybrid:
            self._release(list(reversed(full)))
        else:                                 # no full-attention group: what it would have hit (the split)
            self._seen.update(chain[:computed // bs])
        self.cached_tokens += hit * bs
        return hit * bs

    def _left_window(self, win: list[int | None], computed: int) -> list[int | None]:
        """The window group's slots whose tokens left the window at this step, newest first: freed,
        from the newest down to the first already freed."""
        gone = min(max(0, computed - self.window + 1) // self.block_size, len(win))
        freed: list[int | None] = []
        for j in range(gone - 1, -1, -1):
            if win[j] is None:
                break
            freed.append(win[j])
            win[j] = None
        return freed

    def _cache_upto(self, slots: list[int | None], group: int, chain: list[BlockKey], cached: int, computed: int,
                    keep: set[int] | None) -> int:
        """Cache the group's blocks that became full at this step (only those in ``keep``, where given:
        the window group keeps what a later request can still hit); the new count of cached blocks."""
        for j in range(cached, min(computed // self.block_size, len(chain))):
            slot = slots[j]
            if slot is not None and (keep is None or j in keep):
                self._cache(slot, group, chain[j])
        return max(cached, computed // self.block_size)

    def _grow(self, win: list[int | None], full: list[int | None], tokens: int) -> bool:
        """Slots for `tokens` in each group; False when the free queue cannot give them."""
        need = -(-tokens // self.block_size)
        for blocks in ((win, full) if self.hybrid else (win,)):
            got = self._take(max(need - len(blocks), 0))
            if got is None:
                return False
            blocks.extend(got)
        return True


__all__ = ["WindowedPoolSim"]
