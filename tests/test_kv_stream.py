"""The KV-event source (sources/kv_stream.py) and stage (runtime/kv_stage.py) on real ZMQ sockets
bound on 127.0.0.1: the real 0.32.0 capture re-published, gaps recovered from a real ROUTER replay
socket, unrecoverable gaps, restarts, garbage and oversized frames, bounded memory.

``Publisher`` below is a CONSTRUCTED stand-in for vLLM's ZmqEventPublisher, written from
vllm/distributed/kv_events.py at v0.32.0 (PUB sends [topic, seq 8 bytes BE, payload]; the ROUTER
answers [b"", start_seq] with [b"", topic, seq, payload] per buffered batch, then seq -1). Payloads are
the real capture's, or constructed with msgspec where a test says so.
"""
from __future__ import annotations

import base64
import json
import threading
import time
import tracemalloc

import msgspec
import pytest
import zmq

from cachemon import catalog as C
from cachemon.config import KvEventsEndpoint, KvEventsSettings, Upstream
from cachemon.normalise.kv_batch import Cleared, Removed, Stored
from cachemon.runtime.kv_stage import KvStage, StreamFeed
from cachemon.sources.kv_stream import KvStream, StreamSettings
from helpers import FIXTURES, eventually

CAPTURE = FIXTURES / "vllm-0.32.0-cpu-kv-events"
END = (-1).to_bytes(8, "big", signed=True)


def seqb(n: int) -> bytes:
    return n.to_bytes(8, "big")


def captured(scenario: str) -> list[tuple[int, bytes]]:
    path = CAPTURE / scenario / "events.jsonl"
    if not path.exists():
        pytest.skip(f"the capture's {scenario} scenario is not in this checkout")
    return [(d["seq"], base64.b64decode(d["payload_b64"]))
            for d in map(json.loads, path.read_text().splitlines()) if d]


def constructed_batch(seq: int, n_hashes: int = 2, block_size: int = 16) -> bytes:
    """A 0.32.0-shaped batch (constructed): one BlockStored of n_hashes blocks, distinct hashes per seq."""
    base = 2**63 + seq * n_hashes
    ev = {"type": "BlockStored", "block_hashes": list(range(base, base + n_hashes)), "parent_block_hash": None,
          "token_ids": [7] * (n_hashes * block_size), "block_size": block_size, "lora_id": None, "medium": "GPU",
          "lora_name": None}
    return msgspec.msgpack.encode([time.time(), [ev], 0])


