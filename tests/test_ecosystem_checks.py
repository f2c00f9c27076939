"""The ecosystem's own checks on cachemon's LIVE /metrics, in every mode it runs in.

Each mode is a real `cachemon run` / `cachemon demo` subprocess fed by real vLLM 0.32.0 captures
(replayed by cachemon.demo.replay) or the real vLLM 0.32.0 server log (tests/fixtures/vllm-0.32.0-cpu):

- metrics: polling a vLLM /metrics page, through a vLLM restart (the counters fall);
- logs: tailing the real server log only;
- warm-up: `warmup:` configured and triggered by that restart;
- cost: `cost:` configured;
- demo: `cachemon demo`, which replays the bundled captures by itself;
- kv-events: following vLLM's KV-cache events (the real 0.32.0 tiny_pool capture re-published over
  ZMQ by tests/test_kv_stream.Publisher): the ledger's histograms.

On each page: `promtool check metrics` (Prometheus' own linter, exit 0 and nothing printed) on the
text format, and prometheus_client's OpenMetrics parser (the strict one: it rejects what the
OpenMetrics 1.0 spec forbids, e.g. a UNIT that is not the name's suffix, a histogram without +Inf
or whose _count differs from it, a missing # EOF) on the OpenMetrics format, which must carry a
# UNIT line for every family whose catalog unit is its name's suffix.

promtool: Debian package `prometheus`; skipped without it locally, a failure under CI.
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import time

import pytest
import requests
import yaml
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
from prometheus_client.parser import text_string_to_metric_families

import helpers
from cachemon import catalog as C
from cachemon.demo.replay import ReplayServer, bundled_pages
from helpers import eventually

# The Accept header Prometheus 2.x scrapes with (scrape/scrape.go, scrapeAcceptHeader): OpenMetrics
# first, so the OpenMetrics page is what a real Prometheus (and its own Go parser) reads.
OM = {"Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"}
REAL_LOG = helpers.REAL_032 / "server.log"
REQUESTS = helpers.REAL_032 / "requests-static-system-prompt.jsonl"
COST = {"currency": "USD", "per_million_tokens": {"uncached_input": 3, "cached_input": 0.3, "output": 15}}
UNITS = {s.name: s.openmetrics_unit for s in C.ALL if s.openmetrics_unit}
# families each mode must show, so a check cannot pass on an empty page
EXPECTED = {
    "metrics": ("cachemon_prefix_cache_query_tokens_total", "cachemon_request_prompt_tokens_bucket",
                "cachemon_upstream_last_restart_timestamp_seconds", "cachemon_build_info"),
    "logs": ("cachemon_log_lines_total", "cachemon_log_last_stats_line_timestamp_seconds"),
    "warm-up": ("cachemon_warmups_total",),
    "cost": ("cachemon_estimated_cost_total", "cachemon_cost_saving_factor"),
    "demo": ("cachemon_prefix_cache_query_tokens_total", "cachemon_request_prompt_tokens_bucket"),
    "kv-events": ("cachemon_kv_stored_tokens_total", "cachemon_kv_divergence_depth_blocks_bucket",
                  "cachemon_kv_block_lifetime_seconds_bucket"),
}


def _has(text: str, names) -> bool:
    return all(f"\n{n}{{" in text or f"\n{n} " in text for n in names)


def _wait_text(url: str, names, timeout: float = 30.0) -> str:
    def page() -> str:
        text = requests.get(url, timeout=5).text
        missing = [n for n in names if not _has(text, (n,))]
        assert not missing, f"{url}: no {missing}"
        return text
    return eventually(page, timeout, f"{', '.join(names)} on {url}", interval=0.2, ignore=(requests.RequestException,))


def _restart(replay: ReplayServer, url: str) -> None:
    """Show the capture with traffic, then the idle one: vLLM's counters fall, a restart."""
    replay.show(1)
    _wait_text(url, ("cachemon_request_prompt_tokens_bucket",))
    start = helpers.scrapes(helpers.samples(requests.get(url, timeout=5).text), "vllm")
    eventually(lambda: helpers.scrapes(helpers.samples(requests.get(url, timeout=5).text), "vllm") >= start + 2,
               15, "two more polls of the page with traffic", interval=0.1, ignore=(requests.RequestException,))
    replay.show(0)


