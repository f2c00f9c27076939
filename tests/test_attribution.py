"""The attribution engine (judge/attribute.py) and its two users, `check` and the exporter stage,
which reach it by one route: the store, then the one snapshot builder (judge/snapshots.py).

Real data: the vLLM 0.32.0 / 0.8.5 captures in tests/fixtures (pages read as recorded). Cases marked
CONSTRUCTED build a snapshot or edit a real page; each says what it changes.
"""
from __future__ import annotations

import time
from dataclasses import replace

import pytest

from cachemon import catalog as C
from cachemon.check import JUDGED_KINDS, check_upstream, check_upstreams, exit_code
from cachemon.daemon import Daemon
from cachemon.demo.replay import ReplayServer, load_pages
from cachemon.judge import attribute as A
from cachemon.judge.snapshots import SnapshotBuilder, read_store
from cachemon.normalise.log_grammar import reset_event
from cachemon.normalise.log_stream import LogStream
from cachemon.normalise.normaliser import Normalised, normalise_text, to_update
from cachemon.runconfig import from_dict
from cachemon.runtime.attribution_stage import AttributionSettings, Attributor
from cachemon.runtime.change_detector import _cache_config_of
from cachemon.state.store import Store
from helpers import FIXTURES, REAL_032, read_fixture, wait_until

V0 = FIXTURES / "vllm-0.8.5-cpu-v0-show-hidden-0.7"


def real(name: str):
    return normalise_text((REAL_032 / f"metrics-{name}.txt").read_text(encoding="utf-8"))


def snapshots(name: str, first: Normalised, last: Normalised, seconds: float, now: float) -> list[A.ModelSnapshot]:
    """Two reads of a page, ``seconds`` apart, as check's pollers fold them into the store, then the
    snapshots the shared builder cuts from it (what check asks the engine about)."""
    from cachemon.state.events import EventKind, EventLog
    events = EventLog()
    store, builder = Store({"1m": 60.0}), SnapshotBuilder(AttributionSettings(), kinds=JUDGED_KINDS, events=events)
    for page, t in ((first, now - seconds), (last, now)):
        restart = store.apply(name, to_update(page), t).restart
        if restart:          # as check's poller publishes it
            events.publish(EventKind.RESTART, name, t, restart)
        snaps = builder.build(read_store(store), t)
    return snaps


def judge(first: str, last: str, seconds: float = 30.0) -> A.Attribution:
    [snap] = snapshots("vllm", real(first), real(last), seconds, time.time())
    return A.attribute(snap)


# --- the engine on real captures ------------------------------------------------------------------

def test_static_system_prompt_interval_is_healthy_with_a_cold_cache_only():
    # v2 (intended change): the idle page then 16 requests is this process's first traffic: its first
    # request missed all 831 tokens because nothing was cached yet. That cost is named (cold_cache),
    # with no severity: the ratio is healthy.
    a = judge("idle", "static-system-prompt")
    assert a.basis == "interval" and a.ratio == pytest.approx(11520 / 13296)
    assert a.severity is None and a.codes == (A.CauseCode.COLD_CACHE,)
    [cold] = a.causes
    # an upper bound: every miss of the interval (831 + 15 uncacheable 63-token tails = 1776)
    assert (cold.certainty, cold.tokens, cold.tokens_certainty) == ("measured", 13296 - 11520, "estimated")
    # the same traffic on a process that had traffic before is no cold cache
    [snap] = snapshots("vllm", real("static-system-prompt"), real("static-system-prompt"), 30.0, time.time())
    assert snap.first_traffic_at is None


def test_timestamp_at_the_head_is_a_dynamic_prefix_with_the_analyze_line():
    a = judge("static-system-prompt", "timestamp-in-system-prompt")
    assert a.ratio == 0.0 and a.severity == "critical"
    assert a.codes == (A.CauseCode.DYNAMIC_PREFIX,)
    msg = a.causes[0].message
    assert "cachemon analyze REQUESTS.jsonl --tokenizer" in msg and "--block-size 128 --redact" in msg
    assert a.causes[0].certainty == "heuristic"


