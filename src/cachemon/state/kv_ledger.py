"""The miss ledger: why every block vLLM stored was not cached already (issue 16, items 2-4).

vLLM's KV-cache events (``normalise.kv_events``) say which blocks a replica computed and
cached (``Stored``), which it evicted (``Removed``) and when it dropped everything
(``Cleared``). Cache hits are silent, so every stored block is a block that was *not* found:
the ledger decides why, per block, in the contract's order (docs/kv-events.md):

    recompute_last_block  still cached here (a prompt of whole blocks recomputes its last one)
    restart               cached here by an earlier vLLM process
    reset                 cached here, left at an AllBlocksCleared
    capacity              cached here, left by a BlockRemoved (eviction)
    routing               cached now on another replica of the same model
    first                 none of the above

Identity. vLLM's block hashes are per process (PYTHONHASHSEED, xxhash, older releases), so
everything that crosses a process (restart) or a replica (routing) uses the ledger's *content
id*: a 60-bit hash chained from a fixed root over (parent content id, the block's token ids as
canonical msgpack bytes (``normalise.kv_tokens.block_keys``: the same bytes whether the tokens
came encoded from the decoder or as ints), its extra keys, lora). Python's ``hash`` of bytes and
str is salted per process, the same way for every replica in one process, so content ids agree
across every replica one cachemon process follows; a fleet is never split across processes
(shard by model), and nothing of a content id outlives the process.

Hot path. At >= 500 000 block events/s a block may cost a few dict operations: a cached block
is one dict entry (vLLM hash -> one packed int holding content id, depth, reference count,
an "open tail" bit and the store time), departed content one entry (content id -> how | when),
the fleet index one entry per content cached on a multi-replica model (built only once a
second replica of the model appears). Token ids stay msgpack-encoded from the decoder: a block's
key is a slice of the received bytes found by a compiled regex (``kv_tokens``), hashed as bytes;
making 128 ids a block into Python ints cost more than the whole budget (benchmarks/bench_kv_ledger.py).

Bounds (whatever the stream sends): ``max_blocks`` cached blocks per replica (more: counted in
``overflow_blocks``, the ledger marks itself out of sync), ``history_blocks`` departed contents
(two generations: at least the last half is kept; dropped ones counted), a fixed window of token
hashes for the dynamic-prefix signature, a fixed number of divergence parents followed, and with
``keep_text`` a few example blocks of token ids (never exported, never logged).
"""
from __future__ import annotations

import threading
from bisect import bisect_left
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from cachemon.normalise.kv_events import Cleared, Hash, KvBatch, Removed, Stored
from cachemon.normalise.kv_tokens import block_keys, decode_ids

__all__ = [
    "DEFAULT_HISTORY_BLOCKS",
    "DEFAULT_MAX_BLOCKS",
    "DEPTH_BUCKETS",
    "LIFETIME_BUCKETS",
    "REASONS",
    "DynamicPrefix",
    "FleetLedger",
    "Histogram",
    "LedgerView",
    "ReplicaLedger",
    "ReplicaSnapshot",
]

# Label values of cachemon_kv_stored_tokens_total{reason}; the index is the reason's code.
REASONS = ("first", "capacity", "reset", "restart", "routing", "recompute_last_block")
R_FIRST, R_CAPACITY, R_RESET, R_RESTART, R_ROUTING, R_RECOMPUTE = range(6)

# A vLLM pool holds at most num_gpu_blocks blocks; 1 Mi covers the largest GPUs at block_size 16.
DEFAULT_MAX_BLOCKS = 1 << 20
# Departed contents kept per replica (two generations: between half of it and all of it). A fleet
# of 64 replicas x 50 000 cached blocks with every history full stays under the 1 GB target
# (benchmarks/bench_kv_ledger.py measures the worst case: distinct content on every replica).
DEFAULT_HISTORY_BLOCKS = 32_768

# Histogram buckets (upper bounds). Lifetimes span a busy pool's seconds to an idle one's day.
LIFETIME_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0)
# Depth 0 (nothing of the prompt was cached) gets its own bucket; then powers of two.
DEPTH_BUCKETS = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0)

