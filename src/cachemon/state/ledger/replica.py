"""One replica's miss ledger: why every block vLLM stored was not cached already.

vLLM's KV-cache events (``normalise.kv_events``) say which blocks a replica computed and cached
(``Stored``), which it evicted (``Removed``) and when it dropped everything (``Cleared``). Cache hits
are silent (except full-report requests' reuse reports), so every stored block is a block that was
*not* found: the ledger decides why, per block, in the order of ``kv_reasons.Reason``.

Identity. vLLM's block hashes are per process (PYTHONHASHSEED, xxhash, older releases), so
everything that crosses a process (restart) or a replica (routing) uses the ledger's *content id*: a
60-bit hash chained from a fixed root over (parent content id, the block's token ids as canonical
msgpack bytes (``normalise.kv_tokens.block_keys``), its extra keys, lora). Python's ``hash`` of bytes
and str is salted per process, the same way for every replica in one process, so content ids agree
across every replica one cachemon process follows; a fleet is never split across processes.
Isolation compares a second id, the *token content id*: the same chain without the salt and the
LoRA name (multimodal keys stay: they are content), kept only for blocks of salted or adapter chains.

Hot path. A cached block is one dict entry (vLLM hash -> one packed int, state/ledger/records.py);
departed content one entry (content id -> reason | time); the model's routing index one entry per distinct
content cached on a multi-replica model, its isolation index at most one per cached block (the fleet
indexes, state/ledger/index.py; made and shared by state/ledger/fleet.py).
Bounds: ``max_blocks`` cached blocks (more: counted, out of sync), ``history_blocks`` departed
contents (two generations), the dynamic-prefix detector's windows.
"""
from __future__ import annotations

from bisect import bisect_left
from collections.abc import Collection, Iterable
from typing import NamedTuple

from cachemon.normalise.kv_batch import POOL_MEDIA, Cleared, Hash, KvBatch, Removed, Stored
from cachemon.normalise.kv_tokens import block_keys
from cachemon.state.ledger import extras as X
from cachemon.state.ledger import records as K
from cachemon.state.ledger import reuse as kv_reuse
from cachemon.state.ledger.dynamic import DynamicPrefixDetector
from cachemon.state.ledger.groups import SideGroups
from cachemon.state.ledger.histogram import Histogram
from cachemon.state.ledger.index import FleetIndex, hold_all, release_all
from cachemon.state.ledger.reasons import DEFAULT_HISTORY_BLOCKS, REASONS, Reason
from cachemon.state.ledger.tenants import TenantBook, TenantCounts, salt_of
from cachemon.state.ledger.tiers import Tiers

# A vLLM pool holds at most num_gpu_blocks blocks; 1 Mi covers the largest GPUs at block_size 16.
DEFAULT_MAX_BLOCKS = 1 << 20
# Histogram buckets (upper bounds). Lifetimes span a busy pool's seconds to an idle one's day.
LIFETIME_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0)
# Depth 0 (nothing of the prompt was cached) gets its own bucket; then powers of two.
DEPTH_BUCKETS = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0)

_ROOT = hash(("cachemon-kv-root", None)) & K.CID_MASK     # the chain's root (no lora)
_ORPHAN = "cachemon-kv-orphan"                            # marker for a parent the ledger does not know
# Anomalies counted per replica (cachemon_kv_ledger_anomalies_total{kind}).
ANOMALIES = ("overflow_blocks", "orphan_stores", "unknown_removed", "malformed_stores", "other_groups",
             "ambiguous_reports", "index_misses", "sanitised_labels", "forged_reports")


_ROUTING, _ISOLATION = int(Reason.ROUTING), int(Reason.ISOLATION)


class ChainStart(NamedTuple):
    """Where a store's blocks go: below the chain of content id ``pc`` (token content id ``pu``), tenant
    code ``tcode``, its first block at ``depth``; ``divergence``: the store's first block is where a
    prompt diverged from the cache (a divergence observation: depth, dynamic prefix)."""
    pc: int
    pu: int
    tcode: int
    depth: int
    divergence: bool


