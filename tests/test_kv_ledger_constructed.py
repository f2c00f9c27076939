"""The KV-event ledger's rules, one at a time, on CONSTRUCTED event streams (no vLLM here).

Every batch below is constructed in this file: the token ids are made-up ints and the vLLM
hashes are derived here with a per-"process" seed, to show that the ledger never relies on vLLM's
hashes agreeing across processes or replicas. The real-capture tests are in
test_kv_ledger_real.py.
"""
from __future__ import annotations

import sys
import threading

import pytest

from assert_support import nonempty
from cachemon.normalise.kv_batch import Cleared, KvBatch, Removed, Stored
from cachemon.state.ledger import dynamic as D
from cachemon.state.ledger import fleet as L
from cachemon.state.ledger.fleet import DynamicPrefix, FleetLedger, ReplicaLedger

BS = 4
M64 = (1 << 64) - 1


def blocks(*ids: int) -> list[list[int]]:
    """One constructed block of BS tokens per id (token i*100 .. i*100+BS-1)."""
    return [[i * 100 + j for j in range(BS)] for i in ids]


def vhash(parent: int | None, toks: list[int], seed: int) -> int:
    return hash((seed, parent, tuple(toks))) & M64


class Replica:
    """A constructed vLLM replica: chains blocks, hashes them with its process's seed."""

    def __init__(self, fleet: FleetLedger, name: str, model: str = "m", seed: int = 1) -> None:
        self.fleet, self.name, self.model, self.seed = fleet, name, model, seed
        self.seq = 0
        self.t = 1000.0

    def hashes(self, bl: list[list[int]], salt: object = None) -> list[int]:
        out, p = [], None
        for b in bl:
            p = vhash(p, b, hash((self.seed, salt)))
            out.append(p)
        return out

    def send(self, *events, dt: float = 1.0) -> None:
        self.t += dt
        self.fleet.on_batch(self.name, self.model, KvBatch(self.seq, self.t, list(events)), self.t)
        self.seq += 1

    def store(self, bl: list[list[int]], upto: int = 0, **kw) -> list[int]:
        """Store blocks bl[upto:] below bl[upto-1] (a prompt whose first `upto` blocks hit)."""
        hs = self.hashes(bl, (kw.get("lora"), repr(kw.get("extra"))))
        parent = hs[upto - 1] if upto else None
        toks = tuple(t for b in bl[upto:] for t in b)
        self.send(Stored(tuple(hs[upto:]), parent, toks, BS, **kw))
        return hs

    def remove(self, *hs: int, dt: float = 1.0) -> None:
        self.send(*(Removed((h,)) for h in hs), dt=dt)

    def restart(self, seed: int) -> None:
        self.seed, self.seq = seed, 0
        self.fleet.on_restart(self.name, self.t)

    def view(self):
        return self.fleet.view(self.name)


def split(r: Replica) -> dict[str, float]:
    return {k: v for k, v in r.view().stored_tokens.items() if v}


def test_first_then_capacity_after_eviction_and_lifetime():
    f = FleetLedger()
    r = Replica(f, "a")
    hs = r.store(blocks(1, 2, 3))
    assert split(r) == {"first": 3 * BS}
    r.remove(hs[2], dt=30.0)
    assert r.view().cached_blocks == 2
    r.store(blocks(1, 2, 3), upto=2)
    assert split(r) == {"first": 3 * BS, "capacity": BS}
    life = f.snapshot()[0].lifetime
    assert life.count == 1 and life.sum == pytest.approx(30.0)


def test_reset_then_restart_with_other_hash_seed():
    f = FleetLedger()
    r = Replica(f, "a")
    r.store(blocks(1, 2))
    r.send(Cleared())
    assert r.view().cached_blocks == 0
    r.store(blocks(1, 2))
    assert split(r) == {"first": 2 * BS, "reset": 2 * BS}
    # A new process hashing with another seed: vLLM hashes differ, content ids do not.
    r.restart(seed=99)
    r.store(blocks(1, 2, 3))
    assert split(r) == {"first": 3 * BS, "reset": 2 * BS, "restart": 2 * BS}


