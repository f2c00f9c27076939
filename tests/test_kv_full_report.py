"""Full report mode (vLLM >= 0.32.0, ``kv_cache_report_mode="full"``) in the ledger, on CONSTRUCTED streams.

Everything here is constructed in this file: a small model of vLLM's block pool (``Pool``) that follows
the wire facts read in vLLM 0.32.0's source (``vllm/v1/core/kv_cache_manager.py`` ``get_computed_blocks``
and ``vllm/v1/core/block_pool.py`` ``emit_cached_block_events`` / ``cache_full_blocks``):

* a lookup hits the longest cached prefix of the prompt's block chain, at most ``prompt - 1`` tokens;
* a request in full mode that hit k > 0 blocks makes vLLM send a BlockStored of blocks 0..k-1 with
  ``parent_block_hash`` null (the same shape as a store) at the lookup, before anything else of the request;
* the request's computed full blocks k..m-1 are then stored below block k-1 (a twin when the hash is
  still cached: vLLM keeps a second physical copy), each eviction of a cached block is a BlockRemoved
  sent just before the store that needed the space.

The real-capture proof (hits == the responses' cached_tokens) is in test_kv_full_report_real.py.
"""
from __future__ import annotations

import random
from collections import OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st

from assert_support import nonempty
from cachemon.normalise.kv_batch import KvBatch, Removed, Stored
from cachemon.state.ledger.fleet import FleetLedger

BS = 4


class Pool:
    """A constructed vLLM block pool of ``size`` physical blocks, LRU eviction, one request at a time."""

    def __init__(self, size: int, fleet: FleetLedger, name: str = "a", full_every: int = 0) -> None:
        self.size, self.fleet, self.name = size, fleet, name
        self.blocks: OrderedDict[int, int] = OrderedDict()   # physical id -> hash (LRU order, oldest first)
        self.next_id = 0
        self.seq, self.t = 0, 1000.0
        self.hits: list[int] = []          # per full-mode request: hit tokens (what vLLM's usage reports)

    def _cached(self, h: int) -> int | None:
        for pid, hh in self.blocks.items():
            if hh == h:
                return pid
        return None

    def request(self, toks: list[int], full: bool) -> None:
        n_full = len(toks) // BS
        hashes, p = [], None
        for i in range(n_full):
            p = hash(("v", p, tuple(toks[i * BS:(i + 1) * BS]))) & ((1 << 64) - 1)
            hashes.append(p)
        k = 0
        while k < n_full and (k + 1) * BS <= len(toks) - 1 and self._cached(hashes[k]) is not None:
            k += 1
        events: list = []
        for h in hashes[:k]:                         # touched: most recently used
            pid = self._cached(h)
            assert pid is not None
            self.blocks.move_to_end(pid)
        if full and k:
            events.append(Stored(tuple(hashes[:k]), None, tuple(toks[:k * BS]), BS))
            self.hits.append(k * BS)
        elif full:
            self.hits.append(0)
        new = []
        for h in hashes[k:]:
            if len(self.blocks) >= self.size:
                _, old = self.blocks.popitem(last=False)
                events.append(Removed((old,)))
            self.blocks[self.next_id] = h
            self.next_id += 1
            new.append(h)
        if new:
            events.append(Stored(tuple(new), hashes[k - 1] if k else None, tuple(toks[k * BS:n_full * BS]), BS))
        if events:
            self.t += 1.0
            self.fleet.on_batch(self.name, "m", KvBatch(self.seq, self.t, events), self.t)
            self.seq += 1


def _prompts(seed: int, n: int) -> list[list[int]]:
    """Prompts over a few shared prefixes, 2-9 blocks, never exactly one block (see the twin test)."""
    rnd = random.Random(seed)
    heads = [[rnd.randrange(1000) for _ in range(BS * rnd.randrange(1, 4))] for _ in range(4)]
    out = []
    for _ in range(n):
        tail = [rnd.randrange(1000) for _ in range(rnd.randrange(BS + 1, BS * 6))]
        out.append(rnd.choice(heads) + tail)
    return out


