"""Change, restart and cache-reset detection, against a local server replaying real vLLM 0.32.0 captures.

Pages marked CONSTRUCTED are real captures with one value edited (said where); everything else
is served exactly as recorded.
"""
from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from assert_support import nonempty
from cachemon import catalog as C
from cachemon.config import ConfigError
from cachemon.config.events import ResetSettings, parse_event_settings
from cachemon.daemon import Daemon
from cachemon.demo.replay import ReplayServer
from cachemon.normalise.normaliser import normalise_text, to_update
from cachemon.runconfig import from_dict
from cachemon.runtime.change_detector import ChangeDetector, ResetDetector
from cachemon.state.store import Store
from helpers import wait_until

FIX = Path(__file__).resolve().parent / "fixtures"
REAL_032 = FIX / "vllm-0.32.0-cpu"


def page(name: str) -> str:
    return (REAL_032 / f"metrics-{name}.txt").read_text(encoding="utf-8")


def real_pages(*names):
    return [(n, page(n)) for n in names]


def parse(text: str) -> dict:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def val(parsed: dict, name: str, **labels):
    hits = [v for (n, ls), v in parsed.items() if n == name and all(dict(ls).get(k) == w for k, w in labels.items())]
    assert len(hits) <= 1, (name, labels, hits)
    return hits[0] if hits else None


def labelsets(parsed: dict, name: str) -> list[dict]:
    return [dict(ls) for (n, ls), _ in parsed.items() if n == name]


# --- the reset heuristic on real captures -----------------------------------------------------------

class Feeder:
    """Folds real pages through the core store (reset-corrected) into a detector, one poll each."""

    def __init__(self, det: ResetDetector, dt: float = 10.0):
        self.det, self.dt = det, dt
        self.st = Store({"1m": 60.0}).upstream("u")
        self.t = 1000.0
        self.restarts = 0
        self.fired: list[float] = []

    def __call__(self, *pages: str) -> Feeder:
        for text in pages:
            self.t += self.dt
            st = self.st
            st.apply(to_update(normalise_text(text)), self.t)
            q = sum(c.value for (m, k), c in st.counters.items() if m == C.QUERY_TOKENS.name and k[-1] == "local")
            h = sum(c.value for (m, k), c in st.counters.items() if m == C.HIT_TOKENS.name and k[-1] == "local")
            at = self.det.observe(self.t, q, h, restarted=st.restarts != self.restarts)
            self.restarts = st.restarts
            if at is not None:
                self.fired.append(at)
        return self


def test_timestamp_scenario_collapse_is_not_a_reset():
    """Real sequence static -> timestamp -> request-id: hits collapse (+0 of 13584 queried, the same volume
    as static's 13296), which the detector does see as a collapse, but they never recover: traffic changed."""
    det = ResetDetector(ResetSettings(baseline_polls=1, min_query_tokens=1000, confirm_polls=1))
    f = Feeder(det)(page("idle"), page("static-system-prompt"), page("timestamp-in-system-prompt"))
    assert f.fired == []
    assert det.candidate is not None, "the collapse itself must be noticed, else this test proves nothing"
    f(page("request-id-at-head"))       # again 0 hits of 13747 queried
    assert f.fired == [] and det.candidate is None and det.rejected == 1


def test_restart_is_not_a_cache_reset():
    """Real pages static -> idle (counters drop: restart) -> static: the cold cache after the restart is the
    restart's event, never a cache reset."""
    det = ResetDetector(ResetSettings(baseline_polls=1, min_query_tokens=1000, confirm_polls=1))
    f = Feeder(det)(page("idle"), page("static-system-prompt"), page("idle"), page("static-system-prompt"),
                    page("timestamp-in-system-prompt"))
    assert f.st.restarts == 1
    assert f.fired == []


def test_idle_polls_are_neither_evidence_for_nor_against():
    det = ResetDetector(ResetSettings(baseline_polls=1, min_query_tokens=1000, confirm_polls=1))
    f = Feeder(det)(page("idle"), page("idle"), page("static-system-prompt"), page("static-system-prompt"),
                    page("static-system-prompt"))
    assert f.fired == [] and len(det.baseline) == 1 and det.candidate is None


def test_reset_confirmed_by_recovery_constructed_counters():
    """CONSTRUCTED totals (no capture has a reset): 3 polls at 90 % of 10k tokens, a poll with 0 hits of
    10k tokens (same load), then 85 %: one reset, dated at the collapse poll."""
    det = ResetDetector(ResetSettings(min_query_tokens=2000))
    q = h = 0.0
    det.observe(90.0, q, h)     # the first poll: the base of the first interval
    fired = []
    for i, (dq, dh) in enumerate([(10_000, 9_000)] * 3 + [(10_000, 0), (10_000, 8_500)]):
        q, h = q + dq, h + dh
        r = det.observe(100.0 + 10 * i, q, h)
        if r is not None:
            fired.append(r)
    assert fired == [130.0]


