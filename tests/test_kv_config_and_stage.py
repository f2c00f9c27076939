"""KV-event configuration (upstreams[].kv_events, kv_events:, --kv-events), the missing-extra error,
"no cost when events are off", and the stage inside a real Daemon serving /metrics."""
from __future__ import annotations

import importlib.util
import threading
import time

import pytest
import requests

from cachemon import catalog as C
from cachemon.config import ConfigError
from cachemon.daemon import Daemon
from cachemon.normalise.kv_batch import Stored
from cachemon.runconfig import build_config, from_dict
from helpers import CachemonProcess, one_line_error, samples
from test_kv_stream import Publisher, Recorder, constructed_batch

URL = "http://127.0.0.1:8000/metrics"




def test_the_short_form_and_the_mapping():
    cfg = from_dict({"upstreams": [{"url": URL, "name": "a", "kv_events": "tcp://10.0.0.5:5557"},
                                   {"url": "http://127.0.0.1:8001/metrics", "name": "b", "kv_events": {
                                       "endpoint": "tcp://vllm-b:5557", "replay": "tcp://vllm-b:5558",
                                       "topic": "kv-events", "model": "llama", "max_frame_bytes": 1048576}},
                                   {"url": "http://127.0.0.1:8002/metrics", "name": "c"}],
                     "kv_events": {"history_blocks": 5000, "max_blocks": 20000}})
    a, b, c = cfg.upstreams
    assert a.kv_events.endpoint == "tcp://10.0.0.5:5557" and a.kv_events.replay is None and a.kv_events.topic == ""
    assert (b.kv_events.replay, b.kv_events.topic, b.kv_events.model, b.kv_events.max_frame_bytes) == \
        ("tcp://vllm-b:5558", "kv-events", "llama", 1048576)
    assert c.kv_events is None
    assert (cfg.kv_events.history_blocks, cfg.kv_events.max_blocks) == (5000, 20000)
    assert cfg.kv_events.max_frame_bytes == 16 * 1024 * 1024 and cfg.kv_events.replay_timeout == 2.0


@pytest.mark.parametrize("data, key", [
    ({"upstreams": [{"url": URL, "kv_events": "tcp://*:5557"}]}, "upstreams[0].kv_events.endpoint"),
    ({"upstreams": [{"url": URL, "kv_events": "http://x:5557"}]}, "upstreams[0].kv_events.endpoint"),
    ({"upstreams": [{"url": URL, "kv_events": "tcp://x:70000"}]}, "upstreams[0].kv_events.endpoint"),
    ({"upstreams": [{"url": URL, "kv_events": {"endpoint": "tcp://x:1", "replay": 5}}]}, "upstreams[0].kv_events.replay"),
    ({"upstreams": [{"url": URL, "kv_events": {"endpoint": "tcp://x:1", "bogus": 1}}]}, "upstreams[0].kv_events.bogus"),
    ({"upstreams": [{"url": URL, "kv_events": {"replay": "tcp://x:2"}}]}, "upstreams[0].kv_events.endpoint"),
    ({"upstreams": [{"url": URL, "kv_events": {"endpoint": "tcp://x:1", "max_frame_bytes": 10}}]},
     "upstreams[0].kv_events.max_frame_bytes"),
    ({"kv_events": {"history_blocks": -1}}, "kv_events.history_blocks"),
    ({"kv_events": {"replay_timeout": "forever"}}, "kv_events.replay_timeout"),
    ({"kv_events": {"ledger": 1}}, "kv_events.ledger"),
])
def test_bad_values_name_their_key(data, key):
    with pytest.raises(ConfigError) as e:
        from_dict(data)
    assert e.value.key == key


def test_the_flag_names_its_upstream_or_takes_the_only_one():
    cfg = build_config(None, [f"a={URL}"], kv_events=["tcp://127.0.0.1:5557"])
    assert cfg.upstreams[0].kv_events.endpoint == "tcp://127.0.0.1:5557"
    cfg = build_config(None, [f"a={URL}", "b=http://127.0.0.1:8001/metrics"],
                       kv_events=["b=tcp://127.0.0.1:5558", "a=tcp://127.0.0.1:5557"])
    assert [u.kv_events.endpoint for u in cfg.upstreams] == ["tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558"]
    cfg = build_config(None, kv_events=["tcp://127.0.0.1:5557"])       # the default upstream
    assert cfg.upstreams[0].kv_events is not None


