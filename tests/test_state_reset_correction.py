"""Reset-corrected counters, restart detection and the cachemon-computed windows."""
from __future__ import annotations

from helpers import REAL_032

from cachemon import catalog as C
from cachemon.normalise.normaliser import normalise_text
from cachemon.runtime.poller import to_update
from cachemon.state.store import Store
from cachemon.state.windows import RatioWindow

KEY = (C.QUERY_TOKENS.name, ("tiny", "0", "local"))
HKEY = (C.HIT_TOKENS.name, ("tiny", "0", "local"))


def page(scenario: str):
    return normalise_text((REAL_032 / f"metrics-{scenario}.txt").read_text())


def test_counters_keep_increasing_across_an_upstream_restart():
    store = Store({"1m": 60})
    st = store.upstream("u")
    assert st.apply(to_update(page("static-system-prompt")), 0.0) is None
    assert st.counters[KEY].value == 13296           # first sight: vLLM's own value
    assert st.apply(to_update(page("timestamp-in-system-prompt")), 1.0) is None
    assert st.counters[KEY].value == 26880
    # vLLM restarts: its counters are back at 0 (the idle page), cachemon's keep their total.
    reason = st.apply(to_update(page("idle")), 2.0)
    assert reason and st.restarts == 1
    assert st.counters[KEY].value == 26880
    st.apply(to_update(page("static-system-prompt")), 3.0)
    assert st.counters[KEY].value == 26880 + 13296
    assert st.counters[HKEY].value == 11520 + 11520


def test_restart_detected_from_created_timestamp_even_when_counters_grew_past():
    store = Store({"1m": 60})
    st = store.upstream("u")
    st.apply(to_update(page("static-system-prompt")), 0.0)
    later = page("request-id-at-head")        # counters above the previous poll ...
    for sig in later.created:
        later.created[sig] += 100.0           # ... but the process was re-created
    later.process_start_time = None
    reason = st.apply(to_update(later), 1.0)
    assert reason and "created timestamp changed" in reason
    assert st.restarts == 1
    # Everything the new process counted is added on top of the old total.
    assert st.counters[KEY].value == 13296 + 40627


def test_no_restart_on_steady_growth():
    store = Store({"1m": 60})
    st = store.upstream("u")
    for i, s in enumerate(["idle", "static-system-prompt", "timestamp-in-system-prompt", "request-id-at-head"]):
        st.apply(to_update(page(s)), float(i))
    assert st.restarts == 0
    assert st.counters[KEY].value == 40627


def test_window_ratio_over_real_scenarios():
    store = Store({"1m": 60, "5m": 300})
    st = store.upstream("u")
    st.apply(to_update(page("idle")), 0.0)
    st.apply(to_update(page("static-system-prompt")), 30.0)
    win = st.windows[("tiny", "0", "local")]
    h, q = win.ratio(60)
    assert (h, q) == (11520, 13296)
    st.apply(to_update(page("timestamp-in-system-prompt")), 100.0)
    # The last minute only saw the timestamp scenario: 13584 query tokens, 0 hits.
    assert win.ratio(60) == (0, 26880 - 13296)
    # Five minutes reach back to the idle page.
    assert win.ratio(300) == (11520, 26880)


def test_window_without_traffic_has_no_ratio():
    w = RatioWindow(300)
    w.add(0, 100, 200)
    assert w.ratio(60) is None
    w.add(10, 100, 200)
    assert w.ratio(60) is None


def test_window_keeps_bounded_points():
    w = RatioWindow(60)
    for t in range(0, 10000, 2):
        w.add(float(t), float(t), float(2 * t))
    assert len(w.points) <= 32
    assert w.ratio(60) == (60.0, 120.0)


def test_errors_drop_gauges_but_keep_counters():
    store = Store({"1m": 60})
    st = store.upstream("u")
    st.apply(to_update(page("static-system-prompt")), 0.0)
    st.record_error("refused", "cannot connect")
    assert not st.up and st.gauges == {}
    assert st.counters[KEY].value == 13296
    assert st.errors["refused"] == 1
