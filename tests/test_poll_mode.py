"""Scrape-synchronous polling: `poll_mode: scrape` polls every upstream on each
scrape of cachemon's /metrics, coalesces concurrent scrapes, bounds a hung upstream by its
timeout, and keeps a slow background poll that sees restarts between scrapes. Background mode
does not poll on a scrape.

A real Daemon against the ReplayServer serving the bundled real vLLM 0.32.0 captures; the upstream
requests are counted by the ReplayServer itself, per path (change detection also asks /version and
/v1/models; only /metrics is counted). The hang is the ReplayServer's "hang" fault.
"""
from __future__ import annotations

import threading
from collections import Counter

import pytest
import requests

from cachemon.config import ConfigError
from cachemon.daemon import Daemon
from cachemon.demo.replay import ReplayServer, bundled_pages
from cachemon.runconfig import build_config, from_dict
from helpers import CachemonProcess, one_line_error, samples, value, wait_until

HOUR = "1h"




class _PathCounts(dict):
    """ReplayServer.requested (path -> last target) that also counts the requests of each path."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __setitem__(self, path: str, target: str) -> None:
        self.counts[path] += 1
        super().__setitem__(path, target)


def _counting(srv: ReplayServer) -> ReplayServer:
    srv.requested = _PathCounts()
    return srv


def _polls(srv: ReplayServer) -> int:
    """/metrics requests the ReplayServer has answered."""
    requested = srv.requested
    assert isinstance(requested, _PathCounts)
    return requested.counts["/metrics"]


def _daemon(replay: ReplayServer, mode: str, **extra: object) -> Daemon:
    cfg = from_dict({"upstreams": [{"name": "vllm", "url": replay.url, **extra.pop("upstream", {})}],
                     "listen": {"address": "127.0.0.1", "port": 0}, "poll_mode": mode, **extra})
    d = Daemon(cfg)
    d.start()
    return d


def _scrape(d: Daemon) -> dict:
    r = requests.get(f"http://127.0.0.1:{d.port}/metrics", timeout=20)
    r.raise_for_status()
    return samples(r.text)


def _first_poll_done(d: Daemon) -> bool:
    return d.ready() and all(p.poll_age() is not None for p in d.pollers)


@pytest.fixture
def replay():
    with ReplayServer(bundled_pages()) as srv:
        yield _counting(srv)


def test_scrape_mode_fetches_the_upstream_once_per_scrape_and_shows_the_new_page(replay):
    d = _daemon(replay, "scrape", scrape_mode={"min_gap": "1ms", "background_interval": HOUR})
    try:
        assert wait_until(lambda: _first_poll_done(d), 10)      # the background poll at start (+ /version)
        before = _polls(replay)
        for _ in range(3):
            _scrape(d)
        assert _polls(replay) - before == 3
        # the page changes between two scrapes: the next scrape shows it, no background poll needed
        replay.show(1)
        got = _scrape(d)
        assert value(got, "cachemon_prefix_cache_query_tokens_total", upstream="vllm", model_name="tiny", cache="local") == 13296
        assert _polls(replay) - before == 4
    finally:
        d.shutdown()


def test_two_concurrent_scrapes_fetch_the_upstream_once(replay):
    d = _daemon(replay, "scrape", scrape_mode={"min_gap": "30s", "background_interval": HOUR})
    try:
        assert wait_until(lambda: _first_poll_done(d), 10)
        with d.pollers[0]._poll_lock:       # make the previous poll stale without waiting 30 s
            d.pollers[0]._polled_at = None
        before = _polls(replay)
        results: list[dict] = []
        threads = [threading.Thread(target=lambda: results.append(_scrape(d))) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(results) == 2
        assert _polls(replay) - before == 1
    finally:
        d.shutdown()


@pytest.mark.slow
def test_a_restart_between_two_scrapes_is_seen_by_the_background_poll(replay):
    replay.show(3)      # request ID at the head: the highest counters of the captures
    d = _daemon(replay, "scrape", scrape_mode={"min_gap": "1ms", "background_interval": "1s"})
    try:
        assert wait_until(lambda: _first_poll_done(d), 10)
        first = _scrape(d)
        assert value(first, "cachemon_upstream_restarts_total", upstream="vllm") == 0
        replay.show(0)      # the server restarted: idle, counters back at zero
        before = _polls(replay)
        # nobody scrapes; the background poll alone corrects the counters
        assert wait_until(lambda: d.store.upstreams["vllm"].restarts == 1, 15)
        assert _polls(replay) > before
        second = _scrape(d)
        assert value(second, "cachemon_upstream_restarts_total", upstream="vllm") == 1
        assert value(second, "cachemon_prefix_cache_query_tokens_total", upstream="vllm", model_name="tiny", cache="local") == \
            value(first, "cachemon_prefix_cache_query_tokens_total", upstream="vllm", model_name="tiny", cache="local")
    finally:
        d.shutdown()


@pytest.mark.slow
def test_a_hung_upstream_is_marked_down_and_the_scrape_returns_within_its_bound(replay):
    d = _daemon(replay, "scrape", upstream={"timeout": "1s"},
                scrape_mode={"min_gap": "1ms", "background_interval": HOUR})
    try:
        assert wait_until(lambda: _first_poll_done(d), 10)
        assert value(_scrape(d), "cachemon_upstream_up", upstream="vllm") == 1
        replay.set_fault("hang")        # the ReplayServer sleeps 30 s before answering
        # the client gives up after 20 s, well before the hang ends: the scrape returned on the
        # upstream's own 1 s timeout
        got = _scrape(d)
        assert value(got, "cachemon_upstream_up", upstream="vllm") == 0
        assert value(got, "cachemon_upstream_scrape_errors_total", upstream="vllm", reason="timeout") == 1
    finally:
        replay.set_fault(None)
        d.shutdown()


def test_background_mode_does_not_poll_on_a_scrape(replay):
    d = _daemon(replay, "background", poll_interval=HOUR)
    try:
        assert wait_until(lambda: _first_poll_done(d), 10)
        before = _polls(replay)
        for _ in range(3):
            _scrape(d)
        assert _polls(replay) == before
        assert d.scrape_sync is None
    finally:
        d.shutdown()


@pytest.mark.slow
def test_several_upstreams_are_polled_on_each_scrape():
    with ReplayServer(bundled_pages()) as a, ReplayServer(bundled_pages()) as b:
        _counting(a), _counting(b)
        cfg = from_dict({"upstreams": [{"name": "a", "url": a.url}, {"name": "b", "url": b.url}],
                         "listen": {"address": "127.0.0.1", "port": 0}, "poll_mode": "scrape",
                         "scrape_mode": {"min_gap": "1ms", "background_interval": HOUR}})
        d = Daemon(cfg)
        d.start()
        try:
            assert wait_until(lambda: _first_poll_done(d), 10)
            before = (_polls(a), _polls(b))
            _scrape(d)
            assert (_polls(a) - before[0], _polls(b) - before[1]) == (1, 1)
        finally:
            d.shutdown()


# --- the settings ----------------------------------------------------------------------------------

def test_poll_mode_settings_defaults_flag_and_one_line_errors(tmp_path):
    cfg = from_dict({})
    assert (cfg.poll_mode, cfg.poll_interval) == ("background", 5.0)
    assert (cfg.scrape_mode.min_gap, cfg.scrape_mode.background_interval) == (1.0, 30.0)
    p = tmp_path / "c.yaml"
    p.write_text("poll_mode: scrape\nscrape_mode: {min_gap: 500ms, background_interval: 1m}\n")
    cfg = build_config(str(p))
    assert (cfg.poll_mode, cfg.scrape_mode.min_gap, cfg.scrape_mode.background_interval) == ("scrape", 0.5, 60.0)
    assert build_config(str(p), poll_mode="background").poll_mode == "background"    # the flag wins
    for raw, key in (({"poll_mode": "sync"}, "poll_mode"),
                     ({"scrape_mode": {"min_gap": "2m"}}, "scrape_mode.min_gap"),
                     ({"scrape_mode": {"background_interval": "500ms"}}, "scrape_mode.background_interval"),
                     ({"scrape_mode": {"every": "1s"}}, "scrape_mode")):
        with pytest.raises(ConfigError) as e:
            from_dict(raw)
        assert e.value.key.startswith(key), (raw, e.value)
    line = one_line_error(["run", "--poll-mode", "sync", "--upstream", "http://127.0.0.1:9/metrics"])
    assert line.startswith("cachemon: config error: --poll-mode: expected one of background, scrape")


@pytest.mark.slow
def test_cachemon_run_poll_mode_flag_starts_scrape_mode_and_says_so(replay):
    cm = CachemonProcess("--upstream", f"vllm={replay.url}", "--poll-mode", "scrape")
    try:
        assert value(cm.scrape(), "cachemon_upstream_up", upstream="vllm") == 1
        assert _polls(replay) >= 1
    finally:
        out = cm.stop()
    assert "polling on each scrape (reused for 1s), and every 30s without scrapes" in out