# Dynamic-prefix signature: votes (a divergence whose first block is new and whose later blocks
# repeat token content seen under another parent) needed within DP_WINDOW_S at one (parent,
# depth); the finding holds until no vote came for DP_HOLD_S (no flapping).
DP_MIN_VOTES = 3
DP_CONFIRM = 3                # later votes at the same point before a vote counts (see _DivergencePoint)
DP_MAX_CHILDREN = 32          # children followed per point
DP_VOTE_BLOCKS = 8192         # blocks of voting stores remembered, to see their reuse (two generations)
DP_WINDOW_S = 600.0
DP_HOLD_S = 300.0
DP_TOKEN_WINDOW = 16384       # token-content hashes remembered per replica (two generations)
DP_MAX_PARENTS = 512          # divergence parents followed per replica
TEXT_SAMPLES = 4              # keep_text: example blocks kept at the divergence depth
TEXT_MAX_TOKENS = 1024        # ... and at most this many token ids of each

# The packed record of a cached block (one int per vLLM hash):
#   bits 0-59 content id | 60-73 depth | 74-81 reference count | 82 open tail | 83+ store time (ms)
# 60-bit content ids are 2-digit Python ints (32 bytes, not 40) and the record fits 4 digits
# (120 bits: 40 bytes) for 4 years of milliseconds: 8 bytes saved three times per block.
_MCID = (1 << 60) - 1         # the content-id mask
_DEPTH1 = 1 << 60
_DEPTH_MAX = 0x3FFF           # 16 383 blocks (262 144 tokens at block_size 16); deeper is clamped
_REF1 = 1 << 74
_REF_MASK = 0xFF              # copies of one content (saturating; vLLM keeps a handful at most)
_REF_BITS = _REF_MASK << 74
_OPEN = 1 << 82
_TSHIFT = 83
# The packed departure record: how (reason code, 2 bits used) | time (ms) << 3.
_HSHIFT = 3

_PRIMARY = frozenset((None, "GPU"))   # the medium vLLM's own block pool reports (also on CPU builds)
_ROOT = hash(("cachemon-kv-root", None)) & _MCID     # the chain's root (no lora)
_ORPHAN = "cachemon-kv-orphan"                        # marker for a parent the ledger does not know


def _hashable(x: object) -> object:
    """vLLM's extra keys arrive as msgpack arrays (lists): make them hashable, recursively."""
    if isinstance(x, list | tuple):
        return tuple(_hashable(v) for v in x)
    if isinstance(x, dict):
        return tuple(sorted((str(k), _hashable(v)) for k, v in x.items()))
    return x