def test_routing_across_replicas_with_different_seeds_and_own_history_first():
    f = FleetLedger()
    a, b = Replica(f, "a", seed=1), Replica(f, "b", seed=2)
    ha = a.store(blocks(1, 2))
    b.store(blocks(1, 2, 3))
    assert split(b) == {"routing": 2 * BS, "first": BS}
    # b evicts block 3; a then stores 1,2,3: 3 is cached nowhere, was never on a -> first
    hb = b.hashes(blocks(1, 2, 3), (None, "None"))
    b.remove(hb[2])
    a.store(blocks(1, 2, 3), upto=2)
    assert split(a) == {"first": 3 * BS}
    # a evicts 3, b re-stores it: b's own history (capacity) wins over a? a no longer caches it either
    a.remove(a.hashes(blocks(1, 2, 3), (None, "None"))[2])
    b.store(blocks(1, 2, 3), upto=2)
    assert split(b) == {"routing": 2 * BS, "first": BS, "capacity": BS}
    # precedence: a's own history (capacity) wins although b caches the content now
    a.store(blocks(1, 2, 3), upto=2)
    assert split(a) == {"first": 3 * BS, "capacity": BS}
    # another model never counts as routing
    c = Replica(f, "c", model="other", seed=3)
    c.store(blocks(1, 2))
    assert split(c) == {"first": 2 * BS}
    assert ha


def test_restart_wins_over_routing():
    f = FleetLedger()
    a, b = Replica(f, "a", seed=1), Replica(f, "b", seed=2)
    a.store(blocks(5, 6))
    b.store(blocks(5, 6))
    a.restart(seed=7)
    a.store(blocks(5, 6))
    assert split(a) == {"first": 2 * BS, "restart": 2 * BS}


def test_reference_counts_whole_block_prompt_recomputes_its_last_block():
    f = FleetLedger()
    r = Replica(f, "a")
    hs = r.store(blocks(1, 2))
    r.store(blocks(1, 2), upto=1)            # the last block again, while cached
    assert split(r) == {"first": 2 * BS, "recompute_last_block": BS}
    r.remove(hs[1])                         # one copy evicted: the content is still cached
    assert r.view().cached_blocks == 2
    r.remove(hs[1])
    assert r.view().cached_blocks == 1
    r.store(blocks(1, 2), upto=1)
    assert split(r)["capacity"] == BS


def test_extra_keys_and_lora_take_part_in_the_content_id():
    f = FleetLedger()
    a, b = Replica(f, "a", seed=1), Replica(f, "b", seed=2)
    a.store(blocks(1, 2), lora="x")
    b.store(blocks(1, 2), lora="y")
    assert split(b) == {"first": 2 * BS}
    b.store(blocks(1, 2), lora="x")
    assert split(b) == {"first": 2 * BS, "routing": 2 * BS}
    a.store(blocks(7), extra=(["salt-a"],))
    b.store(blocks(7), extra=(["salt-b"],))
    assert split(b)["first"] == 3 * BS


def test_unknown_parent_is_counted_and_chains_from_a_marker():
    f = FleetLedger()
    r = Replica(f, "a")
    r.send(Stored((11, 12), 424242, tuple(t for b in blocks(1, 2) for t in b), BS))
    led = f.replica("a")
    assert led is not None and led.anomalies["orphan_stores"] == 1
    r.remove(12)
    r.send(Stored((12,), 11, tuple(blocks(2)[0]), BS))
    assert split(r) == {"first": 2 * BS, "capacity": BS}


def test_in_sync_lost_until_cleared_or_restart_and_joining_mid_stream():
    f = FleetLedger()
    r = Replica(f, "a")
    r.store(blocks(1))
    assert r.view().in_sync
    f.on_lost("a", 3, r.t)
    assert not r.view().in_sync
    r.send(Cleared())
    assert r.view().in_sync
    f.on_lost("a", 1, r.t)
    r.restart(seed=5)
    assert r.view().in_sync
    late = Replica(f, "late")
    late.seq = 40                            # first batch seen is not seq 0: earlier state unknown
    late.store(blocks(1))
    assert not late.view().in_sync


def test_divergence_depth_and_continuations():
    f = FleetLedger()
    r = Replica(f, "a")
    bl = blocks(1, 2, 3, 4)
    hs = r.store(bl)                        # depth 0
    r.send(Stored((vhash(hs[3], [9] * BS, 1),), hs[3], (9,) * BS, BS))   # under the open tail: a continuation
    r.store(blocks(1, 2, 3, 8), upto=3)     # diverges below block 3: depth 3
    d = f.snapshot()[0].depth
    assert d.count == 2 and d.sum == 3.0


def _dyn_prompts(head_values, shared=(50, 51, 52, 53), depth=0, questions=None):
    """Prompts: `depth` shared blocks, a per-request block, the shared blocks, a question block."""
    out = []
    for n, v in enumerate(head_values):
        q = (questions[n],) if questions is not None else ()
        out.append(blocks(*range(60, 60 + depth), v, *shared, *q))
    return out


def _run(prompts, r: Replica, dt=1.0):
    for bl in prompts:
        # the longest cached prefix is what vLLM would hit: find it from what r stored before
        led = r.fleet.replica(r.name)
        hs = r.hashes(bl, (None, "None"))
        upto = 0
        if led is not None:
            while upto < len(bl) - 1 and hs[upto] in led._cached:
                upto += 1
        r.t += dt
        r.store(bl, upto=upto)