def test_request_id_at_the_head_is_a_dynamic_prefix_too():
    assert judge("timestamp-in-system-prompt", "request-id-at-head").codes == (A.CauseCode.DYNAMIC_PREFIX,)


def test_real_prompt_length_histogram_is_above_one_block():
    [snap] = snapshots("vllm", real("idle"), real("static-system-prompt"), 30.0, time.time())
    assert snap.block_size == 128 and snap.pool_tokens == 16384 * 128
    # 16 prompts of 831 tokens: all in the (500, 1000] bucket
    assert dict(snap.interval_prompt_buckets)[500.0] == 0 and dict(snap.interval_prompt_buckets)[1000.0] == 16
    assert A.short_prompt_fraction(snap.interval_prompt_buckets, 128) == 0.0


def test_restart_between_reads_explains_the_drop_not_a_dynamic_prefix():
    # the idle page after the busy one: a different process whose every counter fell (a corroborated
    # restart, as the store requires since issue 17; both pages recorded)
    first, last = real("timestamp-in-system-prompt"), real("idle")
    last.process_start_time = (first.process_start_time or 0) + 60     # CONSTRUCTED: a new process start time
    [snap] = snapshots("vllm", first, last, 30.0, time.time())
    assert A.attribute(snap).codes == (A.CauseCode.RESTART,)
    # the counters restarted from zero: the interval is what the new process counted, not a negative delta
    assert snap.interval_query_tokens == 0 and snap.interval_hit_tokens == 0
    # a new start time whose counters did not all fall is held (a restart, or a second process behind
    # the URL: the next page tells): the daemon's rule, and now check's
    first, last = real("static-system-prompt"), real("timestamp-in-system-prompt")
    last.process_start_time = (first.process_start_time or 0) + 60     # CONSTRUCTED: a new process start time
    [snap] = snapshots("vllm", first, last, 30.0, time.time())
    assert snap.interval_query_tokens == 0 and A.CauseCode.RESTART not in A.attribute(snap).codes


# --- constructed cases (each builds the one signal it tests) -----------------------------------------

BASE = A.ModelSnapshot(upstream="u", model="m", now=1000.0, prefix_caching="true", block_size=16,
                       since_start_query_tokens=1e5, since_start_hit_tokens=5e4, interval_seconds=60.0,
                       interval_query_tokens=10000.0, interval_hit_tokens=0.0, interval_preemptions=0.0,
                       interval_prompt_buckets=((10.0, 0.0), (20.0, 0.0), (50.0, 0.0), (+1e309, 40.0)),
                       kv_usage=0.3, pool_tokens=1e6)


def test_constructed_short_prompts():
    s = replace(BASE, interval_prompt_buckets=((10.0, 30.0), (20.0, 38.0), (50.0, 40.0), (float("inf"), 40.0)))
    assert A.attribute(s).codes == (A.CauseCode.SHORT_PROMPTS,)
    # bucket bound above the block size: not certainly short, so not claimed
    s = replace(BASE, interval_prompt_buckets=((10.0, 0.0), (20.0, 38.0), (50.0, 40.0), (float("inf"), 40.0)))
    assert A.CauseCode.SHORT_PROMPTS not in A.attribute(s).codes


def test_constructed_capacity_from_preemptions_usage_evictions_and_pool():
    assert A.attribute(replace(BASE, interval_preemptions=10.0)).codes == (A.CauseCode.CAPACITY,)
    assert A.attribute(replace(BASE, kv_usage=0.99)).codes == (A.CauseCode.CAPACITY,)
    assert A.attribute(replace(BASE, interval_evictions=50.0)).causes[0].certainty == "measured"
    pool = A.attribute(replace(BASE, pool_tokens=2048.0))
    assert pool.codes == (A.CauseCode.CAPACITY,) and pool.causes[0].certainty == "heuristic"


def test_constructed_preemption_inflated_hits_only_when_the_ratio_looks_fine():
    s = replace(BASE, interval_hit_tokens=9500.0, interval_preemptions=20.0)
    a = A.attribute(s)
    assert a.severity is None and a.codes == (A.CauseCode.PREEMPTION_INFLATED,)