def test_the_flag_keeps_the_files_other_settings(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(f"upstreams:\n  - url: {URL}\n    name: a\n    kv_events: {{endpoint: 'tcp://h:1', replay: 'tcp://h:2'}}\n")
    cfg = build_config(str(p), kv_events=["a=tcp://h:9"])
    assert (cfg.upstreams[0].kv_events.endpoint, cfg.upstreams[0].kv_events.replay) == ("tcp://h:9", "tcp://h:2")


@pytest.mark.parametrize("args, words", [
    (["--upstream", f"a={URL}", "--upstream", "b=http://127.0.0.1:8001/metrics", "--kv-events", "tcp://h:1"],
     ["--kv-events[0]", "NAME=tcp://h:1", "a, b"]),
    (["--upstream", f"a={URL}", "--kv-events", "z=tcp://h:1"], ["--kv-events[0]", "no upstream named 'z'"]),
    (["--upstream", f"a={URL}", "--kv-events", "tcp://h"], ["--kv-events[0]", "tcp://HOST:PORT"]),
])
def test_flag_errors_are_one_line_exit_2(args, words):
    line = one_line_error(["run", *args])
    assert all(w in line for w in words), line


def test_without_the_extra_configuring_events_is_one_line_naming_it(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "zmq" else real(name, *a))
    line = one_line_error(["run", "--upstream", f"a={URL}", "--kv-events", "tcp://127.0.0.1:5557"])
    assert "pyzmq" in line and ".venv/bin/pip install -e '.[kv-events]'" in line \
        and "-py3-none-any.whl[kv-events]" in line and line.count("\n") == 0
    p = tmp_path / "c.yaml"
    p.write_text(f"upstreams:\n  - url: {URL}\n    kv_events: tcp://127.0.0.1:5557\n")
    line = one_line_error(["run", "--config", str(p)])
    assert line.startswith("cachemon: config error: upstreams[0].kv_events: following KV events needs pyzmq")
    # without kv_events nothing asks for the extra
    assert build_config(None, [f"a={URL}"]).upstreams[0].kv_events is None


def _maps(pid: int) -> str:
    with open(f"/proc/{pid}/maps") as f:
        return f.read()


@pytest.mark.slow
def test_no_cost_when_events_are_off():
    """A real `cachemon run` without kv_events: no stage, and neither libzmq nor msgspec is loaded
    (their shared objects would be mapped into the process)."""
    proc = CachemonProcess("--upstream", "http://127.0.0.1:9/metrics")
    try:
        proc.scrape()
        maps = _maps(proc.proc.pid)
        assert "zmq" not in maps and "msgspec" not in maps
        assert "cachemon_kv_" not in proc.text()
    finally:
        proc.stop()
    cfg = build_config(None, [f"a={URL}"])
    assert not [c for c in Daemon(cfg).components if type(c).__name__ == "KvStage"]


def test_the_stage_in_a_daemon_feeds_its_sink_and_serves_the_families():
    pub, sink = Publisher(), Recorder()
    cfg = build_config(None, ["vllm-0=http://127.0.0.1:9/metrics"], listen="127.0.0.1:0",
                       kv_events=[f"vllm-0={pub.endpoint}"])
    cfg.upstreams[0].kv_events.replay = pub.replay_endpoint
    cfg.upstreams[0].kv_events.topic = "kv-events"
    made = []
    daemon = Daemon(cfg, kv_sink_factory=lambda settings: made.append(settings) or sink)
    assert made == [cfg.kv_events]
    daemon.start()
    try:
        pub.wait_subscribed()
        for s in range(3):
            pub.send(s, constructed_batch(s), drop=s == 1)
        sink.wait(lambda r: len(r.batches) == 3)
        # no model configured, the upstream reports none: the upstream's name
        assert {c[2] for c in sink.calls} == {"vllm-0"}
        text = requests.get(f"http://127.0.0.1:{daemon.port}/metrics", timeout=5).text
        got = samples(text)
        assert got[(C.KV_EVENTS.sample_name, (("type", "stored"), ("upstream", "vllm-0")))] == 3
        assert got[(C.KV_RECOVERED_BATCHES.sample_name, (("upstream", "vllm-0"),))] == 1
        assert got[(C.KV_STREAM_UP.sample_name, (("upstream", "vllm-0"),))] == 1
        threads = [t.name for t in threading.enumerate()]
        assert "kv-events-vllm-0" in threads
    finally:
        t0 = time.monotonic()
        daemon.shutdown()
        pub.close()
    assert time.monotonic() - t0 < 3
    assert "kv-events-vllm-0" not in [t.name for t in threading.enumerate()]


def test_a_streams_model_is_the_config_s_then_the_one_the_metrics_report_then_the_upstream_name():
    from cachemon.config import KvEventsEndpoint, Upstream
    from cachemon.runtime.kv_stage import StreamFeed
    from cachemon.state.store import Store
    store = Store({"1m": 60.0})
    sink = Recorder()
    up = Upstream(url=URL, name="r", kv_events=KvEventsEndpoint(endpoint="tcp://h:1"))
    clock = [0.0]
    feed = StreamFeed(up, sink, store, clock=lambda: clock[0])
    assert feed.model() == "r"                                   # nothing reported yet
    store.upstream("r").idents[("llama", "0")] = 0.0             # the poller admitted llama's series
    assert feed.model() == "r"                                   # re-read only every MODEL_RECHECK seconds
    clock[0] += 11
    assert feed.model() == "llama"
    store.upstream("r").idents[("other", "0")] = 0.0             # two models: ambiguous, keep the last known
    clock[0] += 11
    assert feed.model() == "llama"
    up.kv_events.model = "configured"
    assert StreamFeed(up, sink, store).model() == "configured"
    feed.on_payload(0, constructed_batch(0), 1.0)
    assert sink.calls == [("batch", "r", "llama", 0)]


@pytest.mark.skipif(importlib.util.find_spec("cachemon.state.ledger.fleet") is None,
                    reason="the ledger (state/ledger/fleet.py, ledger branch) is not in this checkout")
@pytest.mark.slow
def test_cachemon_run_follows_a_replayed_real_capture(tmp_path):
    """A real `cachemon run --kv-events` process, the real fleet ledger, the real 0.32.0 capture re-published."""
    from test_kv_stream import captured
    msgs = captured("tiny_pool")
    pub = Publisher()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"upstreams:\n  - name: vllm-0\n    url: http://127.0.0.1:9/metrics\n    kv_events:\n"
                   f"      endpoint: {pub.endpoint}\n      replay: {pub.replay_endpoint}\n      topic: kv-events\n")
    proc = CachemonProcess("--config", str(cfg), "--kv-events", f"vllm-0={pub.endpoint}")
    try:
        pub.wait_subscribed(timeout=15)
        for s, p in msgs:
            pub.send(s, p, drop=s == 3)                               # one recovered from the replay socket
        stored = (C.KV_EVENTS.sample_name, (("type", "stored"), ("upstream", "vllm-0")))
        got = proc.wait_for(lambda g: g.get(stored, 0) >= 1 and
                            g.get((C.KV_RECOVERED_BATCHES.sample_name, (("upstream", "vllm-0"),))) == 1)
        from cachemon.normalise.kv_decode import KvDecoder
        dec = KvDecoder()
        want = sum(isinstance(e, Stored) for s, p in msgs for e in dec.decode(p, s).events)
        got = proc.wait_for(lambda g: g.get(stored) == want)
        assert got[stored] == want
        assert got[(C.KV_STREAM_UP.sample_name, (("upstream", "vllm-0"),))] == 1
        assert "zmq" in _maps(proc.proc.pid)
        # the ledger's families are on /metrics too (through the stage), once each
        text = proc.text()
        assert text.count(f"# TYPE {C.KV_STORED_TOKENS.sample_name} counter") == 1
        assert got[(C.KV_LEDGER_IN_SYNC.sample_name, (("upstream", "vllm-0"),))] == 1
    finally:
        proc.stop()
        pub.close()
