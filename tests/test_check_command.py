"""`cachemon check`: era, unified numbers, findings, the JSON schema and exit codes, on real captures."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cachemon.check import check_upstream, exit_code
from cachemon.demo.replay import ReplayServer, bundled_pages, load_pages
from helpers import FIXTURES, free_port


@pytest.fixture
def replay():
    srv = ReplayServer(bundled_pages()).start()
    yield srv
    srv.stop()


def codes(rep):
    return {f["code"]: f["severity"] for f in rep["findings"]}


def test_static_prompt_is_healthy(replay):
    replay.show(1)
    rep = check_upstream(f"vllm={replay.url}", 0, 5)
    assert rep["up"] and rep["era"] == "v1-prefix-cache" and rep["vllm_version"] == "0.32.0"
    assert rep["cache_config"] == {"prefix_caching": "true", "block_size": 128, "hash_algo": "sha256"}
    local = [s for s in rep["series"] if s["cache"] == "local"][0]
    assert (local["query_tokens"], local["hit_tokens"], local["miss_tokens"]) == (13296, 11520, 1776)
    assert local["hit_ratio_since_start"] == pytest.approx(11520 / 13296)
    assert exit_code([rep]) == 0


def test_interval_sees_the_timestamp_collapse(replay):
    replay.show(1)
    rep = check_upstream(f"vllm={replay.url}", 0.01, 5, sleep=lambda s: replay.show(2))
    local = [s for s in rep["series"] if s["cache"] == "local"][0]
    assert local["interval"]["query_tokens"] == 26880 - 13296 and local["interval"]["hit_tokens"] == 0
    assert codes(rep)["no_hits"] == "critical"
    assert exit_code([rep]) == 3


def test_v0_ratio_only_and_low_ratio_findings():
    pages = load_pages([str(FIXTURES / "vllm-0.8.5-cpu-v0-show-hidden-0.7" / "metrics-static-system-prompt.txt")])
    with ReplayServer(pages, version="0.8.5.post2") as srv:
        rep = check_upstream(srv.url, 0, 5)
    assert rep["era"] == "v0-hit-rate-gauge" and rep["series"] == []
    local = [r for r in rep["reported_hit_ratios"] if r["cache"] == "local"]
    assert local == [{"model_name": "tiny", "engine": "", "cache": "local", "basis": "since_start_blocks", "value": 0.9375}]
    assert "ratio_only" in codes(rep) and "low_hit_ratio" not in codes(rep)


def test_disabled_prefix_caching_is_critical():
    with ReplayServer(load_pages([str(FIXTURES / "constructed" / "v0-disabled.txt")])) as srv:
        rep = check_upstream(srv.url, 0, 5)
    assert codes(rep)["prefix_caching_disabled"] == "critical"


def test_no_metrics_page_explains_why():
    with ReplayServer(load_pages([str(FIXTURES / "vllm-0.8.5-cpu-v0" / "metrics-static-system-prompt.txt")])) as srv:
        rep = check_upstream(srv.url, 0, 5)
    assert codes(rep)["no_prefix_cache_metrics"] == "warning" and exit_code([rep]) == 1


@pytest.mark.slow
def test_cli_json_schema_and_exit_code_for_unreachable_upstream():
    url = f"http://127.0.0.1:{free_port()}/metrics"
    r = subprocess.run([sys.executable, "-m", "cachemon.cli", "check", "--upstream", url, "--interval", "0",
                        "--format", "json"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 3
    rep = json.loads(r.stdout)
    assert rep["schema"] == "cachemon-check/1" and rep["exit_code"] == 3
    src = rep["sources"][0]
    assert set(src) >= {"kind", "name", "url", "path", "up", "error", "era", "era_versions", "counter_unit",
                        "vllm_version", "cache_config", "series", "reported_hit_ratios", "gauges", "findings"}
    assert src["up"] is False and src["error"]["reason"] == "refused"


@pytest.mark.slow
def test_cli_text_output(replay):
    replay.show(3)
    r = subprocess.run([sys.executable, "-m", "cachemon.cli", "check", "--upstream", replay.url, "--interval", "0"],
                       capture_output=True, text=True, timeout=30)
    assert "era: v1-prefix-cache" in r.stdout
    assert "queries 40627 tokens, hits 11520" in r.stdout
    # --interval 0: no traffic seen, so the 28.4 % since start is a warning (the same on every era)
    assert r.returncode == 1
    assert "low_hit_ratio" in r.stdout and "no_traffic" in r.stdout


@pytest.mark.slow
def test_log_and_metrics_sources_share_one_report_builder(tmp_path, replay):
    """Same counters, same findings: a log whose rule reports the timestamp-collapse interval's
    numbers gets the same no_hits / low_hit_ratio verdicts as the /metrics page (one builder)."""
    replay.show(3)      # 0.32.0 page after the dynamic heads: 28.4 % since start
    page = check_upstream(f"vllm={replay.url}", 0, 5)
    local = [r for r in page["series"] if r["cache"] == "local"][0]
    log = tmp_path / "gateway.log"
    log.write_text(f"t INFO gateway model=tiny cache_hit={local['hit_tokens']:.0f} "
                   f"cache_miss={local['miss_tokens']:.0f}\n")
    cfg = tmp_path / "cachemon.yaml"
    cfg.write_text("logs:\n  builtin_parsers: false\n  rules:\n    - name: gw\n"
                   "      regex: 'model=(?P<model>\\S+) cache_hit=(?P<hit>\\d+) cache_miss=(?P<miss>\\d+)'\n"
                   "      labels: {model_name: {group: model}}\n"
                   "      counters: {hit_tokens: hit, miss_tokens: miss}\n")
    r = subprocess.run([sys.executable, "-m", "cachemon.cli", "check", "--config", str(cfg), "--log-file", str(log),
                        "--format", "json"], capture_output=True, text=True, timeout=60)
    rep = json.loads(r.stdout)
    (src,) = rep["sources"]
    (row,) = src["series"]
    assert set(row) == set(local)
    assert (row["query_tokens"], row["hit_tokens"]) == (local["query_tokens"], local["hit_tokens"])
    severity = {f["code"]: f["severity"] for f in page["findings"] if f["code"] == "low_hit_ratio"}
    assert severity == {f["code"]: f["severity"] for f in src["findings"] if f["code"] == "low_hit_ratio"}
    # no interval on either: since start, a warning at most, for the page and the log alike
    assert severity == {"low_hit_ratio": "warning"} and r.returncode == exit_code([page]) == 1


def test_check_reads_through_the_daemons_store_on_an_injected_clock_and_session(replay):
    """check's two reads go through `cachemon run`'s Store and UpstreamPoller: the interval is the
    injected clock's (no wall time in the verdict) and every request goes through the injected session."""
    from cachemon.sources.scrape import new_session
    now = [1_000_000.0]
    session = new_session()
    asked: list[str] = []
    request = session.request

    def recorded(method, url, *a, **k):
        asked.append(url.rsplit("/", 1)[-1])
        return request(method, url, *a, **k)

    session.request = recorded

    def sleep(seconds: float) -> None:
        now[0] += seconds
        replay.show(2)

    replay.show(1)
    rep = check_upstream(f"vllm={replay.url}", 30.0, 5, session=session, sleep=sleep, clock=lambda: now[0])
    local = [s for s in rep["series"] if s["cache"] == "local"][0]
    assert local["interval"]["seconds"] == 30.0 and local["interval"]["query_tokens"] == 26880 - 13296
    [a] = rep["attribution"]
    assert a["basis"] == "interval" and a["hit_ratio"] == 0.0 and a["severity"] == "critical"
    assert "over the last 30s" in {f["code"]: f["message"] for f in rep["findings"]}["no_hits"]
    assert asked == ["metrics", "version", "metrics"]