class Histogram:
    """A cumulative Prometheus histogram kept as plain per-bucket counts (rendered in expose)."""
    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)     # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        self.counts[bisect_left(self.bounds, v)] += 1
        self.sum += v
        self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, cumulative count) per bucket, +Inf last."""
        out, acc = [], 0
        for b, c in zip(self.bounds + (float("inf"),), self.counts, strict=True):
            acc += c
            out.append((b, acc))
        return out

    def copy(self) -> Histogram:
        h = Histogram(self.bounds)
        h.counts, h.sum, h.count = list(self.counts), self.sum, self.count
        return h


@dataclass(frozen=True)
class DynamicPrefix:
    depth_blocks: int                        # where the per-request value sits (blocks from the prompt's start)
    since: float                             # first seen (unix time)
    recomputed_tokens: float                 # cumulative tokens recomputed below a per-request value (a part of `first`)


@dataclass(frozen=True)
class LedgerView:
    model: str
    in_sync: bool
    stored_tokens: dict[str, float]          # reason -> cumulative tokens (the counter's values)
    cached_blocks: int
    dynamic_prefix: DynamicPrefix | None     # the signature, while it holds


@dataclass(frozen=True)
class ReplicaSnapshot:
    """Everything the collector exports for one replica, copied under the lock."""
    replica: str
    model: str
    in_sync: bool
    stored_tokens: dict[str, float]
    cached_blocks: int
    history_evicted: int
    lifetime: Histogram
    depth: Histogram
    reused_tokens: float = 0.0               # hit tokens of full-report requests (reuse reports)


class _DivergencePoint:
    """Candidate per-request values at one (parent content, depth).

    Each vote is a new child of the parent with recomputed shared content below it. A
    per-request value makes a new child per request and none is ever used again; a per-tenant
    value (a handful of tenants, each with its own head) looks the same on the tenants' first
    requests, but their subtrees are reused by the next request of the tenant. So a vote counts
    only once ``DP_CONFIRM`` later votes came at the same point and its child was not reused
    meanwhile, and the finding needs ``DP_MIN_VOTES`` such votes with few reuses."""
    __slots__ = ("children", "depth", "last_vote", "reused")

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.children: dict[int, list[float]] = {}   # child content id -> [vote time, later votes, reused 0/1]
        self.reused = 0                              # children (kept) whose subtree a later request reused
        self.last_vote = 0.0

    def confirmed(self, since: float) -> int:
        return sum(1 for t, later, reused in self.children.values()
                   if later >= DP_CONFIRM and not reused and t >= since)

    def plausible(self) -> bool:
        """Few of its children were ever reused: per-request, not per-tenant."""
        return self.reused * 4 <= len(self.children)


class ReplicaLedger:
    """One upstream's ledger. Not locked itself: ``FleetLedger`` serialises access."""

    def __init__(self, replica: str, model: str, *, max_blocks: int = DEFAULT_MAX_BLOCKS,
                 history_blocks: int = DEFAULT_HISTORY_BLOCKS, keep_text: bool = False) -> None:
        if max_blocks < 1 or history_blocks < 2:
            raise ValueError("kv_events.max_blocks must be >= 1 and kv_events.history_blocks >= 2")
        self.replica = replica
        self.model = model
        self.max_blocks = max_blocks
        self.history_blocks = history_blocks
        self.keep_text = keep_text
        self._cached: dict[Hash, int] = {}            # vLLM hash -> packed record (see _MCID ...)
        self._hist: dict[int, int] = {}                # content id -> how | when (current generation)
        self._hist_old: dict[int, int] = {}            # the previous generation
        self._tok_new: dict[int, int] = {}             # token-content hash -> content id (dynamic prefix window)
        self._tok_old: dict[int, int] = {}
        self._points: dict[tuple[int, int], _DivergencePoint] = {}
        self._vote_new: dict[Hash, tuple[tuple[int, int], int]] = {}   # vLLM hash -> (point, child) of voting stores
        self._vote_old: dict[Hash, tuple[tuple[int, int], int]] = {}
        self.fleet: dict[int, int] | None = None       # content id -> replicas caching it (shared per model)
        self.tokens = [0] * len(REASONS)               # cumulative stored tokens per reason code
        self.lifetime = Histogram(LIFETIME_BUCKETS)
        self.depth = Histogram(DEPTH_BUCKETS)
        self.in_sync = True
        self.history_evicted = 0
        self.overflow_blocks = 0                       # stored blocks not tracked: over max_blocks
        self.orphans = 0                               # Stored events whose parent the ledger did not know
        self.unknown_removed = 0                       # BlockRemoved of a hash the ledger did not hold
        self.malformed = 0                             # Stored events whose token ids do not fit (count, not ints)
        self.other_tier = 0                            # events of another medium / KV-cache group (not ledgered)
        self.dynamic_prefix_tokens = 0                 # cumulative tokens recomputed below a per-request value
        self.reused_tokens = 0                         # hit tokens reported by full-report requests
        self.reuse_reports = 0                         # reports received (one per full-report request that hit)
        self.full_reports = False                      # an unambiguous reuse report was seen on this replica
        self.finding: DynamicPrefix | None = None
        self._finding_key: tuple[int, int] | None = None
        self.samples: deque[tuple[int, ...]] = deque(maxlen=TEXT_SAMPLES)
        self.last_at = 0.0
        self._seen_batch = False
        self._t0 = 0.0                                 # epoch of the packed store times

    # --- events ----------------------------------------------------------------------------
    def apply(self, batch: KvBatch, at: float) -> None:
        if not self._seen_batch:
            self._seen_batch = True
            if batch.seq > 0:
                # Joined a running publisher mid-stream: what it cached before is unknown.
                self.in_sync = False
        ts = batch.ts or at
        if self._t0 == 0.0:
            self._t0 = ts - 1.0
        if at > self.last_at:
            self.last_at = at
        pending: list[Hash] = []     # consecutive BlockRemoved (one hash each on 0.32.0): handled in one call
        for ev in batch.events:
            tp = type(ev)
            if tp is Removed:
                if ev.group or ev.medium not in _PRIMARY:    # type: ignore[union-attr]
                    self.other_tier += 1
                else:
                    pending.extend(ev.hashes)                # type: ignore[union-attr]
                continue
            if pending:
                self._removed(pending, ts)
                pending = []
            if tp is Stored:
                if ev.group or ev.medium not in _PRIMARY:    # type: ignore[union-attr]
                    self.other_tier += 1
                else:
                    self._stored(ev, ts, at)                 # type: ignore[arg-type]
            elif tp is Cleared:
                if ev.medium not in _PRIMARY:                # another tier was cleared, not the pool
                    self.other_tier += 1
                else:
                    self._depart_all(R_RESET, ts)
                    self.in_sync = True
        if pending:
            self._removed(pending, ts)
        self._expire(at)

    def restart(self, at: float) -> None:
        """A new vLLM process: everything cached left with the old one; its cache is empty (in sync)."""
        self._depart_all(R_RESTART, at)
        self.in_sync = True
        self._seen_batch = True       # the new process's stream starts at seq 0

    def lost(self) -> None:
        self.in_sync = False

    def _stored(self, ev: Stored, ts: float, at: float) -> None:
        if ev.parent is None and self._reuse_report(ev):
            return
        keys = self._store_keys(ev)
        if keys is None:
            return
        hashes = ev.hashes
        n = len(hashes)
        bs = ev.block_size
        pc, depth, divergence = self._chain_start(ev.parent, ev.lora, n)
        if depth + n > _DEPTH_MAX:
            depth = max(_DEPTH_MAX - n, 0)     # absurd depths: clamped, never overflowing the field
        cnt, rep, first_new = self._store_blocks(ev, keys, pc, depth, divergence, ts)
        tokens = self.tokens
        for r in range(6):
            if cnt[r]:
                tokens[r] += cnt[r] * bs
        if divergence:
            self.depth.observe(depth)
            if len(self._tok_new) >= DP_TOKEN_WINDOW // 2:
                self._tok_old = self._tok_new
                self._tok_new = {}
            if first_new and rep:
                self._vote(pc, depth, rep * bs, hashes, keys[0], bs, at)

    def _reuse_report(self, ev: Stored) -> bool:
        """Whether a chain-head store is vLLM's report of blocks a request *reused* (a request with
        ``kv_cache_report_mode="full"``: ``BlockPool.emit_cached_block_events``), not a store.

        On the wire the two are shaped alike: a report is a BlockStored of the request's hit blocks
        0..k-1, parent null, sent at the lookup. What tells them apart is that a report names only
        blocks that are cached at that moment, while a real chain-head store computes blocks that
        the lookup did not find: new ones. The exceptions are twins, a copy computed while the hash
        is cached: a prompt of exactly one block sent again (the lookup may hit at most
        prompt - 1 tokens), or a request that skips the lookup (prompt logprobs). A twin of a longer
        prompt's last block has a parent, so only a single block is ambiguous: it is read as a report
        once this replica has sent an unambiguous one (two or more blocks, all cached), else as a
        twin (docs/kv-events.md, "Full report mode")."""
        cached = self._cached
        hashes = ev.hashes
        for h in hashes:
            if h not in cached:
                return False
        if len(hashes) > 1:
            self.full_reports = True
        elif not self.full_reports:
            return False
        self.reused_tokens += len(hashes) * ev.block_size
        self.reuse_reports += 1
        return True

    def _store_keys(self, ev: Stored) -> list[bytes] | None:
        """The store's per-block token keys, or None when it is empty or malformed (counted)."""
        n = len(ev.hashes)
        bs = ev.block_size
        if n == 0:
            return None
        if bs <= 0 or len(ev.tokens) != n * bs:
            self.malformed += 1
            return None
        keys = block_keys(ev.tokens, n, bs)
        if keys is None:
            # token ids that are not integers (the decoder leaves them encoded, so this is where they
            # are read): the store is lost, and what this replica caches is no longer known
            self.malformed += 1
            self.in_sync = False
        return keys

    def _chain_start(self, parent: Hash | None, lora: str | None, n: int) -> tuple[int, int, bool]:
        """(content id of the chain above the store, depth of its first block, whether the store
        is a divergence observation)."""
        if parent is None:
            return (_ROOT if lora is None else hash(("cachemon-kv-root", lora)) & _MCID), 0, True
        cached = self._cached
        prec = cached.get(parent)
        if prec is None:
            self.orphans += 1
            # its depth is unknown: no divergence observation
            return hash((_ORPHAN, lora, parent)) & _MCID, 0, False
        divergence = True
        if prec & _OPEN:
            # The parent is the last block of an earlier store with no child yet.
            cached[parent] = prec & ~_OPEN
            if n == 1:
                # One block below an open tail: a decode step of the same request filling its
                # next block (generated tokens), not a new prompt diverging from the cache. A
                # new turn extending the tail stores the reply's rest and the new message:
                # mostly more than one block, so it is seen (multi-turn chats).
                divergence = False
        elif self._vote_new or self._vote_old:
            self._reused(parent)
        return prec & _MCID, ((prec >> 60) & _DEPTH_MAX) + 1, divergence

    def _store_blocks(self, ev: Stored, keys: list[bytes], pc: int, depth: int, divergence: bool,
                      ts: float) -> tuple[list[int], int, bool]:
        """Each block of the store into the ledger, below content id ``pc`` at ``depth``. Returns
        (blocks by reason, blocks whose token content was seen under another parent, whether the
        first block is new content never seen before)."""
        hashes = ev.hashes
        cached = self._cached
        extra = ev.extra
        if extra is not None and extra.count(None) == len(extra):     # C speed: 0.32.0 sends [None] per block
            extra = None
        hist, hold = self._hist, self._hist_old
        fleet = self.fleet
        tokw_new, tokw_old = self._tok_new, self._tok_old
        tms = int((ts - self._t0) * 1000.0)
        rec_base = ((tms if tms > 0 else 0) << _TSHIFT) | _REF1 | (depth << 60)
        room = self.max_blocks - len(cached)
        cnt = [0, 0, 0, 0, 0, 0]
        rep = 0              # blocks of this store whose token content was seen under another parent
        first_new = False
        last_tracked: Hash | None = None
        mcid, depth1, ref1, ref_bits = _MCID, _DEPTH1, _REF1, _REF_BITS      # locals: this loop is the hot path
        for k in range(len(hashes)):
            h = hashes[k]
            th = hash(keys[k])
            if extra is None:
                cid = hash((pc, th)) & mcid
            else:
                cid = hash((pc, th, _hashable(extra[k]) if k < len(extra) else None)) & mcid
            rec = cached.get(h)
            if rec is not None:
                # Still cached: recomputed although present (whole-block prompt). Count a reference.
                cnt[5] += 1                                   # R_RECOMPUTE
                if rec & ref_bits != ref_bits:
                    cached[h] = rec + ref1
                last_tracked = h
                pc = rec & mcid
                rec_base += depth1
                continue
            how = hist.pop(cid, None) if hist else None
            if how is None and hold:
                how = hold.pop(cid, None)
            if how is not None:
                r = how & 3
            elif fleet is not None and cid in fleet:
                r = 4                                         # R_ROUTING
            else:
                r = 0                                         # R_FIRST
            cnt[r] += 1
            if divergence:
                # token content seen before under another chain? (first seen kept: one dict op)
                seen = tokw_new.setdefault(th, cid)
                if seen is cid and tokw_old:
                    seen = tokw_old.get(th, cid)
                if k == 0:
                    first_new = r == 0 and seen == cid
                elif r == 0 and seen != cid:
                    rep += 1
            if room > 0:
                cached[h] = rec_base | cid
                room -= 1
                last_tracked = h
                if fleet is not None:
                    fleet[cid] = fleet.get(cid, 0) + 1
            else:
                self.overflow_blocks += 1
                self.in_sync = False
            pc = cid
            rec_base += depth1
        if last_tracked is not None:
            cached[last_tracked] |= _OPEN
        return cnt, rep, first_new

    def _removed(self, hashes: Iterable[Hash], ts: float) -> None:
        cached = self._cached
        now = ts - self._t0
        how = R_CAPACITY | ((int(now * 1000.0) if now > 0 else 0) << _HSHIFT)
        life = self.lifetime
        bounds, counts = life.bounds, life.counts
        fleet = self.fleet
        hist = self._hist
        half = self.history_blocks // 2
        pop = cached.pop
        ref_bits, ref1, mcid, tshift = _REF_BITS, _REF1, _MCID, _TSHIFT     # locals: a hot loop
        total, observed, unknown = 0.0, 0, 0
        for h in hashes:
            rec = pop(h, None)
            if rec is None:
                unknown += 1
                continue
            if rec & ref_bits != ref1:
                cached[h] = rec - ref1             # another copy of the content is still cached
                continue
            cid = rec & mcid
            v = now - (rec >> tshift) / 1000.0
            if v < 0.0:
                v = 0.0
            counts[bisect_left(bounds, v)] += 1
            total += v
            observed += 1
            hist[cid] = how
            if len(hist) >= half:
                self._rotate()
                hist = self._hist
            if fleet is not None:
                c = fleet.get(cid, 0) - 1
                if c > 0:
                    fleet[cid] = c
                else:
                    fleet.pop(cid, None)
        life.sum += total
        life.count += observed
        if unknown:
            self.unknown_removed += unknown

    def _rotate(self) -> None:
        self.history_evicted += len(self._hist_old)
        self._hist_old = self._hist
        self._hist = {}

    def _remember(self, cid: int, how: int) -> None:
        self._hist[cid] = how
        if len(self._hist) >= self.history_blocks // 2:
            self._rotate()

    def _depart_all(self, how: int, at: float) -> None:
        """Cleared or restart: every cached content left, the same way."""
        packed = how | (max(int((at - self._t0) * 1000.0), 0) << _HSHIFT)
        fleet = self.fleet
        for rec in self._cached.values():
            cid = rec & _MCID
            self._remember(cid, packed)
            if fleet is not None:
                c = fleet.get(cid, 0) - 1
                if c > 0:
                    fleet[cid] = c
                else:
                    fleet.pop(cid, None)
        self._cached.clear()

    # --- the dynamic-prefix signature -------------------------------------------------------
    def _vote(self, parent: int, depth: int, rep_tokens: int, hashes: tuple[Hash, ...],
              sample: bytes, bs: int, at: float) -> None:
        """A vote for a per-request value below ``parent`` at ``depth``: a divergence whose first
        block is new content (a new child of the parent) and whose later blocks of the same store
        repeat token content already seen under another parent (shared content, recomputed because
        of what precedes it). Unique questions below a shared system prompt repeat nothing below
        their first block: they never vote."""
        key = (parent, depth)
        pt = self._points.get(key)
        if pt is None:
            if len(self._points) >= DP_MAX_PARENTS:
                self._points.pop(next(iter(self._points)))
            pt = self._points[key] = _DivergencePoint(depth)
        for c in pt.children.values():
            c[1] += 1
        child = hash((key, hashes[0]))
        if len(pt.children) >= DP_MAX_CHILDREN:
            old = pt.children.pop(next(iter(pt.children)))
            pt.reused -= int(old[2])
        pt.children[child] = [at, 0, 0]
        pt.last_vote = at
        vb = self._vote_new
        for h in hashes[:-1]:          # the last block is the open tail: continuations hang there
            vb[h] = (key, child)
        if len(vb) >= DP_VOTE_BLOCKS // 2:
            self._vote_old = vb
            self._vote_new = {}
        self.dynamic_prefix_tokens += rep_tokens
        if self.keep_text:
            # decoded here, bounded (only with keep_text, only at a vote): the key may be a huge block
            self.samples.append(decode_ids(sample, bs, TEXT_MAX_TOKENS))
        if self.finding is None and pt.plausible() and pt.confirmed(at - DP_WINDOW_S) >= DP_MIN_VOTES:
            self.finding = DynamicPrefix(depth, at, float(self.dynamic_prefix_tokens))
            self._finding_key = key

    def _reused(self, parent: Hash) -> None:
        """A new prompt diverged below a block of a voting store: that child was not per-request."""
        hit = self._vote_new.get(parent) or self._vote_old.get(parent)
        if hit is None:
            return
        key, child = hit
        pt = self._points.get(key)
        if pt is None:
            return
        c = pt.children.get(child)
        if c is not None and not c[2]:
            c[2] = 1
            pt.reused += 1
            if self._finding_key == key and not pt.plausible():
                self.finding = None
                self._finding_key = None

    def _expire(self, now: float) -> None:
        if self.finding is None or self._finding_key is None:
            return
        pt = self._points.get(self._finding_key)
        if pt is None or now - pt.last_vote > DP_HOLD_S:
            self.finding = None
            self._finding_key = None

    # --- reading ---------------------------------------------------------------------------
    def stored_tokens(self) -> dict[str, float]:
        return {r: float(t) for r, t in zip(REASONS, self.tokens, strict=True)}

    def view(self, now: float | None = None) -> LedgerView:
        self._expire(self.last_at if now is None else now)
        fp = self.finding
        if fp is not None:
            fp = DynamicPrefix(fp.depth_blocks, fp.since, float(self.dynamic_prefix_tokens))
        return LedgerView(self.model, self.in_sync, self.stored_tokens(), len(self._cached), fp)

    def snapshot(self) -> ReplicaSnapshot:
        return ReplicaSnapshot(self.replica, self.model, self.in_sync, self.stored_tokens(), len(self._cached),
                               self.history_evicted, self.lifetime.copy(), self.depth.copy(),
                               float(self.reused_tokens))

    def cached_contents(self) -> Iterator[int]:
        for rec in self._cached.values():
            yield rec & _MCID

    def history_size(self) -> int:
        return len(self._hist) + len(self._hist_old)


