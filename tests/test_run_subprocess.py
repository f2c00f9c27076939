"""`cachemon run` as a real subprocess against a local server replaying real vLLM 0.32.0 captures.

Scraped output is parsed with prometheus_client's parser.
"""
from __future__ import annotations

import re

import pytest

from cachemon.demo.replay import ReplayServer, bundled_pages
from helpers import CachemonProcess, value

Q = "cachemon_prefix_cache_query_tokens_total"
H = "cachemon_prefix_cache_hit_tokens_total"
LOCAL = dict(upstream="vllm", model_name="tiny", engine="0", cache="local")


@pytest.fixture
def replay():
    srv = ReplayServer(bundled_pages()).start()
    yield srv
    srv.stop()


@pytest.fixture
def cachemon(replay):
    procs = []

    def start(*extra):
        p = CachemonProcess("--upstream", f"vllm={replay.url}", "--poll-interval", "100ms", *extra)
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.stop()


@pytest.mark.slow
def test_exports_vllms_counters_exactly_and_survives_a_restart(replay, cachemon):
    replay.show(1)                                  # static system prompt: 13296 / 11520
    cm = cachemon()
    m = cm.wait_for(lambda m: value(m, Q, **LOCAL) == 13296)
    assert value(m, H, **LOCAL) == 11520
    assert value(m, "cachemon_prefix_cache_miss_tokens_total", **LOCAL) == 13296 - 11520
    assert value(m, "cachemon_upstream_up", upstream="vllm") == 1
    assert value(m, "cachemon_upstream_info", upstream="vllm", era="v1-prefix-cache", vllm_version="0.32.0",
                 prefix_caching="true", block_size="128", hash_algo="sha256", counter_unit="tokens") == 1

    replay.show(2)                                  # timestamp at the head: queries grow, hits don't
    m = cm.wait_for(lambda m: value(m, Q, **LOCAL) == 26880)
    assert value(m, H, **LOCAL) == 11520
    # cachemon has run < 1 min, so its 1m window starts at its first poll (the static page):
    # since then 13584 query tokens and 0 hits.
    assert value(m, "cachemon_prefix_cache_hit_ratio", window="1m", **LOCAL) == 0.0

    replay.show(0)                                  # vLLM restarted: counters back to 0
    m = cm.wait_for(lambda m: value(m, "cachemon_upstream_restarts_total", upstream="vllm") == 1)
    assert value(m, Q, **LOCAL) == 26880            # never goes down
    replay.show(1)                                  # the new process serves 16 requests
    m = cm.wait_for(lambda m: value(m, Q, **LOCAL) == 26880 + 13296)
    assert value(m, H, **LOCAL) == 11520 * 2
    assert value(m, "cachemon_upstream_last_restart_timestamp_seconds", upstream="vllm") > 1.7e9


@pytest.mark.slow
def test_exposition_follows_prometheus_naming(replay, cachemon):
    replay.show(1)
    cm = cachemon()
    cm.wait_for(lambda m: value(m, Q, **LOCAL) == 13296)
    text = cm.text()
    for line in text.splitlines():
        if line.startswith("# TYPE"):
            _, _, name, kind = line.split()
            assert ":" not in name
            assert name.startswith(("cachemon_", "process_"))   # process_*: cachemon's own process
            if kind == "counter":
                assert name.endswith("_total")
    assert re.search(r'^cachemon_build_info\{version="[^"]+",revision="[^"]+",python_version="3\.[0-9]+\.[^"]+"\} 1\.0$',
                     text, re.M)


@pytest.mark.parametrize("fault,reason", [
    ("http500", "http_status"),
    ("garbage", "not_exposition"),
    ("html", "not_exposition"),
    ("truncated", "truncated"),
    ("huge", "too_large"),
    ("hang", "timeout"),
    ("slow", "timeout"),        # trickles 512 bytes every 50 ms: the whole-transfer deadline cuts it
    # 5 bytes a second, so every socket read returns something before the read timeout:
    # only a deadline on the whole transfer ends the poll (the body, or status + headers)
    ("trickle", "timeout"),
    ("trickle_headers", "timeout"),
])
@pytest.mark.slow
def test_bad_upstream_sets_up_0_with_the_reason_and_recovers(replay, cachemon, tmp_path, fault, reason):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"upstreams:\n  - name: vllm\n    url: {replay.url}\n    timeout: 1s\n    max_body_bytes: 1000000\n")
    replay.show(1)
    cm = CachemonProcess("--config", str(cfg), "--poll-interval", "100ms")
    try:
        cm.wait_for(lambda m: value(m, Q, **LOCAL) == 13296)
        replay.set_fault(fault)
        # Wait for the reason itself: on a loaded machine one poll of the 21 MB `huge` body can
        # time out before the size check, so the newest error may briefly carry another reason.
        m = cm.wait_for(lambda m: value(m, "cachemon_upstream_up", upstream="vllm") == 0
                        and value(m, "cachemon_upstream_last_error_info", upstream="vllm", reason=reason) == 1,
                        timeout=20)
        assert value(m, "cachemon_upstream_up", upstream="vllm") == 0
        assert value(m, "cachemon_upstream_scrape_errors_total", upstream="vllm", reason=reason) >= 1
        assert value(m, "cachemon_upstream_last_error_info", upstream="vllm", reason=reason) == 1
        # counters are kept (never a wrong number), gauges go stale
        assert value(m, Q, **LOCAL) == 13296
        assert value(m, "cachemon_kv_cache_usage_ratio", upstream="vllm") is None
        replay.set_fault(None)
        m = cm.wait_for(lambda m: value(m, "cachemon_upstream_up", upstream="vllm") == 1, timeout=20)
        assert value(m, Q, **LOCAL) == 13296
        assert value(m, "cachemon_upstream_last_error_info", upstream="vllm", reason=reason) is None
    finally:
        cm.stop()


@pytest.mark.slow
def test_unreachable_upstream_keeps_the_daemon_serving(cachemon):
    from helpers import free_port
    dead = f"http://127.0.0.1:{free_port()}/metrics"
    cm = CachemonProcess("--upstream", f"dead={dead}", "--poll-interval", "100ms")
    try:
        m = cm.wait_for(
            lambda m: (value(m, "cachemon_upstream_scrape_errors_total", upstream="dead", reason="refused") or 0) >= 2)
        assert value(m, "cachemon_upstream_up", upstream="dead") == 0
    finally:
        out = cm.stop()
    # logged once when it went down, not once per poll
    poller_lines = [line for line in out.splitlines() if "cachemon.upstream" in line and "cannot connect" in line]
    assert len(poller_lines) == 1


@pytest.mark.slow
def test_two_upstreams_are_labelled_apart(replay):
    other = ReplayServer(bundled_pages()).start()
    try:
        replay.show(1)
        other.show(3)
        cm = CachemonProcess("--upstream", f"a={replay.url}", "--upstream", f"b={other.url}", "--poll-interval", "100ms")
        try:
            # Each upstream has its own poller: wait for both first polls.
            m = cm.wait_for(lambda m: value(m, Q, upstream="b", cache="local") == 40627
                            and value(m, Q, upstream="a", cache="local") is not None)
            assert value(m, Q, upstream="a", cache="local") == 13296
        finally:
            cm.stop()
    finally:
        other.stop()