def test_constructed_events_within_the_lookback_only():
    ev = (A.Event("cache_reset", 900.0, "vLLM log"), A.Event("change", 950.0, "version"))
    a = A.attribute(replace(BASE, events=ev))
    assert a.codes == (A.CauseCode.CACHE_RESET, A.CauseCode.CHANGE) and "version changed" in a.causes[1].message
    assert A.attribute(replace(BASE, events=ev), lookback=10.0).codes == (A.CauseCode.DYNAMIC_PREFIX,)


def test_constructed_logged_reset_supersedes_the_heuristic():
    heuristic = (A.Event("cache_reset_suspected", 990.0),)
    a = A.attribute(replace(BASE, events=heuristic))
    assert a.codes == (A.CauseCode.CACHE_RESET_SUSPECTED,) and a.causes[0].certainty == "heuristic"
    both = heuristic + (A.Event("cache_reset", 985.0, "vLLM log"),)
    assert A.attribute(replace(BASE, events=both)).codes == (A.CauseCode.CACHE_RESET,)


def test_constructed_routing_skew_replaces_dynamic_prefix():
    a = A.attribute(replace(BASE, fleet_query_tokens=20000.0, fleet_hit_tokens=18000.0))
    assert a.codes == (A.CauseCode.ROUTING_SKEW,)
    # the fleet is low too: not skew
    assert A.attribute(replace(BASE, fleet_query_tokens=20000.0, fleet_hit_tokens=0.0)).codes == (A.CauseCode.DYNAMIC_PREFIX,)


def test_constructed_per_model_thresholds():
    s = replace(BASE, interval_hit_tokens=7000.0)                     # 70 %
    assert A.attribute(s).severity == "warning"
    assert A.attribute(replace(s, thresholds=A.Thresholds(0.5, 0.3))).severity is None


def test_no_traffic_judges_since_start_as_a_warning_at_most():
    a = A.attribute(replace(BASE, interval_query_tokens=0.0, interval_hit_tokens=0.0, since_start_hit_tokens=1e4))
    assert (a.basis, a.traffic, a.severity) == ("since_start", False, "warning")


# --- check: one code path, the same verdict on every era ---------------------------------------------

def codes(rep):
    return {f["code"]: f["severity"] for f in rep["findings"]}


@pytest.mark.slow
def test_check_without_traffic_warns_alike_on_v1_and_v0():
    v1 = load_pages([str(REAL_032 / "metrics-timestamp-in-system-prompt.txt")])   # 28.4 % since start
    # CONSTRUCTED: the real V0 page with its GPU hit rate 0.9375 -> 0.25
    v0_text = read_fixture("vllm-0.8.5-cpu-v0-show-hidden-0.7/metrics-static-system-prompt.txt").replace(
        'vllm:gpu_prefix_cache_hit_rate{model_name="tiny"} 0.9375', 'vllm:gpu_prefix_cache_hit_rate{model_name="tiny"} 0.25')
    with ReplayServer(v1) as a, ReplayServer([("v0", v0_text)], version="0.8.5.post2") as b:
        r1 = check_upstream(a.url, 0.01, 5)
        r0 = check_upstream(b.url, 0.01, 5)
    for rep in (r1, r0):
        assert codes(rep)["no_traffic"] == "info" and codes(rep)["low_hit_ratio"] == "warning"
        assert exit_code([rep]) == 1
    assert r0["attribution"][0]["basis"] == "reported"


def test_check_names_a_partial_drop_cause():
    # CONSTRUCTED: the static page, then the same page with 8 more preemptions and 2000 more
    # query tokens of which 1000 hit (a partial drop to 50 % in the interval)
    first = read_fixture("vllm-0.32.0-cpu/metrics-static-system-prompt.txt")
    last = (first.replace('vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 13296.0',
                          'vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 15296.0')
                 .replace('vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 11520.0',
                          'vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 12520.0')
                 .replace('vllm:num_preemptions_total{engine="0",model_name="tiny"} 0.0',
                          'vllm:num_preemptions_total{engine="0",model_name="tiny"} 8.0'))
    assert last.count("15296.0") == 1 and "12520.0" in last and 'model_name="tiny"} 8.0' in last
    with ReplayServer([("a", first), ("b", last)]) as srv:
        rep = check_upstream(srv.url, 0.01, 5, sleep=lambda s: srv.show(1))
    assert codes(rep)["low_hit_ratio"] == "critical" and codes(rep)[A.CauseCode.CAPACITY] == "critical"
    assert A.CauseCode.DYNAMIC_PREFIX not in codes(rep)


