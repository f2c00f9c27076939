"""`cachemon check --kv-events [--show-text --tokenizer DIR]` on a real recording: vLLM 0.32.0's KV events
of `dynamic_prefix_head` (tests/fixtures/vllm-0.32.0-cpu-kv-events/) re-published over real ZMQ
(tests/kv_publisher.Republisher) while `check` reads a replay of the same run's real /metrics pages
(its metrics.jsonl: the first page, then the last). Nothing here is constructed but the timing."""
from __future__ import annotations

import hashlib
import json
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

zmq = pytest.importorskip("zmq")
pytest.importorskip("msgspec")

from cachemon.check import check_command  # noqa: E402
from cachemon.demo.replay import ReplayServer  # noqa: E402
from helpers import FIXTURES, free_port, wait_until  # noqa: E402
from kv_publisher import Republisher, load_events  # noqa: E402

KV = FIXTURES / "vllm-0.32.0-cpu-kv-events"
TOKENIZER = FIXTURES / "vllm-0.32.0-cpu" / "model"


def _stamp(i: int) -> str:
    # scripts/e2e/kv_record.py's _stamp / _rid: what the recorder put at the head of request i's system prompt
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(1764580000 + i))


def _rid(i: int) -> str:
    return hashlib.sha256(f"kv-events request {i}".encode()).hexdigest()[:16]


HEAD_VALUES = [_stamp(i) for i in range(20)] + [_rid(i) for i in range(0, 20, 2)]


def metrics_pages(scenario: str | Path, replica: str | None = None) -> list[tuple[str, str]]:
    """The first and the last full page the recorder polled (real /metrics of the run); ``scenario``: a name
    under KV, or a capture folder."""
    rows = [json.loads(x) for x in (KV / scenario / "metrics.jsonl").read_text().splitlines() if x.strip()]
    texts = [r["text"] for r in rows if "text" in r and (replica is None or r["replica"] == replica)]
    return [("first", texts[0]), ("last", texts[-1])]


def run_check(args: list[str], scenario: str | Path = "dynamic_prefix_head", interval: str = "2s"):
    """`check` (in-process) against the replayed pages while the recording is re-published: the publisher
    waits for check's subscription and its first page read, sends everything (fast), then shows the last page."""
    recorded = load_events(KV / scenario / "events.jsonl")
    pub = Republisher(recorded)
    srv = ReplayServer(metrics_pages(scenario)).start()
    sent: list[int] = []

    def feed() -> None:
        if not pub.wait_subscribed(10):
            return
        if not wait_until(lambda: "/version" in srv.requested, 10):    # check's first read is done
            return                    # nothing re-published: the assert on `sent` below says so
        sent.append(pub.publish(speed=200.0))
        srv.show(1)

    t = threading.Thread(target=feed, daemon=True)
    t.start()
    try:
        r = CliRunner().invoke(check_command, ["--upstream", f"vllm={srv.url}", "--interval", interval,
                                               "--kv-events", f"vllm={pub.pub_endpoint}", *args])
        t.join(5)
    finally:
        srv.stop()
        pub.close()
    assert sent == [len(recorded)] and (scenario != "dynamic_prefix_head" or sent == [20]), \
        "the recording was not re-published inside the window"
    return r


@pytest.mark.slow
def test_dynamic_prefix_is_named_with_its_depth_and_no_text_without_show_text():
    r = run_check(["--format", "json"])
    rep = json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))
    src = rep["sources"][0]
    kv = src["kv_events"]
    # 20 requests x 6 new blocks of 128 tokens (the fixture's README), every one new content
    assert kv["connected"] and kv["messages"] == 20 and kv["in_sync"] is True
    assert kv["events"] == {"stored": 20, "removed": 0, "cleared": 0, "unknown": 0}
    assert sum(kv["stored_tokens"].values()) == 20 * 6 * 128
    assert kv["stored_tokens"]["capacity"] == kv["stored_tokens"]["routing"] == 0
    # the value sits in the first block: depth 0 (every block 0 distinct, a chain from the root)
    assert kv["dynamic_prefix"]["depth_blocks"] == 0 and kv["dynamic_prefix"]["recomputed_tokens"] > 0
    # every request's chain starts at the root: all 20 divergences at depth 0
    assert kv["divergence_depth_blocks"]["0"] == kv["divergence_depth_blocks"]["+Inf"] == 20
    causes = {c["cause"]: c for a in src["attribution"] for c in a["causes"]}
    assert causes["dynamic_prefix"]["certainty"] == "exact"
    assert "block depth 0" in causes["dynamic_prefix"]["message"]
    assert "dynamic_prefix_suspected" not in causes and "cold_cache" not in causes
    assert "text" not in kv
    for value in HEAD_VALUES + ["Current time", "Request ID"]:
        assert value not in r.output


