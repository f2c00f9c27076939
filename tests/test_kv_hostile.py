"""Red team of the KV-event stream (issue 26, section 1): a hostile publisher on real pyzmq sockets (PUB,
and a ROUTER replay socket that may never answer, answer garbage or answer forever), against cachemon's
real KvStream, decoder, fleet ledger and /metrics, inside a real Daemon.

Every frame sent here is CONSTRUCTED (msgspec for well-formed payloads, hand-written bytes for the bombs);
the PUB/ROUTER stand-in is tests/test_kv_stream.Publisher (written from vLLM 0.32.0's ZmqEventPublisher).
In every case: /metrics answers, the ledger says it is out of sync (cachemon_kv_ledger_in_sync 0, the
batch counted in cachemon_kv_lost_batches_total by reason) and is back in sync at the next reset
(AllBlocksCleared) or restart, the split counts nothing it did not understand, and the token ids sent
(TOKEN) appear in no log line and nowhere on /metrics.

The long and heavy attacks (a 50 k messages/s flood, millions of distinct hashes, reconnect storms) are
in benchmarks/bench_kv_hostile.py, against a `cachemon run` process, with RSS and CPU figures.
"""
from __future__ import annotations

import logging
import resource
import threading
import time

import msgspec
import pytest
import requests
import zmq

from cachemon import catalog as C
from cachemon.daemon import Daemon
from cachemon.runconfig import build_config
from cachemon.runtime.kv_stage import KvStage
from helpers import eventually, samples
from test_kv_stream import Publisher, seqb

TOKEN = 48151623                      # the token id every constructed store carries: must never show
UP = (("upstream", "vllm-0"),)


def stored(seq: int, blocks: int = 2, block_size: int = 16, tokens: object = None, **extra) -> bytes:
    """CONSTRUCTED 0.32.0-shaped batch: one BlockStored of ``blocks`` new hashes (distinct per seq)."""
    base = 2**62 + seq * 1000
    ev = {"type": "BlockStored", "block_hashes": list(range(base, base + blocks)), "parent_block_hash": None,
          "token_ids": [TOKEN + i for i in range(blocks * block_size)] if tokens is None else tokens,
          "block_size": block_size, "lora_id": None, "medium": "GPU", "lora_name": None, **extra}
    return msgspec.msgpack.encode([time.time(), [ev], 0])


def cleared() -> bytes:
    return msgspec.msgpack.encode([time.time(), [{"type": "AllBlocksCleared"}], 0])


class Fleet:
    """A real Daemon (real fleet ledger) following one publisher, serving /metrics on 127.0.0.1."""

    def __init__(self, pub: Publisher, replay: str | None, **kv_settings):
        cfg = build_config(None, ["vllm-0=http://127.0.0.1:9/metrics"], listen="127.0.0.1:0",
                           kv_events=[f"vllm-0={pub.endpoint}"])
        ev = cfg.upstreams[0].kv_events
        ev.replay, ev.topic, ev.model = replay, "kv-events", "m"
        kv_settings.setdefault("new_series_hold", 0.0)   # the counts at once (shipped: 0 for 90s; test_new_series.py)
        for k, v in kv_settings.items():
            setattr(cfg.kv_events, k, v)
        self.daemon = Daemon(cfg)
        self.daemon.start()
        self.url = f"http://127.0.0.1:{self.daemon.port}/metrics"
        stage = next(c for c in self.daemon.components if isinstance(c, KvStage))
        self.stream, self.feed = stage.streams[0]
        self.slowest_scrape = 0.0

    def text(self) -> str:
        t0 = time.monotonic()
        r = requests.get(self.url, timeout=5)
        self.slowest_scrape = max(self.slowest_scrape, time.monotonic() - t0)
        r.raise_for_status()
        return r.text

    def get(self, name: str, **labels: str) -> float | None:
        want = tuple(sorted({"upstream": "vllm-0", **labels}.items()))
        return samples(self.text()).get((name, want))

    def in_sync(self) -> float | None:
        return self.get(C.KV_LEDGER_IN_SYNC.sample_name)

    def lost(self, reason: str) -> float | None:
        return self.get(C.KV_LOST_BATCHES.sample_name, reason=reason)

    def split(self) -> dict[str, float]:
        name = C.KV_STORED_TOKENS.sample_name
        return {dict(ls)["reason"]: v for (n, ls), v in samples(self.text()).items() if n == name and v}

    def wait_seq(self, seq: int) -> None:
        eventually(lambda: self.stream.last_seq == seq, timeout=10, what=f"seq {seq} handled")

    def close(self) -> None:
        self.daemon.shutdown()