class ReplicaLedger:
    """One upstream's ledger. Not locked itself: ``FleetLedger`` serialises access."""

    def __init__(self, replica: str, model: str, *, max_blocks: int = DEFAULT_MAX_BLOCKS,
                 history_blocks: int = DEFAULT_HISTORY_BLOCKS, keep_text: bool = False,
                 tenants: TenantBook | None = None, full_reports: bool | None = None,
                 isolation: bool = False) -> None:
        if max_blocks < 1 or history_blocks < 2:
            raise ValueError("kv_events.max_blocks must be >= 1 and kv_events.history_blocks >= 2")
        self.replica = replica
        self.model = model
        self.max_blocks = max_blocks
        self.history_blocks = history_blocks
        self._cached: dict[Hash, int] = {}            # vLLM hash -> packed record (kv_records)
        self._hist: dict[int, int] = {}                # content id -> departure record (current generation)
        self._hist_old: dict[int, int] = {}            # the previous generation
        self.dyn = DynamicPrefixDetector(keep_text)
        # the model's fleet indexes (state/ledger/index.py), shared by its replicas and set by the fleet:
        self.routing: FleetIndex | None = None         # content ids, once per replica caching (2+ replicas)
        self.isolation_index: FleetIndex | None = None   # token content ids, once per copy (2+ keys)
        self.tenants = TenantCounts(tenants) if tenants is not None else None
        # salted and adapter chains keep their token content id apart from their content id (the isolation
        # reason): needs the tenants' book, and kv_events.isolation on
        self.isolation = isolation and tenants is not None
        self.tokens = [0] * len(REASONS)               # cumulative stored tokens per reason code
        self.lifetime = Histogram(LIFETIME_BUCKETS)
        self.depth = Histogram(DEPTH_BUCKETS)
        self.in_sync = True
        self.history_evicted = 0
        self.anomalies = dict.fromkeys(ANOMALIES, 0)
        self.reused_tokens = 0                         # hit tokens reported by full-report requests
        self.reuse_reports = 0                         # reports received (one per full-report request that hit)
        # reuse reports are read (kv_events.full_reports: True declared, None auto: once one is certain)
        self.full_reports = bool(full_reports)
        self.reports_declared = full_reports           # the setting: True, False (never read one), None (auto)
        self.opt_outs = 0                              # stores of requests that skipped (part of) the lookup
        self.group: int | None = None                  # the KV-cache group followed (_followed)
        self.tiers = Tiers(max_blocks)                 # other media (CPU offload, ...), kept apart
        self.side = SideGroups(max_blocks)             # a hybrid model's other groups (its reuse reports)
        self.last_at = 0.0
        self._seen_batch = False
        self._t0 = 0.0                                 # epoch of the packed store times

    # --- events ----------------------------------------------------------------------------
    def apply(self, batch: KvBatch, at: float) -> None:
        ts = self._begin(batch, at)
        pending: list[Hash] = []     # consecutive BlockRemoved (one hash each on 0.32.0): handled in one call
        events = batch.events
        group = self.group
        for i, ev in enumerate(events):
            if type(ev) is Removed:       # `type() is`, not isinstance: the hot loop (mypy narrows both)
                if ev.medium in POOL_MEDIA and ev.group == group:      # the pool's: most events
                    pending.extend(ev.hashes)
                else:
                    self._removed_elsewhere(ev, pending)
                continue
            if pending:
                self._removed(pending, ts)
                pending = []
            if type(ev) is Stored:
                nxt = events[i + 1] if i + 1 < len(events) else None
                if ev.medium in POOL_MEDIA and ev.group == group:
                    self._stored(ev, ts, at, nxt)
                else:
                    self._stored_elsewhere(ev, ts, at, nxt)
                group = self.group                                    # the first store pins the group
            elif type(ev) is Cleared:
                self._cleared(ev, ts)
        if pending:
            self._removed(pending, ts)
        self.dyn.expire(at)

    def _begin(self, batch: KvBatch, at: float) -> float:
        """A batch's bookkeeping before its events; returns its time (the batch's, else arrival)."""
        if not self._seen_batch:
            self._seen_batch = True
            if batch.seq > 0:
                # Joined a running publisher mid-stream: what it cached before is unknown.
                self.in_sync = False
        ts = batch.ts or at
        if batch.sanitised:                            # media and LoRA names made printable (wire_label.py)
            self.anomalies["sanitised_labels"] += batch.sanitised
        if self._t0 == 0.0:
            self._t0 = ts - 1.0
        if at > self.last_at:
            self.last_at = at
        if self.tiers.pending:
            self.tiers.settle(at)
        return ts

    def _removed_elsewhere(self, ev: Removed, pending: list[Hash]) -> None:
        """A removal from another tier, another group of a hybrid model, or the pool before its group is known."""
        if ev.medium not in POOL_MEDIA:
            self.tiers.on_removed(ev)
        elif ev.group != self.group and not self._followed(ev.group, None, False):
            self.anomalies["other_groups"] += 1
            self.side.removed(ev.group, ev.hashes)
        else:
            pending.extend(ev.hashes)

    def _stored_elsewhere(self, ev: Stored, ts: float, at: float, nxt: object) -> None:
        """A store in another tier (its loads may disprove earlier hits), another group of a hybrid model,
        or the pool's first store (which pins the group followed)."""
        if ev.medium not in POOL_MEDIA:
            back = self.tiers.on_stored(ev)
            if back:                                 # loads it disproves: computed after all
                self._computed_after_all(back)
        elif ev.group != self.group and not self._followed(ev.group, ev.kind):
            self.anomalies["other_groups"] += 1
            self.side.stored(ev)
        else:
            self._stored(ev, ts, at, nxt)

    def _cleared(self, ev: Cleared, ts: float) -> None:
        if ev.medium not in POOL_MEDIA:                 # another tier was cleared, not the pool
            self.tiers.cleared(ev.medium)
        else:
            self._depart_all(Reason.RESET, ts)
            self.side.cleared()
            self.in_sync = True

    def _followed(self, group: int, kind: str | None, pin: bool = True) -> bool:
        """Whether the ledger follows this KV-cache group: the first full-attention group a store names
        (older releases name no kind: group 0). A hybrid model's sliding-window or mamba group stores
        only the blocks it keeps (vLLM 0.32.0; the real hybrid_swa capture: group 0 is its sliding-window
        group, group 1 full attention), and a second group would count the same tokens twice."""
        if self.group is None:
            if kind is None and group == 0 or kind == "full_attention":
                if pin:                      # a store names its kind; a removal does not
                    self.group = group
                return True
            return False
        return group == self.group

    def restart(self, at: float) -> None:
        """A new vLLM process: everything cached left with the old one; its cache is empty (in sync)."""
        self._depart_all(Reason.RESTART, at)
        self.group = None             # the new process may serve another model
        self.tiers.cleared(None)
        self.side.restarted()
        self.in_sync = True
        self._seen_batch = True       # the new process's stream starts at seq 0

    def lost(self) -> None:
        self.in_sync = False

    # --- GPU pool stores ------------------------------------------------------------------------
    def _stored(self, ev: Stored, ts: float, at: float, nxt: object = None) -> None:
        opt_out = False
        if ev.parent is None and ev.hashes:
            verdict = self._chain_head(ev, nxt)
            if verdict == "report":
                return
            opt_out = verdict == "opt_out"
        elif len(ev.hashes) > 1 and ev.hashes[0] in self._cached and self.anomalies["other_groups"] == 0:
            # cached blocks stored again below a parent: a request whose lookup stopped short of what is cached
            # (vLLM 0.34 prefix_cache_hit_limit: prompt_logprobs with prompt_logprob_start, v1/request.py:364)
            # or the next chunk of one that skipped it; a twin (whole-block prompt) is a single block
            opt_out = True
            self.opt_outs += 1
        keys = self._store_keys(ev)
        if keys is None:
            return
        media = self.tiers.loaded(ev, self._cached) if self.tiers else []
        loaded = len(media)
        hashes = ev.hashes
        n = len(hashes)
        bs = ev.block_size
        chain = self._chain_start(ev, n, opt_out or loaded > 0)
        pc, _, tcode, depth, divergence = chain
        alt: list[int] = []              # the reasons the loaded blocks would have had
        cnt, rep, first_new = self._store_blocks(ev, keys, chain, ts, loaded, alt, opt_out)
        if loaded:
            self.tiers.hold(at, media, ev, alt, tcode)
        tokens = self.tokens
        for r in range(len(cnt)):
            if cnt[r]:
                tokens[r] += cnt[r] * bs
        if self.tenants is not None:
            self.tenants.add_stored(tcode, cnt, bs)
        if divergence:
            self.depth.observe(depth)
            self.dyn.rotate_window()
            if first_new and rep:
                self.dyn.vote(pc, depth, rep * bs, hashes, keys[0], bs, at)

    def _computed_after_all(self, back: list[tuple[int, int, int]]) -> None:
        """Loads the tier's own store proved computed (kv_tiers.py): counted under their reasons now."""
        for tcode, r, tokens in back:
            self.tokens[r] += tokens
            if self.tenants is not None:
                self.tenants.add_stored(tcode, [int(i == r) for i in range(len(REASONS))], tokens)

    def _chain_head(self, ev: Stored, nxt: object) -> kv_reuse.Verdict:
        """What a parent-null store is (state/ledger/reuse.py): a store, a full-report request's reuse report
        (its hit tokens counted, per tenant too) or a request that skipped the lookup (counted here; its
        blocks stored as ``cache_opt_out``). ``nxt``: the batch's next event."""
        hashes = ev.hashes
        hybrid = self.anomalies["other_groups"] > 0
        side = self.side.judge(hashes) if hybrid else None
        declared = self.reports_declared
        child = (declared is not False and type(nxt) is Stored and nxt.parent == hashes[-1]
                 and nxt.group == ev.group)
        verdict, ambiguous = kv_reuse.judge(hashes, self._cached, hybrid, side, self.full_reports, child)
        if ambiguous:
            self.anomalies["ambiguous_reports"] += 1
        if verdict == "opt_out":
            self.opt_outs += 1
        if verdict != "report":
            return verdict
        code = 0
        if self.tenants is not None:
            ex = ev.extra
            code = self.tenants.book.code(salt_of(ex[0] if ex else None, ev.lora), ev.lora)
            if code != K.tenant_of(self._cached[hashes[0]]):
                # cached under another tenant's key: vLLM's hashes cover the salt and the adapter, so no
                # request of this one reused them (a hostile publisher's report): counted, credited to no one
                self.anomalies["forged_reports"] += 1
                return verdict
        if child and declared is None:
            self.full_reports = True      # a report followed by its own computed blocks: this replica sends them
        tokens = len(hashes) * ev.block_size
        self.reused_tokens += tokens
        self.reuse_reports += 1
        if self.tenants is not None:
            self.tenants.add_reused(code, tokens)
        return verdict

    def _store_keys(self, ev: Stored) -> list[bytes] | None:
        """The store's per-block token keys, or None when it is empty or malformed (counted)."""
        n = len(ev.hashes)
        bs = ev.block_size
        if n == 0:
            return None
        if bs <= 0 or len(ev.tokens) != n * bs:
            self.anomalies["malformed_stores"] += 1
            return None
        keys = block_keys(ev.tokens, n, bs)
        if keys is None:
            # token ids that are not integers (the decoder leaves them encoded, so this is where they
            # are read): the store is lost, and what this replica caches is no longer known
            self.anomalies["malformed_stores"] += 1
            self.in_sync = False
        return keys

    def _chain_start(self, ev: Stored, n: int, no_lookup_here: bool) -> ChainStart:
        """Where the store's ``n`` blocks go below. ``no_lookup_here``: the store does not start where a
        lookup stopped (a request that skipped it, or blocks loaded from another tier), so it is no
        divergence observation."""
        chain = self._chain_above(ev, n)
        if no_lookup_here and chain.divergence:
            chain = chain._replace(divergence=False)
        if chain.depth + n > K.DEPTH_MAX:       # absurd depths: clamped, never overflowing the field
            chain = chain._replace(depth=max(K.DEPTH_MAX - n, 0))
        return chain

    def _chain_above(self, ev: Stored, n: int) -> ChainStart:
        parent, lora = ev.parent, ev.lora
        if parent is None:
            pc = _ROOT if lora is None else _ROOT ^ (hash(("cachemon-kv-root", lora)) & K.KEY_MASK)
            tcode = 0
            if self.tenants is not None:
                ex = ev.extra
                tcode = self.tenants.book.code(salt_of(ex[0] if ex else None, lora), lora)
            return ChainStart(pc, _ROOT, tcode, 0, True)
        cached = self._cached
        prec = cached.get(parent)
        if prec is None:
            self.anomalies["orphan_stores"] += 1
            # its depth is unknown: no divergence observation
            pc = hash((_ORPHAN, lora, parent)) & K.CID_MASK
            return ChainStart(pc, pc, 0, 0, False)
        divergence = True
        if prec & K.OPEN:
            # The parent is the last block of an earlier store with no child yet.
            cached[parent] = prec & ~K.OPEN
            if n == 1:
                # One block below an open tail: a decode step of the same request filling its
                # next block (generated tokens), not a new prompt diverging from the cache. A
                # new turn extending the tail stores the reply's rest and the new message:
                # mostly more than one block, so it is seen (multi-turn chats).
                divergence = False
        else:
            self.dyn.reused(parent)
        pc = K.content_of(prec)
        return ChainStart(pc, K.token_content_of(prec), K.tenant_of(prec), K.depth_of(prec) + 1, divergence)

    def _store_blocks(self, ev: Stored, keys: list[bytes], chain: ChainStart, ts: float, loaded: int,
                      alt: list[int], opt_out: bool = False) -> tuple[list[int], int, bool]:
        """Each block of the store into the ledger, below ``chain``. Returns (blocks by reason code, blocks
        whose token content was seen under another parent, whether the first block is new content never
        seen before). The first ``loaded`` blocks came from another tier: tracked, their departure record
        used up, classified as nothing (the reason each would have had goes to ``alt``)."""
        pc, pu, tcode, depth, divergence = chain
        hashes = ev.hashes
        cached = self._cached
        extra = X.block_extras(ev.extra)
        lora = ev.lora
        routing_add = self.routing.add if self.routing is not None else None
        iso = self.isolation_index
        isolation_add = iso.add if iso is not None else None
        probing = iso is not None     # until a probe misses (then no later block of the store is held)
        # a salted or adapter chain keeps its token content id apart (isolation); others' equals their id
        apart = self.isolation and (tcode != 0 or pc != pu or lora is not None or extra is not None)
        dyn = self.dyn
        tokw_new, tokw_old = dyn.tok_new, dyn.tok_old
        tms = int((ts - self._t0) * 1000.0)
        # the chain's key (salt, adapter): content id xor token content id; 0 for none, and without isolation
        key = pc ^ pu if apart else 0
        rec_base = K.pack_block(0, depth, tms) | (tcode << K.TENANT_SHIFT) | (key << K.KEY_SHIFT)
        room = self.max_blocks - len(cached)
        cnt = [0] * (len(REASONS) + 1)     # the last slot (r = -1): blocks loaded from another tier
        rep = 0              # blocks of this store whose token content was seen under another parent
        first_new = False
        last_tracked: Hash | None = None
        mcid, depth1, ref1, ref_bits = K.CID_MASK, K.DEPTH_ONE, K.COPY_ONE, K.COPY_BITS   # locals: the hot path
        # a cached block recomputed: a whole-block prompt's last one (a single block below its parent), else on a
        # model with a sliding-window group the window's cost (state/ledger/groups.py, SideGroups.window); by a request
        # that skipped the lookup, what it chose not to read (state/ledger/reuse.py)
        recompute = int(Reason.CACHE_OPT_OUT if opt_out
                        else Reason.SLIDING_WINDOW if self.side.window and (ev.parent is None or len(hashes) > 1)
                        else Reason.RECOMPUTE_LAST_BLOCK)
        for k in range(len(hashes)):
            h = hashes[k]
            th = hash(keys[k])
            x = None if extra is None or k >= len(extra) else extra[k]
            if not apart:     # no call for a block without keys
                cid = uid = (hash((pc, th)) if x is None else hash((pc, th, X.hashable(x)))) & mcid
            elif x is None:
                # one hash a block: the token content id by the chain, the content id that xor the
                # chain's key (its salt and adapter, kv_extras.keyed_ids), equal for equal keys
                uid = hash((pu, th)) & mcid
                cid = uid ^ key
            else:
                uid, cid = X.keyed_ids(pu, th, x, key, lora)
                # a salt in this block's keys (a chain's first) makes the key from here on
                rec_base ^= (key ^ cid ^ uid) << K.KEY_SHIFT
                key = cid ^ uid
            rec = cached.get(h)
            if rec is not None:
                # Still cached: recomputed although present (whole-block prompt). Count a reference.
                cnt[recompute] += 1
                if rec & ref_bits != ref_bits:
                    cached[h] = rec + ref1
                last_tracked = h
                pc, pu = rec & mcid, uid
                rec_base += depth1
                continue
            r = self._why_new(cid, uid, probing)
            probing = probing and r != 0
            if k < loaded:
                alt.append(r)
                r = -1
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
                cached[h] = rec_base | cid         # the key is in rec_base: token content id = cid ^ key
                room -= 1
                last_tracked = h
                if routing_add is not None:
                    routing_add(cid)
                if isolation_add is not None:
                    isolation_add(uid)
            else:
                self.anomalies["overflow_blocks"] += 1
                self.in_sync = False
            pc, pu = cid, uid
            rec_base += depth1
        if last_tracked is not None:
            cached[last_tracked] |= K.OPEN
        return cnt[:-1], rep, first_new

    def _why_new(self, cid: int, uid: int, probing: bool) -> int:
        """The reason code of a block this replica did not hold: how its content last left (its departure
        record, used up), else cached on another replica (routing), else its token content cached under
        another key (isolation, probed while ``probing``), else first seen (0). Once a block's token
        content is not held under another key, neither is its child's: a key's copy of a child is only
        cached with its parent's (vLLM evicts a request's blocks tail first and touches a prefix with its
        child), so the caller stops probing at the first 0."""
        hist, hold = self._hist, self._hist_old
        how = hist.pop(cid, None) if hist else None
        if how is None and hold:
            how = hold.pop(cid, None)
        if how is not None:
            return how & K.DEPART_REASON
        if self.routing is not None and cid in self.routing:
            return _ROUTING
        if probing and self.isolation_index is not None and uid in self.isolation_index:
            return _ISOLATION
        return 0

    def _removed(self, hashes: Iterable[Hash], ts: float) -> None:
        cached = self._cached
        now = ts - self._t0
        how = K.pack_departure(Reason.CAPACITY, int(now * 1000.0))
        life = self.lifetime
        bounds, counts = life.bounds, life.counts
        routing, iso = self.routing, self.isolation_index
        hist = self._hist
        half = self.history_blocks // 2
        pop = cached.pop
        ref_bits, ref1, mcid, tshift, tmax = K.COPY_BITS, K.COPY_ONE, K.CID_MASK, K.TIME_SHIFT, K.TIME_MAX
        key_shift = K.KEY_SHIFT
        isolation_discard = iso.discard if iso is not None else None
        total, observed, unknown, unindexed = 0.0, 0, 0, 0
        left: list[int] = []          # content ids whose last copy left this replica (for the routing index)
        for h in hashes:
            rec = pop(h, None)
            if rec is None:
                unknown += 1
                continue
            if rec & ref_bits != ref1:
                cached[h] = rec - ref1             # another copy (a twin) of the block is still cached
                continue
            cid = rec & mcid
            v = now - ((rec >> tshift) & tmax) / 1000.0      # kv_records.stored_ms, inline: a hot loop
            if v < 0.0:
                v = 0.0
            counts[bisect_left(bounds, v)] += 1
            total += v
            observed += 1
            hist[cid] = how
            if len(hist) >= half:
                self._rotate()
                hist = self._hist
            if routing is not None:
                left.append(cid)
            if isolation_discard is not None and not isolation_discard((rec >> key_shift) ^ cid):  # token content id
                unindexed += 1                              # not held: cannot happen while the index is exact
        if routing is not None and left:
            unindexed += release_all(routing, left)
        life.sum += total
        life.count += observed
        if unknown:
            self.anomalies["unknown_removed"] += unknown
        if unindexed:
            self.anomalies["index_misses"] += unindexed

    def _rotate(self) -> None:
        self.history_evicted += len(self._hist_old)
        self._hist_old = self._hist
        self._hist = {}

    def _depart_all(self, reason: Reason, at: float) -> None:
        """Cleared or restart: every cached content left, the same way."""
        packed = K.pack_departure(reason, int((at - self._t0) * 1000.0))
        for rec in self._cached.values():
            cid = K.content_of(rec)
            self._hist[cid] = packed
            if len(self._hist) >= self.history_blocks // 2:
                self._rotate()
        self.leave_indexes()
        self._cached.clear()

    # --- reading ---------------------------------------------------------------------------
    def stored_tokens(self) -> dict[str, float]:
        return {r: float(t) for r, t in zip(REASONS, self.tokens, strict=True)}

    def copies(self, h: Hash) -> int:
        """How many copies of vLLM hash ``h`` the ledger holds as cached (0: none)."""
        rec = self._cached.get(h)
        return 0 if rec is None else K.copies_of(rec)

    def cached_hashes(self) -> Collection[Hash]:
        """vLLM's hashes of the blocks cached (a live view)."""
        return self._cached.keys()

    def cached_contents(self) -> Iterable[int]:
        for rec in self._cached.values():
            yield K.content_of(rec)

    def cached_token_contents(self) -> Iterable[int]:
        for rec in self._cached.values():
            yield K.token_content_of(rec)

    def join_indexes(self, routing: FleetIndex | None, isolation: FleetIndex | None) -> None:
        """Hold what this replica caches in the model's indexes (a model's second replica or key made them,
        or this replica joined its model) and use them from now on. None: that index does not exist."""
        if routing is not None and self.routing is None:
            hold_all(routing, self.cached_contents())
        if isolation is not None and self.isolation_index is None:
            hold_all(isolation, self.cached_token_contents())
        self.routing, self.isolation_index = routing, isolation

    def leave_indexes(self) -> None:
        """Release what this replica caches from the model's indexes (it is emptied, or leaves the model);
        an id an index did not hold is counted as ``index_misses``. The indexes stay joined."""
        if self.routing is not None:
            self.anomalies["index_misses"] += release_all(self.routing, self.cached_contents())
        if self.isolation_index is not None:
            self.anomalies["index_misses"] += release_all(self.isolation_index, self.cached_token_contents())

    def history_size(self) -> int:
        return len(self._hist) + len(self._hist_old)