def _run(tmp_path, replay, mode, pub=None):
    """A `cachemon run` in `mode`; returns (process, url). Caller stops it."""
    cfg: dict = {}
    args = ["--poll-interval", "100ms"]
    if pub is not None:
        cfg["upstreams"] = [{"name": "vllm", "url": replay.url, "kv_events": {
            "endpoint": pub.endpoint, "replay": pub.replay_endpoint, "topic": "kv-events"}}]
    if mode == "logs":
        (tmp_path / "vllm.log").write_text("")      # the real log is appended once cachemon follows it
        args += ["--log-file", str(tmp_path / "vllm.log"), "--state-file", str(tmp_path / "state.json")]
    elif pub is None:
        cfg["upstreams"] = [{"name": "vllm", "url": replay.url}]
    if mode == "warm-up":
        cfg["warmup"] = {"prompts": str(REQUESTS), "warmup_on": ["restart"], "rate": 100, "delay": "1ms"}
    if mode == "cost":
        cfg["cost"] = COST
    if cfg:
        (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
        args = ["--config", str(tmp_path / "c.yaml"), *args]
    proc = helpers.CachemonProcess(*args)
    return proc, proc.url


def _om(url: str) -> str:
    r = requests.get(url, headers=OM, timeout=5)
    assert r.headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0"), r.headers
    return r.text


def _publisher():
    from test_kv_stream import Publisher  # needs the kv-events extra (pyzmq, msgspec)
    return Publisher()


def _captured(scenario: str):
    from test_kv_stream import captured
    return captured(scenario)


def _demo():
    port = helpers.free_port()
    proc = subprocess.Popen([sys.executable, "-m", "cachemon.cli", "demo", "--listen", f"127.0.0.1:{port}",
                             "--vllm-listen", "127.0.0.1:0",
                             "--dwell", "2s", "--poll-interval", "200ms", "--duration", "60s"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}/metrics"


@pytest.fixture(scope="module")
def live_pages(tmp_path_factory):
    """(text format, OpenMetrics) of each mode's live /metrics, taken once for the module."""
    pages: dict[str, tuple[str, str] | None] = {}
    for mode in EXPECTED:
        tmp = tmp_path_factory.mktemp(mode)
        if mode == "kv-events" and not all(importlib.util.find_spec(m) for m in ("zmq", "msgspec")):
            pages[mode] = None       # the kv-events extra is not installed: that mode's tests skip
            continue
        if mode == "demo":
            proc, url = _demo()
            try:
                text = _wait_text(url, EXPECTED[mode], timeout=40)
                pages[mode] = (text, _om(url))
            finally:
                proc.terminate()
                proc.wait(10)
            continue
        srv = ReplayServer(bundled_pages()).start()
        proc = pub = None
        try:
            if mode == "kv-events":
                pub = _publisher()
            proc, url = _run(tmp, srv, mode, pub)
            if pub is not None:
                pub.wait_subscribed(timeout=20)
                for seq, payload in _captured("tiny_pool"):
                    pub.send(seq, payload)
            elif mode == "logs":
                _wait_text(url, ("cachemon_log_files_open",))
                with open(tmp / "vllm.log", "a", encoding="utf-8") as f:
                    f.write(REAL_LOG.read_text(encoding="utf-8"))
            else:
                _restart(srv, url)
            text = _wait_text(url, EXPECTED[mode])
            pages[mode] = (text, _om(url))
        finally:
            if proc is not None:
                proc.stop()
            if pub is not None:
                pub.close()
            srv.stop()
    return pages


def _page(live_pages, mode) -> tuple[str, str]:
    if live_pages[mode] is None:
        pytest.skip(f"{mode}: the kv-events extra (pyzmq, msgspec) is not installed")
    return live_pages[mode]


@pytest.mark.prometheus
@pytest.mark.parametrize("mode", list(EXPECTED))
def test_promtool_check_metrics_is_clean_on_the_live_page(live_pages, mode):
    promtool = helpers.require_binary("promtool", "prometheus")
    text, _ = _page(live_pages, mode)
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout + r.stderr) == (0, "")


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(EXPECTED))
def test_strict_openmetrics_parser_accepts_the_live_page_with_its_units(live_pages, mode):
    _, om = _page(live_pages, mode)
    assert om.endswith("# EOF\n") and om.count("# EOF") == 1
    fams = {f.name: f for f in om_families(om)}      # raises on anything OpenMetrics 1.0 forbids
    cachemon = {n: f for n, f in fams.items() if n.startswith(C.PREFIX)}
    assert cachemon
    for name, fam in cachemon.items():
        assert fam.unit == UNITS.get(name, ""), name
    # every family that has a unit says so: at least the token counters and the timestamps
    units = {line.split()[2]: line.split()[3] for line in om.splitlines() if line.startswith("# UNIT ")}
    assert units == {n: u for n, u in UNITS.items() if n in cachemon}
    for name, unit in units.items():
        assert name.endswith("_" + unit)