@pytest.fixture
def hostile(caplog):
    """(start, logs): start(pub, replay=..., **kv_settings) -> Fleet; logs() is every log line so far."""
    caplog.set_level(logging.DEBUG)
    made: list[tuple[Fleet, Publisher]] = []

    def start(pub: Publisher, replay: str | None = None, **kw) -> Fleet:
        fleet = Fleet(pub, replay, **kw)
        made.append((fleet, pub))
        pub.wait_subscribed()
        return fleet

    yield start, lambda: "\n".join(r.getMessage() for r in caplog.records)
    for fleet, pub in made:
        fleet.close()
        pub.close()


def _no_token_anywhere(fleet: Fleet, logs: str) -> None:
    assert str(TOKEN) not in logs and str(TOKEN) not in fleet.text()
    assert str(TOKEN + 1) not in logs and str(TOKEN + 1) not in fleet.text()


# --- garbage, bombs, wrong token counts, oversized -----------------------------------------------------

BOMBS = {
    # wrong frame counts and seq widths (the stream's own checks)
    "one part": [b"kv-events"],
    "two parts": [b"kv-events", seqb(0)],
    "four parts": [b"kv-events", seqb(0), b"x", b"y"],
    "seq of 3 bytes": [b"kv-events", b"\x00\x00\x01", b"x"],
}
PAYLOADS = {
    # reason the decoder gives -> payload (each sent with the next seq, so that no gap shows)
    "not msgpack": ("not_msgpack", b"\xc1\xc1\xc1"),
    "garbage": ("bad_batch", b"\x00" * 100),
    "deep nesting (a million arrays)": ("bad_batch", b"\x93\xcb" + b"\x00" * 8 + b"\x91" * 1_000_000 + b"\xc0"),
    "deep nesting in an event": ("bad_batch", b"\x93\xcb" + b"\x00" * 8 + b"\x91\x82\xa4type\xabBlockStored\xa1x"
                                 + b"\x91" * 100_000 + b"\xc0\x00"),
    "4 Gi events declared": ("too_many_events", b"\x93\xcb" + b"\x00" * 8 + b"\xdd\xff\xff\xff\xff"),
    "4 Gi map entries declared": ("not_msgpack", b"\x93\xcb" + b"\x00" * 8 + b"\x91\xdf\xff\xff\xff\xff"),
    "4 GiB string declared": ("not_msgpack", b"\x93\xcb" + b"\x00" * 8 + b"\x91\x82\xa4type\xdb\xff\xff\xff\xff"),
    "200 000 one-byte events": ("too_many_events", msgspec.msgpack.encode([0.0, [0] * 200_000, 0])),
    "an event of 100 000 fields": ("bad_event", msgspec.msgpack.encode(
        [0.0, [{"type": "BlockStored", **{f"k{i}": 0 for i in range(100_000)}}], 0])),
    "token_ids one short": ("token_count", stored(0, tokens=[TOKEN] * 31)),
    "token_ids one too many": ("token_count", stored(0, tokens=[TOKEN] * 33)),
    "token_ids not an array": ("bad_event", stored(0, tokens=TOKEN)),
    "block_size 0": ("token_count", stored(0, block_size=0, tokens=[])),
    "extra_keys of the wrong length": ("extra_keys", stored(0, extra_keys=[None])),
    # values the ledger would keep (up to max_blocks hashes; a label per LoRA name): sizes bounded
    "block hashes of 64 KiB": ("bad_event", stored(0, block_hashes=[b"x" * 65536, b"y" * 65536])),
    "a LoRA name of 100 000 characters": ("bad_event", stored(0, lora_name="L" * 100_000)),
    # the batch's ts, from which block lifetimes are measured
    "ts NaN": ("bad_batch", msgspec.msgpack.encode([float("nan"), [{"type": "AllBlocksCleared"}], 0])),
    "ts inf": ("bad_batch", msgspec.msgpack.encode([float("inf"), [{"type": "AllBlocksCleared"}], 0])),
    "ts 1e300": ("bad_batch", msgspec.msgpack.encode([1e300, [{"type": "AllBlocksCleared"}], 0])),
    "ts negative": ("bad_batch", msgspec.msgpack.encode([-1.0, [{"type": "AllBlocksCleared"}], 0])),
}


