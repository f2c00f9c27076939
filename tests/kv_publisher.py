"""Re-publish recorded vLLM KV-cache events over real ZMQ sockets (for tests; no vllm import).

The recordings are ``tests/fixtures/vllm-0.32.0-cpu-kv-events/*/events.jsonl`` (one line per
ZMQ message vLLM sent: ``{"t", "replica", "topic", "seq", "payload_b64"}``). ``Republisher``
sends them again the way vLLM 0.32.0's ``ZmqEventPublisher`` does
(vllm/distributed/kv_events.py, v0.32.0):

* a PUB socket sends ``[topic, seq (8 bytes big-endian), payload]`` per batch;
* a ROUTER replay socket answers a DEALER's ``[b"", start_seq (8 bytes big-endian)]`` with
  ``[b"", topic, seq, payload]`` for every buffered batch whose seq >= start_seq, then the end
  marker ``[b"", b"", (-1 as 8 signed bytes), b""]``. Like vLLM, the buffer holds the last
  ``buffer_steps`` batches of the current process only: a seq that goes back (a restart) empties it.

``drop`` seqs are not sent on the PUB socket but stay in the replay buffer (a gap the replay
socket can recover); ``lost`` seqs are neither sent nor buffered (an unrecoverable gap). The PUB
side is an XPUB socket so ``wait_subscribed`` can wait for a subscriber instead of sleeping
(ZMQ drops what a PUB sends before the subscription arrives).
"""
from __future__ import annotations

import base64
import gzip
import json
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import zmq

END_SEQ = (-1).to_bytes(8, "big", signed=True)


@dataclass(frozen=True)
class Message:
    t: float            # receive time at recording (unix seconds)
    replica: str
    topic: bytes
    seq: int
    payload: bytes


def load_events(path: str | Path, replica: str | None = None) -> list[Message]:
    """Messages of a recorded events.jsonl (or .jsonl.gz), optionally of one replica only."""
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    out = []
    with opener(p, "rt", encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            d = json.loads(line)
            if replica is not None and d["replica"] != replica:
                continue
            out.append(Message(d["t"], d["replica"], d["topic"].encode(), int(d["seq"]),
                               base64.b64decode(d["payload_b64"])))
    return out


class Republisher:
    """PUB (+ replay ROUTER) bound on 127.0.0.1; ``publish`` sends from the calling thread."""

    def __init__(self, messages: Iterable[Message], pub: str = "tcp://127.0.0.1:*",
                 replay: str | None = "tcp://127.0.0.1:*", buffer_steps: int = 10_000,
                 drop: Iterable[int] = (), lost: Iterable[int] = ()):
        self.messages = list(messages)
        self.drop, self.lost = set(drop), set(lost)
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.SNDHWM, 0)
        self.pub.bind(pub)
        self.pub_endpoint = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.replay_endpoint: str | None = None
        self._buf: deque[tuple[int, bytes, bytes]] = deque(maxlen=buffer_steps)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.replay_requests = 0
        self.sent: list[int] = []
        if replay is not None:
            self._router = self.ctx.socket(zmq.ROUTER)
            self._router.setsockopt(zmq.LINGER, 0)
            self._router.bind(replay)
            self.replay_endpoint = self._router.getsockopt_string(zmq.LAST_ENDPOINT)
            self._thread = threading.Thread(target=self._serve_replay, name="kv-replay", daemon=True)
            self._thread.start()

    def wait_subscribed(self, timeout: float = 5.0) -> bool:
        """True once a subscriber's subscription reached the XPUB socket."""
        if self.pub.poll(int(timeout * 1000)):
            self.pub.recv()
            return True
        return False

    def publish(self, speed: float | None = None, start: int = 0, stop: int | None = None) -> int:
        """Send messages[start:stop]; ``speed`` None sends at once, else at the recorded pace
        divided by speed. Returns how many were sent on the PUB socket."""
        msgs = self.messages[start:stop]
        n = 0
        t0_rec, t0 = (msgs[0].t if msgs else 0.0), time.monotonic()
        last_seq = None
        for m in msgs:
            if speed:
                delay = (m.t - t0_rec) / speed - (time.monotonic() - t0)
                if delay > 0:
                    time.sleep(delay)
            with self._lock:
                if last_seq is not None and m.seq <= last_seq:
                    self._buf.clear()          # a new publisher process: its buffer starts empty
                last_seq = m.seq
                if m.seq not in self.lost:
                    self._buf.append((m.seq, m.topic, m.payload))
            if m.seq in self.drop or m.seq in self.lost:
                continue
            self.pub.send_multipart([m.topic, m.seq.to_bytes(8, "big"), m.payload])
            self.sent.append(m.seq)
            n += 1
        return n

    def _serve_replay(self) -> None:
        while not self._stop.is_set():
            try:
                if not self._router.poll(100):
                    continue
                frame = self._router.recv_multipart()
            except zmq.ZMQError:
                return
            if len(frame) != 3:         # vLLM logs and ignores a malformed request
                continue
            client, _, start = frame
            start_seq = int.from_bytes(start, "big")
            self.replay_requests += 1
            with self._lock:
                items = [x for x in self._buf if x[0] >= start_seq]
            for seq, topic, payload in items:
                self._router.send_multipart([client, b"", topic, seq.to_bytes(8, "big"), payload])
            self._router.send_multipart([client, b"", b"", END_SEQ, b""])

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
            self._router.close(0)
        self.pub.close(0)
        self.ctx.term()

    def __enter__(self) -> Republisher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