def test_prompt_length_is_one_real_histogram_on_the_live_page(live_pages):
    """vLLM's prompt-length histogram re-exported as a histogram: buckets with le, _sum, _count == +Inf;
    no counter carries an le label (what promtool rejected before)."""
    text, om = live_pages["metrics"]
    (fam,) = [f for f in om_families(om) if f.name == C.PROMPT_LENGTH_REQUESTS.name]
    assert fam.type == "histogram" and fam.unit == "tokens"
    by = {(s.name, s.labels.get("le")): s.value for s in fam.samples if s.labels["upstream"] == "vllm"}
    assert by[(fam.name + "_count", None)] == by[(fam.name + "_bucket", "+Inf")] > 0
    assert by[(fam.name + "_sum", None)] > 0
    for line in text.splitlines():
        if 'le="' in line and not line.startswith("#"):
            assert line.split("{")[0].endswith("_bucket"), line


def test_conventions_on_the_live_page(live_pages):
    """build_info carries revision and runtime; no free-text label on last_error; the stats-line
    series is a timestamp, not an age."""
    text, _ = live_pages["metrics"]
    parsed = helpers.samples(text)
    (build,) = [dict(ls) for (n, ls) in parsed if n == "cachemon_build_info"]
    assert set(build) == {"version", "revision", "python_version"}
    assert build["python_version"] == ".".join(map(str, sys.version_info[:3]))
    assert "message=" not in text
    logs = helpers.samples(live_pages["logs"][0])
    (ts,) = [v for (n, _), v in logs.items() if n == "cachemon_log_last_stats_line_timestamp_seconds"]
    assert 1.7e9 < ts <= time.time()
    assert "_age_seconds" not in text + live_pages["logs"][0]


@pytest.mark.prometheus
def test_promtool_check_metrics_rejects_what_cachemon_used_to_expose():
    """The check can fail: a CONSTRUCTED page with a counter carrying `le` (cachemon's old
    prompt_length_requests_total) exits 3, as it did on `cachemon demo` before."""
    promtool = helpers.require_binary("promtool", "prometheus")
    page = ("# HELP cachemon_prompt_length_requests_total Constructed.\n# TYPE cachemon_prompt_length_requests_total counter\n"
            'cachemon_prompt_length_requests_total{le="+Inf"} 1.0\n')
    r = subprocess.run([promtool, "check", "metrics"], input=page, capture_output=True, text=True, timeout=60)
    assert r.returncode == 3 and 'non-histogram metrics should not have "le" label' in r.stdout + r.stderr


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_every_stage_built_its_metrics_on_the_live_page(live_pages, mode):
    """cachemon_stage_collect_success is 1 for every stage in every mode: a stage whose collect raises
    loses its series silently but for this gauge (the cost stage did, with a log upstream, at the v3 merge)."""
    text, _ = _page(live_pages, mode)
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    stages = {s.labels["stage"]: s.value for s in fams[C.STAGE_SUCCESS.name].samples}
    assert stages and all(v == 1.0 for v in stages.values()), stages