@pytest.mark.slow
def test_garbage_bombs_and_wrong_token_counts_are_counted_skips_and_the_ledger_recovers(hostile):
    start, logs = hostile
    pub = Publisher(replay=False)
    fleet = start(pub, max_frame_bytes=2 * 1024 * 1024)
    pub.send(0, stored(0))
    fleet.wait_seq(0)
    assert fleet.in_sync() == 1 and fleet.split() == {"first": 32}
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    for frames in BOMBS.values():
        pub.raw(frames)
    seq = 0
    for _, payload in PAYLOADS.values():
        seq += 1
        pub.send(seq, payload)
    seq += 1
    pub.send(seq, stored(seq, tokens=["a"] * 32))           # right length, not integers: the ledger's to find
    seq += 1
    pub.send(seq, msgspec.msgpack.encode([0.0, [{"type": "Weird", "token_ids": [TOKEN] * 100_000}], 0]))
    seq += 1
    pub.send(seq, b"\x00" * (2 * 1024 * 1024 + 1))          # over max_frame_bytes, under ZMQ's 4x limit
    fleet.wait_seq(seq)
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    reasons = {}
    for want, _ in PAYLOADS.values():
        reasons[want] = reasons.get(want, 0) + 1
    assert fleet.feed.decode_reasons == reasons
    shapes = logs()
    assert "wrong shape (parts) skipped; counted as a decode_error (1 so far)" in shapes
    assert "wrong shape (seq_length) skipped; counted as a decode_error (1 so far)" in shapes
    assert fleet.lost("decode_error") == len(BOMBS) + len(PAYLOADS)
    assert fleet.lost("oversized") == 1 and fleet.lost("gap") == 0
    assert fleet.in_sync() == 0
    assert fleet.split() == {"first": 32}                    # nothing it did not understand was counted
    assert fleet.get(C.KV_LEDGER_ANOMALIES.sample_name, kind="malformed_stores") == 1
    assert fleet.get(C.KV_EVENTS.sample_name, type="unknown") == 1
    # bounded: the whole attack (~3.3 MB of frames) in well under a second of this process's CPU
    cpu = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
    assert cpu < 3.0, cpu
    # back in sync at the next reset, and counting again
    pub.send(seq + 1, cleared())
    pub.send(seq + 2, stored(0))
    fleet.wait_seq(seq + 2)
    assert fleet.in_sync() == 1 and fleet.split() == {"first": 32, "reset": 32}
    _no_token_anywhere(fleet, logs())


# --- sequences that jump, go back or repeat ---------------------------------------------------------------

@pytest.mark.slow
def test_sequences_that_repeat_jump_or_go_back(hostile):
    start, logs = hostile
    pub = Publisher()
    fleet = start(pub, replay=pub.replay_endpoint, replay_timeout=1.0)
    first = stored(0)
    pub.send(0, first)
    second = stored(1)
    pub.send(1, second)
    fleet.wait_seq(1)
    # repeat: the last batch again, byte for byte: skipped (not a restart, not counted twice)
    pub.raw([b"kv-events", seqb(1), second])
    eventually(lambda: fleet.lost("duplicate") == 1)
    assert fleet.in_sync() == 0 and fleet.split() == {"first": 64}
    assert fleet.stream.stats.restarts == 0
    pub.send(2, cleared())
    fleet.wait_seq(2)
    assert fleet.in_sync() == 1
    # go back: an old batch of the same process (its replay buffer still holds our last one): skipped
    pub.raw([b"kv-events", seqb(0), first])
    eventually(lambda: fleet.lost("duplicate") == 2)
    assert fleet.in_sync() == 0 and fleet.stream.stats.restarts == 0 and fleet.split() == {"first": 64}
    # jump: seqs 3-9 never published (not in the replay buffer either): a gap of 7, lost
    pub.send(10, stored(10))
    fleet.wait_seq(10)
    assert fleet.lost("gap") == 7
    assert fleet.in_sync() == 0
    assert fleet.split() == {"first": 64, "reset": 32}     # the same token ids as seq 0's: left at the reset
    # a real restart: seq 0 of a new process (its buffer starts empty): in sync, the content is "restart"
    pub.send(0, stored(10))
    eventually(lambda: fleet.stream.stats.restarts == 1)
    fleet.wait_seq(0)
    assert fleet.in_sync() == 1
    assert fleet.split() == {"first": 64, "reset": 32, "restart": 32}
    _no_token_anywhere(fleet, logs())


