"""The real vLLM 0.32.0 server.log through the whole log source and `cachemon check`."""
from __future__ import annotations

import json
import re
import shutil

import pytest
from click.testing import CliRunner

from cachemon import catalog as C
from cachemon.cli import main
from cachemon.expose.collector import CachemonCollector
from cachemon.expose.render import render
from cachemon.normalise.log_updates import log_gauges
from cachemon.state.store import Store
from helpers import REAL_032
from logs_support import Clock, config, source

LOG = REAL_032 / "server.log"


def _expected_last_per_engine():
    """Independent reading of the fixture: the last stats line of each engine, split by hand."""
    last = {}
    for line in LOG.read_text().splitlines():
        m = re.search(r"\] Engine (\d+): (.*)$", line)
        if m:
            last[str(int(m.group(1)))] = dict(p.split(": ", 1) for p in m.group(2).split(", "))
    return last


def test_every_stats_line_parsed_and_last_values_match(tmp_path):
    log = tmp_path / "server.log"
    shutil.copy(LOG, log)
    src = source(config([log], tmp_path, from_beginning=True, rules=()), Clock())
    src.poll()
    s = src.entries[0].stream
    n_stats = sum(1 for line in LOG.read_text().splitlines() if "] Engine 000: Avg prompt throughput" in line)
    n_lines = LOG.read_bytes().count(b"\n")
    assert n_stats > 0
    assert s.stats_lines == n_stats
    # the prefix-cache reset lines (POST /reset_prefix_cache) are parsed lines too
    n_resets = sum(1 for line in LOG.read_text().splitlines()
                   if line.endswith(("] Resetting prefix cache...", "] Successfully reset prefix cache")))
    assert n_resets == 2
    # the engine's start-up lines that state its config (the prefix-caching flag, the pool, the block count)
    n_config = sum(1 for line in LOG.read_text().splitlines()
                   if "] Initializing a V1 LLM engine (v" in line or " KV cache size: " in line
                   or "with num_gpu_blocks_override=" in line)
    assert n_config >= 2 and s.config["prefix_caching"] == "True"
    parsed = n_stats + n_resets + n_config
    assert s.lines == {"parsed": parsed, "unmatched": n_lines - parsed, "malformed": 0}
    g = log_gauges(s)
    for engine, fields in _expected_last_per_engine().items():
        kv = float(fields["CPU KV cache usage"].rstrip("%")) / 100
        hit = float(fields["Prefix cache hit rate"].rstrip("%")) / 100
        assert g[(C.KV_CACHE_USAGE.name, ("", engine))] == pytest.approx(kv)
        assert g[(C.REPORTED_HIT_RATIO.name, ("", engine, "local", "recent_requests"))] == pytest.approx(hit)
        assert g[(C.REQUESTS_RUNNING.name, ("", engine))] == float(fields["Running"].split()[0])
    # the logged hit rate never becomes token counts
    assert not any(m in (C.QUERY_TOKENS.name, C.HIT_TOKENS.name) for (m, _) in s.counters)
    assert s.era == "v1-log-0.30+"
    assert s.vllm_restarts == 1          # the capture holds two server runs (pid 22255, then 23690)


def test_exposed_through_the_collectors(tmp_path):
    from helpers import samples, value
    log = tmp_path / "server.log"
    shutil.copy(LOG, log)
    store = Store({"1m": 60.0})
    src = source(config([log], tmp_path, from_beginning=True, rules=()), Clock(), store)
    src.poll()
    page = samples(render([CachemonCollector(store), src]).decode())
    last = _expected_last_per_engine()["0"]
    assert value(page, "cachemon_prefix_cache_reported_hit_ratio", upstream="log0", engine="0",
                 basis="recent_requests") == pytest.approx(float(last["Prefix cache hit rate"].rstrip("%")) / 100)
    # + the reset lines, + the engine start-up lines that state its config (2 starts x init and pool)
    assert value(page, "cachemon_log_lines_total", upstream="log0", outcome="parsed") == 11 + 2 + 4
    assert value(page, "cachemon_log_prefix_cache_resets_total", upstream="log0", result="done") == 1
    assert value(page, "cachemon_log_read_bytes_total", upstream="log0") == LOG.stat().st_size
    assert value(page, "cachemon_log_files_open", upstream="log0") == 1
    assert value(page, "cachemon_upstream_info", upstream="log0", kind="log") == 1
    est = value(page, "cachemon_prompt_tokens_estimated_total", upstream="log0", engine="0")
    assert est is not None and est > 0
    # no prompt text in any label: the request-log lines hold prompts
    text = render([CachemonCollector(store), src]).decode()
    assert "parcel" not in text and "SamplingParams" not in text


def test_check_json_reports_the_log(tmp_path):
    res = CliRunner().invoke(main, ["check", "--log-file", str(LOG), "--from-beginning", "--format", "json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)
    assert rep["schema"] == "cachemon-check/1"
    (src,) = rep["sources"]
    assert src["kind"] == "log" and src["path"] == str(LOG) and src["up"]
    last = _expected_last_per_engine()["0"]
    (r,) = src["reported_hit_ratios"]
    assert r["value"] == pytest.approx(float(last["Prefix cache hit rate"].rstrip("%")) / 100)
    assert src["log"]["stats_lines"] == 11 and src["log"]["lines"]["malformed"] == 0
    assert "text_extra" not in src


def test_check_text_and_missing_file(tmp_path):
    res = CliRunner().invoke(main, ["check", "--log-file", str(LOG)])
    assert "17 parsed" in res.output and "reported hit ratio" in res.output   # 11 stats, 2 resets, 4 start-up
    assert "prefix_cache_reset" in res.output and "Successfully reset prefix cache" in res.output
    res = CliRunner().invoke(main, ["check", "--log-file", str(tmp_path / "nope.log"), "--format", "json"])
    assert res.exit_code == 3
    assert json.loads(res.output)["sources"][0]["up"] is False
