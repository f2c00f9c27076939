"""vLLM 0.32.0's Rust frontend against its Python frontend, on the real capture of the same traffic through
both (tests/fixtures/vllm-0.32.0-cpu-rust-frontend: raw /metrics every 2 s with three Accept headers, a
restart, the ANSI server log). Nothing here is constructed."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families as text_families

from cachemon import catalog as C
from cachemon.cli import main as cli
from cachemon.normalise import log_grammar
from cachemon.normalise.log_stream import LogStream
from cachemon.normalise.log_updates import log_gauges, log_info
from cachemon.normalise.normaliser import normalise_text, to_update
from cachemon.state.store import Store
from helpers import FIXTURES, samples, value

CAPTURE = FIXTURES / "vllm-0.32.0-cpu-rust-frontend"
LOCAL = ("tiny", "0", "local")
# vLLM's own counters, first process's last poll + second process's last poll (README "Counters across
# the restart"): the exact totals across the restart
QUERIES, HITS = 5811 + 5814, 2304 + 2304


def polls(frontend: str) -> list[dict]:
    """Every poll, with the page it served filled in where the line says it was unchanged."""
    out, last = [], {}
    for line in (CAPTURE / frontend / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if "text" in r and r["text"]:
            last[r["accept"]] = r["text"]
        elif r.get("same_as_accept"):
            r["text"] = last[r["same_as_accept"]]
        else:
            r["text"] = last[r["accept"]]
        last[r["accept"]] = r["text"]
        out.append(r)
    return out


def test_the_rust_frontend_serves_openmetrics_whatever_accept_asks():
    rust = polls("rust")
    assert {r["accept"] for r in rust} == {"text/plain", None, "application/openmetrics-text; version=1.0.0; charset=utf-8"}
    assert {r["content_type"] for r in rust} == {"application/openmetrics-text; version=1.0.0; charset=utf-8"}
    assert all(r["text"].rstrip().endswith("# EOF") for r in rust)
    assert {r["content_type"].split(";")[0] for r in polls("python")} == {"text/plain"}


@pytest.mark.parametrize("frontend", ["rust", "python"])
def test_every_page_reads_as_vllms_own_parser_reads_it(frontend):
    """cachemon's selective parser against prometheus_client's OpenMetrics (Rust) / text (Python) parser."""
    pages = {r["text"] for r in polls(frontend)}
    assert len(pages) >= 10
    for text in pages:
        vllm = samples(text, openmetrics_families if frontend == "rust" else text_families)
        n = normalise_text(text)
        assert n.era.name == "v1-prefix-cache" and not n.problems
        assert n.counters[(C.QUERY_TOKENS.name, LOCAL)] == value(vllm, "vllm:prefix_cache_queries_total")
        assert n.counters[(C.HIT_TOKENS.name, LOCAL)] == value(vllm, "vllm:prefix_cache_hits_total")
        for tier in ("device", "host", "disk", "p2p", "external_unspecified"):
            assert n.counters[(C.HIT_TOKENS_BY_SOURCE.name, ("tiny", "0", tier))] == value(
                vllm, "vllm:prompt_tokens_cached_by_source_total", source=tier)
        if frontend == "rust":     # the fields this frontend's page lacks
            assert n.process_start_time is None and not n.engines
            assert not any(s.created for s in n.samples)


@pytest.mark.parametrize("frontend", ["rust", "python"])
def test_one_restart_is_counted_once_and_the_totals_are_exact(frontend):
    st = Store({"1m": 60.0}).upstream("u")
    reasons = []
    for r in polls(frontend):
        if r["accept"] == "text/plain":
            why = st.apply(to_update(normalise_text(r["text"])), r["t"])
            if why:
                reasons.append(why)
    # Rust: the first restart poll lacks prompt_tokens_total and the histograms (no traffic yet); they
    # come back below their old values with the first requests: before the fix, a second restart
    assert st.restarts == 1, reasons
    assert st.counters[(C.QUERY_TOKENS.name, LOCAL)].value == QUERIES
    assert st.counters[(C.HIT_TOKENS.name, LOCAL)].value == HITS
    requests = [v.value for k, v in st.counters.items() if k == (C.PROMPT_LENGTH_REQUESTS.name, ("tiny", "0", "+Inf"))]
    assert requests == [7 + 7]


def rust_log() -> Path:
    return CAPTURE / "rust" / "vllm-server.log"


def test_the_rust_stats_lines_are_all_read():
    raw = rust_log().read_bytes()
    assert b"\x1b[" in raw                                   # ANSI codes, in a file
    stream = LogStream("rust")
    stream.feed(raw)
    text = raw.decode()
    n_stats = text.count("[log_stats.rs:")
    assert n_stats == 5 and stream.stats_lines == n_stats and stream.lines["malformed"] == 0
    assert stream.era == "rust-frontend-log" and stream.vllm_restarts == 1     # pid 4575 -> 9955
    # every 10 s whatever VLLM_LOG_STATS_INTERVAL (2) says: the fixed interval caps the throughput estimate
    times = [log_grammar.log_time(ln) for ln in text.splitlines() if "[log_stats.rs:" in ln]
    assert [b - a for a, b in zip(times[:-1], times[1:], strict=True)] == [10.0, 55.0, 10.0, 10.0]
    [last] = stream.stats.values()
    assert last.kind == "rust" and last.interval == 10.0 and last.prompt_throughput == 0.0
    assert last.hit_rates == {}            # the idle interval's "0.0%" is of nothing: no ratio
    # where this frontend says its config: the engine core's start-up lines in the same log
    assert stream.config == {"frontend": "rust", "version": "0.32.0", "prefix_caching": "True",
                             "blocks": "160", "pool": "20480"}
    g = log_gauges(stream)
    assert g[(C.BLOCK_SIZE.name, ("", ""))] == 128.0 == g[(C.MATCH_FLOOR.name, ("", ""))]
    assert g[(C.PREFIX_CACHING_ENABLED.name, ("", ""))] == 1.0
    info = log_info(stream)
    assert (info.block_size, info.prefix_caching, info.vllm_version) == ("128", "true", "0.32.0")


def test_a_rust_line_with_traffic_gives_its_interval_hit_rate():
    line = next(ln for ln in rust_log().read_text().splitlines() if "[log_stats.rs:" in ln)
    s = log_grammar.parse(line)
    assert s is not None and s.pid == "4575" and s.device == "GPU"      # "GPU KV cache used" even on CPU
    assert (s.prompt_throughput, s.running, s.waiting, s.kv_usage, s.hit_rates) == (
        100.8, 0, 0, 0.0, {"local": pytest.approx(0.696)})


def test_check_log_file_on_the_real_rust_log():
    res = CliRunner().invoke(cli, ["check", "--log-file", str(rust_log())])
    out = res.output
    assert "era: rust-frontend-log" in out and "vLLM 0.32.0" in out
    assert re.search(r"lines: \d+ parsed \(5 vLLM stats lines\), \d+ unmatched, 0 malformed", out)
    assert "prefix caching true, block size 128" in out


def test_attribution_reads_the_block_size_the_rust_log_states():
    """The Rust page has no cache_config_info: the causes that need the block size read the linked log's
    start-up lines (the daemon's logs.files[].upstream link; here the only metrics upstream)."""
    from cachemon.judge.attribute import attribute
    from cachemon.judge.snapshots import SnapshotBuilder, read_store
    from cachemon.normalise.log_updates import log_update
    from cachemon.runtime.attribution_stage import AttributionSettings

    meta = json.loads((CAPTURE / "rust" / "metadata.json").read_text())
    head = next(p["t"] for p in meta["phases"] if p["phase"] == "traffic round 0: timestamp at the head")
    pages = [r for r in polls("rust") if r["accept"] == "text/plain"]
    store = Store({"1m": 60.0})
    builder = SnapshotBuilder(AttributionSettings())
    page_st = store.upstream("rust")
    before = [r for r in pages if r["t"] < head]
    with store.lock:
        page_st.apply(to_update(normalise_text(before[-1]["text"])), before[-1]["t"])
    builder.build(read_store(store), before[-1]["t"])
    [blind] = builder.build(read_store(store), before[-1]["t"] + 1)
    assert (blind.block_size, blind.prefix_caching) == (None, "")          # the page alone says neither
    stream = LogStream("log", model_name="tiny")
    stream.feed(rust_log().read_bytes())
    log_st = store.upstream("log", "log")
    with store.lock:
        log_st.apply(log_update(stream), before[-1]["t"] + 1)
    after = next(r for r in pages if r["t"] > head + 4)                   # the 3 head requests done
    with store.lock:
        page_st.apply(to_update(normalise_text(after["text"])), after["t"])
    [snap] = builder.build(read_store(store), after["t"])
    assert (snap.block_size, snap.match_floor, snap.prefix_caching, snap.pool_tokens) == (128, 128, "true", 20480.0)
    assert "--block-size 128" in snap.analyze_hint
    # the 3 requests with the time at the head of the system prompt: vLLM hit 0 of their tokens
    a = attribute(snap)
    assert a.ratio == 0.0 and a.codes == ("dynamic_prefix_suspected",)


def test_check_on_the_rust_pages_served_again():
    """`cachemon check --upstream` on two real Rust pages (before and after the 3 requests with the time at
    the head), served again as recorded by the replay server: the OpenMetrics body is read whatever its
    Content-Type and the interval judged; without the log the block size is unknown, so the dynamic-prefix
    heuristic, which needs prompts provably longer than it, stays silent (with the log it is named:
    test_attribution_reads_the_block_size_the_rust_log_states)."""
    from cachemon.check import check_upstream
    from cachemon.demo.replay import ReplayServer

    meta = json.loads((CAPTURE / "rust" / "metadata.json").read_text())
    head = next(p["t"] for p in meta["phases"] if p["phase"] == "traffic round 0: timestamp at the head")
    pages = [r for r in polls("rust") if r["accept"] == "text/plain"]
    before = [r for r in pages if r["t"] < head][-1]["text"]
    after = next(r for r in pages if r["t"] > head + 4)["text"]
    with ReplayServer([("before", before), ("after", after)]) as srv:
        rep = check_upstream(srv.url, 0.01, 5, sleep=lambda s: srv.show(1))
    assert rep["era"] == "v1-prefix-cache" and rep["cache_config"]["block_size"] is None
    [a] = rep["attribution"]
    assert a["hit_ratio"] == 0.0 and a["severity"] == "critical" and a["causes"] == []