# --- a hostile replay socket ----------------------------------------------------------------------------

class HostileReplay:
    """CONSTRUCTED ROUTER replay socket: "silent" reads requests and never answers; "garbage" answers
    junk frames (wrong part counts, short seqs); "forever" answers a valid batch at the first asked seq
    again and again, never the end marker."""

    def __init__(self, mode: str):
        self.mode = mode
        self.ctx = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.setsockopt(zmq.SNDHWM, 1000)
        self.router.bind("tcp://127.0.0.1:*")
        self.endpoint = self.router.getsockopt_string(zmq.LAST_ENDPOINT)
        self.requests = 0
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        clients: list[tuple[bytes, int, bytes]] = []
        while not self._stop.is_set():
            if self.router.poll(5 if clients and self.mode != "silent" else 50):
                ident, _, start = self.router.recv_multipart()
                self.requests += 1
                first = int.from_bytes(start, "big")
                clients.append((ident, first, stored(first)))
            for ident, start, batch in clients:
                try:
                    for _ in range(100):
                        if self.mode == "garbage":
                            self.router.send_multipart([ident, b"", b"\x01\x02", b"junk"], zmq.NOBLOCK)
                            self.router.send_multipart([ident, b"only"], zmq.NOBLOCK)
                        elif self.mode == "forever":
                            self.router.send_multipart([ident, b"", b"kv-events", seqb(start), batch],
                                                       zmq.NOBLOCK)
                        self.sent += self.mode != "silent"
                except zmq.ZMQError:
                    pass                        # the client went away, or its queue is full

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.ctx.destroy(linger=0)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["silent", "garbage", "forever"])
def test_a_replay_socket_that_never_answers_answers_garbage_or_answers_forever(hostile, mode):
    start, logs = hostile
    replay = HostileReplay(mode)
    pub = Publisher(replay=False)
    try:
        fleet = start(pub, replay=replay.endpoint, replay_timeout=0.5)
        pub.send(0, stored(0))
        fleet.wait_seq(0)
        t0 = time.monotonic()
        pub.send(5, stored(5))                                # seqs 1-4 missed: asked of the replay socket
        pub.send(6, stored(6))
        fleet.wait_seq(6)
        took = time.monotonic() - t0
        assert replay.requests >= 1
        assert took < 0.5 + 2.0, took                         # bounded by replay_timeout, then live again
        recovered = fleet.get(C.KV_RECOVERED_BATCHES.sample_name)
        assert fleet.lost("gap") == 4 - recovered
        assert recovered == (1 if mode == "forever" else 0)  # seq 1 once, however often it is sent
        if mode == "garbage":
            assert fleet.lost("decode_error") > 0            # each junk answer counted
            assert "wrong shape (replay_parts)" in logs()                # each junk answer a decode_error
        assert fleet.in_sync() == 0
        assert fleet.split() == {"first": 32 * (3 + recovered)}
        assert fleet.slowest_scrape < 1.0
        pub.send(7, cleared())
        fleet.wait_seq(7)
        assert fleet.in_sync() == 1
        _no_token_anywhere(fleet, logs())
    finally:
        replay.close()


# --- many distinct hashes: the ledger stays bounded --------------------------------------------------------

@pytest.mark.slow
def test_more_distinct_hashes_than_the_ledger_holds_overflow_visibly_and_recover(hostile):
    """max_blocks 2 000 per replica, 20 000 distinct blocks stored: at most 2 000 tracked, the rest counted
    (overflow_blocks) and the ledger out of sync; a reset empties it and it is in sync again. The million-
    hash run at the default bounds is benchmarks/bench_kv_hostile.py."""
    start, logs = hostile
    pub = Publisher(replay=False)
    fleet = start(pub, max_blocks=2000, history_blocks=1000)
    for s in range(200):
        pub.send(s, stored(s, blocks=100, block_size=1))
    fleet.wait_seq(199)
    cached = fleet.get(C.KV_CACHED_BLOCKS.sample_name, model_name="m")
    assert cached == 2000
    assert fleet.get(C.KV_LEDGER_ANOMALIES.sample_name, kind="overflow_blocks") == 18_000
    assert fleet.in_sync() == 0
    assert sum(fleet.split().values()) == 20_000               # every stored token counted once
    pub.send(200, cleared())
    fleet.wait_seq(200)
    assert fleet.in_sync() == 1 and fleet.get(C.KV_CACHED_BLOCKS.sample_name, model_name="m") == 0
    _no_token_anywhere(fleet, logs())