@pytest.mark.slow
def test_check_two_upstreams_names_routing_skew_on_the_cold_replica():
    pages = [(n, (REAL_032 / f"metrics-{n}.txt").read_text()) for n in
             ("idle", "static-system-prompt", "timestamp-in-system-prompt")]
    with ReplayServer(pages) as hot, ReplayServer(pages) as cold:
        cold.show(1)
        # the same model on two replicas: the hot one sees the shared prefix (idle -> static), the cold
        # one only prompts it has never seen (static -> timestamp)
        reps = check_upstreams([f"hot={hot.url}", f"cold={cold.url}"], 0.01, 5,
                               sleep=lambda s: (hot.show(1), cold.show(2)))
    hot_rep, cold_rep = reps
    assert [c["cause"] for c in cold_rep["attribution"][0]["causes"]] == [A.CauseCode.ROUTING_SKEW]
    # the hot replica's first traffic is its cold cache (v2: named, severity info, exit code still 0)
    assert [c["cause"] for c in hot_rep["attribution"][0]["causes"]] == [A.CauseCode.COLD_CACHE]
    assert exit_code([hot_rep]) == 0 and codes(hot_rep)[A.CauseCode.COLD_CACHE] == "info"
    assert codes(cold_rep)[A.CauseCode.ROUTING_SKEW] == "critical" and A.CauseCode.DYNAMIC_PREFIX not in codes(cold_rep)
    # alone, the cold replica looks like a dynamic prefix: the fleet is what tells them apart
    with ReplayServer(pages) as cold:
        cold.show(1)
        alone = check_upstream(f"cold={cold.url}", 0.01, 5, sleep=lambda s: cold.show(2))
    assert [c["cause"] for c in alone["attribution"][0]["causes"]] == [A.CauseCode.DYNAMIC_PREFIX]


# --- V0 cache config: no spurious change --------------------------------------------------------------

def test_v0_cache_config_is_the_same_before_and_after_traffic():
    idle = normalise_text((V0 / "metrics-idle.txt").read_text())
    busy = normalise_text((V0 / "metrics-static-system-prompt.txt").read_text())
    assert list(idle.engines) == [("", "")] and list(busy.engines) == [("tiny", "")]   # what used to differ
    assert _cache_config_of(idle) == _cache_config_of(busy)


def test_v0_disabled_gauge_joins_the_engines_cache_config_row():
    n = normalise_text(read_fixture("constructed/v0-disabled.txt"))
    assert len(n.engines) == 1 and next(iter(n.engines.values())).prefix_caching == "false"


# --- prefix-cache reset read from vLLM's log ----------------------------------------------------------

def test_reset_lines_of_the_real_server_log():
    s = LogStream("log", "tiny")
    s.feed((REAL_032 / "server.log").read_bytes())
    assert s.counters[(C.LOG_CACHE_RESETS.name, ("requested",))] == 1
    assert s.counters[(C.LOG_CACHE_RESETS.name, ("done",))] == 1
    assert (C.LOG_CACHE_RESETS.name, ("failed",)) not in s.counters


def test_check_turns_the_logged_reset_into_an_event_by_its_log_time():
    from cachemon.check import log_reset_events
    s = LogStream("log", "tiny")
    s.feed((REAL_032 / "server.log").read_bytes())
    rep = {"log": {"last_reset_log_time": s.last_reset_log_time}}
    # the real line: "11-29 15:56:59 [block_pool.py:861] Successfully reset prefix cache"
    now = time.mktime((2026, 11, 29, 16, 0, 0, 0, 0, -1))
    assert log_reset_events([rep], now) == [A.Event("cache_reset", now - 181, "vLLM log")]
    assert log_reset_events([rep], now + 3600) == []          # older than the lookback


