"""New series of the KV ledger start at 0 (expose/new_series.py, kv_events.new_series_hold): a replica's
counters (stored tokens by reason, reused tokens, anomalies, history evictions, the lifetime and depth
histograms, its tiers') and its tenants': what every scraper reads off /metrics is monotonic, starts at 0,
and Prometheus' increase() over it (counter resets included) is the ledger's exact count.

The real captures (tests/fixtures/vllm-0.32.0-cpu-kv-events/tenants_alert, tenants_lora and
full_report_bursts, vllm-0.32.0-cpu-offloading/cpu_offload_hostcopy, a real vLLM 0.32.0) go through the
live ledger and the real collector, rendered and parsed as a scrape; the clock is the recording's. Where
a test needs what the captures do not hold (a vLLM restart, a model switch, a counter that goes down at
the source) the stream or values are CONSTRUCTED, and say so.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from assert_support import nonempty
from cachemon import catalog as C
from cachemon.config import KvEventsSettings, load_section
from cachemon.expose.kv_collector import KvLedgerCollector
from cachemon.expose.new_series import NewSeriesHold
from cachemon.expose.render import render
from cachemon.normalise.tenant_label import OTHER, salt_digest
from cachemon.state.ledger.fleet import FleetLedger
from cachemon.state.ledger.tenants import TenantLabels
from helpers import FIXTURES
from kv_support import messages, scenario

TENANT_FAMILIES = {C.KV_TENANT_STORED_TOKENS.name, C.KV_TENANT_HIT_TOKENS.name, C.KV_TENANT_LABEL_OVERFLOW.name}
# the replica's own counters (histograms: their buckets, _sum and _count are counters too)
LEDGER_FAMILIES = {s.name for s in (C.KV_STORED_TOKENS, C.KV_REUSED_TOKENS, C.KV_LEDGER_ANOMALIES, C.KV_HISTORY_EVICTED,
                                    C.KV_BLOCK_LIFETIME, C.KV_DIVERGENCE_DEPTH, C.KV_TIER_STORED_BLOCKS,
                                    C.KV_TIER_REMOVED_BLOCKS, C.KV_TIER_HIT_TOKENS)}
FAMILIES = TENANT_FAMILIES | LEDGER_FAMILIES
OFFLOAD = FIXTURES / "vllm-0.32.0-cpu-offloading" / "cpu_offload_hostcopy"
SALTS = {"t1": "test-salt-t1-constructed", "ts": "test-salt-ts-constructed"}     # the captures' test salts
KEY = b"new-series-test-key-0123"
STEP = 15.0
HOLD = 90.0

Series = tuple[str, tuple[tuple[str, str], ...]]


def _present(d: Path) -> Path:
    if not (d / "events.jsonl").is_file():
        pytest.skip(f"recording {d} not in this tree")
    return d


def _folder(name: str) -> Path:
    return _present(scenario(name))


def _fleet(top_k: int = 100) -> FleetLedger:
    # the captures' full-mode requests (kv_events.full_reports: true)
    return FleetLedger(tenants=TenantLabels({salt_digest(s): t for t, s in SALTS.items()}, KEY, top_k),
                       full_reports=True)


def scrape(col: KvLedgerCollector, families: set[str] = FAMILIES) -> dict[Series, float]:
    """The ledger's counter samples of one /metrics render (``families``), as a scraper parses them."""
    out = {}
    for fam in text_string_to_metric_families(render([col]).decode()):
        if fam.name in families:
            for s in fam.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def pairs(values: list[float]) -> list[tuple[float, float]]:
    return list(zip(values, values[1:], strict=False))


def monotonic(values: list[float]) -> bool:
    return all(b >= a for a, b in pairs(values))


def pick(scraped: dict[Series, float], name: str, **labels: str) -> float:
    """The one sample ``name`` whose labels include ``labels``."""
    (v,) = [v for (n, ls), v in scraped.items() if n == name and labels.items() <= dict(ls).items()]
    return v


def exactly(value: float) -> object:
    """A count, exactly; a histogram's _sum (seconds, a float) summed from its increments, to rounding."""
    return pytest.approx(value, rel=1e-12, abs=0)


def increase(values: list[float]) -> float:
    """Prometheus' increase() over a series' samples, without extrapolation: what it gained between
    consecutive samples, a drop read as a counter reset (the new value counted from 0)."""
    return sum(b - a if b >= a else b for a, b in pairs(values))


