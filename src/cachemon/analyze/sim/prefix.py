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
  that hash (``_maybe_evict_cached_block``). When a request finishes, its blocks are
  handed back tail first (``SingleTypeKVCacheManager.free``) and ``BlockPool.free_blocks``
  puts those without a hash (the partial last block) at the queue's **front** and the
  cached ones at its **end**, so the queue is LRU over cached blocks with chain tails
  evicted before their heads. Older releases append them all to the end, the uncached
  first (``uncached_first=False``; which releases: ``normalise/eras.FREE_ORDERS``). vLLM does not de-duplicate equal blocks
  (``BlockHashToBlockMap`` keeps several blocks per hash; ``get_one_block`` returns the
  earliest inserted), and neither do we.
* Decode takes blocks from the same pool and caches every full block of computed
  tokens (all output tokens but the last): see ``generated_hashes``.
* ``BlockPool.reset_prefix_cache`` drops every hash: ``reset``.
* Requests run one at a time, in file order: each finishes (and frees its blocks)
  before the next is looked up.

The block hashes: ``block_hash.py``; the pool-size curve: ``pool_curve.py``; N replicas behind a
router: ``fleet_sim.py``.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from itertools import repeat

from cachemon.analyze.sim.block_hash import NONE_HASH, BlockHasher, BlockKey, Placeholder, block_hashes, extra_key
from cachemon.state.ledger.reasons import DEFAULT_HISTORY_BLOCKS, REASONS, Reason

# Why a stored block had to be computed: the live ledger's reasons (state/ledger/reasons.py, the label
# values of cachemon_kv_stored_tokens_total{reason}), in its order. Isolation (another cache_salt or
# adapter) is not simulated here: it stays 0.
SPLIT_REASONS = REASONS
_FIRST, _CAPACITY, _RESET, _RESTART, _ROUTING, _RECOMPUTE = (
    r.label for r in (Reason.FIRST, Reason.CAPACITY, Reason.RESET, Reason.RESTART, Reason.ROUTING,
                      Reason.RECOMPUTE_LAST_BLOCK))
# Departed content remembered per replica: the live ledger's default, so that both forget the same
# content on long streams.
HISTORY_BLOCKS = DEFAULT_HISTORY_BLOCKS