def test_reset_text_inside_a_prompt_is_not_a_reset():
    assert reset_event("(APIServer pid=1) INFO 11-29 15:56:59 [logger.py:1] Received request: "
                       "prompt: 'Successfully reset prefix cache'") is None
    assert reset_event("(EngineCore pid=2) WARNING 11-29 15:56:59 [block_pool.py:840] Failed to reset prefix "
                       "cache because some blocks (3) are not freed yet") == "failed"


# --- the exporter stage: the same engine over the store -----------------------------------------------

def feed(store: Store, name: str, page: str, now: float, kind: str = "metrics") -> None:
    store.apply(name, to_update(real(page)), now, kind=kind)


def test_stage_exports_dynamic_prefix_and_its_start_time():
    store = Store({"1m": 60.0})
    att = Attributor(store, AttributionSettings(window=60.0))
    feed(store, "vllm", "static-system-prompt", 1000.0)
    assert att.evaluate(1000.0)[0].codes == ()
    feed(store, "vllm", "timestamp-in-system-prompt", 1030.0)
    [res] = att.evaluate(1030.0)
    assert res.codes == (A.CauseCode.DYNAMIC_PREFIX,)
    assert att.tracker.since == {("vllm", "tiny", A.CauseCode.DYNAMIC_PREFIX): 1030.0}
    att.evaluate(1040.0)                                                # still active: same start
    assert att.tracker.since == {("vllm", "tiny", A.CauseCode.DYNAMIC_PREFIX): 1030.0}


def test_stage_log_reset_line_becomes_the_cause(tmp_path):
    from cachemon.config import load_section
    from cachemon.runtime.logsource import LogSource
    from cachemon.sources.logs.settings import LogConfig
    from cachemon.state.events import EventLog
    lines = (REAL_032 / "server.log").read_text().splitlines(keepends=True)
    reset = next(ln for ln in lines if "Successfully reset prefix cache" in ln)     # the real line
    path = tmp_path / "vllm.log"
    path.write_text("".join(ln for ln in lines[:50] if "reset prefix cache" not in ln))
    now = [1000.0]
    store, events = Store({"1m": 60.0}), EventLog()
    logs = LogSource(load_section(LogConfig, {"files": [{"path": str(path), "name": "vllm-log"}], "state_file": "",
                                              "from_beginning": True, "watch_events": False}, "logs"),
                     store, clock=lambda: now[0], events=events)
    att = Attributor(store, AttributionSettings(window=60.0, log_links={"vllm-log": "vllm"}), events)
    feed(store, "vllm", "static-system-prompt", 1000.0)
    logs.poll()
    att.evaluate(1000.0)
    with path.open("a") as f:
        f.write(reset)
    now[0] = 1010.0
    logs.poll()
    assert [(e.kind, e.upstream, e.at) for e in events.since()] == [("cache_reset", "vllm-log", 1010.0)]
    feed(store, "vllm", "timestamp-in-system-prompt", 1020.0)
    [res] = att.evaluate(1020.0)
    assert res.codes == (A.CauseCode.CACHE_RESET,)
    logs.close()


def test_a_restarted_log_source_does_not_publish_the_resets_it_had_counted(tmp_path):
    """The real reset line, counted before a restart of cachemon and restored from the state file, is the
    baseline of the new run, not a new reset; one more line is."""
    from cachemon.config import load_section
    from cachemon.runtime.logsource import LogSource
    from cachemon.sources.logs.settings import LogConfig
    from cachemon.state.events import EventKind, EventLog
    reset = next(ln for ln in (REAL_032 / "server.log").read_text().splitlines(keepends=True)
                 if "Successfully reset prefix cache" in ln)
    path = tmp_path / "vllm.log"
    path.write_text(reset)
    cfg = load_section(LogConfig, {"files": [{"path": str(path), "name": "vllm-log"}], "from_beginning": True,
                                   "state_file": str(tmp_path / "state.json"), "watch_events": False}, "logs")
    first = LogSource(cfg, Store({"1m": 60.0}), clock=lambda: 1000.0, events=EventLog())
    first.poll()
    first.close()
    events = EventLog()
    again = LogSource(cfg, Store({"1m": 60.0}), clock=lambda: 2000.0, events=events)
    again.poll()
    assert events.since() == []
    with path.open("a") as f:
        f.write(reset)
    again.poll()
    assert [(e.kind, e.upstream, e.at, e.detail) for e in events.since()] == [
        (EventKind.CACHE_RESET, "vllm-log", 2000.0, "vLLM log")]
    again.close()