def feed(folder: Path, fleet: FleetLedger, times: list[float], on_time: Callable[[float], None],
         start: int = 0, stop: int | None = None) -> None:
    """Feed the capture's messages[start:stop] to ``fleet``, calling ``on_time(t)`` at each of ``times``
    (recording seconds) once every message up to ``t`` is in."""
    msgs = messages(folder)[start:stop]
    k = 0
    for t in times:
        while k < len(msgs) and msgs[k]["t"] <= t:
            fleet.on_batch(msgs[k]["replica"], "tiny", msgs[k]["batch"], msgs[k]["t"])
            k += 1
        on_time(t)
    assert k == len(msgs)


def run(folder: Path, fleet: FleetLedger, scrapers: dict[str, float], hold: float, after: float = 400.0,
        start: int = 0, stop: int | None = None) -> tuple[dict[str, list[dict[Series, float]]], KvLedgerCollector]:
    """Scrapers (name -> phase in seconds) each rendering /metrics every STEP of the recording, all on one
    collector (one sidecar): each one's list of scrapes."""
    msgs = messages(folder)[start:stop]
    t0, t1 = msgs[0]["t"] - 1, msgs[-1]["t"] + after
    clock = [t0]
    col = KvLedgerCollector(fleet, NewSeriesHold(hold, clock=lambda: clock[0]))
    times = sorted((t0 + phase + k * STEP, name) for name, phase in scrapers.items()
                   for k in range(int((t1 - t0) // STEP) + 1))
    seen: dict[str, list[dict[Series, float]]] = {name: [] for name in scrapers}

    def at(t: float) -> None:
        clock[0] = t
        for name in [n for tt, n in times if tt == t]:
            seen[name].append(scrape(col))
    feed(folder, fleet, sorted({t for t, _ in times}), at, start, stop)
    return seen, col


def by_series(scrapes: list[dict[Series, float]]) -> dict[Series, list[float]]:
    out: dict[Series, list[float]] = {}
    for s in scrapes:
        for k, v in s.items():
            out.setdefault(k, []).append(v)
    return out


def exact(fleet: FleetLedger) -> dict[Series, float]:
    return scrape(KvLedgerCollector(fleet))


@pytest.mark.parametrize("name", ["tenants_alert", "tenants_lora", "full_report_bursts"])
def test_every_series_starts_at_zero_never_goes_down_and_increase_is_the_exact_count(name):
    d = _folder(name)
    fleet = _fleet()
    seen, col = run(d, fleet, {"prom": 0.0}, HOLD)
    truth = exact(fleet)
    series = by_series(seen["prom"])
    assert set(series) == set(truth) and len(truth) > 20
    for key, values in series.items():
        assert values[0] == 0, key
        assert monotonic(values), key
        assert values[-1] == truth[key] and increase(values) == exactly(truth[key]), key
    assert any(v > 0 for v in truth.values()) and col.hold.held() == 0
    # the hold is what makes it so: without it, the first scrape of a tenant or a replica already counts
    fleet0 = _fleet()
    seen0, _ = run(d, fleet0, {"prom": 0.0}, 0.0)
    lost = {k: v[0] for k, v in by_series(seen0["prom"]).items() if v[0]}
    assert lost and all(increase(by_series(seen0["prom"])[k]) == exactly(truth[k] - v) for k, v in lost.items())
    # the replica's own stored tokens among them (before the hold covered them, they were lost too)
    assert any(k[0] == C.KV_STORED_TOKENS.sample_name for k in lost)


def _whole(folder: Path) -> FleetLedger:
    """The whole capture in the ledger before the first render (what a sidecar has seen by its first scrape);
    full_report_bursts' clients send full reports (kv_events.full_reports: true)."""
    fleet = FleetLedger(full_reports=True)
    for m in messages(_present(folder)):
        fleet.on_batch(m["replica"], "tiny", m["batch"], m["t"])
    return fleet


@pytest.mark.parametrize("folder", [scenario("full_report_bursts"), OFFLOAD], ids=["full_report_bursts", "offload"])
def test_a_replicas_counters_are_0_for_the_hold_then_exactly_the_ledgers_counts(folder):
    """The whole capture already in the ledger at the first render: with hold H every counter of the replica
    (stored by reason, reused, anomalies, histories, histograms, tiers) is 0 from that render until H later,
    then exactly the ledger's count (what hold 0, the old collector, served at once: the check below that
    the counts are not 0 is what the old behaviour fails on the held collector). Gauges are not held."""
    fleet = _whole(folder)
    truth = scrape(KvLedgerCollector(fleet), LEDGER_FAMILIES)         # hold 0: the counts at once
    stored = {dict(k[1])["reason"]: v for k, v in truth.items() if k[0] == C.KV_STORED_TOKENS.sample_name}
    kinds = {dict(k[1])["kind"]: v for k, v in truth.items() if k[0] == C.KV_LEDGER_ANOMALIES.sample_name}
    life_count = pick(truth, C.KV_BLOCK_LIFETIME.name + "_count")
    if folder == OFFLOAD:
        # the silent reset of the CPU tier (tests/test_kv_tiers_real.py): one anomaly, once
        assert kinds["tier_unannounced_clears"] == 1 and stored["reset"] > 0
        assert pick(truth, C.KV_TIER_STORED_BLOCKS.sample_name, medium="CPU") > 0
        assert pick(truth, C.KV_TIER_HIT_TOKENS.sample_name, medium="CPU") > 0
    else:
        # the capture's own figures (full reports: reused tokens; one ambiguous report; 40 evictions)
        assert stored["first"] == 6144 and stored["capacity"] == 2944
        assert pick(truth, C.KV_REUSED_TOKENS.sample_name) == 21632
        assert kinds["ambiguous_reports"] == 1 and life_count == 40
        assert pick(truth, C.KV_DIVERGENCE_DEPTH.name + "_count") == 15
    clock = [1000.0]
    col = KvLedgerCollector(fleet, NewSeriesHold(HOLD, clock=lambda: clock[0]))
    for at in (1000.0, 1030.0, 1000.0 + HOLD - 0.001):
        clock[0] = at
        shown = scrape(col, LEDGER_FAMILIES)
        assert set(shown) == set(truth) and all(v == 0 for v in shown.values()), at
    gauges = {f.name: f for f in text_string_to_metric_families(render([col]).decode())}
    (cached,) = gauges[C.KV_CACHED_BLOCKS.name].samples
    assert cached.value == fleet.snapshot()[0].cached_blocks > 0                   # a gauge: served as it is
    clock[0] = 1000.0 + HOLD
    assert scrape(col, LEDGER_FAMILIES) == truth and col.hold.held() == 0
    clock[0] = 5000.0
    assert scrape(col, LEDGER_FAMILIES) == truth
    assert any(v > 0 for v in truth.values()) and life_count > 0


def test_an_alert_on_increase_of_the_anomalies_sees_a_one_off_anomaly_only_with_the_hold():
    """full_report_bursts: the replica's one ambiguous report (an anomaly) comes within the capture's
    first 7 s, before the replica's first scrape. Scraped every 15 s (recording clock), increase() of
    cachemon_kv_ledger_anomalies_total{kind="ambiguous_reports"} is 1 with the hold and 0 without it: an
    alert ``increase(...[5m]) > 0`` missed it, as it missed every other first count of the replica."""
    d = _folder("full_report_bursts")
    for hold, want in nonempty(((HOLD, 1.0), (0.0, 0.0))):
        seen, _ = run(d, _fleet(), {"prom": 0.0}, hold)
        series = by_series(seen["prom"])
        (key,) = [k for k in series if k[0] == C.KV_LEDGER_ANOMALIES.sample_name
                  and dict(k[1])["kind"] == "ambiguous_reports"]
        assert series[key][-1] == 1.0 and increase(series[key]) == want, hold
        reused = [v for k, v in series.items() if k[0] == C.KV_REUSED_TOKENS.sample_name]
        assert [increase(v) for v in reused] == [21632.0 if hold else 0.0]


@pytest.mark.parametrize("phase", [1.0, 7.5, 14.0])
def test_a_second_prometheus_scraping_the_same_sidecar_sees_the_zero_too(phase):
    """An HA pair: two scrapers, 15 s apart each, at different phases, one collector. The hold is a time
    (90 s > 15 s), not "the first scrape", so each one's first sample of every series is 0 and each one's
    increase() is the exact count."""
    d = _folder("tenants_alert")
    fleet = _fleet()
    seen, _ = run(d, fleet, {"prom-a": 0.0, "prom-b": phase}, HOLD)
    truth = exact(fleet)
    for name in nonempty(("prom-a", "prom-b")):
        series = by_series(seen[name])
        assert set(series) == set(truth)
        for key, values in series.items():
            assert values[0] == 0 and increase(values) == truth[key], (name, key)


def test_a_hold_shorter_than_the_scrape_interval_can_hide_the_zero_from_the_second_scraper():
    """Why the hold is a time longer than the scrape interval: at 5 s (< 15 s) the scraper whose phase
    comes second (10 s after or 5 s after the other) finds a series already released, the other one's render
having started the hold."""
    d = _folder("tenants_alert")
    fleet = _fleet()
    seen, _ = run(d, fleet, {"prom-a": 0.0, "prom-b": 10.0}, 5.0)
    missed = {name: [k for k, v in by_series(seen[name]).items() if v[0] > 0] for name in seen}
    assert any(missed.values()), missed


def test_top_k_folding_keeps_other_monotonic_and_starting_at_zero():
    """tenant_top_k 1 on tenants_alert: of the two hashed tenants (t2, t3) the first keeps its series, the
    second is folded into tenant="other" for good (first come, first served: a series never moves, so
    "other" never gives anything back). Every series, "other" and the overflow counter included, starts at
    0, never goes down, and its increase() is the exact count."""
    d = _folder("tenants_alert")
    fleet = _fleet(top_k=1)
    seen, _ = run(d, fleet, {"prom": 0.0}, HOLD)
    truth = exact(fleet)
    series = by_series(seen["prom"])
    tenants = {dict(k[1]).get("tenant") for k in series}
    assert OTHER in tenants and sum(t.startswith("h-") for t in tenants if t) == 1
    over = [k for k in series if k[0] == C.KV_TENANT_LABEL_OVERFLOW.sample_name]
    assert over and truth[over[0]] > 0
    for key, values in series.items():
        assert values[0] == 0 and monotonic(values), key
        assert increase(values) == truth[key], key
    other = [v for k, v in series.items() if dict(k[1]).get("tenant") == OTHER and v[-1] > 0]
    assert other


def test_a_cachemon_restart_starts_every_series_over_at_zero_and_increase_counts_both_lives():
    """A cachemon restart halfway through tenants_alert: a new process (a new ledger, a new collector)
    follows the second half. Its series start at 0 again (a counter reset to Prometheus); increase() over
    both lives is the first process's final count plus the second's."""
    d = _folder("tenants_alert")
    half = len(messages(d)) // 2
    f1, f2 = _fleet(), _fleet()
    seen1, _ = run(d, f1, {"prom": 0.0}, HOLD, after=30.0, stop=half)
    seen2, _ = run(d, f2, {"prom": 0.0}, HOLD, start=half)
    t1, t2 = exact(f1), exact(f2)
    both = by_series(seen1["prom"] + seen2["prom"])
    assert set(t1) <= set(both) and set(t2) <= set(both)
    assert any(t1.get(k, 0) and t2.get(k, 0) for k in both)       # series counting in both lives
    for key, values in both.items():
        assert increase(values) == t1.get(key, 0) + t2.get(key, 0), key
    second = by_series(seen2["prom"])
    assert all(v[0] == 0 for v in second.values())


def restarted_halfway(fleet: FleetLedger, second_model: str) -> tuple[list[dict[Series, float]], dict[Series, float]]:
    """tenants_alert through ``fleet``, a vLLM restart halfway (CONSTRUCTED: on_restart before the middle
    message) after which the replica serves ``second_model``; /metrics rendered every STEP of the
    recording and once more 10 steps after: (the scrapes, the exact counts at the restart)."""
    msgs = messages(_folder("tenants_alert"))
    clock = [msgs[0]["t"]]
    col = KvLedgerCollector(fleet, NewSeriesHold(HOLD, clock=lambda: clock[0]))
    scrapes, at_restart = [], {}
    for i, m in enumerate(msgs):
        if i == len(msgs) // 2:
            at_restart = exact(fleet)
            fleet.on_restart(m["replica"], m["t"])
        fleet.on_batch(m["replica"], "tiny" if i < len(msgs) // 2 else second_model, m["batch"], m["t"])
        if m["t"] >= clock[0] + STEP:
            clock[0] = m["t"]
            scrapes.append(scrape(col))
    clock[0] += 10 * STEP
    scrapes.append(scrape(col))
    return scrapes, at_restart


def test_a_vllm_restart_does_not_start_a_series_over():
    """The ledger keeps a tenant's counts across a vLLM restart (the replica's new process): the series
    continues, released, never held at 0 again (that would count its history twice)."""
    fleet = _fleet()
    scrapes, _ = restarted_halfway(fleet, "tiny")
    truth = exact(fleet)
    for key, values in nonempty(by_series(scrapes).items()):
        assert values[0] == 0 and monotonic(values), key
        assert increase(values) == truth[key], key


def test_a_replica_back_with_another_model_does_not_count_its_history_as_the_new_models():
    """The ledger keeps a replica's tenant counts when it comes back serving another model: its pairs show up
    under the new model_name with the old model's history in them. Those series are served at once (as
    before the hold), never at 0 first: increase() under the new model is then at most what the tenants
    did under it."""
    fleet = _fleet()
    scrapes, at_switch = restarted_halfway(fleet, "tiny-2")
    truth = exact(fleet)
    moved = 0
    for key, values in by_series(scrapes).items():
        labels = dict(key[1])
        assert monotonic(values), key
        if labels.get("model_name") == "tiny-2":
            old = dict(key[1], model_name="tiny")
            before = at_switch.get((key[0], tuple(sorted(old.items()))), 0.0)
            assert increase(values) <= truth[key] - before, key
            moved += before > 0
    assert moved


def test_a_replica_back_with_another_model_continues_its_tiers_series_at_once():
    """cpu_offload_hostcopy (43 s of a real CPU tier) with the model switched halfway (CONSTRUCTED: the
    second half's batches under "tiny-2"), scraped every second with a 5 s hold: the replica's own and its
    tier's counts go on under the new model_name; released before the switch, they are served at once, so
    increase() under "tiny-2" never counts what was stored, removed or loaded under "tiny"."""
    msgs = messages(_present(OFFLOAD))
    fleet = FleetLedger()
    clock = [msgs[0]["t"]]
    col = KvLedgerCollector(fleet, NewSeriesHold(5.0, clock=lambda: clock[0]))
    scrapes, before = [], {}
    for i, m in enumerate(msgs):
        if i == len(msgs) // 2:
            before = scrape(KvLedgerCollector(fleet), LEDGER_FAMILIES)
        fleet.on_batch(m["replica"], "tiny" if i < len(msgs) // 2 else "tiny-2", m["batch"], m["t"])
        while clock[0] + 1.0 <= m["t"]:
            clock[0] += 1.0
            scrapes.append(scrape(col, LEDGER_FAMILIES))
    clock[0] += 10.0
    scrapes.append(scrape(col, LEDGER_FAMILIES))
    truth = scrape(KvLedgerCollector(fleet), LEDGER_FAMILIES)
    moved = set()
    for key, values in by_series(scrapes).items():
        labels = dict(key[1])
        assert monotonic(values), key
        if labels.get("model_name") == "tiny-2":
            was = before.get((key[0], tuple(sorted(dict(labels, model_name="tiny").items()))), 0.0)
            assert increase(values) <= truth[key] - was + 1e-9, key
            if was > 0:
                moved.add(key[0])
    assert {C.KV_TIER_STORED_BLOCKS.sample_name, C.KV_STORED_TOKENS.sample_name} <= moved


def test_the_hold_itself():
    """CONSTRUCTED values on a constructed clock: held at 0 until ``hold`` seconds after the first render that
    saw the group; then the values; a group that comes back with counts at least as high continues; one
    whose counts went down (a reset at the source) is held at 0 again; hold 0 shows values at once."""
    now = [100.0]
    h = NewSeriesHold(30.0, clock=lambda: now[0])
    assert h.values("a", (5, 1), h.begin()) == (0, 0) and h.held() == 1
    now[0] = 129.9
    assert h.values("a", (6, 1), h.begin()) == (0, 0)
    now[0] = 130.0
    assert h.values("a", (7, 2), h.begin()) == (7, 2) and h.held() == 0
    now[0] = 500.0                                         # gone from a few renders, back with more: continues
    assert h.values("a", (9, 2), h.begin()) == (9, 2)
    assert h.values("a", (3, 2), h.begin()) == (0, 0)      # went down: a reset, from 0 again
    now[0] = 530.0
    assert h.values("a", (4, 2), h.begin()) == (4, 2)
    assert NewSeriesHold(0.0).values("b", (5.0,), 0.0) == (5.0,)
    # a group carrying a released group's counts under new labels (same lineage): served at once
    now[0] = 600.0
    assert h.values("a2", (4, 3), h.begin(), lineage="L") == (0, 0)          # lineage L not released yet
    now[0] = 630.0
    assert h.values("a2", (5, 3), h.begin(), lineage="L") == (5, 3)
    assert h.values("a3", (6, 3), h.begin(), lineage="L") == (6, 3)
    with pytest.raises(ValueError):
        NewSeriesHold(-1.0)


def test_the_setting():
    assert KvEventsSettings().new_series_hold == HOLD
    assert load_section(KvEventsSettings, {"new_series_hold": "0"}, "kv_events").new_series_hold == 0
    assert load_section(KvEventsSettings, {"new_series_hold": "2m"}, "kv_events").new_series_hold == 120