def test_a_long_cache_salt_is_remembered_by_its_digest_not_kept():
    """A cache_salt is whatever a vLLM client sends; the ledger remembers up to 4 096 of them. 200 salts of
    200 000 characters (CONSTRUCTED, in 0.32.0's extra_keys) leave no salt of over 64 characters behind,
    and two long salts that differ stay two tenants."""
    from cachemon.normalise.kv_decode import KvDecoder
    from cachemon.state.ledger.fleet import FleetLedger
    from cachemon.state.ledger.tenants import TenantLabels
    fleet, dec = FleetLedger(tenants=TenantLabels({}, b"k" * 16, 500)), KvDecoder()
    for s in range(200):
        salt = f"S{s}-" + "x" * 200_000
        fleet.on_batch("r", "m", dec.decode(stored(s, extra_keys=[[salt], None]), s), 0.0)
    book = fleet.replica("r").tenants.book
    assert max(len(k[0]) for k in book._salts) <= 65
    assert len({t for t, _ in book.pairs if t.startswith("h-")}) == 200


def test_no_salt_is_kept_once_a_tenant_key_names_them():
    """Issue 38 item 2: with kv_events.tenant_key set, every salt went through TenantNamer, which kept up to
    65 536 of them, of any length, as its memo's keys (2 000 salts of 100 000 characters: RSS 38 -> 232 MB).
    300 salts of 100 000 characters (CONSTRUCTED, in 0.32.0's extra_keys) through the live ledger, then
    through analyze's namer: less than 1 MB stays allocated (60 MB before), and two long salts that differ
    are still two tenants."""
    import tracemalloc

    from cachemon.normalise.kv_decode import KvDecoder
    from cachemon.normalise.tenant_label import TenantNamer
    from cachemon.state.ledger.fleet import FleetLedger
    from cachemon.state.ledger.tenants import TenantLabels
    fleet, dec = FleetLedger(tenants=TenantLabels({}, b"k" * 16, 500)), KvDecoder()
    namer = TenantNamer(key=b"k" * 16)
    labels = set()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for s in range(300):
            salt = f"S{s}-" + "x" * 100_000
            fleet.on_batch("r", "m", dec.decode(stored(s, extra_keys=[[salt], None]), s), 0.0)
            labels.add(namer(salt))
        del salt
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert grown < 1_000_000, grown
    book = fleet.replica("r").tenants.book
    assert len({t for t, _ in book.pairs if t.startswith("h-")}) == 300
    assert len(labels) == 300 and labels == {t for t, _ in book.pairs if t.startswith("h-")}


@pytest.mark.slow
def test_a_peer_that_does_not_speak_zmtp_gets_a_new_socket_backing_off_and_one_warning(caplog):
    """CONSTRUCTED: a plain TCP server at the endpoint that writes junk and hangs up. ZMQ drops such a
    connection without scheduling a retry; the stream makes a new socket each time, with a growing delay,
    and says so once (then at the 10th, 100th, ...), not once a second."""
    import socket

    from cachemon.sources.kv_stream import KvStream, StreamSettings
    from test_kv_stream import Recorder
    caplog.set_level(logging.INFO)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    accepted = []

    def serve():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            accepted.append(1)
            with c:
                c.sendall(b"\xff" + b"\x00" * 8 + b"\x7f" + b"not ZMTP" * 64)

    threading.Thread(target=serve, daemon=True).start()
    try:
        stream = KvStream("junk", StreamSettings(endpoint=f"tcp://127.0.0.1:{srv.getsockname()[1]}"), Recorder())
        stop = threading.Event()
        stream.start(stop)
        eventually(lambda: stream.stats.protocol_errors >= 3, timeout=15, what="three protocol errors")
        stop.set()
        stream.join(5)
        assert not stream.stats.connected and stream.stats.connects == 0
        assert caplog.text.count("ZMQ gave up the connection") == 1
    finally:
        srv.close()


