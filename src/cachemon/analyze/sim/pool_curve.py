"""Cached tokens for every pool size in one pass: ``PoolCurve`` (Mattson's LRU stack distances in
vLLM's eviction order), over a growing Fenwick tree of runs."""
from __future__ import annotations

from array import array
from collections.abc import Sequence

from cachemon.analyze.sim.block_hash import BlockKey, Placeholder


class _Fenwick:
    """Prefix sums over run ids (live blocks per run), growing as runs are added."""

    def __init__(self) -> None:
        self.tree = [0]

    def add(self, i: int, v: int) -> None:
        tree, n = self.tree, len(self.tree)
        i += 1
        while i < n:
            tree[i] += v
            i += i & -i

    def grow(self) -> int:
        # Appending index n: its node covers (n - lowbit(n), n]; fill it from the existing sums.
        n = len(self.tree)
        low = n & -n
        self.tree.append(self.prefix(n - 2) - self.prefix(n - low - 1) if low > 1 else 0)
        return n - 1

    def last_at_most(self, target: int) -> int:
        """The largest id whose prefix sum is <= target (-1 if none); sums are >= 0."""
        tree, n = self.tree, len(self.tree) - 1
        pos, step = 0, 1 << n.bit_length()
        while step:
            nxt = pos + step
            if nxt <= n and tree[nxt] <= target:
                pos = nxt
                target -= tree[nxt]
            step >>= 1
        return pos - 1

    def prefix(self, i: int) -> int:
        """Sum over ids 0..i."""
        tree, s = self.tree, 0
        i += 1
        while i > 0:
            s += tree[i]
            i -= i & -i
        return s