@pytest.mark.slow
def test_show_text_prints_the_differing_head_and_text_mode_without_it_does_not():
    r = run_check(["--show-text", "--tokenizer", str(TOKENIZER)])
    out = r.output
    assert "!! PROMPT CONTENT (--show-text)" in out and "block depth 0 (the dynamic prefix)" in out
    assert "dynamic_prefix (exact)" in out
    shown = [v for v in HEAD_VALUES if v in out]
    assert len([v for v in shown if v.startswith("2025-12-01 09:06:")]) >= 2, out   # distinct timestamps, side by side
    assert "Current time: 2025-12-01 09:06:" in out
    assert any(f"[Request ID: {_rid(i)}] Current time: {_stamp(i)}" in out for i in range(0, 20, 2)), out
    plain = run_check([])
    assert "KV events (" in plain.output and "dynamic prefix at block depth 0" in plain.output
    for value in HEAD_VALUES + ["Current time", "Request ID", "PROMPT CONTENT"]:
        assert value not in plain.output


def test_errors_are_one_line():
    runner = CliRunner()
    url = f"http://127.0.0.1:{free_port()}/metrics"
    r = runner.invoke(check_command, ["--upstream", url, "--kv-events", "tcp://*:5557"])
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "--kv-events[0]" in r.output
    r = runner.invoke(check_command, ["--upstream", url, "--kv-events", "tcp://127.0.0.1:5557", "--show-text"])
    assert r.exit_code == 2 and "needs --tokenizer" in r.output and "Traceback" not in r.output
    r = runner.invoke(check_command, ["--upstream", url, "--kv-events", "tcp://127.0.0.1:5557", "--interval", "0"])
    assert r.exit_code == 2 and "needs an --interval above 0" in r.output
    r = runner.invoke(check_command, ["--upstream", url, "--kv-events", "other=tcp://127.0.0.1:5557"])
    assert r.exit_code == 2 and "no upstream named 'other'" in r.output


@pytest.mark.slow
def test_nothing_to_connect_to_and_a_silent_publisher_are_said_plainly():
    pages = metrics_pages("dynamic_prefix_head")
    with ReplayServer([pages[-1]]) as srv:
        dead = f"tcp://127.0.0.1:{free_port()}"
        r = CliRunner().invoke(check_command, ["--upstream", f"vllm={srv.url}", "--interval", "500ms",
                                               "--kv-events", dead])
        assert "[warning] kv_events_unreachable: KV events of vllm" in r.output and "Traceback" not in r.output
        with Republisher([]) as pub:       # listening, publishing nothing
            r = CliRunner().invoke(check_command, ["--upstream", f"vllm={srv.url}", "--interval", "1s",
                                                   "--kv-events", pub.pub_endpoint])
        assert "[info] kv_events_none: KV events of vllm" in r.output and "no event in the" in r.output


def test_without_pyzmq_it_is_one_config_line(monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "zmq" else real(name, *a))
    r = CliRunner().invoke(check_command, ["--upstream", "http://127.0.0.1:1/metrics",
                                           "--kv-events", "tcp://127.0.0.1:5557"])
    assert r.exit_code == 2 and "needs pyzmq: from a clone: .venv/bin/pip install -e '.[kv-events]'" in r.output