def test_dynamic_prefix_found_at_its_depth_with_hold_down():
    f = FleetLedger()
    r = Replica(f, "a")
    _run(_dyn_prompts(range(1000, 1008), depth=2), r)
    dp = r.view().dynamic_prefix
    assert dp is not None and dp.depth_blocks == 2
    # 7 requests recomputed the 4 shared blocks below the per-request one
    assert dp.recomputed_tokens == 7 * 4 * BS
    since = dp.since
    _run(_dyn_prompts(range(2000, 2002), depth=2), r)
    dp2 = r.view().dynamic_prefix
    assert dp2 is not None and dp2.since == since and dp2.recomputed_tokens == 9 * 4 * BS
    # the signature stops: held for DP_HOLD_S, then cleared
    assert f.view("a", now=r.t + D.DP_HOLD_S - 1).dynamic_prefix is not None
    assert f.view("a", now=r.t + D.DP_HOLD_S + 1).dynamic_prefix is None


def test_dynamic_prefix_recomputed_tokens_are_a_part_of_first():
    f = FleetLedger()
    r = Replica(f, "a")
    _run(_dyn_prompts(range(1000, 1008)), r)
    v = r.view()
    assert v.dynamic_prefix is not None and v.dynamic_prefix.depth_blocks == 0
    assert v.dynamic_prefix.recomputed_tokens <= v.stored_tokens["first"]


def test_unique_questions_below_a_shared_system_prompt_are_not_a_dynamic_prefix():
    f = FleetLedger()
    r = Replica(f, "a")
    # shared system prompt (blocks 50..53), then a unique question of 1..3 blocks
    prompts = [blocks(50, 51, 52, 53, *range(1000 + 10 * i, 1000 + 10 * i + 1 + i % 3)) for i in range(30)]
    _run(prompts, r)
    assert r.view().dynamic_prefix is None


def test_a_value_at_the_tail_is_not_a_dynamic_prefix():
    f = FleetLedger()
    r = Replica(f, "a")
    _run([blocks(50, 51, 52, 53, 1000 + i) for i in range(30)], r)
    assert r.view().dynamic_prefix is None


def test_per_tenant_heads_reused_by_later_requests_are_not_a_dynamic_prefix():
    """Six tenants, round robin: their first requests look like per-request values, but each
    tenant's subtree is reused by its next request."""
    f = FleetLedger()
    r = Replica(f, "a")
    prompts = [blocks(900 + k, 50, 51, 52, 2000 + 10 * rnd + k) for rnd in range(5) for k in range(6)]
    _run(prompts, r)
    assert r.view().dynamic_prefix is None


def test_text_samples_only_with_keep_text_and_bounded():
    for keep in nonempty((False, True)):
        f = FleetLedger(keep_text=keep)
        r = Replica(f, "a")
        _run(_dyn_prompts(range(1000, 1010)), r)
        s = f.text_samples("a")
        if keep:
            assert 0 < len(s) <= D.TEXT_SAMPLES and s[-1] == tuple(blocks(1009)[0])
        else:
            assert s == []


def test_other_medium_and_malformed_events_are_counted_not_ledgered():
    f = FleetLedger()
    r = Replica(f, "a")
    r.store(blocks(1), medium="CPU")
    r.send(Stored((5,), None, (1, 2), BS))   # 2 tokens for a block of 4
    led = f.replica("a")
    assert led is not None and led.tiers.stored == {"CPU": 1} and led.anomalies["malformed_stores"] == 1
    assert split(r) == {} and r.view().cached_blocks == 0
    r.store(blocks(2))
    r.send(Cleared("CPU"), Removed((12345,), "CPU"))      # the offload tier's events leave the pool alone
    assert r.view().cached_blocks == 1 and led.tiers.removed == {"CPU": 1} and not led.tiers


def _footprint(led: ReplicaLedger) -> int:
    """Bytes held by the ledger's growing structures (containers and their int records)."""
    total = 0
    for d in (led._cached, led._hist, led._hist_old, led.dyn.tok_new, led.dyn.tok_old, led.dyn.vote_new, led.dyn.vote_old):
        total += sys.getsizeof(d) + sum(sys.getsizeof(k) + sys.getsizeof(v) for k, v in d.items())
    return total + sys.getsizeof(led.dyn.points)


