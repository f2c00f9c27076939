"""Reset-corrected counters, restart detection and the cachemon-computed windows."""
from __future__ import annotations

from cachemon import catalog as C
from cachemon.normalise.normaliser import normalise_text, to_update
from cachemon.state.store import Store
from cachemon.state.windows import RatioWindow
from helpers import REAL_032

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


def test_a_later_created_is_a_restart_when_the_counter_fell():
    """A moved *_created corroborates a fall of any size (a smaller fall alone is a glitch, held)."""
    store = Store({"1m": 60})
    st = store.upstream("u")
    st.apply(to_update(page("request-id-at-head")), 0.0)             # 40627 queries
    later = page("timestamp-in-system-prompt")                       # 26880: above half, below the last
    for smp in later.samples:
        if smp.created is not None:
            smp.created += 100.0                                     # the process was re-created
    later.process_start_time = None
    reason = st.apply(to_update(later), 1.0)
    assert reason and "created timestamp changed" in reason
    assert st.restarts == 1
    assert st.counters[KEY].value == 40627 + 26880                   # the new life added on top


def test_a_later_created_on_a_counter_that_did_not_fall_is_no_restart():
    """Issue 38 item 7: a *_created that moves while the counter rises is no new life (a new life starts
    from 0): the increase is the same life's, and the moved _created is refused, counted. On 74d8045 it was
    a restart, which added the page's whole value (13 296 + 40 627) for a true 40 627."""
    store = Store({"1m": 60})
    st = store.upstream("u")
    st.apply(to_update(page("static-system-prompt")), 0.0)
    later = page("request-id-at-head")        # counters above the previous poll ...
    for smp in later.samples:
        if smp.created is not None:
            smp.created += 100.0              # ... and a later _created
    later.process_start_time = None
    assert st.apply(to_update(later), 1.0) is None
    assert st.restarts == 0
    assert st.counters[KEY].value == 40627
    assert st.rejected["created_moved"] > 0


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


def test_snapshot_shows_each_source_series_and_its_resets():
    """The read API for diagnostics: per exported series, its source series with raw, offset, resets."""
    from helpers import exposition
    q = "ray_vllm:prefix_cache_queries_total"
    r1 = {"engine": "0", "model_name": "m", "ReplicaId": "r1"}
    r2 = {"engine": "0", "model_name": "m", "ReplicaId": "r2"}
    store = Store({"1m": 60})
    store.apply("u", to_update(normalise_text(exposition([(q, r1, 500.0), (q, r2, 300.0)]))), 0.0)
    reason = store.apply("u", to_update(normalise_text(exposition([(q, r1, 600.0), (q, r2, 20.0)]))), 1.0).restart
    assert reason == "prefix_cache_queries_total went down"
    key = (C.QUERY_TOKENS.name, ("m", "0", "local"))
    with store.read() as view:
        u = view.upstreams["u"]
        assert u.counters[key].value == 600 + 300 + 20
        by_replica = {dict(s.source.labels)["ReplicaId"]: s for s in u.sources.values() if s.key == key}
        assert (by_replica["r1"].last_raw, by_replica["r1"].offset, by_replica["r1"].resets) == (600, 0, 0)
        assert (by_replica["r2"].last_raw, by_replica["r2"].offset, by_replica["r2"].resets) == (20, 300, 1)
        assert u.restarts == 1


def test_a_created_that_moves_at_every_poll_while_the_counter_rises_counts_the_true_increase():
    """Issue 38 item 7 (CONSTRUCTED pages, vLLM 0.32.0's names): queries rise 1 000 -> 2 600 over 32 polls while
    every counter's _created moves one second later at each poll and process_start_time stays. The true
    increase (1 600) is exported; on 74d8045 each poll was a restart and 58 400 were added."""
    from helpers import exposition
    lab = {"model_name": "tiny", "engine": "0"}
    st = Store({"1m": 60}).upstream("u")
    for i in range(33):
        q, created = 1000.0 + 50 * i, 1.7e9 + i
        text = exposition([("vllm:prefix_cache_queries_total", lab, q), ("vllm:prefix_cache_queries_created", lab, created),
                           ("vllm:prefix_cache_hits_total", lab, q / 2), ("vllm:prefix_cache_hits_created", lab, created)],
                          process_start=1.7e9 - 60)
        st.apply(to_update(normalise_text(text)), float(i))
    assert st.restarts == 0
    assert st.counters[KEY].value - 1000 == 1600
    assert st.counters[HKEY].value - 500 == 800
    assert st.rejected["created_moved"] == 2 * 32
