"""New per-tenant series start at 0 (expose/new_series.py, kv_events.new_series_hold): what every scraper
reads off /metrics is monotonic, starts at 0, and Prometheus' increase() over it (counter resets included)
is the ledger's exact count.

The real captures (tests/fixtures/vllm-0.32.0-cpu-kv-events/tenants_alert and tenants_lora, a real vLLM
0.32.0) go through the live ledger and the real collector, rendered and parsed as a scrape; the clock is
the recording's. Where a test needs what the captures do not hold (a vLLM restart, a counter that goes
down at the source) the stream or values are CONSTRUCTED, and say so.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cachemon import catalog as C
from cachemon.config import KvEventsSettings, load_section
from cachemon.expose.kv_collector import KvLedgerCollector
from cachemon.expose.new_series import NewSeriesHold
from cachemon.expose.render import render
from cachemon.normalise.tenant_label import OTHER, salt_digest
from cachemon.state.kv_ledger import FleetLedger
from cachemon.state.kv_tenants import TenantLabels
from kv_support import messages, scenario

FAMILIES = {C.KV_TENANT_STORED_TOKENS.name, C.KV_TENANT_HIT_TOKENS.name, C.KV_TENANT_LABEL_OVERFLOW.name}
SALTS = {"t1": "test-salt-t1-constructed", "ts": "test-salt-ts-constructed"}     # the captures' test salts
KEY = b"new-series-test-key-0123"
STEP = 15.0
HOLD = 90.0

Series = tuple[str, tuple[tuple[str, str], ...]]


def _folder(name: str) -> Path:
    d = scenario(name)
    if not (d / "events.jsonl").is_file():
        pytest.skip(f"recording {d} not in this tree")
    return d


def _fleet(top_k: int = 100) -> FleetLedger:
    return FleetLedger(tenants=TenantLabels({salt_digest(s): t for t, s in SALTS.items()}, KEY, top_k))


def scrape(col: KvLedgerCollector) -> dict[Series, float]:
    """The per-tenant samples of one /metrics render, as a scraper parses them."""
    out = {}
    for fam in text_string_to_metric_families(render([col]).decode()):
        if fam.name in FAMILIES:
            for s in fam.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def pairs(values: list[float]) -> list[tuple[float, float]]:
    return list(zip(values, values[1:], strict=False))


def monotonic(values: list[float]) -> bool:
    return all(b >= a for a, b in pairs(values))


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


@pytest.mark.parametrize("name", ["tenants_alert", "tenants_lora"])
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
        assert values[-1] == truth[key] and increase(values) == truth[key], key
    assert any(v > 0 for v in truth.values()) and col.hold.held() == 0
    # the hold is what makes it so: without it, the first scrape of a tenant already counts
    fleet0 = _fleet()
    seen0, _ = run(d, fleet0, {"prom": 0.0}, 0.0)
    lost = {k: v[0] for k, v in by_series(seen0["prom"]).items() if v[0]}
    assert lost and all(increase(by_series(seen0["prom"])[k]) == truth[k] - v for k, v in lost.items())


@pytest.mark.parametrize("phase", [1.0, 7.5, 14.0])
def test_a_second_prometheus_scraping_the_same_sidecar_sees_the_zero_too(phase):
    """An HA pair: two scrapers, 15 s apart each, at different phases, one collector. The hold is a time
    (90 s > 15 s), not "the first scrape", so each one's first sample of every series is 0 and each one's
    increase() is the exact count."""
    d = _folder("tenants_alert")
    fleet = _fleet()
    seen, _ = run(d, fleet, {"prom-a": 0.0, "prom-b": phase}, HOLD)
    truth = exact(fleet)
    for name in ("prom-a", "prom-b"):
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
    for key, values in by_series(scrapes).items():
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