def _run(full_share: float, seed: int, pool: int):
    fleet = FleetLedger(full_reports=True)      # the replica's clients send full reports (kv_events.full_reports)
    p = Pool(pool, fleet)
    rnd = random.Random(seed + 1)
    prompts = _prompts(seed, 300)
    # the first full-mode request hits several blocks (unambiguous), then a mix
    p.request(prompts[0], full=False)
    p.request(prompts[0], full=full_share > 0)
    for t in prompts[1:]:
        p.request(t, full=rnd.random() < full_share)
    led = fleet.replica("a")
    assert led is not None
    return fleet, p, led


def test_reuse_reports_count_as_hits_and_leave_the_split_depths_and_capacity_unchanged():
    for seed, pool in nonempty(((1, 24), (2, 60), (3, 400))):
        f_inc, _, inc = _run(0.0, seed, pool)
        f_full, p, full = _run(0.5, seed, pool)
        v_inc, v_full = f_inc.view("a"), f_full.view("a")
        assert v_inc is not None and v_full is not None
        # the same stream with and without reports: identical split, cache, depths and lifetimes
        assert v_full.stored_tokens == v_inc.stored_tokens, seed
        assert v_full.cached_blocks == v_inc.cached_blocks
        assert full.depth.counts == inc.depth.counts and full.depth.count == inc.depth.count
        assert full.lifetime.count == inc.lifetime.count
        assert full.history_size() == inc.history_size()
        # every reported hit, and nothing else, is a reused token
        assert full.reused_tokens == sum(p.hits) > 0
        assert full.reuse_reports == sum(1 for h in p.hits if h)
        assert inc.reused_tokens == 0
        if pool < 100:
            assert v_full.stored_tokens["capacity"] > 0     # churn keeps its capacity reason


def test_per_request_hits_from_the_events_alone():
    fleet = FleetLedger(full_reports=True)
    p = Pool(400, fleet)
    led_hits = []
    for t in _prompts(7, 40):
        led = fleet.replica("a")
        before = led.reused_tokens if led else 0
        p.request(t, full=True)
        led = fleet.replica("a")
        assert led is not None
        led_hits.append(led.reused_tokens - before)
    assert led_hits == p.hits and sum(led_hits) > 0


def test_a_chain_head_store_of_new_blocks_is_a_store():
    fleet = FleetLedger()
    p = Pool(100, fleet)
    p.request(list(range(4 * BS + 2)), full=True)         # nothing cached: no report, block 0 stored
    v = fleet.view("a")
    assert v is not None and v.stored_tokens["first"] == 4 * BS
    assert fleet.replica("a").reused_tokens == 0       # type: ignore[union-attr]


def test_a_one_block_twin_is_a_store_until_the_replica_has_sent_a_full_report():
    fleet = FleetLedger()
    p = Pool(100, fleet)
    one = list(range(BS))                               # exactly one block: the lookup can hit nothing
    p.request(one, full=False)
    p.request(one, full=True)                           # recomputed while cached: a twin, no report
    v = fleet.view("a")
    assert v is not None and v.stored_tokens["recompute_last_block"] == BS
    led = fleet.replica("a")
    assert led is not None and led.reused_tokens == 0
    two = list(range(100, 100 + 3 * BS))
    p.request(two, full=False)
    p.request(two, full=True)                           # hits 2 blocks: an unambiguous report
    assert led.reused_tokens == 2 * BS and led.full_reports
    p.request(list(range(100, 100 + BS + 1)), full=True)    # hits one block: now read as a report
    assert led.reused_tokens == 3 * BS
    v = fleet.view("a")
    assert v is not None and v.stored_tokens["recompute_last_block"] == 2 * BS   # the 3-block prompt's last
    assert led.anomalies["ambiguous_reports"] == 2      # both one-block shapes counted, whichever way read


def _group_store(hashes: tuple[int, ...], group: int, kind: str, window: int | None = None) -> Stored:
    toks = tuple(range(len(hashes) * BS))
    if kind == "full_attention":
        return Stored(hashes, None, toks, BS, None, "GPU", None, group, None, kind)
    return Stored(hashes, None, (), BS, None, "GPU", None, group, None, kind, window)


