"""The demo's KV-cache events: real vLLM 0.32.0 event batches, published over ZMQ like vLLM does.

Each traffic phase names the KV-event capture of its kind of traffic (data/captures/
vllm-0.32.0-cpu-kv-events/: ``dynamic_prefix_tail``, a static system prompt; ``dynamic_prefix_head``,
a request ID and timestamp at the head). Its batches are sent at their recorded offsets, the capture
played again and again while the phase lasts, on one PUB socket with one growing sequence number
(one vLLM process: no restart, no gap).

Played again, the same blocks would look to cachemon's ledger like blocks vLLM already cached; a
real server sees new timestamps instead. So every replay after the first carries new content: the
block hashes are xor-ed with a per-replay salt and the first token of each chain's first block is
shifted, which is what a different timestamp at the head does. A capture whose misses are only its
first request's (the static prompt: ``repeat`` false) is sent once per phase, as a server that
keeps the prompt cached would.
"""
from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources

from cachemon.demo.traffic import Traffic

MASK64 = (1 << 64) - 1
SALT = 0x9E3779B97F4A7C15
REPEATS = {"dynamic_prefix_head": True, "dynamic_prefix_tail": False}


@dataclass(frozen=True)
class Capture:
    name: str
    requests: int
    seconds: float                          # one play of the capture, first request to the next cycle's
    batches: tuple[tuple[float, bytes, bytes], ...]   # (offset from the first request, topic, payload)
    repeat: bool

    @property
    def rate(self) -> float:
        return self.requests / self.seconds


def bundled_capture(name: str) -> Capture:
    base = resources.files("cachemon") / "data" / "captures" / "vllm-0.32.0-cpu-kv-events" / name
    cycle = json.loads((base / "cycle.json").read_text(encoding="utf-8"))
    batches = []
    for line in (base / "events.jsonl").read_text(encoding="utf-8").splitlines():
        if line.strip():
            d = json.loads(line)
            batches.append((max(0.0, d["t"] - cycle["t0"]), d["topic"].encode(), base64.b64decode(d["payload_b64"])))
    return Capture(name, cycle["requests"], cycle["seconds"], tuple(batches), REPEATS.get(name, True))


def _salted(h: object, salt: int) -> object:
    return (h ^ salt) & MASK64 if isinstance(h, int) else h


def renew(payload: bytes, replay: int, now: float) -> bytes:
    """The batch as a later request would have made it: new hashes, a shifted head token (see above)."""
    import msgspec
    ts, events, *rest = msgspec.msgpack.decode(payload)
    if replay:
        salt = (SALT * replay) & MASK64
        for ev in events:
            if not isinstance(ev, dict):
                continue
            if "block_hashes" in ev:
                ev["block_hashes"] = [_salted(h, salt) for h in ev["block_hashes"]]
            if "parent_block_hash" in ev:
                ev["parent_block_hash"] = _salted(ev["parent_block_hash"], salt)
                if ev["parent_block_hash"] is None and ev.get("token_ids"):
                    ev["token_ids"][0] = int(ev["token_ids"][0]) + replay
    return msgspec.msgpack.encode([now, events, *rest])


class KvReplay:
    """Publishes the phases' captures on ``endpoint`` (a thread) until ``stop()``."""

    def __init__(self, traffic: Traffic, endpoint: str = "tcp://127.0.0.1:0",
                 captures: dict[str, Capture] | None = None, clock: Callable[[], float] = time.monotonic):
        import zmq
        self.traffic, self.clock = traffic, clock
        names = {p.kv for p in (traffic.idle, *traffic.round) if p.kv}
        self.captures = captures or {n: bundled_capture(n) for n in names}
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.PUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 0)
        if endpoint.endswith(":0"):
            port = self.sock.bind_to_random_port(endpoint.rsplit(":", 1)[0])
            endpoint = f"{endpoint.rsplit(':', 1)[0]}:{port}"
        else:
            self.sock.bind(endpoint)
        self.endpoint = endpoint
        self.seq = 0
        self.sent = 0
        self.replays = 0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="demo-kv-events", daemon=True)

    def start(self) -> KvReplay:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self.thread.is_alive():
            self.thread.join(timeout=5)
        self.sock.close()
        self.ctx.term()

    def _run(self) -> None:
        current: tuple[int, int] | None = None      # (phase number, cycle of the capture in it)
        pending: list[tuple[float, bytes, bytes]] = []
        while not self._stop.is_set():
            number, _, phase, into, _ = self.traffic.position(self.clock())
            cap = self.captures.get(phase.kv or "")
            if cap is not None:
                cycle = int(into // cap.seconds)
                if (number, cycle) != current:
                    current = (number, cycle)
                    pending = list(cap.batches) if cap.repeat or cycle == 0 else []
                    replay, self.replays = self.replays, self.replays + 1
                offset = into - cycle * cap.seconds
                while pending and pending[0][0] <= offset:
                    _, topic, payload = pending.pop(0)
                    self.sock.send_multipart([topic, self.seq.to_bytes(8, "big"),
                                              renew(payload, replay, time.time())])
                    self.seq += 1
                    self.sent += 1
            self._stop.wait(0.05)