def test_zmq_s_queue_is_bounded_in_bytes_not_only_in_messages():
    """RCVHWM counts messages; the bytes they may hold are RCVHWM x MAXMSGSIZE (4 x max_frame_bytes).
    With the default 16 MiB frames that is 8 messages (512 MiB); with small frames, queue_messages."""
    from cachemon.sources.kv_stream import HARD_LIMIT_FACTOR, KvStream, StreamSettings
    from test_kv_stream import Recorder

    def limit(max_frame_bytes: int) -> int:
        return KvStream("r", StreamSettings("tcp://127.0.0.1:1", max_frame_bytes=max_frame_bytes), Recorder()).queue_limit()
    assert limit(16 * 1024 * 1024) == 8
    assert limit(16 * 1024 * 1024) * HARD_LIMIT_FACTOR * 16 * 1024 * 1024 <= 512 * 1024 * 1024
    assert limit(64 * 1024) == 2048 and limit(1024) == 10_000
    assert limit(1024 * 1024 * 1024) == 8                 # a floor, whatever the frame size


def test_a_seq_leaping_to_2_64_minus_2_is_no_gap_of_1_8e19_batches():
    """Issue 38: a (CONSTRUCTED) batch with seq 2^64-2 after seq 1 counted 1.8e19 lost batches (gap) on 74d8045,
    and as the first batch heard, as many "joined". A leap of more than 2^24 seqs is a garbled seq, not a
    gap: the batch is skipped and counted once (seq_jump), the stream keeps its seq and goes on."""
    from test_kv_stream import Recorder, families, stage_for
    sink, pub = Recorder(), Publisher(replay=False)
    try:
        stage = stage_for(pub, sink, replay=False)          # not started: frames handed to the stream directly
        stream, _ = stage.streams[0]
        huge = 2**64 - 2
        stream.on_frames([b"kv-events", seqb(huge), stored(9)])          # the first batch heard
        for s in (0, 1):
            stream.on_frames([b"kv-events", seqb(s), stored(s)])
        stream.on_frames([b"kv-events", seqb(huge), stored(9)])
        stream.on_frames([b"kv-events", seqb(2), stored(2)])
    finally:
        pub.close()
    lost = families(stage)[C.KV_LOST_BATCHES.name]
    assert sink.seqs() == [0, 1, 2] and stream.stats.restarts == 0
    assert sum(n for _, _, n in (c for c in sink.calls if c[0] == "lost")) == 2
    assert lost['upstream="vllm-0",reason="seq_jump"'] == 2
    assert lost.get('upstream="vllm-0",reason="gap"', 0) == 0


@pytest.mark.slow
def test_a_silent_replay_socket_does_not_stall_the_live_stream(hostile):
    """Issue 38: while the stream waited replay_timeout for a replay socket that never answers, it read nothing
    live: ZMQ's queue (8 messages at the default max_frame_bytes) filled, the publisher (ZMQ's default send
    queue of 1 000 messages here) dropped the rest, and each drop was a new gap that asked the silent socket
    again (on 74d8045: 11 of 1 918 batches lost in 20 s at ~100 batches/s). Now the live messages are read on
    while the replay waits and handled after it: 3 000 CONSTRUCTED batches sent during the wait, none lost;
    only the 4 never published are (gap)."""
    start, logs = hostile
    replay = HostileReplay("silent")
    pub = Publisher(replay=False)
    try:
        fleet = start(pub, replay=replay.endpoint, replay_timeout=1.0)
        pub.send(0, stored(0))
        fleet.wait_seq(0)
        pub.send(5, stored(5))                                # seqs 1-4 missed: asked of the silent socket
        for s in range(6, 3006):                              # ~5 KB each: past ZMQ's and the kernel's buffers
            pub.send(s, stored(s, blocks=64))
        time.sleep(3.0)                                       # past the wait (and any it led to)
        pub.send(3006, stored(3006))
        fleet.wait_seq(3006)
        assert fleet.lost("gap") == 4
        assert fleet.split() == {"first": 32 * 3 + 1024 * 3000}
        assert replay.requests == 1
    finally:
        replay.close()
