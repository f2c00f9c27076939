"""One replica's KV-event stream: a ZMQ SUB socket on vLLM's publisher, gap recovery from its replay
socket, restart detection from the sequence number, bounded memory whatever arrives.

The wire, as every release publishes it (``vllm/distributed/kv_events.py``, ``ZmqEventPublisher``,
0.9.0 to 0.33.0): each message is ``[topic, seq, payload]``, ``seq`` an 8-byte big-endian counter
that starts at 0 in each publisher process and grows by one per message. The replay socket is a
ROUTER: a DEALER sends ``[b"", start_seq]`` and gets one message per buffered batch with
``seq >= start_seq`` (``[b"", seq, payload]`` up to 0.25.1, ``[b"", topic, seq, payload]`` from 0.26.0),
then an end marker whose seq is -1 (signed). It buffers the current process's last 10 000 batches.

What this module decides, and why:

* A seq above the next expected one is a gap (ZMQ dropped messages at the high-water mark, or the
  connection broke): the missed seqs are asked of the replay socket, delivered in order, and what
  it cannot give (no replay endpoint, evicted from its buffer, timeout) is reported lost.
* A seq at or below the last one is a new publisher process (vLLM restarted; seqs never repeat within
  a process): ``on_restart``, then the new process's seqs below it are a gap like any other. Unless it
  is a repeat: our last batch again byte for byte, or an older seq while the replay socket still holds
  our last batch at our last seq (the same process): skipped, reported lost as ``duplicate`` (such a
  publisher is not one the ledger can trust), never a restart. So is a
  seq above the next one after a reconnect, if the replay socket holds another batch than ours at our
  last seq (the new process published before ZMQ reconnected and its seqs passed ours).
* A seq more than MAX_SEQ_JUMP above the next expected one (or, at the start, above 0) is no gap: no
  vLLM process publishes 2^24 batches (days of engine steps) unheard, and a seq of 2^64-2 would have
  counted 1.8e19 lost batches. It is a garbled seq or a hostile publisher: the batch is skipped and
  counted lost as ``seq_jump`` (one batch), and the stream keeps its last seq.
* While a replay request waits (up to replay_timeout), the live socket is read on into a bounded
  hold, handled in order after the replay (replay.py): a silent replay socket no longer stalls the live
  stream into drops.
* The first message after cachemon starts with seq > 0: the batches before it are asked of the
  replay socket too (the ledger needs them to know what is cached); whatever is missing is lost.
* Memory: ZMQ queues at most ``queue_messages`` messages, and at most QUEUE_BYTES of frames of the
  largest size it accepts (RCVHWM, ``queue_limit``; without the byte bound a stream stalled 2 s on a
  silent replay socket took 1.2 GB of 20 MB frames; a replay answer's queue is queue_messages); beyond,
  the publisher drops (a gap); a frame
  over ``max_frame_bytes`` is counted ``oversized`` and never copied into Python;
  ZMQ itself refuses frames over 4x that (MAXMSGSIZE) before buffering them: it drops the connection
  and, for such a protocol error, schedules no retry; the stream sees a disconnect with no retry and
  makes a new socket, and the frame shows as a gap. Frames of the wrong shape count as ``decode_error`` (logged by kind).
  No per-hash state.
* Up: ZMQ connects and reconnects by itself (with exponential backoff, RECONNECT_IVL to
  RECONNECT_IVL_MAX); a socket monitor tells connected from not, since a healthy idle vLLM sends
  nothing (silence is not down).

Never logged: payloads, token ids, hashes.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Protocol, TypeAlias

from cachemon import install_hint
from cachemon.sources.kv_stream_replay import END_SEQ, Frame, LiveHold, Socket, answer, frame_bytes

if TYPE_CHECKING:   # pyzmq is the optional extra kv-events
    import zmq

Context: TypeAlias = "zmq.Context[zmq.Socket[bytes]]"

log = logging.getLogger("cachemon.kv_events")

POLL_MS = 200                     # how often the loop looks at stop_event while idle
RECONNECT_IVL_MS = 100            # ZMQ's first reconnect delay ...
RECONNECT_IVL_MAX_MS = 10_000     # ... doubling up to this
HARD_LIMIT_FACTOR = 4             # MAXMSGSIZE = this x max_frame_bytes
QUEUE_BYTES = 512 * 1024 * 1024    # ZMQ's receive queue in bytes (RCVHWM x MAXMSGSIZE), unless ...
QUEUE_MIN = 8                      # ... that leaves fewer messages
MAX_SEQ_JUMP = 1 << 24            # a larger step of the seq is no gap (see the module's doc)
ORPHAN_AFTER = 1.0                # seconds after a disconnect without a retry scheduled: a new socket


class FrameHandler(Protocol):
    """What the stream reports, in order (the runtime stage decodes payloads and feeds the ledger)."""
    def on_payload(self, seq: int, payload: bytes, at: float) -> None: ...
    def on_restart(self, at: float) -> None: ...
    def on_lost(self, batches: int, reason: str, at: float) -> None: ...


@dataclass
class StreamSettings:
    endpoint: str
    replay: str | None = None
    topic: str = ""
    max_frame_bytes: int = 16 * 1024 * 1024
    queue_messages: int = 10_000
    replay_timeout: float = 2.0


@dataclass
class StreamStats:
    """One stream's health (written by the stream's thread; read at scrape time by the stage, which exports
    it, and by `cachemon check`). Batches lost, by reason, are counted once: by the handler (``on_lost``)."""
    messages: int = 0             # frames delivered (live or replayed): check's report
    recovered: int = 0            # of which from the replay socket
    restarts: int = 0             # publisher restarts seen (seq went back): check's report
    connected: bool = False
    connects: int = 0             # handshakes: check (was it ever up) and the reconnect backoff
    disconnects: int = 0          # connections that broke after their handshake
    protocol_errors: int = 0      # connections ZMQ dropped without a retry (a new socket was made)
    last_message: float = 0.0     # unix time of the last live frame, 0 before one (silence is not down)


def _worth_a_line(n: int) -> bool:
    """The 1st, 10th, 100th and every 1000th of a repeated warning: seen, never a flood."""
    return n in (1, 10, 100) or n % 1000 == 0


def _zmq() -> ModuleType:
    try:
        import zmq
    except ImportError:           # the config check catches this first; this is the backstop
        raise RuntimeError(f"following KV events needs pyzmq; {install_hint('kv-events')}") from None
    return zmq


class KvStream:
    """Follows one endpoint until ``stop_event`` is set; ``run`` is the thread's body."""

    def __init__(self, name: str, settings: StreamSettings, handler: FrameHandler,
                 clock: Callable[[], float] = time.time, context: Context | None = None):
        self.name = name
        self.s = settings
        self.handler = handler
        self.clock = clock
        self.stats = StreamStats()
        self.last_seq: int | None = None
        self._ctx = context
        self._thread: threading.Thread | None = None
        self._orphaned_since: float | None = None
        self._reconnected = False          # a handshake since the last message (not the first one)
        self._last_payload: bytes | None = None
        self._catch_up = False             # a reconnect: ask the replay socket what was published meanwhile
        self._replayed: dict[int, int] = {}   # seq -> hash of a batch the catch-up delivered (live duplicates)
        self._live = LiveHold(settings.queue_messages)   # the live socket, read on while a replay waits
        self._warned: dict[str, int] = {}  # repeated warnings by kind, to log a few (the losses are the handler's)

    def queue_limit(self) -> int:
        """RCVHWM: ZMQ counts messages, not bytes, so the queue is also held to QUEUE_BYTES of frames of
        the largest size ZMQ accepts (8 messages with the default max_frame_bytes). vLLM sends one batch
        per engine step, so that is room enough; a hostile 50 k msg/s flood measured 0.7 % dropped (gaps,
        counted) and 35 % more CPU than with 10 000 (benchmarks/bench_kv_hostile.py).
        Beyond it ZMQ stops reading the connection: what follows waits in the
        kernel's buffers and then in the publisher's queue (vLLM's holds 100 000 messages), and a drop there
        is a gap the replay socket can fill."""
        return min(self.s.queue_messages, max(QUEUE_MIN, QUEUE_BYTES // (HARD_LIMIT_FACTOR * self.s.max_frame_bytes)))

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, stop_event: threading.Event) -> None:
        self._thread = threading.Thread(target=self.run, args=(stop_event,), name=f"kv-events-{self.name}", daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def run(self, stop_event: threading.Event) -> None:
        zmq = _zmq()
        ctx = self._ctx or zmq.Context.instance()
        backoff = RECONNECT_IVL_MS / 1000
        while not stop_event.is_set():
            try:
                connects = self.stats.connects
                self._follow(zmq, ctx, stop_event)
                if self.stats.connects > connects:
                    backoff = RECONNECT_IVL_MS / 1000      # it was up: a new socket at once
                stop_event.wait(backoff)                   # a peer that never completes a handshake: backing off
                backoff = min(backoff * 2, RECONNECT_IVL_MAX_MS / 1000)
            except Exception as e:
                # ZMQ reconnects by itself; this is a socket that failed outright (bad endpoint,
                # context trouble): make a new one, backing off.
                self.stats.connected = False
                log.warning("kv events %s: socket error %s; retrying in %.1fs", self.name,
                            e if isinstance(e, zmq.ZMQError) else type(e).__name__, backoff)
                stop_event.wait(backoff)
                backoff = min(backoff * 2, RECONNECT_IVL_MAX_MS / 1000)

    def _socket(self, zmq: ModuleType, ctx: Context, kind: int, endpoint: str | None) -> Socket:
        """A socket with the stream's bounds, connected to ``endpoint`` (None: not yet)."""
        sock = ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        # the live stream's queue in bytes too; a replay answer (at most the publisher's 10 000 buffered
        # batches, from a ROUTER that drops what does not fit) as before
        sock.setsockopt(zmq.RCVHWM, self.queue_limit() if kind == zmq.SUB else self.s.queue_messages)
        sock.setsockopt(zmq.MAXMSGSIZE, HARD_LIMIT_FACTOR * self.s.max_frame_bytes)
        sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)
        if endpoint is not None:
            sock.connect(endpoint)
        return sock

    def _follow(self, zmq: ModuleType, ctx: Context, stop_event: threading.Event) -> None:
        sub = self._socket(zmq, ctx, zmq.SUB, None)
        sub.setsockopt(zmq.SUBSCRIBE, self.s.topic.encode())
        # the monitor first: a handshake that completed before it was attached would never be seen
        monitor = sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED
                                         | zmq.EVENT_CLOSED | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_CONNECTED
                                         | zmq.EVENT_MONITOR_STOPPED)
        self._orphaned_since = None
        sub.connect(self.s.endpoint)
        self._live.sub = sub
        poller = zmq.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        try:
            while not stop_event.is_set():
                ready = dict(poller.poll(POLL_MS))
                if monitor in ready:
                    self._on_monitor(zmq, monitor)
                if self._catch_up:
                    self._catch_up = False
                    self.catch_up(self.clock())
                    self._handle_held()
                if self._orphaned_since is not None and time.monotonic() - self._orphaned_since > ORPHAN_AFTER:
                    # ZMQ retries a connection that broke, but not one it dropped for a protocol error (a
                    # frame over MAXMSGSIZE, garbage): no retry was scheduled, so make a new socket.
                    self.stats.protocol_errors += 1
                    n = self.stats.protocol_errors
                    if _worth_a_line(n):
                        log.warning("kv events %s: ZMQ gave up the connection to %s (a protocol error, e.g. a frame "
                                    "over %d bytes, or a peer that does not speak ZMTP); reconnecting with a new "
                                    "socket (%d so far)", self.name, self.s.endpoint,
                                    HARD_LIMIT_FACTOR * self.s.max_frame_bytes, n)
                    return
                if sub in ready:
                    # drain what is queued, but look at stop_event now and then
                    for _ in range(1000):
                        try:
                            frames = sub.recv_multipart(zmq.NOBLOCK, copy=False)
                        except zmq.Again:
                            break
                        self._handle(frames)
                        self._handle_held()
        finally:
            self._live.clear()
            self.stats.connected = False
            sub.disable_monitor()
            monitor.close(0)
            sub.close(0)

    def _handle(self, frames: Sequence[Frame]) -> None:
        try:
            self.on_frames(frames)
        except Exception as e:      # a sink's bug must not end the stream
            n = self._tally("handler")
            if _worth_a_line(n):    # the exception's type only: its text could quote a payload
                log.error("kv events %s: handling a batch failed (%s; %d so far)", self.name, type(e).__name__, n)
            try:
                self.handler.on_lost(1, "handler", self.clock())   # its state is unsure now
            except Exception:
                pass

    def _handle_held(self) -> None:
        """The live messages read while a replay waited (replay.py), in the order they came (one of them
        may make another replay wait, which holds more)."""
        while self._live:
            self._handle(self._live.pop())

    def _tally(self, kind: str) -> int:
        """One more of a repeated warning of this kind; how many so far."""
        self._warned[kind] = n = self._warned.get(kind, 0) + 1
        return n

    def _on_monitor(self, zmq: ModuleType, monitor: Socket) -> None:
        from zmq.utils.monitor import recv_monitor_message
        while True:
            try:
                ev = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            if ev["event"] in (zmq.EVENT_CONNECT_RETRIED, zmq.EVENT_CONNECTED):
                self._orphaned_since = None          # ZMQ is on it
            elif ev["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._orphaned_since = None
                self._reconnected = self.stats.connects > 0
                self._catch_up = self._reconnected
                self.stats.connected = True
                self.stats.connects += 1
                log.info("kv events %s: connected to %s", self.name, self.s.endpoint)
            elif ev["event"] in (zmq.EVENT_DISCONNECTED, zmq.EVENT_CLOSED):
                if self.stats.connected:    # a connection that broke (not an attempt that never completed)
                    log.warning("kv events %s: disconnected from %s; ZMQ reconnects by itself", self.name, self.s.endpoint)
                    self.stats.disconnects += 1
                self.stats.connected = False
                if ev["event"] == zmq.EVENT_DISCONNECTED:
                    self._orphaned_since = time.monotonic()   # cleared when ZMQ schedules a retry

    # -- frames (tests drive this directly) ----------------------------------------------------
    def _malformed(self, kind: str, at: float) -> None:
        n = self._tally(kind)
        if _worth_a_line(n):        # the kind only: never the frames
            log.warning("kv events %s: a message of the wrong shape (%s) skipped; counted as a decode_error "
                        "(%d so far)", self.name, kind, n)
        self.handler.on_lost(1, "decode_error", at)

    def on_frames(self, frames: Sequence[Frame]) -> None:
        """One live message: ``[topic, seq, payload]`` (zmq Frames or bytes)."""
        at = self.clock()
        self.stats.last_message = at
        if len(frames) != 3:
            self._malformed("parts", at)
            return
        seq_frame, payload = frames[1], frames[2]
        if len(seq_frame) != 8:
            self._malformed("seq_length", at)
            return
        seq = int.from_bytes(frame_bytes(seq_frame), "big")
        if self._replayed:
            if self._replayed.get(seq) == hash(frame_bytes(payload)):
                return                          # the catch-up delivered it already (sent live as we reconnected)
            self._replayed.clear()
        if self.last_seq is not None and seq <= self.last_seq and self._repeated(seq, payload):
            n = self._tally("duplicate")
            if _worth_a_line(n):
                log.warning("kv events %s: batch seq %d received again after seq %d (the same publisher): skipped; "
                            "the ledger is out of sync until the next reset or restart (%d so far)", self.name,
                            seq, self.last_seq, n)
            self.handler.on_lost(1, "duplicate", at)
            return
        if seq > (-1 if self.last_seq is None else self.last_seq) + MAX_SEQ_JUMP:
            n = self._tally("seq_jump")
            if _worth_a_line(n):
                log.warning("kv events %s: batch seq %d leaps more than %d past seq %s: a garbled seq, not a gap; "
                            "skipped, the ledger is out of sync until the next reset or restart (%d so far)",
                            self.name, seq, MAX_SEQ_JUMP, self.last_seq, n)
            self.handler.on_lost(1, "seq_jump", at)
            return
        joined = self.last_seq is None         # the first message this stream ever got
        restarted = False
        if self.last_seq is not None:
            # seqs never go back within a publisher process: a lower one is a new process; so is a higher
            # one after a reconnect if the replay socket holds another batch at our last seq
            restarted = seq <= self.last_seq or (seq > self.last_seq + 1 and self._reconnected and self._new_process())
        self._reconnected = False
        if restarted:
            self.stats.restarts += 1
            log.info("kv events %s: publisher restarted (seq %d after %d)", self.name, seq, self.last_seq)
            self.handler.on_restart(at)
            self.last_seq = self._last_payload = None
        expected = 0 if self.last_seq is None else self.last_seq + 1   # at a start: want the process's history
        if seq > expected:
            self._recover(expected, seq, at, joined)
        self._deliver(seq, payload, at)

    def _deliver(self, seq: int, payload: Frame, at: float) -> bool:
        self.last_seq = seq
        self._last_payload = None
        if len(payload) > self.s.max_frame_bytes:
            self.handler.on_lost(1, "oversized", at)
            return False
        self.stats.messages += 1
        body = self._last_payload = frame_bytes(payload)      # one payload kept: to tell a restart after a reconnect
        self.handler.on_payload(seq, body, at)
        return True

    def _repeated(self, seq: int, payload: Frame) -> bool:
        """A seq not above ours from the same process: our last batch byte for byte, or (an older seq)
        the replay socket still holds our last batch at our last seq. A new process holds another batch
        there or none. No replay endpoint or no answer: taken as a restart, as vLLM's seqs say."""
        if self._last_payload is not None and seq == self.last_seq and frame_bytes(payload) == self._last_payload:
            return True
        first = self._replay_at_last()
        return first is not None and first == (self.last_seq, self._last_payload)

    def _new_process(self) -> bool:
        """After a reconnect, with a gap: is the publisher a new vLLM process that sent batches before
        ZMQ reconnected (so its seqs passed ours)? Its replay buffer then holds another batch at our last
        seq; the same process holds ours byte for byte. Without a replay endpoint or an answer: no."""
        first = self._replay_at_last()
        return first is not None and first[0] == self.last_seq and first[1] != self._last_payload

    def _replay_at_last(self) -> tuple[int, bytes] | None:
        """The replay socket's first batch at or after our last seq (None: no replay endpoint, nothing
        delivered yet, no answer, or it failed)."""
        if not self.s.replay or self.last_seq is None or self._last_payload is None:
            return None
        try:
            return self._replay_first(self.last_seq)
        except Exception as e:
            log.warning("kv events %s: replay from %s failed: %s", self.name, self.s.replay, type(e).__name__)
            return None

    def _recover(self, start: int, stop: int, at: float, joined: bool = False) -> None:
        """Seqs [start, stop) were missed: deliver what the replay socket still has, report the rest.
        ``joined``: they were published before cachemon first heard this process (not a loss of the
        stream's, but the ledger cannot know what they cached): reported as reason "joined"."""
        missing = stop - start
        got = 0
        if self.s.replay:
            try:
                got = self._replay(start, stop)
            except Exception as e:          # never let a replay problem end the stream
                log.warning("kv events %s: replay from %s failed: %s", self.name, self.s.replay, type(e).__name__)
        lost = missing - got
        if lost > 0 and joined:
            log.info("kv events %s: joined a running publisher at seq %d; %d earlier batch(es) not in its replay "
                     "buffer: the ledger is unsure until the next reset or restart", self.name, stop, lost)
            self.handler.on_lost(lost, "joined", at)
        elif lost > 0:
            log.warning("kv events %s: %d batch(es) missed (seq %d-%d), %d recovered from replay; the ledger is out "
                        "of sync until the next reset or restart", self.name, missing, start, stop - 1, got)
            self.handler.on_lost(lost, "gap", at)

    def catch_up(self, at: float) -> None:
        """After a reconnect, what was published while we were away. A PUB socket drops what it sends
        before the subscriber is connected again, and our reconnect backs off to seconds: a restarted vLLM
        that served requests in that time went unseen until its next batch, and for ever if none came
        (seen live on vLLM 0.32.0, scripts/e2e/kv_attribution.py: restart). Our batch at our last seq
        still in the replay buffer: the same process, deliver what follows it. Another batch there, or
        none there but some from 0: a new process, ``on_restart`` and its history from 0. Nothing at all:
        nothing was published (the live stream tells the rest)."""
        if not self.s.replay or self.last_seq is None or self._last_payload is None:
            return
        try:
            first = self._replay_first(self.last_seq)
            if first is not None and first[0] == self.last_seq and first[1] == self._last_payload:
                start = self.last_seq + 1
            elif (first is not None and first[0] == self.last_seq) or (first is None and self._replay_first(0)):
                self.stats.restarts += 1
                log.info("kv events %s: publisher restarted while we were away (replay socket, after seq %d)",
                         self.name, self.last_seq)
                self.handler.on_restart(at)
                self.last_seq = self._last_payload = None
                start = 0
            else:
                return                          # nothing published, or our batch left the buffer: the live rule
            self._replay(start, 1 << 62, remember=True)
        except Exception as e:                  # never let a replay problem end the stream
            log.warning("kv events %s: catch-up from %s failed: %s", self.name, self.s.replay, type(e).__name__)

    def _replay_first(self, start: int) -> tuple[int, bytes] | None:
        """The replay socket's first batch at or after ``start`` (None: none, or no answer in time)."""
        zmq = _zmq()
        dealer = self._socket(zmq, self._ctx or zmq.Context.instance(), zmq.DEALER, self.s.replay)
        try:
            dealer.send_multipart([b"", start.to_bytes(8, "big")])
            if not self._live.wait(zmq, dealer, self.s.replay_timeout):
                return None
            got = answer(dealer.recv_multipart(copy=False))
            return None if got is None or got[0] == END_SEQ else (got[0], frame_bytes(got[1]))
        finally:
            dealer.close(0)

    def _replay(self, start: int, stop: int, remember: bool = False) -> int:
        """Ask the replay socket for [start, stop); returns how many were delivered (in order)."""
        zmq = _zmq()
        ctx = self._ctx or zmq.Context.instance()
        assert self.s.replay is not None
        dealer = self._socket(zmq, ctx, zmq.DEALER, self.s.replay)
        got = 0
        try:
            dealer.send_multipart([b"", start.to_bytes(8, "big")])
            deadline = time.monotonic() + self.s.replay_timeout
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not self._live.wait(zmq, dealer, left):
                    log.warning("kv events %s: replay timed out after %.1fs", self.name, self.s.replay_timeout)
                    return got
                reply = answer(dealer.recv_multipart(copy=False))
                if reply is None:
                    self._malformed("replay_parts", self.clock())
                    continue
                seq, payload = reply
                if seq == END_SEQ:
                    return got
                if start <= seq < stop and (self.last_seq is None or seq > self.last_seq):
                    got += 1                        # received: an oversized one counts as oversized, not a gap
                    if self._deliver(seq, payload, self.clock()):
                        self.stats.recovered += 1
                    if remember:
                        self._replayed[seq] = hash(frame_bytes(payload))
                        if len(self._replayed) > 2 * self.s.queue_messages:   # bounded: live duplicates are few
                            self._replayed.pop(next(iter(self._replayed)))
        finally:
            dealer.close(0)
