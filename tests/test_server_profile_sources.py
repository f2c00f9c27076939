"""Where each field of a server's one profile (normalise/server_profile.py) enters, on real captures:
what a KV stream says (runtime/kv_stage.StreamFeed.profile: the full-attention block size, a sliding-window
group's window, the engine), and the one ``merge(page, log, KV events)`` the daemon's judge and `check`
read, where the page alone says nothing (vLLM 0.32.0's Rust frontend serves no vllm:cache_config_info).

Real: the payloads of tests/fixtures/vllm-0.32.0-cpu-floors/block_size_restart (block size 32, a restart,
128), vllm-0.32.0-cpu-hybrid-swa/hybrid_swa (two groups, window 256) and vllm-0.32.0-cpu-rust-frontend/rust
(the Rust frontend's pages, log and events of one run). Constructed: only the sink the stream feeds (it
keeps nothing) and the clock.
"""
from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from cachemon.check.report import SourceReport
from cachemon.config import KvEventsEndpoint, Upstream
from cachemon.judge.snapshots import read_store
from cachemon.normalise.normaliser import normalise_text, to_update
from cachemon.normalise.server_profile import ServerProfile
from cachemon.runtime.kv_stage import StreamFeed
from helpers import FIXTURES

pytest.importorskip("msgspec")

RUST = FIXTURES / "vllm-0.32.0-cpu-rust-frontend" / "rust"
RESTART = FIXTURES / "vllm-0.32.0-cpu-floors" / "block_size_restart"
SWA = FIXTURES / "vllm-0.32.0-cpu-hybrid-swa" / "hybrid_swa"
CLOSED = "http://127.0.0.1:9/metrics"     # never polled


class _Sink:
    """Constructed: a KvSink that keeps nothing (the profile is the feed's own)."""
    def on_batch(self, *_: object) -> None: ...
    def on_restart(self, *_: object) -> None: ...
    def on_lost(self, *_: object) -> None: ...


def _feed(name: str) -> StreamFeed:
    return StreamFeed(Upstream(url=CLOSED, name=name, kv_events=KvEventsEndpoint(endpoint="tcp://127.0.0.1:9")),
                      _Sink())


def _replay(folder: Path, feed: StreamFeed) -> list[ServerProfile]:
    """Every recorded payload into the feed as the stream hands them over (a seq back to 0: a restart);
    the feed's profile after each."""
    out, last = [], None
    for line in (folder / "events.jsonl").read_text().splitlines():
        d = json.loads(line)
        seq = int(d["seq"])
        if last is not None and seq == 0 <= last:
            feed.on_restart(d["t"])
        last = seq
        feed.on_payload(seq, base64.b64decode(d["payload_b64"]), d["t"])
        out.append(feed.profile())
    return out