def test_a_hybrid_group_without_a_window_leaves_a_report_shaped_store_ambiguous_and_counted():
    """Constructed: a mamba-like second group (no window on its events). Its report-shaped event gives
    no verdict, so the full-attention group's parent-null store of cached blocks is read as a recompute
    and counted as ambiguous; with a sliding-window group holding the window it is a report."""
    hs = (11, 12, 13)
    for kind, window, reused, ambiguous in nonempty((("mamba", None, 0, 1), ("sliding_window", 2 * BS, 3 * BS, 0))):
        fleet = FleetLedger()
        fleet.on_batch("a", "m", KvBatch(0, 1.0, [_group_store(hs, 0, kind, window),
                                                  _group_store(hs, 1, "full_attention")]), 1.0)
        fleet.on_batch("a", "m", KvBatch(1, 2.0, [_group_store(hs, 0, kind, window),
                                                  _group_store(hs, 1, "full_attention")]), 2.0)
        led = fleet.replica("a")
        assert led is not None and led.group == 1, kind
        assert led.reused_tokens == reused and led.anomalies["ambiguous_reports"] == ambiguous, kind


@settings(max_examples=60, deadline=None)
@given(plan=st.lists(st.tuples(st.integers(0, 5), st.integers(1, 14), st.booleans()), min_size=1, max_size=40),
       pool=st.integers(6, 60))
def test_any_mix_of_full_and_incremental_requests_leaves_the_split_as_without_reports(plan, pool):
    """Property over CONSTRUCTED request streams: whatever mix of modes, prompts and pool size, the
    split, cache, depths and lifetimes are those of the same stream with no report, and the reused
    tokens are the full-mode requests' hits. The replica has sent one unambiguous report first (a
    single-block report before any is the documented ambiguity: test above)."""
    heads = [[h * 1000 + t for t in range(BS * (1 + h % 3))] for h in range(6)]

    def stream(full_ok: bool):
        fleet = FleetLedger(full_reports=True)
        p = Pool(pool, fleet)
        warm = list(range(500, 500 + 3 * BS + 1))
        p.request(warm, full=False)
        p.request(warm, full=full_ok)          # hits 3 blocks: an unambiguous report
        for i, (head, tail, full) in enumerate(plan):
            p.request(heads[head] + [7000 + i * 31 + t for t in range(tail)], full=full and full_ok)
        led = fleet.replica("a")
        assert led is not None
        return fleet.view("a"), led, p

    v_full, full, p = stream(True)
    v_inc, inc, _ = stream(False)
    assert v_full is not None and v_inc is not None
    assert v_full.stored_tokens == v_inc.stored_tokens and v_full.cached_blocks == v_inc.cached_blocks
    assert full.depth.counts == inc.depth.counts and full.lifetime.count == inc.lifetime.count
    assert full.reused_tokens == sum(p.hits) and inc.reused_tokens == 0


def test_a_bounded_lookup_recomputing_cached_blocks_below_a_parent_is_cache_opt_out():
    """Constructed from vLLM 0.34's source (v1/request.py:364 ``get_prefix_cache_hit_limit``,
    kv_cache_manager.py:253): a prompt_logprobs request with ``prompt_logprob_start`` = 2 blocks reads the cache
    up to there only, then recomputes cached blocks 2..4 and stores them again below block 1; a one-block twin
    below a parent stays a twin."""
    fleet = FleetLedger()
    toks = tuple(range(6 * BS))
    hs = (101, 102, 103, 104, 105, 106)
    fleet.on_batch("a", "m", KvBatch(0, 1.0, [Stored(hs[:5], None, toks[:5 * BS], BS, None, "GPU", None)]), 1.0)
    fleet.on_batch("a", "m", KvBatch(1, 2.0, [Stored(hs[2:6], hs[1], toks[2 * BS:6 * BS], BS, None, "GPU", None)]), 2.0)
    fleet.on_batch("a", "m", KvBatch(2, 3.0, [Stored(hs[4:5], hs[3], toks[4 * BS:5 * BS], BS, None, "GPU", None)]), 3.0)
    v, led = fleet.view("a"), fleet.replica("a")
    assert v is not None and led is not None
    assert v.stored_tokens["first"] == 6 * BS and v.stored_tokens["cache_opt_out"] == 3 * BS
    assert v.stored_tokens["recompute_last_block"] == BS and led.reused_tokens == 0
    assert led.copies(103) == 2 and led.copies(105) == 3       # each recompute is a physical copy in vLLM