@pytest.mark.slow
def test_memory_stays_flat_on_millions_of_distinct_hashes():
    """A hostile stream: 1.2 million distinct block hashes, stored and never (or rarely) removed.
    Caps hold: blocks, history, windows. (~3 s: the point is the count of distinct hashes.)"""
    f = FleetLedger(max_blocks=20_000, history_blocks=20_000)
    clock = [0.0]

    def feed(n_events: int, start: int) -> None:
        for e in range(start, start + n_events):
            hs = tuple(range(e * 32, e * 32 + 32))
            toks = tuple(range(e * 64, e * 64 + 64))
            clock[0] += 0.01
            f.on_batch("a", "m", KvBatch(e, clock[0], [Removed((hs[0] - 32,)), Stored(hs, None, toks, 2)]), clock[0])

    feed(6_000, 1)                            # warm: 192 000 hashes, every cap reached
    led = f.replica("a")
    assert led is not None
    before = _footprint(led)
    feed(31_250, 6_001)                       # 1 000 000 more distinct hashes
    after = _footprint(led)
    assert len(led._cached) <= 20_000 and led.history_size() <= 20_000
    assert led.anomalies["overflow_blocks"] > 900_000 and not led.in_sync
    assert len(led.dyn.tok_new) + len(led.dyn.tok_old) <= D.DP_TOKEN_WINDOW
    # Generational structures swing between half and full: bounded, not growing with the stream.
    assert after <= before * 1.5, (before, after)
    assert after <= (20_000 + 20_000 + D.DP_TOKEN_WINDOW) * 150, after


def test_history_is_bounded_and_dropped_content_counts():
    f = FleetLedger(history_blocks=10)
    r = Replica(f, "a")
    for i in range(40):
        hs = r.store(blocks(3000 + i))
        r.remove(hs[0])
    led = f.replica("a")
    assert led is not None and led.history_size() <= 10 and led.history_evicted >= 30
    r.store(blocks(3000))                    # fell out of the history: first again
    assert split(r) == {"first": 41 * BS}


def test_concurrent_sources_and_scrapes_keep_exact_totals():
    f = FleetLedger()
    reps = [Replica(f, f"r{k}", seed=k) for k in range(2)]

    def feed(rep: Replica, k: int) -> None:
        for i in range(300):
            rep.store(blocks(k * 10_000 + i, k * 10_000 + i + 5000))

    ts = [threading.Thread(target=feed, args=(rep, k)) for k, rep in enumerate(reps)]
    for t in ts:
        t.start()
    while any(t.is_alive() for t in ts):
        f.snapshot()
    for t in ts:
        t.join()
    for rep in nonempty(reps):
        assert sum(rep.view().stored_tokens.values()) == 300 * 2 * BS


def test_ledger_rejects_nonsense_bounds():
    with pytest.raises(ValueError):
        ReplicaLedger("a", "m", max_blocks=0)
    assert DynamicPrefix(1, 0.0, 0.0).depth_blocks == 1


def test_histogram_families_render_in_both_formats_as_prometheus_client_reads_them():
    """A constructed histogram family (with and without labels) through both renderers."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
    from prometheus_client.parser import text_string_to_metric_families as parse_text

    from cachemon.expose.render import Family, format_labels, render, render_openmetrics

    class One:
        def collect(self):
            fam = Family("cachemon_test_seconds", "histogram", 'A "test" histogram.')
            h = L.Histogram((1.0, 5.0))
            for v in (0.5, 2.0, 2.5, 9.0):
                h.observe(v)
            fam.add_histogram(format_labels(("upstream",), ('a"b',)), h.cumulative(), h.sum, h.count)
            fam.add_histogram("", [(1.0, 0.0)], 0.0, 0.0)
            yield fam

    for body, parse in nonempty(((render([One()]).decode(), parse_text), (render_openmetrics([One()]).decode(), parse_om))):
        (fam,) = list(parse(body))
        assert fam.type == "histogram"
        got = {(s.name, s.labels.get("upstream"), s.labels.get("le")): s.value for s in fam.samples}
        assert got[("cachemon_test_seconds_bucket", 'a"b', "1.0")] == 1
        assert got[("cachemon_test_seconds_bucket", 'a"b', "5.0")] == 3
        assert got[("cachemon_test_seconds_bucket", 'a"b', "+Inf")] == 4
        assert got[("cachemon_test_seconds_sum", 'a"b', None)] == 14.0
        assert got[("cachemon_test_seconds_count", None, None)] == 0


def test_many_tenants_are_named_until_their_reuse_clears_it():
    """The documented trade-off: 8 tenants round robin look per-request on their first round; the
    tenants' second requests reuse their subtrees and clear the finding."""
    f = FleetLedger()
    r = Replica(f, "a")
    seen = []
    for rnd in range(3):
        for k in range(8):
            _run([blocks(900 + k, 50, 51, 52, 2000 + 10 * rnd + k)], r)
            seen.append(r.view().dynamic_prefix is not None)
    assert any(seen[:8]) and not any(seen[11:])