def test_collapse_at_a_different_load_is_not_a_reset_constructed_counters():
    """CONSTRUCTED: the same collapse but with 5x the query volume (a traffic burst, not the same traffic)."""
    det = ResetDetector(ResetSettings(min_query_tokens=2000))
    q = h = 0.0
    det.observe(90.0, q, h)
    for i, (dq, dh) in nonempty(enumerate([(10_000, 9_000)] * 3 + [(50_000, 0), (10_000, 9_000)])):
        q, h = q + dq, h + dh
        assert det.observe(100.0 + 10 * i, q, h) is None


def test_a_b_a_traffic_is_a_documented_false_positive():
    """The heuristic's stated limit, on real deltas: static traffic, then the same volume of traffic with no
    shared prefix (the real timestamp scenario), then static again (CONSTRUCTED page: the timestamp page's
    counters plus the static scenario's real deltas). /metrics cannot tell this from a reset, and the docs
    say so; this test keeps that statement true."""
    det = ResetDetector(ResetSettings(baseline_polls=1, min_query_tokens=1000))
    # idle, static, timestamp (real), then +13296 queried / +11520 hit
    totals = [(0, 0), (13296, 11520), (26880, 11520), (26880 + 13296, 11520 + 11520)]
    fired = [r for i, (q, h) in enumerate(totals) if (r := det.observe(100.0 + 10 * i, q, h)) is not None]
    assert fired == [120.0]


# --- config ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("events, models, key", [
    ({"interval": "soon"}, None, "events.interval"),
    ({"cache_reset": {"collapse_fraction": 2}}, None, "events.cache_reset.collapse_fraction"),
    ({"cache_reset": {"volume_band": [2, 1]}}, None, "events.cache_reset.volume_band"),
    ({"cache_reset": {"baseline_polls": 0}}, None, "events.cache_reset.baseline_polls"),
    ({"surprise": 1}, None, "events.surprise"),
    (None, {"name": "tiny"}, "models"),
    (None, [{"tokenizer": "/tmp"}], "models[0].name"),
    (None, [{"name": "tiny", "tokenizer": "/does/not/exist"}], "models[0].tokenizer"),
])
def test_malformed_events_config_names_the_key(events, models, key):
    with pytest.raises(ConfigError) as ei:
        parse_event_settings(events, models)
    assert ei.value.key == key