class FleetLedger:
    """Every followed replica's ledger, grouped by model (the ``routing`` reason needs the model's
    whole fleet). The KvSink of runtime/kv_stage.py: ``on_batch`` comes from the source threads,
    ``view`` / ``snapshot`` from the scrape and attribution threads; one lock, held per batch."""

    def __init__(self, *, max_blocks: int = DEFAULT_MAX_BLOCKS, history_blocks: int = DEFAULT_HISTORY_BLOCKS,
                 keep_text: bool = False) -> None:
        self.lock = threading.Lock()
        self._opts = {"max_blocks": max_blocks, "history_blocks": history_blocks, "keep_text": keep_text}
        self._replicas: dict[str, ReplicaLedger] = {}
        self._models: dict[str, list[ReplicaLedger]] = {}
        self._fleet: dict[str, dict[int, int]] = {}

    def _ledger(self, replica: str, model: str) -> ReplicaLedger:
        led = self._replicas.get(replica)
        if led is None:
            led = self._replicas[replica] = ReplicaLedger(replica, model, **self._opts)  # type: ignore[arg-type]
            self._join(led)
        elif led.model != model and model:
            self._leave(led)
            led.model = model
            self._join(led)
        return led

    def _join(self, led: ReplicaLedger) -> None:
        group = self._models.setdefault(led.model, [])
        group.append(led)
        if len(group) == 2:
            # A second replica: from now on the model needs the index of what each one caches.
            fleet: dict[int, int] = {}
            for other in group:
                for cid in other.cached_contents():
                    fleet[cid] = fleet.get(cid, 0) + 1
                other.fleet = fleet
            self._fleet[led.model] = fleet
        elif len(group) > 2:
            fleet = self._fleet[led.model]
            for cid in led.cached_contents():
                fleet[cid] = fleet.get(cid, 0) + 1
            led.fleet = fleet

    def _leave(self, led: ReplicaLedger) -> None:
        group = self._models[led.model]
        group.remove(led)
        fleet = led.fleet
        led.fleet = None
        if fleet is not None:
            for cid in led.cached_contents():
                c = fleet.get(cid, 0) - 1
                if c > 0:
                    fleet[cid] = c
                else:
                    fleet.pop(cid, None)
        if len(group) < 2:
            for other in group:
                other.fleet = None
            self._fleet.pop(led.model, None)
        if not group:
            del self._models[led.model]

    # --- KvSink ----------------------------------------------------------------------------
    def on_batch(self, replica: str, model: str, batch: KvBatch, at: float) -> None:
        with self.lock:
            self._ledger(replica, model).apply(batch, at)

    def on_restart(self, replica: str, at: float) -> None:
        with self.lock:
            led = self._replicas.get(replica)
            if led is not None:
                led.restart(at)

    def on_lost(self, replica: str, _batches: int, _at: float, /) -> None:
        """How many batches and when do not matter here: the replica's ledger is out of sync until
        its next restart (kv_stage.KvSink)."""
        with self.lock:
            led = self._replicas.get(replica)
            if led is not None:
                led.lost()

    # --- reading ---------------------------------------------------------------------------
    def view(self, replica: str, now: float | None = None) -> LedgerView | None:
        with self.lock:
            led = self._replicas.get(replica)
            return None if led is None else led.view(now)

    def snapshot(self) -> list[ReplicaSnapshot]:
        with self.lock:
            return [led.snapshot() for led in self._replicas.values()]

    def text_samples(self, replica: str) -> list[tuple[int, ...]]:
        """keep_text only: token ids of example blocks where requests diverge (for ``check --show-text``)."""
        with self.lock:
            led = self._replicas.get(replica)
            return [] if led is None else list(led.samples)

    def replica(self, replica: str) -> ReplicaLedger | None:
        """The replica's ledger itself (tests, benchmarks; callers hold ``lock``)."""
        return self._replicas.get(replica)