@pytest.mark.slow
def test_two_replicas_of_one_model_name_routing_exactly(monkeypatch):
    """The real `routing` capture (two replicas behind round-robin) through one `check`: one fleet ledger,
    so replica1's re-stores of what replica0 had cached are `routing`, and the engine names routing_skew
    exact on replica1 only. The two sockets' messages are sent in the recorded order, each only once the
    ledger holds the previous one (ZMQ orders one socket's messages, not two sockets')."""
    import cachemon.check.command as check_mod

    windows: list = []

    class Recorded(check_mod.KvWindow):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            windows.append(self)

    monkeypatch.setattr(check_mod, "KvWindow", Recorded)
    msgs = load_events(KV / "routing" / "events.jsonl")
    reps = ("replica0", "replica1")
    pubs = {r: Republisher([m for m in msgs if m.replica == r]) for r in reps}
    srvs = {r: ReplayServer(metrics_pages("routing", r)).start() for r in reps}
    done: list[bool] = []

    def stored(r: str) -> float:
        v = windows[0].ledger.view(r) if windows else None
        return 0.0 if v is None else sum(v.stored_tokens.values())

    def feed() -> None:
        if not all(p.wait_subscribed(10) for p in pubs.values()):
            return
        sent = dict.fromkeys(reps, 0)
        for m in msgs:
            before = stored(m.replica)
            pubs[m.replica].publish(start=sent[m.replica], stop=sent[m.replica] + 1)
            sent[m.replica] += 1
            if not wait_until(lambda r=m.replica, b=before: stored(r) > b, 10):
                return
        for s in srvs.values():
            s.show(1)
        done.append(True)

    t = threading.Thread(target=feed, daemon=True)
    t.start()
    try:
        args = [a for r in reps for a in ("--upstream", f"{r}={srvs[r].url}", "--kv-events", f"{r}={pubs[r].pub_endpoint}")]
        # ~3 s: check reads its upstreams one after the other, each over its own 1 s interval
        r = CliRunner().invoke(check_command, [*args, "--interval", "1s", "--format", "json"])
        t.join(5)
    finally:
        for s in srvs.values():
            s.stop()
        for p in pubs.values():
            p.close()
    assert done == [True]
    rep = {s["name"]: s for s in json.loads(r.stdout)["sources"]}
    # the oracle of tests/test_kv_ledger_real.py on the same events: replica0 first 2304, replica1 routing 2304
    assert {k: v for k, v in rep["replica0"]["kv_events"]["stored_tokens"].items() if v} == {"first": 2304.0}
    assert {k: v for k, v in rep["replica1"]["kv_events"]["stored_tokens"].items() if v} == {"routing": 2304.0}
    assert rep["replica1"]["kv_events"]["model"] == rep["replica0"]["kv_events"]["model"] == "tiny"
    causes = {name: {c["cause"]: c for a in s["attribution"] for c in a["causes"]} for name, s in rep.items()}
    assert causes["replica1"]["routing_skew"]["certainty"] == "exact"
    assert "routing_skew" not in causes["replica0"]


@pytest.mark.slow
def test_a_sliding_window_model_is_said_with_its_window_and_cause():
    """The real hybrid sliding-window capture (tests/fixtures/vllm-0.32.0-cpu-hybrid-swa/hybrid_swa): check
    reports the window its KV events name, says the page's floor bounds resent prompts only, and splits the
    stored tokens with the window's cost apart (what the ledger derives from the same events)."""
    folder = FIXTURES / "vllm-0.32.0-cpu-hybrid-swa" / "hybrid_swa"
    r = run_check(["--format", "json"], scenario=folder)
    rep = json.loads(r.stdout)
    [src] = [s for s in rep["sources"] if s["kind"] == "metrics"]
    kv = src["kv_events"]
    assert kv["sliding_window"] == 256 and kv["in_sync"]
    from cachemon.state.ledger.fleet import FleetLedger
    from kv_support import messages
    fleet = FleetLedger()
    for m in messages(folder):
        fleet.on_batch(m["replica"], "tiny", m["batch"], m["t"])
    view = fleet.view("vllm")
    assert view is not None
    assert kv["stored_tokens"]["sliding_window"] == view.stored_tokens["sliding_window"] > 0
    [f] = [f for f in src["findings"] if f["code"] == "sliding_window_model"]
    assert "window 256 tokens" in f["message"] and "--sliding-window 256" in f["message"]