class PrefixCacheSim:
    """vLLM's prefix cache for requests run one at a time.

    ``cache_blocks=None``: unlimited pool (nothing is evicted). Otherwise the pool size
    as vLLM counts it (``num_gpu_blocks``, including the reserved null block)."""

    def __init__(self, block_size: int, cache_blocks: int | None = None, uncached_first: bool = True):
        if block_size < 1:
            raise ValueError("block_size must be at least 1")
        if cache_blocks is not None and cache_blocks < 2:
            raise ValueError("cache_blocks must be at least 2 (one is vLLM's reserved null block)")
        self.block_size = block_size
        self.cache_blocks = cache_blocks
        self.uncached_first = uncached_first   # freed blocks without a hash go to the free queue's front
        self.requests = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.oversized = 0          # requests needing more blocks than the pool has
        self.resets = 0
        self.hasher = BlockHasher(block_size)
        self._gen = 0               # counter for the hashes of generated blocks whose tokens are unknown
        self.split: dict[str, int] | None = None   # stored tokens by reason (``track_split``)
        self._departed: dict[Hashable, str] = {}   # content hash -> why it left this pool (its latest departure)
        self._departed_old: dict[Hashable, str] = {}   # the previous generation of that history
        self._history = 0           # departed entries kept (``track_split``)
        self.history_dropped = 0    # departed entries forgotten to stay bounded (then counted "first")
        self._peers: list[PrefixCacheSim] = []   # the other replicas of a fleet (for "routing")
        # Called with the blocks (hashes, chain positions) counted "first", as they are stored:
        # the per-tenant split (tenant_split.py) tells isolation from new content there.
        self.on_first: Callable[[list[BlockKey], Sequence[int]], None] | None = None
        self._empty()

    def _empty(self) -> None:
        if self.cache_blocks is None:
            self._seen: set[BlockKey] = set()
        else:
            self._blank = self.cache_blocks - 1
            self._where: dict[Hashable, int] = {}     # hash -> run holding the copy that serves it
            self._dups: dict[Hashable, list[int]] = {}  # hash -> runs holding later copies, oldest first
            self._chain: list[list[BlockKey] | None] = []      # per run: its hashes by chain position
            self._s: list[int] = []
            self._e: list[int] = []
            self._b: list[int] = []                  # per run: blanks queued before it (not uncached_first)
            self._order: deque[int] = deque()        # live runs, oldest first

    def reset(self, kind: str = "reset_prefix_cache") -> None:
        """``POST /reset_prefix_cache`` or a restart (`kind` "restart"): every hash is dropped
        (``BlockPool.reset_prefix_cache``); the queue order no longer matters."""
        self.resets += 1
        if self.split is not None:
            live = self._cached_now()
            if self.cache_blocks is not None and self._runs_pool:
                gone = (self._where.keys() | self._dups.keys()) - set(live)   # evicted from here
                self._departed.update(dict.fromkeys(gone, _CAPACITY))
            self._departed.update(dict.fromkeys(live, _RESTART if kind == "restart" else _RESET))
            self._trim_history()
        self._empty()

    # -- the split of stored blocks (docs/kv-events.md, "Classification of stored blocks")
    def track_split(self, history_blocks: int = HISTORY_BLOCKS) -> None:
        """Classify every block this pool stores, as vLLM's KV events would show it: the
        content is still cached here (``recompute_last_block``), else it left this pool
        before (``restart`` / ``reset`` / ``capacity``: the reason of its latest departure),
        else it is cached now on a peer replica (``routing``), else ``first``. Tokens per
        reason accumulate in ``split``. Departed content is remembered like the live ledger
        does (state/ledger/fleet.py): two generations of `history_blocks` / 2, so at least the
        latest half is kept; forgotten entries are counted in ``history_dropped``."""
        self.split = dict.fromkeys(SPLIT_REASONS, 0)
        self._history = history_blocks

    def _cached_now(self) -> list[BlockKey]:
        if self.cache_blocks is None:
            return list(self._seen)
        out: list[BlockKey] = []
        for r in self._order:
            c = self._chain[r]
            if c is not None:
                out += c[self._s[r]:self._e[r]]
        return out

    def holds(self, h: Hashable, j: int) -> bool:
        """Whether content `h` (at chain position j) is cached in this pool now."""
        if self.cache_blocks is None:
            return h in self._seen
        return self._at(h, j) is not None

    def holds_any(self, hs: Iterable[Hashable], j: int) -> bool:
        """Whether any of contents `hs` (each at chain position j) is cached in this pool now: ``holds``
        in one call (the per-tenant split asks it for every other key's copy of a first block)."""
        if self.cache_blocks is None:
            seen = self._seen
            return any(h in seen for h in hs)
        where, s, e, dups = self._where, self._s, self._e, self._dups
        for h in hs:
            r = where.get(h)
            if r is not None and s[r] <= j < e[r] or dups and self._at(h, j) is not None:
                return True
        return False

    def _depart(self, h: Hashable, why: str) -> None:
        self._departed[h] = why

    def _trim_history(self) -> None:
        if len(self._departed) >= self._history // 2:
            self.history_dropped += len(self._departed_old)
            self._departed_old = self._departed
            self._departed = {}

    def _why_left(self, hs: Sequence[BlockKey]) -> list[str | None]:
        """Per block of `hs`, how its content last left this pool (None: never), used up."""
        dep, old = self._departed, self._departed_old
        whys: list[str | None] = list(map(dep.pop, hs, repeat(None))) if dep else [None] * len(hs)
        if old and None in whys:
            whys = [w if w is not None else old.pop(h, None) for w, h in zip(whys, hs, strict=True)]
        return whys

    def _classify(self, h: BlockKey, j: int, here: bool) -> None:
        if here:
            self.split[_RECOMPUTE] += self.block_size   # type: ignore[index]
        else:
            self._classify_new([h], j)

    # The runs pool remembers evicted content for free: an evicted block's ``_where`` entry
    # stays (pointing at a dead run) until ``_compact`` moves it to ``_departed``.
    _runs_pool = True
    _compact_slack = 4096     # map entries beyond 4x the pool before a compaction

    def _classify_new(self, hs: Sequence[BlockKey], j0: int) -> None:
        """Blocks `hs` (chain positions j0, j0 + 1, ...) are stored and not cached here now.
        A departure is used up when its content is stored again (as the live ledger pops its
        history). Dict and list work is done in C: this runs for every stored block."""
        if not hs:
            return
        split, bs = self.split, self.block_size
        assert split is not None
        pos: Sequence[int] = range(j0, j0 + len(hs))
        if self.cache_blocks is not None and self._runs_pool:
            ws = list(map(self._where.get, hs))     # not cached, yet in the map: evicted from here
            gone = len(ws) - ws.count(None)
            if gone:
                split[_CAPACITY] += gone * bs
                if gone == len(ws):
                    return
                pos = [j0 + k for k, w in enumerate(ws) if w is None]
                hs = [hs[j - j0] for j in pos]
        whys = self._why_left(hs)
        new = whys.count(None)
        if new < len(whys):
            for why in whys:
                if why is not None:
                    split[why] += bs
        if not new:
            return
        if not self._peers:
            split[_FIRST] += new * bs
            if self.on_first is not None:
                self.on_first([*hs] if new == len(hs) else [h for h, w in zip(hs, whys, strict=True) if w is None],
                              pos if new == len(hs) else [p for p, w in zip(pos, whys, strict=True) if w is None])
            return
        for k, h in enumerate(hs):
            if whys[k] is None:
                why = _ROUTING if any(p.holds(h, pos[k]) for p in self._peers) else _FIRST
                split[why] += bs
                if why == _FIRST and self.on_first is not None:
                    self.on_first([h], [pos[k]])

    def rename(self, mapping: dict[Placeholder, int]) -> None:
        """Generated blocks stored under a placeholder (``("generated", serial, position)``)
        whose tokens became known later (a later turn of the same chat shows the reply):
        give each still-held copy its real chained hash, so the next turn can hit it."""
        if self.split is not None:
            for ph, real in mapping.items():
                why = self._why_left([ph])[0]
                if why is not None:
                    self._departed[real] = why
        if self.cache_blocks is None:
            seen = self._seen
            for ph, real in mapping.items():
                if ph in seen:
                    seen.discard(ph)
                    seen.add(real)
            return
        self._rename_pool(mapping)

    def _rename_pool(self, mapping: dict[Placeholder, int]) -> None:
        s, e = self._s, self._e
        for ph, real in mapping.items():
            r = self._where.pop(ph, None)
            if r is None or self._chain[r] is None:
                continue
            j = ph[2]
            if not s[r] <= j < e[r]:          # that copy was evicted meanwhile
                self._where.setdefault(real, r)
                continue
            self._chain[r][j] = real          # type: ignore[index]
            other = self._at(real, j)
            if other is None:
                self._where[real] = r
            else:                             # copies: the earliest inserted serves (vLLM)
                runs = sorted([other, r] + self._dups.get(real, []))
                self._where[real] = runs[0]
                self._dups[real] = runs[1:]

    @property
    def hit_ratio(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def generated_hashes(self, ids: Sequence[int], hashes: list[int], completion_tokens: int | None,
                         completion_ids: Sequence[int] | None, extra: Hashable = None) -> list[BlockKey]:
        """Hashes of the full blocks written while decoding, after the prompt's.

        vLLM computes the KV of every output token but the last (it is sampled, never
        fed back), and caches each block as soon as it is full (``Request.block_hashes``
        grow with the output; ``KVCacheManager.allocate_slots`` caches up to the computed
        tokens). With the output ids the hashes are the real chain; without them each
        block gets a unique hash: it takes room in the pool but can never be hit."""
        bs = self.block_size
        total = len(ids) + max((completion_tokens or 1) - 1, 0)
        full = total // bs
        if full <= len(hashes):
            return []
        out: list[BlockKey] = []
        if completion_ids is not None and len(completion_ids) >= total - len(ids):
            seq = list(ids) + list(completion_ids[:total - len(ids)])
            out += block_hashes(seq, bs, extra)[len(hashes):full]
            return out
        for _ in range(full - len(hashes)):
            self._gen += 1
            out.append(("generated", self._gen))
        return out

    def run(self, ids: Sequence[int], extra: Hashable = None, hashes: list[int] | None = None,
            completion_tokens: int | None = None, completion_ids: Sequence[int] | None = None,
            generated: list[BlockKey] | None = None) -> int:
        """Look the request up, then cache its full blocks. Returns its cached tokens.
        `hashes`: the request's ``block_hashes(ids, block_size, extra)`` if already computed.
        `completion_tokens`: generated tokens (None: assume 1, i.e. the prompt's blocks only).
        `generated`: the hashes of the blocks its decode fills, when the caller has them
        (placeholders it may ``rename`` later); else they come from `completion_ids`."""
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
            hit = self._run_unlimited(ids, extra, hashes, max_blocks, completion_tokens, completion_ids, generated)
        else:
            computed = n + max((completion_tokens or 1) - 1, 0)
            hit = self._run_lru(hashes, max_blocks, -(-computed // bs),
                                (lambda: generated) if generated is not None else
                                lambda: self.generated_hashes(ids, hashes, completion_tokens, completion_ids, extra))
        cached = hit * bs
        self.cached_tokens += cached
        return cached

    def _run_unlimited(self, ids: Sequence[int], extra: Hashable, hashes: list[int], max_blocks: int,
                       completion_tokens: int | None, completion_ids: Sequence[int] | None,
                       generated: list[BlockKey] | None) -> int:
        """One request on the unlimited pool: its hit blocks (a sliding-window model's: window_sim.py)."""
        if self.split is not None:
            return self._run_unlimited_split(ids, hashes, max_blocks, completion_tokens, completion_ids, generated, extra)
        hit = self._lookup_unlimited(hashes, max_blocks)
        if generated is not None:      # placeholders are kept: they may be renamed
            self._seen.update(generated)
        elif completion_ids is not None:   # unknown generated blocks can never hit: not stored
            self._seen.update(self.generated_hashes(ids, hashes, completion_tokens, completion_ids, extra))
        return hit

    def _run_unlimited_split(self, ids: Sequence[int], hashes: list[int], max_blocks: int, completion_tokens: int | None,
                             completion_ids: Sequence[int] | None, generated: list[BlockKey] | None, extra: Hashable) -> int:
        seen = self._seen
        n_full = (len(ids) + max((completion_tokens or 1) - 1, 0)) // self.block_size
        if generated is None:
            generated = (self.generated_hashes(ids, hashes, completion_tokens, completion_ids, extra)
                         if completion_ids is not None else [])
        unknown = max(n_full - len(hashes) - len(generated), 0)   # generated, tokens unknown: new content
        hit = self._lookup_unlimited(hashes, max_blocks, update=False)
        if max_blocks > hit:                  # hit..max_blocks: not cached (presence is monotone)
            self._classify_new(hashes[hit:max_blocks], hit)
        for j, h in enumerate(hashes[max(hit, max_blocks):] + generated, max(hit, max_blocks)):
            self._classify(h, j, h in seen)
        self.split[_FIRST] += unknown * self.block_size   # type: ignore[index]
        seen.update(hashes)
        seen.update(generated)
        self._trim_history()
        return hit

    def _lookup_unlimited(self, hashes: list[int], max_blocks: int, update: bool = True) -> int:
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
        if update:
            seen.update(hashes)
        return lo

    def _at(self, h: Hashable, j: int) -> int | None:
        """The run whose live copy of `h` (at chain position j) serves it, or None."""
        r = self._where.get(h)
        if r is not None and self._s[r] <= j < self._e[r]:
            return r
        dups = self._dups.get(h) if self._dups else None
        if dups:
            s, e = self._s, self._e
            for k, r2 in enumerate(dups):
                if s[r2] <= j < e[r2]:
                    # the earlier copy is gone: the next oldest serves from now on
                    self._where[h] = r2
                    del dups[:k + 1]
                    if not dups:
                        del self._dups[h]
                    return r2
        return None

    def _run_lru(self, hashes: list[int], max_blocks: int, blocks_needed: int, generated: Callable[[], list[BlockKey]]) -> int:
        """The finite pool as *runs*: the cached blocks one request freed, in queue order.

        Between two requests vLLM's free queue is: blank blocks (no hash) at the front, then
        each finished request's cached blocks (after its blanks when not ``uncached_first``),
        tail first, oldest request first. A hit takes a head prefix out of a run (a chain's
        earlier blocks are freed after its later ones), an eviction takes blocks off the tail
        end of the oldest run. So a run is its hashes plus live chain positions [start, end),
        and a request costs O(runs it touches). Same hits as ``LiteralPrefixCacheSim``
        (property-tested), vLLM's duplicates included: a block recomputed while a copy is
        cached is a second copy; the earliest inserted copy serves the hash."""
        at, s, e, b, order = self._at, self._s, self._e, self._b, self._order
        hit = self._longest_hit(hashes, max_blocks)
        if blocks_needed > self.cache_blocks - 1:   # type: ignore[operator]
            self.oversized += 1
            return 0
        self._take_hit(hashes, hit)
        self._evict(blocks_needed - hit)
        full: list[BlockKey] = hashes + generated() if blocks_needed > len(hashes) else [*hashes]
        hashed = len(full) if len(full) < blocks_needed else blocks_needed
        rid = len(s)
        chain = full[:hashed]
        self._chain.append(chain)
        s.append(0)
        e.append(0)                           # not live while the copies below are checked
        b.append(0 if self.uncached_first else blocks_needed - hashed)
        order.append(rid)
        sure = max_blocks if max_blocks < hashed else hashed
        if self.split is not None and sure > hit:   # hit..sure: not cached here (presence is monotone)
            self._classify_new(chain[hit:sure], hit)
        self._where.update(dict.fromkeys(chain[:sure], rid))
        fresh = []
        for k in range(sure, hashed):         # recomputed blocks: a copy may still be cached
            h = chain[k]
            if at(h, k) is None:
                fresh.append(h)
            else:
                self._dups.setdefault(h, []).append(rid)
        if self.split is not None:
            split, bs = self.split, self.block_size
            split[_RECOMPUTE] += (hashed - sure - len(fresh)) * bs
            known = [h for h in fresh if type(h) is not tuple]   # placeholders of generated blocks: new
            split[_FIRST] += (len(fresh) - len(known)) * bs
            if len(known) == hashed - sure:
                self._classify_new(known, sure)
            else:                             # positions only matter to a fleet's peers
                for h in known:
                    self._classify_new([h], chain.index(h, sure))
            self._trim_history()
        self._where.update(dict.fromkeys(fresh, rid))
        e[rid] = hashed
        self._blank += blocks_needed - hashed if self.uncached_first else 0
        if len(self._where) > 4 * (self.cache_blocks or 0) + self._compact_slack:
            self._compact()
        return hit

    def _longest_hit(self, hashes: list[int], max_blocks: int) -> int:
        """How many head blocks are cached: presence is monotone along a chain, so a binary search."""
        at = self._at
        lo, hi = 0, max_blocks
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            if at(hashes[mid - 1], mid - 1) is not None:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _take_hit(self, hashes: list[int], hit: int) -> None:
        """Touch the hit: take each run's head share out of it (a hit is always a run's head)."""
        at, s = self._at, self._s
        j = 0
        while j < hit:
            r = at(hashes[j], j)
            assert r is not None              # blocks below `hit` were all found
            lo, hi = j + 1, hit               # run ids never increase along the chain
            if at(hashes[hit - 1], hit - 1) == r:
                lo = hit                      # the usual case: the whole hit is one run's head
            while lo < hi:
                mid = (lo + hi) >> 1
                if at(hashes[mid], mid) == r:
                    lo = mid + 1
                else:
                    hi = mid
            s[r] = lo
            j = lo

    def _evict(self, need: int) -> None:
        """get_new_blocks: blank blocks first, then the oldest run's (blanks and) tail, evicting hashes;
        runs emptied by hits leave the queue."""
        take = need if need < self._blank else self._blank
        self._blank -= take
        need -= take
        order, s, e, b = self._order, self._s, self._e, self._b
        while need:
            r = order[0]
            if b[r]:
                take = need if need < b[r] else b[r]
                b[r], need = b[r] - take, need - take
                continue
            live = e[r] - s[r]
            if live <= need:
                need -= live
                e[r] = s[r]
                order.popleft()
                self._chain[r] = None
            else:
                e[r] -= need
                need = 0
        while order and e[order[0]] <= s[order[0]] and not b[order[0]]:
            self._chain[order.popleft()] = None

    def _compact(self) -> None:
        """Drop map entries of evicted copies (memory stays bounded by the pool); with the
        split on, they are remembered as departed by eviction."""
        s, e = self._s, self._e
        self._dups = {h: live for h, rs in self._dups.items() if (live := [r for r in rs if s[r] < e[r]])}
        where = self._where
        keep: dict[Hashable, int] = {}
        for r in self._order:
            c = self._chain[r]
            if c is None:
                continue
            for j in range(self._s[r], self._e[r]):
                h = c[j]
                if where.get(h) == r:
                    keep[h] = r
        dups = self._dups
        for lost in [d for d in dups if d not in keep]:
            runs = dups[lost]                 # the serving copy is gone: the next oldest serves
            keep[lost] = runs[0]
            if len(runs) > 1:
                dups[lost] = runs[1:]
            else:
                del dups[lost]
        if self.split is not None:
            self._departed.update(dict.fromkeys(where.keys() - keep.keys(), _CAPACITY))
            self._trim_history()
        self._where = keep


__all__ = ["HISTORY_BLOCKS", "NONE_HASH", "SPLIT_REASONS", "BlockHasher", "PrefixCacheSim", "block_hashes", "extra_key"]