def _rust_pages() -> list[str]:
    rows = [json.loads(x) for x in (RUST / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r["text"] for r in rows if r.get("text") and r.get("accept") == "text/plain"]


def test_a_stream_says_its_block_size_and_after_a_restart_the_new_processes():
    seen = _replay(RESTART, _feed("vllm"))
    sizes = [p.block_size for p in seen]
    assert sizes[0] == 32 and sizes[-1] == 128
    # once 128, never 32 again: the restart forgot the old size, the new process's stores said the new one
    assert 32 not in sizes[sizes.index(128):]
    last = seen[-1]
    assert (last.engine, last.sliding_window, last.tiers) == ("vllm", None, ())
    assert last.source_of("block_size") == last.source_of("engine") == "the KV events of vllm"


def test_a_hybrid_models_stream_names_its_window_and_the_full_attention_block_size():
    p = _replay(SWA, _feed("vllm"))[-1]
    (page,) = normalise_text((SWA / "metrics-final.txt").read_text()).engines.values()
    assert p.sliding_window == 256                  # README: kv_cache_spec_sliding_window of group 0
    assert p.block_size == page.block_size          # the full-attention group's, as the page states it
    assert page.sliding_window is None              # the page's sliding_window label is "None": only events say it


def test_the_daemons_judge_reads_the_block_size_of_a_rust_frontend_from_its_kv_events():
    """The Rust frontend's page has no cache_config_info: the block size the judge used to leave unknown
    (no match floor, analyze's hint without --block-size) is what its KV events say, through the daemon's wiring."""
    from cachemon.daemon import Daemon
    from cachemon.runconfig import from_dict
    d = Daemon(from_dict({"upstreams": [{"name": "rust", "url": CLOSED, "kv_events": "tcp://127.0.0.1:9"}],
                          "listen": {"address": "127.0.0.1", "port": 0}}))
    try:
        kv = next(c for c in d.components if type(c).__name__ == "KvStage")
        att = next(c for c in d.components if hasattr(c, "attributor")).attributor
        pages = _rust_pages()
        for i, text in enumerate(pages[:4]):
            d.store.apply("rust", to_update(normalise_text(text)), 1000.0 + i)
        (page_only,) = att.snapshots(1010.0)
        assert page_only.block_size is None and "--block-size" not in page_only.analyze_hint
        _replay(RUST, kv.streams[0][1])
        (snap,) = att.snapshots(1020.0)
        assert snap.block_size == 128 and "--block-size 128" in snap.analyze_hint
        ups = read_store(d.store)
        assert att.builder.profile(ups["rust"], snap.model, att.kv_profile).source_of("block_size") \
            == "the KV events of rust"
    finally:
        d.shutdown()


def _check_rust(*args: str) -> SourceReport:
    """`cachemon check --format json` of one real Rust-frontend page (and what ``args`` add)."""
    from click.testing import CliRunner

    from cachemon.check import check_command
    from cachemon.demo.replay import ReplayServer
    srv = ReplayServer([("p", _rust_pages()[-1])]).start()
    try:
        r = CliRunner().invoke(check_command, ["--upstream", f"rust={srv.url}", "--interval", "0",
                                               "--format", "json", *args])
    finally:
        srv.stop()
    assert r.exit_code in (0, 1, 3), r.output
    report: SourceReport = next(s for s in json.loads(r.output)["sources"] if s["name"] == "rust")
    return report


def test_checks_report_of_a_rust_frontend_page_takes_the_block_size_from_the_linked_log():
    assert _check_rust()["cache_config"] == {"prefix_caching": "", "block_size": None, "hash_algo": ""}
    got = _check_rust("--log-file", str(RUST / "vllm-server.log"))["cache_config"]
    assert got == {"prefix_caching": "true", "block_size": 128, "hash_algo": ""}


@pytest.mark.slow
def test_checks_report_of_a_rust_frontend_takes_the_block_size_from_its_kv_events():
    """`check --kv-events`: the Rust frontend's real events re-published over real ZMQ while check reads its page."""
    import threading

    from click.testing import CliRunner

    pytest.importorskip("zmq")
    from cachemon.check import check_command
    from cachemon.demo.replay import ReplayServer
    from helpers import wait_until
    from kv_publisher import Republisher, load_events

    recorded = load_events(RUST / "events.jsonl")
    pub = Republisher(recorded)
    page = _rust_pages()[-1]
    srv = ReplayServer([("first", page), ("last", page)]).start()
    sent: list[int] = []

    def feed() -> None:
        if pub.wait_subscribed(10) and wait_until(lambda: "/version" in srv.requested, 10):
            sent.append(pub.publish(speed=200.0))
            srv.show(1)

    t = threading.Thread(target=feed, daemon=True)
    t.start()
    try:
        r = CliRunner().invoke(check_command, ["--upstream", f"rust={srv.url}", "--interval", "2s", "--format",
                                               "json", "--kv-events", f"rust={pub.pub_endpoint}"])
        t.join(5)
    finally:
        srv.stop()
        pub.close()
    assert sent == [len(recorded)], "the recording was not re-published inside the window"
    (rep,) = json.loads(r.output)["sources"]
    assert rep["kv_events"]["messages"] == len(recorded)
    assert rep["cache_config"] == {"prefix_caching": "", "block_size": 128, "hash_algo": ""}


def test_the_judge_reads_each_field_where_it_was_said_the_page_first_then_the_linked_log():
    """The Python frontend's real page and log of one run: the page says the cache, the log the release."""
    from cachemon.judge.snapshots import SnapshotBuilder
    from cachemon.normalise.log_stream import LogStream
    from cachemon.normalise.log_updates import log_update
    from cachemon.runtime.attribution_stage import AttributionSettings
    from cachemon.state.store import Store

    py = RUST.parent / "python"
    rows = [json.loads(x) for x in (py / "metrics.jsonl").read_text().splitlines() if x.strip()]
    page = next(r["text"] for r in rows if "cache_config_info" in r.get("text", ""))
    store = Store({"1m": 60.0})
    store.apply("py", to_update(normalise_text(page)), 1000.0)
    stream = LogStream("vllm-log")
    stream.feed((py / "vllm-server.log").read_bytes())
    store.apply("vllm-log", log_update(stream), 1000.0, kind="log")
    builder = SnapshotBuilder(AttributionSettings(log_links={"vllm-log": "py"}))
    snaps = builder.build(read_store(store), 1001.0)
    ups = read_store(store)
    (snap,) = [s for s in snaps if s.upstream == "py"]
    p = builder.profile(ups["py"], snap.model)
    assert (p.block_size, p.prefix_caching, p.version, p.frontend) == (snap.block_size, snap.prefix_caching,
                                                                      "0.32.0", "python") == (128, "true", "0.32.0", "python")
    assert p.source_of("block_size") == p.source_of("prefix_caching") == "the page's vllm:cache_config_info"
    assert p.source_of("version") == p.source_of("frontend") == "the start-up lines of log vllm-log"
    assert snap.pool_tokens == float(p.pool or 0) > 0


def test_a_page_of_two_engines_is_one_profile_mixed_for_check_and_off_for_the_judge():
    """Constructed: the real 0.32.0 page's cache_config_info row copied for a second engine ("1") with
    prefix caching off and another pool (a data-parallel server whose engines were started differently)."""
    from cachemon.judge.snapshots import SnapshotBuilder
    from cachemon.normalise.server_profile import combine
    from cachemon.runtime.attribution_stage import AttributionSettings
    from cachemon.state.store import Store

    text = (FIXTURES / "vllm-0.32.0-cpu" / "metrics-static-system-prompt.txt").read_text()
    row = next(ln for ln in text.splitlines() if ln.startswith("vllm:cache_config_info{"))
    other = row.replace('engine="0"', 'engine="1"').replace('enable_prefix_caching="True"',
                                                            'enable_prefix_caching="False"')
    other = other.replace('kv_cache_size_tokens="2097152"', 'kv_cache_size_tokens="1048576"')
    assert 'engine="1"' in other and 'enable_prefix_caching="False"' in other and '"1048576"' in other
    n = normalise_text(text.replace(row, row + "\n" + other))
    both = combine(n.engines.values())
    assert both is not None and len(n.engines) == 2
    assert both.to_report() == {"prefix_caching": "mixed", "block_size": 128, "hash_algo": "sha256"}
    assert both.to_report()["prefix_caching"] == n.prefix_caching        # as check always said it
    assert both.pool == 2097152 + 1048576
    store = Store({"1m": 60.0})
    store.apply("dp", to_update(n), 1000.0)
    (snap,) = SnapshotBuilder(AttributionSettings()).build(read_store(store), 1001.0)
    # the judge: an engine of the model without caching, the model's cache is off; the pools summed
    assert (snap.prefix_caching, snap.block_size, snap.pool_tokens) == ("false", 128, 3145728.0)
