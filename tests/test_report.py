"""`cachemon report` against a real Prometheus (Debian package) that scraped a real `cachemon run`, which
polled a replay of the real vLLM 0.32.0 captures (idle -> static -> timestamp -> request-id, then a model
change and a restart). The report's figures must equal (a) the values computed directly from the raw
series in Prometheus and (b) vLLM's own counters on the captured pages.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

from cachemon import catalog as C
from cachemon.demo.replay import ReplayServer
from cachemon.tools.cost_report import counter_increase, gauge_values
from helpers import eventually, free_port

REAL_032 = Path(__file__).resolve().parent / "fixtures" / "vllm-0.32.0-cpu"
PROMETHEUS = shutil.which("prometheus")
PRICES = {"currency": "USD", "per_million_tokens": {"uncached_input": 3.0, "cached_input": 0.3, "output": 15.0}}


def _need_prometheus():
    if PROMETHEUS:
        return
    if os.environ.get("CI"):
        pytest.fail("the prometheus binary is required in CI (apt-get install prometheus)")
    pytest.skip("prometheus binary not installed (Debian package 'prometheus'); CI installs it")


def wait(pred, timeout=30.0, interval=0.2, what=""):
    eventually(pred, timeout, what, interval=interval, ignore=(requests.RequestException,))


# --- pure parts ----------------------------------------------------------------------------------

def test_counter_increase_sums_rises_and_treats_a_drop_as_reset():
    assert counter_increase([(0, 0), (1, 13296), (2, 26880), (3, 40627)]) == 40627
    assert counter_increase([(0, 100), (1, 150), (2, 20), (3, 50)]) == 50 + 20 + 30
    assert counter_increase([(0, 5)]) == 0


def test_gauge_values_one_per_event_in_period():
    assert gauge_values([(0, 10.0), (1, 10.0), (2, 30.0), (3, 30.0)], start=5) == [10.0, 30.0]
    assert gauge_values([(0, 10.0), (1, 30.0)], start=20) == [30.0]


@pytest.mark.slow
def test_unreachable_prometheus_is_a_clear_error():
    r = subprocess.run([sys.executable, "-m", "cachemon.cli", "report", "--prometheus", f"http://127.0.0.1:{free_port()}",
                        "--timeout", "2s"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "cannot reach Prometheus" in r.stderr


@pytest.mark.slow
def test_bad_since_exits_2():
    r = subprocess.run([sys.executable, "-m", "cachemon.cli", "report", "--prometheus", "http://127.0.0.1:9",
                        "--since", "yesterday"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--since" in r.stderr


# --- against a real Prometheus --------------------------------------------------------------------------

class Proc:
    def __init__(self, cmd, **kw):
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)

    def stop(self) -> str:
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(5)
        return self.p.stdout.read() if self.p.stdout else ""


@pytest.fixture
def stack(tmp_path):
    _need_prometheus()
    pages = [(n, (REAL_032 / f"metrics-{n}.txt").read_text()) for n in
             ("idle", "static-system-prompt", "timestamp-in-system-prompt", "request-id-at-head")]
    replay = ReplayServer(pages).start()
    procs = []
    try:
        cport, pport = free_port(), free_port()
        cfg = tmp_path / "cachemon.yaml"
        cfg.write_text(yaml.safe_dump({"upstreams": [{"name": "vllm", "url": replay.url}], "poll_interval": "100ms",
                                       "events": {"interval": "200ms"}, "cost": PRICES}))
        cm = Proc([sys.executable, "-m", "cachemon.cli", "run", "--config", str(cfg), "--listen", f"127.0.0.1:{cport}"])
        procs.append(cm)
        pcfg = tmp_path / "prometheus.yml"
        pcfg.write_text(yaml.safe_dump({"global": {"scrape_interval": "1s"}, "scrape_configs": [
            {"job_name": "cachemon", "static_configs": [{"targets": [f"127.0.0.1:{cport}"]}]}]}))
        prom = Proc([PROMETHEUS, f"--config.file={pcfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                     f"--web.listen-address=127.0.0.1:{pport}"])
        procs.append(prom)
        purl = f"http://127.0.0.1:{pport}"
        wait(lambda: requests.get(purl + "/-/ready", timeout=2).status_code == 200, 60, what="prometheus ready")
        yield replay, purl, cfg
    finally:
        for p in procs:
            out = p.stop()
            if os.environ.get("CACHEMON_TEST_VERBOSE"):
                print(out)
        replay.stop()


def prom_value(purl, promql):
    r = requests.get(purl + "/api/v1/query", params={"query": promql}, timeout=5).json()
    res = r["data"]["result"]
    return float(res[0]["value"][1]) if res else None


@pytest.mark.slow
def test_report_figures_equal_the_series(stack, tmp_path):
    replay, purl, cfg = stack
    hit = f'{C.HIT_TOKENS.sample_name}{{cache="local"}}'
    q = f'{C.QUERY_TOKENS.sample_name}{{cache="local"}}'
    t_start = time.time()
    # Prometheus must hold a sample of the idle page (all zeros) before traffic starts.
    wait(lambda: prom_value(purl, q) == 0.0, 60, what="idle page in prometheus")
    for i, expect in ((1, 13296.0), (2, 26880.0), (3, 40627.0)):
        replay.show(i)
        wait(lambda expect=expect: prom_value(purl, q) == expect, 30, what=f"page {i} in prometheus")
    # a model change, then a restart (the idle page again: counters drop)
    with replay.lock:
        replay.models = [{"id": "tiny-v2", "root": "/models/tiny-v2", "max_model_len": 4096}]
    wait(lambda: prom_value(purl, f'{C.CHANGES.sample_name}{{kind="model"}}') == 1.0, 30, what="model change")
    replay.show(0)
    wait(lambda: prom_value(purl, C.RESTARTS.sample_name) == 1.0, 30, what="restart")
    # misses are published once the page stood still for state/store.SETTLE_S (vLLM's two-statement increment)
    wait(lambda: prom_value(purl, f'{C.MISS_TOKENS.sample_name}{{cache="local"}}') == 29107.0, 30,
         what="the settled misses in prometheus")
    seen = time.time()          # and a scrape after the one that showed it (1 s apart)
    wait(lambda: (prom_value(purl, f'count_over_time(up{{job="cachemon"}}[{int((time.time() - seen) * 1000) + 1}ms])')
                  or 0) >= 1, 10, what="a scrape after the restart")
    end = time.time()
    since = end - t_start + 5

    r = subprocess.run([sys.executable, "-m", "cachemon.cli", "report", "--prometheus", purl, "--since", f"{since:.0f}s",
                        "--until", f"{end:.3f}", "--format", "json", "--config", str(cfg)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    m = rep["models"]["tiny"]

    # (b) vLLM's own counters on the captured pages: idle 0 -> request-id 40627 queried / 11520 hit; 192 generated
    assert (m["query_tokens"], m["hit_tokens"], m["miss_tokens"], m["output_tokens"]) == (40627, 11520, 29107, 192)
    assert m["average_hit_ratio"] == pytest.approx(11520 / 40627)

    # (a) directly from the raw series, computed here with plain last-minus-first (no reset in these series)
    def series_delta(sel):
        res = requests.get(purl + "/api/v1/query", params={"query": f"{sel}[{since:.0f}s]", "time": f"{end:.3f}"},
                           timeout=5).json()["data"]["result"]
        return sum(float(s["values"][-1][1]) - float(s["values"][0][1]) for s in res)

    assert m["hit_tokens"] == series_delta(hit)
    assert m["miss_tokens"] == series_delta(f'{C.MISS_TOKENS.sample_name}{{cache="local"}}')
    cost_with = series_delta(f'{C.ESTIMATED_COST.sample_name}{{scenario="with_cache"}}')
    cost_without = series_delta(f'{C.ESTIMATED_COST.sample_name}{{scenario="without_cache"}}')
    assert m["cost_with_cache"] == pytest.approx(cost_with, rel=1e-12)
    assert m["cost_without_cache"] == pytest.approx(cost_without, rel=1e-12)
    # ... and both equal the prices applied to vLLM's counters
    assert cost_with == pytest.approx((29107 * 3 + 11520 * 0.3 + 192 * 15) / 1e6, rel=1e-9)
    assert cost_without == pytest.approx((40627 * 3 + 192 * 15) / 1e6, rel=1e-9)
    assert m["saving_factor"] == pytest.approx(cost_without / cost_with)
    assert m["output_dominates"] is False

    ev = rep["events"]["vllm"]
    assert ev["restarts"] == 1 and len(ev["restart_times"]) == 1
    assert ev["changes"]["model"] == 1 and len(ev["change_times"]["model"]) == 1
    assert ev["changes"]["version"] == 0
    assert ev["cache_resets"] == 0
    last_restart = prom_value(purl, C.LAST_RESTART.sample_name)
    assert ev["restart_times"] == [last_restart]

    txt = subprocess.run([sys.executable, "-m", "cachemon.cli", "report", "--prometheus", purl, "--since",
                          f"{since:.0f}s", "--until", f"{end:.3f}"], capture_output=True, text=True, timeout=60)
    assert txt.returncode == 0, txt.stderr
    assert "hit tokens          11520" in txt.stdout and "miss tokens         29107" in txt.stdout
    assert "1 restart(s)" in txt.stdout and "1 model change(s)" in txt.stdout
    print(txt.stdout)
    assert "vllm (serving tiny)" in txt.stdout
    assert m["events"]["vllm"]["restarts"] == 1


@pytest.mark.slow
def test_prometheus_url_credentials_are_redacted_in_errors_and_reports():
    """The --prometheus URL is shown through cachemon.urls.redact_url: in the error of an
    unreachable server and in the text and JSON reports."""
    import http.server
    import threading

    r = subprocess.run([sys.executable, "-m", "cachemon.cli", "report", "--prometheus",
                        f"http://bob:pw-424242@127.0.0.1:{free_port()}", "--timeout", "2s"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "cannot reach Prometheus at http://bob:xxxxx@127.0.0.1:" in r.stderr
    assert "pw-424242" not in r.stderr + r.stdout

    class EmptyPrometheus(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b'{"status": "success", "data": {"resultType": "matrix", "result": []}}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), EmptyPrometheus)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://bob:pw-424242@127.0.0.1:{srv.server_address[1]}"
        for fmt in ("text", "json"):
            r = subprocess.run([sys.executable, "-m", "cachemon.cli", "report", "--prometheus", url,
                                "--format", fmt], capture_output=True, text=True, timeout=30)
            assert r.returncode == 0, r.stderr
            assert "pw-424242" not in r.stdout + r.stderr
            shown = f"http://bob:xxxxx@127.0.0.1:{srv.server_address[1]}"
            if fmt == "json":
                assert json.loads(r.stdout)["prometheus"] == shown
            else:
                assert shown in r.stdout
    finally:
        srv.shutdown()
        srv.server_close()