@pytest.mark.slow
def test_malformed_events_config_exits_2_from_cachemon_run(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"upstreams": ["http://127.0.0.1:9/metrics"], "events": {"interval": "-3s"}}))
    p = subprocess.run([sys.executable, "-m", "cachemon.cli", "run", "--config", str(cfg), "--listen", "127.0.0.1:0"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2
    assert "events.interval" in p.stderr


# --- the component live, against the replay server ------------------------------------------------------

@pytest.fixture
def replay():
    srv = ReplayServer(real_pages("idle", "static-system-prompt", "timestamp-in-system-prompt", "request-id-at-head"))
    srv.start()
    yield srv
    srv.stop()


def make_daemon(replay, extra=None):
    raw = {"upstreams": [{"name": "vllm", "url": replay.url}], "poll_interval": "50ms",
           "listen": {"address": "127.0.0.1", "port": 0}, "events": {"interval": "100ms"}}
    raw.update(extra or {})
    d = Daemon(from_dict(raw))
    d.start()
    return d


def scrape(d: Daemon) -> dict:
    return parse(d.registry.render().decode())


@pytest.mark.slow
def test_model_version_cache_config_and_restart_detected_live(replay):
    d = make_daemon(replay)
    try:
        assert wait_until(lambda: val(scrape(d), C.MODEL_INFO.sample_name, model_id="tiny") == 1.0, 10)
        m = scrape(d)
        assert labelsets(m, C.MODEL_INFO.sample_name) == [
            {"upstream": "vllm", "model_id": "tiny", "root": "/models/tiny", "max_model_len": "4096"}]
        for kind in ("model", "version", "cache_config", "tokenizer", "chat_template"):
            assert val(m, C.CHANGES.sample_name, kind=kind) == 0.0, kind   # first sight is the baseline
        assert val(m, C.LAST_CHANGE.sample_name, kind="model") is None

        # 1. the served model list changes (a new model id at the same server)
        t0 = time.time()
        with replay.lock:
            replay.models = [{"id": "tiny-v2", "root": "/models/tiny-v2", "max_model_len": 8192}]
        assert wait_until(lambda: val(scrape(d), C.CHANGES.sample_name, kind="model") == 1.0, 10)
        m = scrape(d)
        assert [x["model_id"] for x in labelsets(m, C.MODEL_INFO.sample_name)] == ["tiny-v2"]
        assert t0 <= val(m, C.LAST_CHANGE.sample_name, kind="model") <= time.time()
        assert val(m, C.RESTARTS.sample_name) == 0.0

        # 2. traffic (real pages), then an upgrade: the server restarts (counters back to the idle page's
        # zeros) and /version answers a new version
        replay.show(1)
        assert wait_until(lambda: val(scrape(d), C.HIT_TOKENS.sample_name, cache="local") == 11520.0, 10)
        with replay.lock:
            replay.version = "0.33.0"
            replay.index = 0
        assert wait_until(lambda: val(scrape(d), C.CHANGES.sample_name, kind="version") == 1.0, 10)
        assert wait_until(lambda: val(scrape(d), C.RESTARTS.sample_name) == 1.0, 10)
        m = scrape(d)
        # the restart is the core's event; corrected counters keep the static page's tokens
        assert val(m, C.HIT_TOKENS.sample_name, cache="local") == 11520.0
        assert val(m, C.CHANGES.sample_name, kind="model") == 1.0       # unchanged by the restart
        assert val(m, C.CACHE_RESETS.sample_name) == 0.0

        # 3. CONSTRUCTED: the real static page with block_size 128 -> 16 in vllm:cache_config_info
        edited = page("static-system-prompt").replace('block_size="128"', 'block_size="16"')
        assert edited != page("static-system-prompt")
        with replay.lock:
            replay.pages.append(("block16", edited))
            replay.index = len(replay.pages) - 1
        assert wait_until(lambda: val(scrape(d), C.CHANGES.sample_name, kind="cache_config") == 1.0, 10)
        m = scrape(d)
        assert val(m, C.CHANGES.sample_name, kind="version") == 1.0
        assert val(m, C.CACHE_RESETS.sample_name) == 0.0
    finally:
        d.shutdown()


@pytest.mark.slow
def test_timestamp_collapse_live_is_not_counted_as_reset(replay):
    """Real pages idle -> static -> timestamp -> request-id through the running daemon: no reset counted."""
    d = make_daemon(replay, {"events": {"interval": "100ms", "cache_reset": {
        "baseline_polls": 1, "min_query_tokens": 1000, "confirm_polls": 1,
        # a replay jumps a whole scenario in one 50 ms poll: rates are bursts, so the load test is off here
        "volume_band": [0.01, 100]}}})
    try:
        det = [c for c in d.components if isinstance(c, ChangeDetector)][0]
        assert wait_until(lambda: det.watches["vllm"].seen_success is not None, 10)   # idle page seen first
        for i in (1, 2, 3):
            before = d.store.upstreams["vllm"].scrapes
            replay.show(i)
            assert wait_until(lambda before=before: d.store.upstreams["vllm"].scrapes > before + 2, 10)
            w = det.watches["vllm"]
            assert wait_until(lambda w=w: w.seen_success == d.store.upstreams["vllm"].last_success, 10)
        m = scrape(d)
        assert val(m, C.CACHE_RESETS.sample_name) == 0.0
        assert val(m, C.LAST_CACHE_RESET.sample_name) is None
        assert det.watches["vllm"].detector.rejected == 1     # it saw the collapse and rejected it
    finally:
        d.shutdown()


def test_version_is_read_by_the_poller_alone_and_a_restart_reads_it_again(replay):
    """Real pages: change detection asks /v1/models itself, and takes /version from the poller, which
    reads it at its first poll and for a new process (the real idle page: every counter back to 0)."""
    from cachemon.config.events import EventSettings
    from cachemon.runtime.poller import UpstreamPoller
    from cachemon.state.events import EventLog
    from_cfg = from_dict({"upstreams": [{"name": "vllm", "url": replay.url}]})
    store, events = Store({"1m": 60.0}), EventLog()
    poller = UpstreamPoller(from_cfg.upstreams[0], store, events=events)
    det = ChangeDetector([poller], store, EventSettings(), events=events)
    replay.show(1)
    assert poller.poll_once() is not None and "/version" in replay.requested
    replay.requested.clear()
    for _ in range(3):
        det.check_metadata()
    assert set(replay.requested) == {"/v1/models"}
    assert det.watches["vllm"].version == replay.version
    with replay.lock:
        replay.version = "0.33.0"
        replay.index = 0
    replay.requested.clear()
    assert poller.poll_once() is not None
    assert "/version" in replay.requested and poller.vllm_version == "0.33.0"
    assert det._recheck.is_set()          # the restart, heard on the log: the next round re-checks at once
    det.check_metadata()
    assert det.watches["vllm"].changes == {"version": 1}


def test_a_server_without_version_is_asked_again_only_after_the_retry_interval(monkeypatch):
    """Real pages; the server answers /version with 404 (older vLLM, another engine)."""
    from cachemon.runtime import poller as P
    from cachemon.state.events import EventLog
    with ReplayServer(real_pages("static-system-prompt"), version=None) as srv:
        p = P.UpstreamPoller(from_dict({"upstreams": [{"name": "vllm", "url": srv.url}]}).upstreams[0],
                             Store({"1m": 60.0}), events=EventLog())
        asked: list[str] = []
        fetch = p._fetch_version
        monkeypatch.setattr(p, "_fetch_version", lambda pst: (asked.append("version"), fetch(pst)))
        for _ in range(3):
            assert p.poll_once() is not None
        assert asked == ["version"] and p.vllm_version == ""          # once, then not on every poll
        monkeypatch.setattr(P, "VERSION_RETRY", 0.0)
        assert p.poll_once() is not None
        assert asked == ["version", "version"]                          # due again: asked again


@pytest.mark.slow
def test_unreachable_models_endpoint_is_not_a_change(replay):
    d = make_daemon(replay)
    try:
        assert wait_until(lambda: val(scrape(d), C.MODEL_INFO.sample_name, model_id="tiny") == 1.0, 10)
        det = next(c for c in d.components if isinstance(c, ChangeDetector))
        replay.set_fault("http500")        # /metrics fails; /v1/models and /version still answer
        original = replay.models
        with replay.lock:
            replay.models = None           # /v1/models now raises inside the handler -> connection error
        assert wait_until(lambda: det.watches["vllm"].models_error is not None, 10)     # a round saw it fail
        with replay.lock:
            replay.models = original
        replay.set_fault(None)
        assert wait_until(lambda: det.watches["vllm"].models_error is None, 10)         # and one read it again
        m = scrape(d)
        assert val(m, C.CHANGES.sample_name, kind="model") == 0.0
        assert val(m, C.MODEL_INFO.sample_name, model_id="tiny") == 1.0
    finally:
        d.shutdown()


# --- tokenizer fingerprints ------------------------------------------------------------------------

def test_tokenizer_and_template_changes_detected(replay, tmp_path):
    model_dir = tmp_path / "model"
    shutil.copytree(REAL_032 / "model", model_dir)
    d = make_daemon(replay, {"models": [{"name": "tiny", "tokenizer": str(model_dir)}]})
    try:
        assert wait_until(lambda: labelsets(scrape(d), C.TOKENIZER_INFO.sample_name), 10)
        first = labelsets(scrape(d), C.TOKENIZER_INFO.sample_name)[0]
        tpl = model_dir / "chat_template.jinja"
        tpl.write_text(tpl.read_text() + "\n{# edited #}\n")
        assert wait_until(lambda: val(scrape(d), C.CHANGES.sample_name, kind="chat_template") == 1.0, 10)
        m = scrape(d)
        assert val(m, C.CHANGES.sample_name, kind="tokenizer") == 0.0
        now = labelsets(m, C.TOKENIZER_INFO.sample_name)[0]
        assert now["tokenizer_hash"] == first["tokenizer_hash"]
        assert now["chat_template_hash"] != first["chat_template_hash"]
    finally:
        d.shutdown()


# --- `cachemon run` has it switched on ------------------------------------------------------------------

@pytest.mark.slow
def test_cachemon_run_exposes_change_metrics(replay):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "cachemon.cli", "run", "--upstream", f"vllm={replay.url}",
                             "--listen", f"127.0.0.1:{port}", "--poll-interval", "100ms"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}/metrics"

        def ready():
            try:
                return val(parse(requests.get(url, timeout=2).text), C.MODEL_INFO.sample_name, model_id="tiny") == 1.0
            except requests.RequestException:
                return False
        assert wait_until(ready, 20), proc.stdout.read() if proc.poll() is not None else "no model info"
        m = parse(requests.get(url, timeout=2).text)
        assert val(m, C.CHANGES.sample_name, kind="model") == 0.0
        assert val(m, C.CACHE_RESETS.sample_name) == 0.0
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
