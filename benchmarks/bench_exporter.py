"""Exporter benchmarks (issue: core exporter).

- parse + normalise the real 52 KB vLLM 0.32.0 page vs prometheus_client's parser (target >= 30x)
- render cachemon's own /metrics with 256 series, text and OpenMetrics (target <= 2 ms each)
- steady-state RSS of a real `cachemon run` process (target <= 40 MB)
"""
from __future__ import annotations

import subprocess
import sys
import time

from common import FIXTURES, median_seconds, result, token_series_store

PAGE = (FIXTURES / "vllm-0.32.0-cpu" / "metrics-static-system-prompt.txt").read_text()


def bench_parse():
    from prometheus_client.parser import text_string_to_metric_families

    from cachemon.normalise.normaliser import Normaliser

    normaliser = Normaliser()       # one per upstream, as the poller keeps it
    ours = median_seconds(lambda: normaliser.normalise_text(PAGE), repeat=51, number=20)
    base = median_seconds(lambda: list(text_string_to_metric_families(PAGE)), repeat=11, number=2)
    ratio = base / ours
    return result(f"parse + normalise real vLLM 0.32.0 /metrics ({len(PAGE) // 1024} KB)", ours, base,
                  "prometheus_client text_string_to_metric_families", ">= 30x", passed=ratio >= 30)


def _render_fixture():
    """cachemon's registry with 327 token series, and a prometheus_client registry of as many."""
    from prometheus_client import CollectorRegistry, Counter

    from cachemon.expose.collector import CachemonCollector
    from cachemon.web.workers import Registry

    # 32 (model, engine) pairs x (query, hit, miss) x 2 caches + 2 windows x 64 ratios = 320 token series
    store = token_series_store()
    reg = Registry()
    reg.register(CachemonCollector(store))
    body = reg.render().decode()
    n_series = sum(1 for line in body.splitlines() if line and not line.startswith("#"))

    base_reg = CollectorRegistry()
    fam = Counter("baseline_tokens", "baseline", ["upstream", "model_name", "engine", "cache", "kind"], registry=base_reg)
    for i in range(n_series):
        fam.labels("vllm", f"model-{i % 8}", str(i % 4), "local", str(i)).inc(5)
    return reg, base_reg, n_series


def bench_render(reg, base_reg, n_series):
    from prometheus_client import generate_latest

    ours = median_seconds(reg.render, repeat=51, number=5)
    base = median_seconds(lambda: generate_latest(base_reg), repeat=51, number=5)
    return result(f"render cachemon /metrics ({n_series} series)", ours, base,
                  "prometheus_client Counter registry, same series count", "<= 2 ms", passed=ours <= 0.002)


def bench_render_openmetrics(reg, base_reg, n_series):
    # Prometheus asks for OpenMetrics first, so this is what a real scrape costs.
    from prometheus_client.openmetrics.exposition import generate_latest

    ours = median_seconds(lambda: reg.render(openmetrics=True), repeat=51, number=5)
    base = median_seconds(lambda: generate_latest(base_reg), repeat=51, number=5)
    return result(f"render cachemon /metrics as OpenMetrics ({n_series} series)", ours, base,
                  "prometheus_client OpenMetrics generate_latest, same series count", "<= 2 ms",
                  passed=ours <= 0.002)


def bench_rss():
    from cachemon.demo.replay import ReplayServer, bundled_pages

    with ReplayServer(bundled_pages()) as replay:
        replay.show(1)
        proc = subprocess.Popen([sys.executable, "-m", "cachemon.cli", "run", "--upstream", f"vllm={replay.url}",
                                 "--listen", "127.0.0.1:0", "--poll-interval", "250ms", "--log-level", "warning"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            time.sleep(8)   # ~30 polls: steady state
            rss_kb = _rss_kb(proc.pid)
        finally:
            proc.terminate()
            proc.wait(10)
    bare = subprocess.run([sys.executable, "-c",
                           "import re;print([l for l in open('/proc/self/status') if l.startswith('VmRSS')][0].split()[1])"],
                          capture_output=True, text=True)
    bare_kb = int(bare.stdout.strip())
    mb = rss_kb / 1024
    return result("steady-state RSS of `cachemon run` polling every 250 ms", mb, bare_kb / 1024,
                  "bare python3 interpreter", "<= 40 MB", unit="MB", passed=mb <= 40)


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def run():
    fixture = _render_fixture()
    return [bench_parse(), bench_render(*fixture), bench_render_openmetrics(*fixture), bench_rss()]


if __name__ == "__main__":
    for r in run():
        print(r)