class PoolCurve:
    """Cached tokens for *every* pool size in one pass (Mattson's LRU stack distances,
    in vLLM's eviction order).

    With requests run one at a time, vLLM's free queue is an LRU stack of cached blocks:
    a finished request's blocks go to its end tail first, so the head block is the most
    recent; blocks without a hash (the partial last block) wait at the front and are
    reused first. So at pool size C (null block included) the cached blocks at lookup
    are the top ``C - 1 - u`` entries of one stack, u being the previous request's
    uncached blocks, and block j of a request hits iff its stack depth
    ``d_j < C - 1 - u``. Depths grow along a chain (a request pushes its head last), so
    one depth per block gives the hit length at every C at once.

    The stack is kept as *runs* (the blocks one request pushed, head on top): a later
    hit removes a prefix of a run, so a run is two integers and a Fenwick tree over runs
    gives the number of blocks above a run in O(log requests).

    A block recomputed while still cached (the last block of a prompt that is an exact
    multiple of the block size) leaves its old copy in place, as in vLLM. Differences
    from ``PrefixCacheSim`` (measured in tests/test_analyze_questions.py): the next hit
    on such a hash moves the newer copy here, the older one in vLLM (which copy stays
    behind shifts later depths by one block); a request that does not fit a pool caches
    nothing there, while here it still enters the stack (vLLM refuses to start with a
    pool smaller than one max-length request, so real pools never see this).
    """

    def __init__(self, block_size: int, max_blocks: int = 1 << 20):
        self.block_size = block_size
        self.max_blocks = max_blocks      # the curve is computed for pool sizes up to this
        # second differences: hist = cumsum(delta) is the tokens first hit at pool size C,
        # curve = cumsum(hist); a run of consecutive depths is then two updates
        self._delta = array("q", [0]) * (max_blocks + 3)
        self.requests = 0
        self.prompt_tokens = 0
        self.inexact = 0                  # hits that were not at the top of their run (should stay 0)
        self._maxc = 0                    # largest pool size where the curve can still change
        self._empty()

    def _empty(self) -> None:
        self._where: dict[BlockKey, int] = {}       # hash -> run id holding its block
        self._start: list[int] = []       # per run: index of its first live block (chain position)
        self._fen = _Fenwick()
        self._live = 0
        self._u = 0
        self._cut = 0                     # runs below this id lie deeper than max_blocks: gone

    def reset(self, _kind: str = "reset_prefix_cache") -> None:
        # (the simulations' signature: a pool curve empties the same way whatever the reason)
        self._empty()

    def rename(self, mapping: dict[Placeholder, int]) -> None:
        """Placeholders of generated blocks get their real hashes (``PrefixCacheSim.rename``)."""
        where = self._where
        for ph, real in mapping.items():
            r = where.pop(ph, None)
            if r is not None:
                where[real] = r

    def _add(self, lo: int, hi: int, tokens: int) -> None:
        top = self.max_blocks + 1
        if lo >= top:
            return
        d = self._delta
        d[lo] += tokens
        d[min(top, hi)] -= tokens

    def run(self, n: int, hashes: list[int], completion_tokens: int | None = None,
            generated: list[BlockKey] | None = None) -> None:
        """One request: `n` prompt tokens, `hashes` its full prompt blocks' chained hashes,
        `completion_tokens` its output length, `generated` the hashes of the full blocks
        written while decoding when the output ids are known (else they only take room)."""
        self.requests += 1
        self.prompt_tokens += n
        if n == 0:
            return
        bs = self.block_size
        computed = n + max((completion_tokens or 1) - 1, 0)
        needed = -(-computed // bs)
        max_hit = min(len(hashes), (n - 1) // bs)
        where, start, fen, cut = self._where, self._start, self._fen, self._cut
        floor = needed + 1                 # a pool smaller than this cannot run the request
        chain: Sequence[BlockKey] = hashes + generated if generated else hashes
        pushed = max(computed // bs, len(chain))
        # Only blocks that can hit are taken out of their run; a block at or past the
        # hit limit is recomputed and, like in vLLM, the old copy stays where it is.
        # Along a chain the run ids never increase (a newer run holding block j holds
        # j-1 too), so each run's share of the hit is found by binary search.
        j = 0
        while j < max_hit:
            r = where.get(hashes[j])
            if r is None or r < cut:
                break
            lo, hi = j + 1, max_hit
            while lo < hi:
                mid = (lo + hi) >> 1
                if where.get(hashes[mid]) == r:
                    lo = mid + 1
                else:
                    hi = mid
            b = lo
            if start[r] != j:
                self.inexact += 1
            above = self._live - fen.prefix(r)
            c0 = above + 2 + self._u       # pool size at which block j starts to hit
            c1 = c0 + (b - j)
            if c0 < floor:                 # these blocks hit from `floor` on
                below = (min(floor, c1)) - c0
                self._add(floor, floor + 1, below * bs)
                c0 = floor
            if c0 < c1:
                self._add(c0, c1, bs)
            start[r] = b
            fen.add(r, j - b)
            self._live -= b - j
            j = b
        rid = fen.grow()
        start.append(0)
        fen.add(rid, pushed)
        self._live += pushed
        where.update(dict.fromkeys(chain, rid))
        self._u = needed - pushed
        self._maxc = max(self._maxc, self._live + 2 + self._u, floor)
        if rid & 1023 == 0:
            self._prune()

    def _prune(self) -> None:
        """Forget runs that lie deeper than max_blocks (they cannot hit at any pool size
        the curve covers), so memory stays bounded by max_blocks, not by the stream."""
        target = self._live - self.max_blocks
        if target <= 0:
            return
        self._cut = self._fen.last_at_most(target) + 1
        if len(self._where) > 4 * self.max_blocks:
            cut = self._cut
            self._where = {h: r for h, r in self._where.items() if r >= cut}

    def curve(self) -> array[int]:
        """Cached tokens at pool size C for C = 0 .. the size beyond which nothing changes
        (index = C; the last value holds for every larger pool, up to max_blocks)."""
        from itertools import accumulate
        end = min(self.max_blocks, self._maxc)
        hist = accumulate(self._delta[:end + 1])
        return array("q", accumulate(hist))