class Publisher:
    """PUB (XPUB, to wait for the subscription) + ROUTER replay, on 127.0.0.1 (see the module docstring)."""

    def __init__(self, topic: bytes = b"kv-events", pub_port: int = 0, replay: bool = True, buffer: int = 10_000,
                 replay_topic: bool = True, replay_port: int = 0):
        """replay_topic=False: replay replies without the topic frame, as up to 0.25.1 (constructed from
        vllm/distributed/kv_events.py at v0.25.1: [b"", seq, payload], end marker [b"", -1, b""])."""
        self.replay_topic = replay_topic
        self.ctx = zmq.Context()
        self.topic = topic
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind(f"tcp://127.0.0.1:{pub_port or '*'}")
        self.endpoint = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.buffer: list[tuple[int, bytes]] = []
        self.buffer_max = buffer
        self.replay_endpoint = None
        self.requests: list[int] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        if replay:
            self.router = self.ctx.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.LINGER, 0)
            self.router.bind(f"tcp://127.0.0.1:{replay_port or '*'}")
            self.replay_endpoint = self.router.getsockopt_string(zmq.LAST_ENDPOINT)
            self._thread = threading.Thread(target=self._serve, daemon=True)
            self._thread.start()

    def wait_subscribed(self, timeout: float = 5.0) -> None:
        """Until a subscription arrives (XPUB also reports unsubscriptions: b"\\x00" + topic)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0 and self.pub.poll(int(left * 1000) + 1), "no subscriber"
            if self.pub.recv()[:1] == b"\x01":
                return

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self.router.poll(50):
                continue
            ident, _, start = self.router.recv_multipart()
            start_seq = int.from_bytes(start, "big")
            self.requests.append(start_seq)
            with self._lock:
                buf = list(self.buffer)
            topic = [self.topic] if self.replay_topic else []
            for s, p in buf:
                if s >= start_seq:
                    self.router.send_multipart([ident, b"", *topic, seqb(s), p])
            self.router.send_multipart([ident, b"", *([b""] if self.replay_topic else []), END, b""])

    def keep(self, seq: int, payload: bytes) -> None:
        """Buffer for replay only (what vLLM does for a batch a subscriber then misses)."""
        with self._lock:
            if self.buffer and seq <= self.buffer[-1][0]:
                self.buffer.clear()                      # a new process: vLLM's buffer is per process
            self.buffer.append((seq, payload))
            del self.buffer[:-self.buffer_max]

    def send(self, seq: int, payload: bytes, *, drop: bool = False, lost: bool = False) -> None:
        """drop: buffered but not sent live (recoverable); lost: neither (unrecoverable)."""
        if not lost:
            self.keep(seq, payload)
        if not drop and not lost:
            self.pub.send_multipart([self.topic, seqb(seq), payload])

    def raw(self, frames: list[bytes]) -> None:
        self.pub.send_multipart(frames)

    def close(self) -> None:
        self._stop.set()
        if self.replay_endpoint is not None:
            self._thread.join(5)                     # it polls the ROUTER: stop it before the context goes
        self.ctx.destroy(linger=0)


class Recorder:
    """A KvSink that records what it is told (the ledger's stand-in)."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.batches: list = []
        self.cond = threading.Condition()

    def on_batch(self, replica, model, batch, at):
        with self.cond:
            self.batches.append(batch)
            self.calls.append(("batch", replica, model, batch.seq))
            self.cond.notify_all()

    def on_restart(self, replica, at):
        with self.cond:
            self.calls.append(("restart", replica))
            self.cond.notify_all()

    def on_lost(self, replica, batches, at):
        with self.cond:
            self.calls.append(("lost", replica, batches))
            self.cond.notify_all()

    def wait(self, pred, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not pred(self):
                left = deadline - time.monotonic()
                assert left > 0, f"timed out; calls so far: {self.calls[-10:]}"
                self.cond.wait(left)

    def seqs(self):
        return [c[3] for c in self.calls if c[0] == "batch"]


def stage_for(pub: Publisher, sink: Recorder, *, replay: bool = True, settings: KvEventsSettings | None = None,
              model: str | None = "m", topic: str = "kv-events") -> KvStage:
    up = Upstream(url="http://127.0.0.1:8000/metrics", name="vllm-0",
                  kv_events=KvEventsEndpoint(endpoint=pub.endpoint, replay=pub.replay_endpoint if replay else None,
                                             topic=topic, model=model))
    return KvStage([up], settings or KvEventsSettings(replay_timeout=2.0), sink)


@pytest.fixture
def running():
    """Start a stage against a publisher; stops both at the end."""
    made = []

    def start(pub: Publisher, sink: Recorder, **kw) -> KvStage:
        stage = stage_for(pub, sink, **kw)
        stop = threading.Event()
        stage.start(stop)
        made.append((stage, stop, pub))
        pub.wait_subscribed()
        return stage

    yield start
    for stage, stop, pub in made:
        stop.set()
        stage.close()
        pub.close()


def families(stage: KvStage) -> dict[str, dict[str, float]]:
    return {f.name: dict(f.samples) for f in stage.collect()}


# --- the real capture, live ---------------------------------------------------------------------------

def test_the_real_capture_streams_through_in_order_with_event_counts(running):
    msgs = captured("tiny_pool")
    pub, sink = Publisher(), Recorder()
    stage = running(pub, sink)
    for s, p in msgs:
        pub.send(s, p)
    sink.wait(lambda r: len(r.batches) == len(msgs))
    assert sink.seqs() == [s for s, _ in msgs]
    assert not [c for c in sink.calls if c[0] != "batch"]            # no loss, no restart
    assert all(c[1:3] == ("vllm-0", "m") for c in sink.calls)
    kinds = {"stored": Stored, "removed": Removed, "cleared": Cleared}
    want = {k: sum(isinstance(e, t) for b in sink.batches for e in b.events) for k, t in kinds.items()}
    fam = families(stage)
    ev = fam[C.KV_EVENTS.name]
    assert ev['upstream="vllm-0",type="stored"'] == want["stored"] > 0
    assert ev['upstream="vllm-0",type="removed"'] == want["removed"] > 0
    assert ev['upstream="vllm-0",type="unknown"'] == 0
    assert fam[C.KV_STREAM_UP.name]['upstream="vllm-0"'] == 1.0
    assert set(fam[C.KV_LOST_BATCHES.name].values()) == {0}


# --- gaps -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("replay_topic", [True, False], ids=["0.26.0+", "up to 0.25.1"])
def test_a_dropped_batch_is_recovered_from_the_replay_socket(running, replay_topic):
    pub, sink = Publisher(replay_topic=replay_topic), Recorder()
    stage = running(pub, sink)
    for s in range(6):
        pub.send(s, constructed_batch(s), drop=s in (2, 3))
    sink.wait(lambda r: len(r.batches) == 6)
    assert sink.seqs() == [0, 1, 2, 3, 4, 5]                        # in order, the replayed ones in place
    assert not [c for c in sink.calls if c[0] == "lost"]
    assert pub.requests == [2]
    assert families(stage)[C.KV_RECOVERED_BATCHES.name]['upstream="vllm-0"'] == 2


def test_an_unrecoverable_gap_is_reported_lost_and_counted(running):
    pub, sink = Publisher(), Recorder()
    stage = running(pub, sink)
    for s in range(5):
        pub.send(s, constructed_batch(s), lost=s == 2)
    sink.wait(lambda r: len(r.batches) == 4)
    assert sink.calls[2] == ("lost", "vllm-0", 1) and sink.seqs() == [0, 1, 3, 4]
    assert families(stage)[C.KV_LOST_BATCHES.name]['upstream="vllm-0",reason="gap"'] == 1


def test_without_a_replay_endpoint_a_gap_is_lost_at_once(running):
    pub, sink = Publisher(replay=False), Recorder()
    stage = running(pub, sink, replay=False)
    for s in range(4):
        pub.send(s, constructed_batch(s), drop=s == 1)
    sink.wait(lambda r: len(r.batches) == 3)
    assert ("lost", "vllm-0", 1) in sink.calls
    assert families(stage)[C.KV_LOST_BATCHES.name]['upstream="vllm-0",reason="gap"'] == 1


def test_joining_a_running_publisher_replays_its_history_or_says_the_ledger_cannot_know(running):
    pub, sink = Publisher(), Recorder()
    for s in range(3):
        pub.keep(s, constructed_batch(s))                           # published before cachemon listened
    running(pub, sink)
    pub.send(3, constructed_batch(3))
    sink.wait(lambda r: len(r.batches) == 4)
    assert sink.seqs() == [0, 1, 2, 3] and not [c for c in sink.calls if c[0] == "lost"]

    pub2, sink2 = Publisher(replay=False), Recorder()
    stage2 = running(pub2, sink2, replay=False)
    pub2.send(7, constructed_batch(7))
    sink2.wait(lambda r: len(r.batches) == 1)
    assert sink2.calls[0] == ("lost", "vllm-0", 7)                  # the ledger is unsure ...
    assert families(stage2)[C.KV_LOST_BATCHES.name]['upstream="vllm-0",reason="gap"'] == 0   # ... nothing was lost


# --- restarts ---------------------------------------------------------------------------------------

def test_the_captured_restart_is_an_on_restart_between_the_two_processes(running):
    msgs = captured("restart")
    pub, sink = Publisher(), Recorder()
    running(pub, sink)
    for s, p in msgs:
        pub.send(s, p)
    sink.wait(lambda r: len(r.batches) == len(msgs))
    restarts = [i for i, c in enumerate(sink.calls) if c[0] == "restart"]
    second = [s for s, _ in msgs].index(0, 1)
    assert restarts == [second]                                      # exactly where seq went back to 0
    assert not [c for c in sink.calls if c[0] == "lost"]


def test_a_restart_caught_late_replays_the_new_process_from_0(running):
    pub, sink = Publisher(), Recorder()
    running(pub, sink)
    for s in range(4):
        pub.send(s, constructed_batch(s))
    sink.wait(lambda r: len(r.batches) == 4)
    for s in range(3):
        pub.send(s, constructed_batch(100 + s), drop=s < 2)          # new process; its first two missed live
    sink.wait(lambda r: len(r.batches) == 7)
    assert sink.calls[4] == ("restart", "vllm-0") and sink.seqs()[4:] == [0, 1, 2]
    assert pub.requests == [3, 0]       # is our last batch still there (no: a new process), then its history


# --- garbage, oversized, memory ------------------------------------------------------------------------

def test_garbage_frames_are_counted_and_the_stream_goes_on(running):
    pub, sink = Publisher(), Recorder()
    stage = running(pub, sink, settings=KvEventsSettings(max_frame_bytes=64 * 1024))
    pub.send(0, constructed_batch(0))
    pub.raw([b"kv-events", seqb(1)])                                  # two parts
    pub.raw([b"kv-events", b"\x01\x02", b"x"])                        # seq not 8 bytes
    pub.send(1, b"\xc1 not msgpack")                                  # does not decode
    pub.send(2, msgspec.msgpack.encode([1.0, [["BlockStored", [1], None, [1], 16, None, "GPU", None]], 0]))  # 1 token
    pub.send(3, constructed_batch(3, n_hashes=5000))                  # ~90 KB: over 64 KiB
    pub.send(4, constructed_batch(4))
    sink.wait(lambda r: r.seqs()[-1:] == [4])
    assert sink.seqs() == [0, 4]
    assert [c[2] for c in sink.calls if c[0] == "lost"] == [1, 1, 1, 1, 1]
    lost = families(stage)[C.KV_LOST_BATCHES.name]
    assert lost['upstream="vllm-0",reason="decode_error"'] == 4
    assert lost['upstream="vllm-0",reason="oversized"'] == 1
    assert lost['upstream="vllm-0",reason="gap"'] == 0


class Counting:
    def __init__(self):
        self.blocks = self.lost = self.restarts = 0

    def on_batch(self, replica, model, batch, at):
        self.blocks += sum(len(e.hashes) for e in batch.events)

    def on_restart(self, replica, at):
        self.restarts += 1

    def on_lost(self, replica, batches, at):
        self.lost += batches


@pytest.mark.slow
def test_a_million_distinct_hashes_and_huge_token_lists_leave_no_state_behind():
    """The source and decoder keep nothing per hash: memory after 1M distinct hashes is what it was
    after the first 50 000 (driven through on_frames, the socket loop's per-message entry point).
    About 2 s on an idle core (a million hashes under tracemalloc); longer on a loaded machine."""
    up = Upstream(url="http://127.0.0.1:8000/metrics", name="r", kv_events=KvEventsEndpoint(endpoint="tcp://127.0.0.1:1"))
    sink = Counting()
    stream = KvStream("r", StreamSettings(endpoint="tcp://127.0.0.1:1", max_frame_bytes=2 * 1024 * 1024),
                      StreamFeed(up, sink))

    def feed(lo: int, hi: int) -> None:
        for s in range(lo, hi):       # 2 500 new hashes per batch; every 100th carries 320 000 token ids
            big = s % 100 == 99
            stream.on_frames([b"t", seqb(s), constructed_batch(s, n_hashes=2500, block_size=128 if big else 1)])

    tracemalloc.start()
    feed(0, 20)
    base = tracemalloc.get_traced_memory()[0]
    feed(20, 400)
    grown = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert sink.blocks == 400 * 2500 and sink.lost == 0
    # what it keeps: the last payload (to tell a restart after a reconnect), at most max_frame_bytes
    kept = len(stream._last_payload or b"")
    assert grown < 64 * 1024 + kept and kept <= stream.s.max_frame_bytes, (grown, kept)
    stream.on_frames([b"t", seqb(400), b"\x00" * (3 * 1024 * 1024)])     # a huge frame: counted, never decoded
    assert sink.lost == 1 and stream.handler.lost["oversized"] == 1


# --- up / down ---------------------------------------------------------------------------------------

def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_stream_up_follows_the_connection_not_the_traffic(running):
    port = _free_port()
    pub, sink = Publisher(pub_port=port, replay=False), Recorder()
    stage = running(pub, sink, replay=False)
    up = lambda: families(stage)[C.KV_STREAM_UP.name]['upstream="vllm-0"']      # noqa: E731
    eventually(lambda: up() == 1.0, what="stream up")
    time.sleep(0.5)
    assert up() == 1.0                                               # idle (nothing sent) is still up
    pub.close()
    eventually(lambda: up() == 0.0, what="stream down")                                      # the publisher went away
    pub2 = Publisher(pub_port=port, replay=False)                    # vLLM back on the same port
    try:
        pub2.wait_subscribed(timeout=15)                             # ZMQ reconnected by itself
        eventually(lambda: up() == 1.0, what="stream up")
        pub2.send(0, constructed_batch(0))
        sink.wait(lambda r: len(r.batches) == 1)
    finally:
        pub2.close()


def test_topic_filter_takes_only_the_configured_topic(running):
    pub, sink = Publisher(topic=b"other"), Recorder()
    running(pub, sink, topic="kv-events")
    pub.raw([b"other", seqb(0), constructed_batch(0)])               # not subscribed: never arrives
    pub.topic = b"kv-events"
    pub.send(0, constructed_batch(0))
    sink.wait(lambda r: len(r.batches) == 1)
    assert sink.seqs() == [0]


class Failing(Recorder):
    def on_batch(self, replica, model, batch, at):
        if batch.seq == 1:
            raise RuntimeError("a ledger bug")
        super().on_batch(replica, model, batch, at)


def test_a_failing_sink_does_not_end_the_stream(running):
    pub, sink = Publisher(), Failing()
    stage = running(pub, sink)
    for s in range(3):
        pub.send(s, constructed_batch(s))
    sink.wait(lambda r: r.seqs() == [0, 2])
    assert ("lost", "vllm-0", 1) in sink.calls                       # the ledger is told it is unsure
    lost = families(stage)[C.KV_LOST_BATCHES.name]
    assert lost.pop('upstream="vllm-0",reason="handler"') == 1       # exported as a loss: the ledger is unsure
    assert set(lost.values()) == {0}


@pytest.mark.slow
def test_a_frame_over_the_hard_limit_never_reaches_python_and_shows_as_a_gap(running):
    """ZMQ's MAXMSGSIZE (4 x max_frame_bytes) drops the connection instead of buffering the frame; the
    SUB reconnects by itself and the missed seq is a gap (the replay socket's copy is refused alike)."""
    pub, sink = Publisher(), Recorder()
    stage = running(pub, sink, settings=KvEventsSettings(max_frame_bytes=1024, replay_timeout=0.5))
    pub.send(0, constructed_batch(0, n_hashes=1))
    sink.wait(lambda r: r.seqs() == [0])
    pub.send(1, b"\x00" * 64 * 1024)                                 # 64 KiB > 4 KiB: refused by ZMQ
    pub.wait_subscribed(timeout=10)                                  # the SUB came back (a new subscription)
    pub.send(2, constructed_batch(2, n_hashes=1))
    sink.wait(lambda r: r.seqs() == [0, 2])
    fam = families(stage)
    lost = fam[C.KV_LOST_BATCHES.name]
    assert lost['upstream="vllm-0",reason="oversized"'] == 0 and lost['upstream="vllm-0",reason="gap"'] == 1
    assert fam[C.KV_STREAM_DISCONNECTS.name]['upstream="vllm-0"'] == 1
    assert ("lost", "vllm-0", 1) in sink.calls


def test_a_restart_whose_seqs_passed_ours_while_disconnected_is_still_a_restart(running):
    """vLLM restarted and published more batches than the old process before ZMQ reconnected: the next
    seq is above ours, but the replay socket holds another batch at our last seq, so it is a new process."""
    port, rport = _free_port(), _free_port()
    old, sink = Publisher(pub_port=port, replay_port=rport), Recorder()
    running(old, sink)
    for s in range(3):
        old.send(s, constructed_batch(s))
    sink.wait(lambda r: len(r.batches) == 3)
    old.close()
    new = Publisher(pub_port=port, replay_port=rport)
    try:
        for s in range(5):
            new.keep(s, constructed_batch(1000 + s))                  # sent while nobody listened
        new.wait_subscribed(timeout=15)
        new.send(5, constructed_batch(1005))
        sink.wait(lambda r: len(r.batches) == 9)
        assert sink.calls[3] == ("restart", "vllm-0")
        assert sink.seqs() == [0, 1, 2, 0, 1, 2, 3, 4, 5]             # the new process from its start
        assert not [c for c in sink.calls if c[0] == "lost"]
    finally:
        new.close()


def test_a_reconnect_to_the_same_process_is_not_a_restart(running):
    pub, sink = Publisher(), Recorder()
    stage = running(pub, sink)
    pub.send(0, constructed_batch(0))
    sink.wait(lambda r: len(r.batches) == 1)
    stream = stage.streams[0][0]
    stream._reconnected = True                                        # as after a dropped connection
    pub.send(1, constructed_batch(1), drop=True)
    pub.send(2, constructed_batch(2))
    sink.wait(lambda r: len(r.batches) == 3)
    assert sink.seqs() == [0, 1, 2] and not [c for c in sink.calls if c[0] != "batch"]
    assert pub.requests == [0, 1]          # asked for our last batch (identical: same process), then the gap


def test_a_restart_that_published_before_we_reconnected_is_caught_up_from_the_replay_socket(running):
    # the shape seen live (scripts/e2e/kv_attribution.py, vLLM 0.32.0: restart): vLLM back on the same
    # ports served its requests before ZMQ reconnected (PUB drops what it sends with no subscriber), and
    # nothing followed; constructed batches
    port, rport = _free_port(), _free_port()
    pub, sink = Publisher(pub_port=port, replay_port=rport), Recorder()
    stage = running(pub, sink)
    for s in range(4):
        pub.send(s, constructed_batch(s))
    sink.wait(lambda r: len(r.batches) == 4)
    pub.close()
    eventually(lambda: families(stage)[C.KV_STREAM_UP.name]['upstream="vllm-0"'] == 0.0,
               what="the stream saw the publisher go")
    pub2 = Publisher(pub_port=port, replay_port=rport)                # the new process
    try:
        for s in range(3):
            pub2.keep(s, constructed_batch(100 + s))                 # published while nobody listened
        pub2.wait_subscribed(timeout=15)
        sink.wait(lambda r: len(r.batches) == 7, timeout=10)
        assert sink.calls[4] == ("restart", "vllm-0") and sink.seqs()[4:] == [0, 1, 2]
        pub2.send(3, constructed_batch(103))                         # live again, in order, no second restart
        sink.wait(lambda r: len(r.batches) == 8)
        assert [c[0] for c in sink.calls].count("restart") == 1 and not [c for c in sink.calls if c[0] == "lost"]
    finally:
        pub2.close()


def test_after_a_reconnect_to_the_same_process_what_it_published_meanwhile_is_delivered(running):
    # constructed: the same publisher, our connection dropped and back; batches sent meanwhile are only in
    # its replay buffer: delivered in order, no restart
    pub, sink = Publisher(), Recorder()
    stage = running(pub, sink)
    pub.send(0, constructed_batch(0))
    sink.wait(lambda r: len(r.batches) == 1)
    stream = stage.streams[0][0]
    b2 = constructed_batch(2)
    pub.keep(1, constructed_batch(1))
    pub.keep(2, b2)
    stream.catch_up(time.time())                                     # what a reconnect's handshake triggers
    sink.wait(lambda r: len(r.batches) == 3)
    assert sink.seqs() == [0, 1, 2] and "restart" not in [c[0] for c in sink.calls]
    pub.pub.send_multipart([pub.topic, seqb(2), b2])                 # the same batch live as well: a duplicate
    pub.send(3, constructed_batch(3))
    sink.wait(lambda r: len(r.batches) == 4)
    assert sink.seqs() == [0, 1, 2, 3] and "restart" not in [c[0] for c in sink.calls]