def _gateway_log(tmp_path, line: str):
    """A gateway log and the rule that reads it (CONSTRUCTED lines, as in the test above)."""
    from cachemon.runconfig import from_dict
    log = tmp_path / "gateway.log"
    log.write_text(line)
    cfg = from_dict({"logs": {"builtin_parsers": False, "rules": [{
        "name": "gw", "regex": r"model=(?P<model>\S+) cache_hit=(?P<hit>\d+) cache_miss=(?P<miss>\d+)",
        "labels": {"model_name": {"group": "model"}}, "counters": {"hit_tokens": "hit", "miss_tokens": "miss"}}]}})
    return log, cfg


def test_a_log_beside_an_upstream_is_read_twice_and_judged_over_the_interval_like_a_page(tmp_path, replay):
    """The log source feeds the same store as the poller and the engine judges both over one interval:
    lines appended during --interval are the log's interval traffic."""
    from cachemon.check import log_config as _log_config
    from cachemon.check import parse_upstreams, run_checks
    log, cfg = _gateway_log(tmp_path, "t INFO gateway model=tiny cache_hit=9000 cache_miss=1000\n")
    now = [2_000_000.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds
        replay.show(1)
        with log.open("a") as f:
            f.write("t INFO gateway model=tiny cache_hit=0 cache_miss=4000\n")

    page, src = run_checks(parse_upstreams([f"vllm={replay.url}"], (), 5.0), 10.0, {},
                           logs=_log_config([str(log)], True, cfg), sleep=sleep, clock=lambda: now[0])
    [a] = src["attribution"]
    # 90 % before the window, 0 hits of 4000 tokens in it: critical, judged over the interval as a page is
    assert (a["model_name"], a["basis"], a["hit_ratio"], a["severity"]) == ("tiny", "interval", 0.0, "critical")
    assert page["attribution"][0]["basis"] == "interval" and exit_code([src]) == 3


def test_a_log_followed_from_its_end_alone_is_judged_since_it_was_first_read(tmp_path):
    """--from-end: the log's series are born inside the window, so there is no base to cut an interval
    from (as for a series a page shows first at the second read): a warning at most, as before."""
    from cachemon.check import log_config as _log_config
    from cachemon.check import run_checks
    log, cfg = _gateway_log(tmp_path, "t INFO gateway model=tiny cache_hit=9000 cache_miss=1000\n")
    now = [2_000_000.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds
        with log.open("a") as f:
            f.write("t INFO gateway model=tiny cache_hit=0 cache_miss=4000\n")

    (src,) = run_checks([], 10.0, {}, logs=_log_config([str(log)], False, cfg), sleep=sleep, clock=lambda: now[0])
    [a] = src["attribution"]
    assert (a["basis"], a["hit_ratio"], a["severity"]) == ("since_start", 0.0, "warning")
    assert src["series"][0]["query_tokens"] == 4000 and exit_code([src]) == 1
