"""`cachemon run --log-file` as a real subprocess: append to a file, scrape /metrics,
restart the process and check nothing is counted twice."""
from __future__ import annotations

import pytest

from helpers import REAL_032, CachemonProcess, value
from logs_support import Writer, gw

RULES = """
logs:
  rules:
    - regex: 'cache_hit=(?P<hit>\\d+) cache_miss=(?P<miss>\\d+)'
      counters: {hit_tokens: hit, miss_tokens: miss}
upstreams: []
"""


def _hit_rate(line: str) -> float:
    return float(line.rsplit("Prefix cache hit rate: ", 1)[1].strip().rstrip("%")) / 100


@pytest.mark.slow
def test_run_log_file_exports_log_series_and_survives_restart(tmp_path):
    log = tmp_path / "vllm.log"
    w = Writer(log)
    real = (REAL_032 / "server.log").read_text().splitlines(keepends=True)
    stats = [line for line in real if "] Engine 000:" in line]
    w.write(real[0])                          # before start: skipped (from the end)
    cfg = tmp_path / "cachemon.yaml"
    cfg.write_text(RULES)
    state = tmp_path / "state.json"
    args = ("--config", str(cfg), "--log-file", str(log), "--state-file", str(state))
    p = CachemonProcess(*args)
    try:
        w.write(stats[0] + gw(960, 40) + stats[1])
        up = "log:vllm.log"
        # The self-metrics and the store are separate collectors: a scrape can fall between a
        # poll's line count and its store update, so wait for both.
        page = p.wait_for(lambda s: value(s, "cachemon_log_lines_total", outcome="parsed") == 3
                          and value(s, "cachemon_prefix_cache_hit_tokens_total", upstream=up) == 960)
        assert value(page, "cachemon_prefix_cache_hit_tokens_total", upstream=up) == 960
        assert value(page, "cachemon_prefix_cache_query_tokens_total", upstream=up) == 1000
        assert value(page, "cachemon_prefix_cache_reported_hit_ratio", upstream=up, engine="0",
                     basis="recent_requests") == pytest.approx(_hit_rate(stats[1]))
        assert value(page, "cachemon_kv_cache_usage_ratio", upstream=up, engine="0") == 0.0
        assert value(page, "cachemon_log_files_open", upstream=up) == 1
        assert value(page, "cachemon_upstream_up", upstream=up) == 1
        assert value(page, "cachemon_log_last_stats_line_timestamp_seconds", upstream=up, file=str(log)) is not None
        w.write("cache_hit=5 cache_mi")      # partial line at shutdown
    finally:
        out = p.stop()
    assert "Traceback" not in out
    w.write("ss=1\n" + gw(35, 0))
    p = CachemonProcess(*args)
    try:
        page = p.wait_for(lambda s: value(s, "cachemon_prefix_cache_hit_tokens_total", upstream="log:vllm.log") == 1000)
        assert value(page, "cachemon_prefix_cache_hit_tokens_total", upstream="log:vllm.log") == 1000
        assert value(page, "cachemon_prefix_cache_miss_tokens_total", upstream="log:vllm.log") == 41
    finally:
        p.stop()
    w.close()


@pytest.mark.slow
def test_run_with_missing_log_reports_down_not_crash(tmp_path):
    p = CachemonProcess("--log-file", str(tmp_path / "absent.log"), "--state-file", str(tmp_path / "s.json"))
    try:
        page = p.wait_for(lambda s: value(s, "cachemon_upstream_up", upstream="log:absent.log") == 0)
        assert value(page, "cachemon_upstream_up", upstream="log:absent.log") == 0
        assert value(page, "cachemon_upstream_scrape_errors_total", upstream="log:absent.log", reason="missing") >= 1
    finally:
        p.stop()