@pytest.mark.slow
def test_cachemon_run_exports_cause_active():
    pages = [(n, (REAL_032 / f"metrics-{n}.txt").read_text()) for n in
             ("static-system-prompt", "timestamp-in-system-prompt")]
    with ReplayServer(pages) as srv:
        d = Daemon(from_dict({"upstreams": [{"name": "vllm", "url": srv.url}], "poll_interval": "50ms",
                              "listen": {"address": "127.0.0.1", "port": 0}, "events": {"interval": "1h"}}))
        d.start()
        try:
            stage = next(c for c in d.components if hasattr(c, "attributor"))
            assert wait_until(lambda: stage.attributor.results, 10)
            srv.show(1)

            def active() -> str:
                return d.registry.render().decode()
            want = (f'{C.CAUSE_ACTIVE.name}{{upstream="vllm",model_name="tiny",cause="{A.CauseCode.DYNAMIC_PREFIX}",'
                    f'certainty="heuristic"}} 1')
            assert wait_until(lambda: want in active(), 10)
            assert f'{C.CAUSE_SINCE.name}{{upstream="vllm",model_name="tiny",cause="{A.CauseCode.DYNAMIC_PREFIX}"}}' in active()
            assert active().count(f"{C.CAUSE_ACTIVE.name}{{") == 1
        finally:
            d.shutdown()


@pytest.mark.slow
def test_check_reads_per_model_thresholds_from_the_config(tmp_path):
    import subprocess
    import sys
    pages = load_pages([str(REAL_032 / "metrics-timestamp-in-system-prompt.txt")])     # 28.4 % since start
    cfg = tmp_path / "cachemon.yaml"
    with ReplayServer(pages) as srv:
        def run(text: str) -> subprocess.CompletedProcess:
            cfg.write_text(text)
            return subprocess.run([sys.executable, "-m", "cachemon.cli", "check", "--upstream", srv.url,
                                   "--interval", "0", "--config", str(cfg)], capture_output=True, text=True, timeout=60)
        assert run("models: [{name: tiny}]\n").returncode == 1                       # the defaults: 80 / 60 %
        assert run("models: [{name: tiny, hit_ratio_warning: 0.25, hit_ratio_critical: 0.1}]\n").returncode == 0
        bad = run("models: [{name: tiny, hit_ratio_warning: 1.5}]\n")
        assert bad.returncode == 2 and "models[0].hit_ratio_warning" in bad.stderr
        bad = run("attribution: {window: 5}\n")
        assert bad.returncode == 2 and "attribution.window" in bad.stderr


def test_check_and_the_daemon_give_one_verdict_on_the_same_reads():
    """One judge: `check` reading a replayed upstream twice and the daemon's Attributor fed the same two
    pages at the same (injected) times name the same causes with the same tokens, in the same words."""
    pages = [(n, (REAL_032 / f"metrics-{n}.txt").read_text()) for n in ("static-system-prompt",
                                                                         "timestamp-in-system-prompt")]
    now = [1_000_000.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds
        srv.show(1)

    with ReplayServer(pages) as srv:
        rep = check_upstream(f"vllm={srv.url}", 30.0, 5, sleep=sleep, clock=lambda: now[0])
    store = Store({"1m": 60.0})
    att = Attributor(store, AttributionSettings(window=60.0))
    feed(store, "vllm", "static-system-prompt", 1_000_000.0)
    att.evaluate(1_000_000.0)
    feed(store, "vllm", "timestamp-in-system-prompt", 1_000_030.0)
    [daemon] = att.evaluate(1_000_030.0)
    [checked] = rep["attribution"]
    assert daemon.codes == (A.CauseCode.DYNAMIC_PREFIX,)
    assert (checked["basis"], checked["hit_ratio"], checked["severity"]) == (daemon.basis, daemon.ratio, daemon.severity)
    assert [(c["cause"], c["certainty"], c["message"], c["missed_tokens"]) for c in checked["causes"]] == \
        [(c.code, c.certainty, c.message, c.tokens) for c in daemon.causes]
