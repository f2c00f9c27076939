"""The causes `cachemon demo` names during each phase are that phase's real cause.

The demo runs in this process, time-scaled (``start_demo``, the same call `cachemon demo` makes: the
fake vLLM of real captures, the real KV-event replay, the exporter), and cachemon's own /metrics is
read once per poll through a first round and into the second, each sample with the phase the
demo's schedule was in. The phases' real causes (docs/demo.md):

- idle: none;
- the first static-system-prompt phase: ``cold_cache``, the process's first traffic, at its start only;
- timestamp-in-system-prompt and request-id-at-head: ``dynamic_prefix`` (exact, from the KV ledger);
- the second static phase: nothing once the timestamp's misses have left the trailing window.

``cold_cache`` is never named after the first phase with traffic: the cache is warm, the demo's
vLLM never restarts.
"""
from __future__ import annotations

import threading
import urllib.request
from collections import defaultdict

import pytest

from cachemon import catalog as C
from cachemon.demo.command import scaled_attribution
from helpers import eventually, samples

SCALE = 0.05          # a round is 45 s: static 12 s, timestamp 27 s, request ID 6 s
POLL = "500ms"


def _active(url: str) -> frozenset[str]:
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return frozenset(dict(labels)["cause"] for (name, labels), v in samples(text).items()
                     if name == C.CAUSE_ACTIVE.sample_name and v == 1)


@pytest.fixture(scope="module")
def timeline():
    """[(phase number, phase scenario, seconds into the phase, active causes)], one per poll."""
    pytest.importorskip("zmq")
    from cachemon.demo.command import start_demo
    traffic, replay, publisher, daemon, note = start_demo("127.0.0.1:0", "127.0.0.1:0", True, SCALE, None, POLL)
    assert publisher is not None, note
    url = f"http://127.0.0.1:{daemon.port}/metrics"
    eventually(lambda: urllib.request.urlopen(url, timeout=5).status == 200, what="cachemon's /metrics")
    out = []
    tick = threading.Event()
    try:
        while True:
            number, _, phase, into, _ = traffic.position()
            if number > len(traffic.round) + 1:          # the second static phase seen whole: done
                break
            out.append((number, phase.scenario, into, _active(url)))
            tick.wait(0.5)                               # one sample per poll: a timeline, no state awaited
    finally:
        daemon.shutdown()
        publisher.stop()
        replay.stop()
    return out


def _phase(timeline, number):
    rows = [(into, act) for n, _, into, act in timeline if n == number]
    assert len(rows) >= 2, f"phase {number}: {len(rows)} samples"
    return rows


def _named(rows) -> set[str]:
    return set().union(*(act for _, act in rows))


@pytest.mark.slow
def test_each_phase_names_its_real_cause_and_cold_cache_only_at_the_first_traffic(timeline):
    scenarios = {n: s for n, s, _, _ in timeline}
    assert [scenarios[n] for n in sorted(scenarios)] == [
        "idle", "static-system-prompt", "timestamp-in-system-prompt", "request-id-at-head", "static-system-prompt"]
    by_phase = defaultdict(list)
    for n, _, into, act in timeline:
        by_phase[n].append((into, sorted(act)))
    shown = "\n".join(f"{scenarios[n]}: {rows}" for n, rows in sorted(by_phase.items()))

    assert _named(_phase(timeline, 0)) == set(), shown
    # the first traffic of the process: a cold cache, and nothing else
    static = _phase(timeline, 1)
    assert _named(static) == {"cold_cache"}, shown
    assert not static[-1][1], shown                     # ... at its start only: gone before the phase ends
    # the timestamp and the request ID at the head: the dynamic prefix, and never a cold cache
    for number in (2, 3):
        rows = _phase(timeline, number)
        assert _named(rows) == {"dynamic_prefix"}, shown
        assert rows[-1][1] == {"dynamic_prefix"}, shown
    # once the ledger has seen enough requests to be sure (about 10, at the captured ~1 a second), it stays
    # named through the timestamp and request-ID phases: no gap, no flapping
    head = [act for n, _, _, act in timeline if n in (2, 3)]
    first = next(i for i, act in enumerate(head) if act)
    assert all(act == {"dynamic_prefix"} for act in head[first:]), shown
    # back to the static prompt: the dynamic prefix stays while its misses are in the trailing window
    # and the hold-down, then nothing; the cache is warm, so no cold cache
    att = scaled_attribution(SCALE, 0.5)
    lag = (att.window or 0) + att.hold_down + 2 * 0.5
    again = _phase(timeline, 4)
    assert _named(again) <= {"dynamic_prefix"}, shown
    assert all(not act for into, act in again if into > lag), shown
    assert not any("cold_cache" in act for n, _, _, act in timeline if n >= 2), shown


def test_the_exporter_timings_play_as_fast_as_the_phases():
    full = scaled_attribution(1, 1.0)
    assert (full.window, full.hold_down, full.lookback) == (None, 30.0, 900.0)    # production's defaults
    fast = scaled_attribution(1 / 15, 1.0)
    assert fast.window == pytest.approx(4.0) and fast.hold_down == pytest.approx(2.0)
    assert fast.lookback == pytest.approx(60.0)
    # never below what a poll can see
    tiny = scaled_attribution(0.001, 1.0)
    assert (tiny.window, tiny.hold_down, tiny.lookback) == (4.0, 1.0, 4.0)
