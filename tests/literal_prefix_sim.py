"""A test reference, not shipped: vLLM's finite pool block by block (``LiteralPrefixCacheSim``),
against which the fast pool of ``cachemon.analyze.sim.prefix.PrefixCacheSim`` is tested."""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

from cachemon.analyze.sim.prefix import PrefixCacheSim
from cachemon.state.ledger.reasons import Reason

_CAPACITY = Reason.CAPACITY.label


class LiteralPrefixCacheSim(PrefixCacheSim):
    """The finite pool block by block, as vLLM's data structures hold it (block ids, a
    free queue of ids, a hash -> blocks map). Slower; kept as the reference the fast
    pool of ``PrefixCacheSim`` is tested against."""

    _runs_pool = False    # evictions are recorded as they happen (``_depart``)

    def _empty(self) -> None:
        if self.cache_blocks is None:
            super()._empty()
            return
        usable = self.cache_blocks - 1
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(1, usable + 1))
        self._block_hash: list = [None] * (usable + 1)
        self._cached: dict[Hashable, list[int]] = {}

    def _cached_now(self) -> list:
        if self.cache_blocks is None:
            return super()._cached_now()
        return list(self._cached)

    def holds(self, h: Hashable, _j: int) -> bool:
        # (the base class's signature: this pool keys by content alone, the position is not needed)
        if self.cache_blocks is None:
            return h in self._seen
        return h in self._cached

    def _rename_pool(self, mapping: dict) -> None:
        for ph, real in mapping.items():
            blocks = self._cached.pop(ph, None)
            if blocks is None:
                continue
            for b in blocks:
                self._block_hash[b] = real
            self._cached[real] = blocks + self._cached.get(real, [])

    def _run_lru(self, hashes: list, max_blocks: int, blocks_needed: int, generated) -> int:
        free, cached, block_hash = self._free, self._cached, self._block_hash
        hit_ids = []
        for j in range(max_blocks):
            ids = cached.get(hashes[j])
            if ids is None:
                break
            hit_ids.append(ids[0])          # get_one_block: the earliest inserted block
        need = blocks_needed - len(hit_ids)
        if blocks_needed > len(free):      # the hit blocks are in the free queue too
            # vLLM refuses prompts that can never fit; count it, predict 0, cache nothing.
            self.oversized += 1
            return 0
        pop = free.pop
        for b in hit_ids:                    # touch: in use, out of the free queue
            pop(b)
        new = []
        popitem = free.popitem
        for _ in range(need):                # get_new_blocks: pop from the queue's front
            b = popitem(last=False)[0]
            h = block_hash[b]
            if h is not None:                # evict the hash this block still carried
                lst = cached[h]
                if len(lst) == 1:
                    del cached[h]
                    if self.split is not None:   # BlockRemoved of the last copy: capacity
                        self._depart(h, _CAPACITY)
                else:
                    lst.remove(b)
                block_hash[b] = None
            new.append(b)
        blocks = hit_ids + new
        full = hashes + generated() if blocks_needed > len(hashes) else hashes
        for j in range(len(hit_ids), min(len(full), blocks_needed)):   # cache the newly computed full blocks
            b = blocks[j]
            h = full[j]
            if self.split is not None:
                self._classify(h, j, h in cached)
            block_hash[b] = h
            copies = cached.get(h)
            if copies is None:
                cached[h] = [b]
            else:
                copies.append(b)
        self._release(blocks, min(blocks_needed, len(full)))
        if self.split is not None:
            self._trim_history()
        return len(hit_ids)

    def _release(self, blocks: list[int], hashed: int) -> None:
        """A finished request's blocks back to the free queue; `blocks[:hashed]` carry a hash.

        ``BlockPool.free_blocks``, given the blocks tail first by
        ``SingleTypeKVCacheManager.free``: blocks without a hash (the partial last block)
        are prepended to the queue's FRONT, to be reused first; cached ones appended to
        its end, so the queue stays LRU over cached blocks. Without ``uncached_first`` (vLLM
        0.10.2, 0.11.2: ``append_n`` of them all) every block goes to the end, tail first."""
        free = self._free
        if not self.uncached_first:
            free.update(dict.fromkeys(reversed(blocks)))
            return
        for b in blocks[hashed:]:      # prepend_n keeps the tail-first order: the tail ends in front
            free[b] = None
            free.move_to_end(b, last=False)
        free.update(dict.fromkeys(reversed(blocks[:hashed])))
