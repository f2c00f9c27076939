"""A hostile KV-event publisher against a real `cachemon run` process (issue 26, section 1): the long and
heavy attacks; the fast ones are tests/test_kv_hostile.py. Every frame is CONSTRUCTED here (msgspec, in
vLLM 0.32.0's encoding), sent on real pyzmq sockets bound on 127.0.0.1.

- flood: 50 000 messages/s (one BlockStored of one block each) for FLOOD_S seconds. cachemon's CPU
  (from /proc), peak RSS (VmHWM), /metrics latency (a scrape every 0.2 s, max and p99) against the same
  process idle just before (baseline); what it ledgered and what it counted lost (ZMQ drops beyond
  kv_events.queue_messages: gaps), in sync after the next reset. Then a burst of BURST messages unpaced
  (as fast as this process sends) from a PUB with vLLM's high-water mark (100 000): what ZMQ drops is
  counted lost (gap), the ledger out of sync, in sync again after a reset.
- millions of distinct hashes: HASHES distinct blocks stored, never removed, at the default bounds
  (max_blocks 1 Mi): RSS after max_blocks blocks vs after all of them (bounded: no growth past the cap);
  overflow counted, out of sync, in sync after a reset. Then churn (each batch stores new blocks and
  removes the last ones): the history stays at history_blocks.
- reconnect storm: the publisher goes away and comes back (a new process: seq from 0, with a replay
  socket) STORM times. cachemon's open fds, threads and RSS before and after, restarts counted, up at
  the end, CPU; baseline: the same process before the storm.
- junk: JUNK garbage frames as fast as they come, then JUNK // 10 stale seqs of the same process (each one
  checked against the replay socket): all counted, none a restart, CPU per 1 000 frames, fds and RSS.
- oversized: BIG frames of 20 MB (over max_frame_bytes, under ZMQ's 4x limit) as fast as they go: peak RSS.
- stall: a gap the replay socket never answers stalls the stream 2 s while STALL frames of 20 MB arrive.
- a 16 MB frame of 16 million one-byte events, decoded (a child process each): peak RSS with the
  decoder's event bound (normalise/kv_limits.py) vs the same decoder with the bound off (baseline).

Run under `nice -n 19` on a shared machine: python benchmarks/bench_kv_hostile.py
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import msgspec
import requests
import zmq
from common import ROOT, result

FLOOD_RATE = 50_000
FLOOD_S = 10.0
BURST = 300_000
HASHES = 3_000_000
STORM = 100
JUNK = 100_000
BIG = 100
STALL = 60
TOPIC = b"kv-events"


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def store(seq: int, blocks: int, block_size: int = 1, removed: range | None = None) -> bytes:
    """CONSTRUCTED 0.32.0-shaped batch: BlockRemoved of ``removed`` then one BlockStored of ``blocks``
    new hashes (distinct per seq), chained from the root."""
    base = seq * blocks + 1
    evs: list[dict] = [{"type": "BlockRemoved", "block_hashes": [h], "medium": "GPU"} for h in removed or ()]
    evs.append({"type": "BlockStored", "block_hashes": list(range(base, base + blocks)), "parent_block_hash": None,
                "token_ids": [(base + i) % 50_000 for i in range(blocks * block_size)], "block_size": block_size,
                "lora_id": None, "medium": "GPU", "lora_name": None})
    return msgspec.msgpack.encode([time.time(), evs, 0])


CLEARED = msgspec.msgpack.encode([0.0, [{"type": "AllBlocksCleared"}], 0])


class Pub:
    """An XPUB (to see the subscription) and, optionally, a ROUTER answering replay requests from what
    was sent (vLLM 0.32.0's shape: [b"", topic, seq, payload] per batch, then seq -1)."""

    def __init__(self, port: int, replay_port: int | None = None):
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.set_hwm(100_000)                      # as vLLM's ZmqEventPublisher (hwm=100_000): it drops beyond
        self.pub.bind(f"tcp://127.0.0.1:{port}")
        self.kept: list[tuple[int, bytes]] = []
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        if replay_port is not None:
            self.router = self.ctx.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.LINGER, 0)
            self.router.bind(f"tcp://127.0.0.1:{replay_port}")
            self.thread = threading.Thread(target=self._answer, daemon=True)
            self.thread.start()

    def subscribed(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0 and self.pub.poll(int(left * 1000) + 1):
            if self.pub.recv()[:1] == b"\x01":
                return True
        return False

    def send(self, seq: int, payload: bytes, keep: bool = False) -> None:
        if keep:
            self.kept.append((seq, payload))
        self.pub.send_multipart([TOPIC, seq.to_bytes(8, "big"), payload])

    def _answer(self) -> None:
        while not self.stop.is_set():
            if not self.router.poll(50):
                continue
            ident, _, start = self.router.recv_multipart()
            first = int.from_bytes(start, "big")
            for seq, payload in list(self.kept):
                if seq >= first:
                    self.router.send_multipart([ident, b"", TOPIC, seq.to_bytes(8, "big"), payload])
            self.router.send_multipart([ident, b"", b"", (-1).to_bytes(8, "big", signed=True), b""])

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(5)
        self.ctx.destroy(linger=0)


class Cachemon:
    """`cachemon run` following one stream (pub_port, replay_port) of upstream vllm-0 (model m)."""

    def __init__(self, work: Path, pub_port: int, replay_port: int | None = None):
        self.port = _free_port()
        cfg = work / f"c{pub_port}.yaml"
        replay = f"      replay: tcp://127.0.0.1:{replay_port}\n" if replay_port else ""
        cfg.write_text("upstreams:\n  - name: vllm-0\n    url: http://127.0.0.1:9/metrics\n    kv_events:\n"
                       f"      endpoint: tcp://127.0.0.1:{pub_port}\n{replay}      topic: kv-events\n      model: m\n")
        self.log = open(work / f"c{pub_port}.log", "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "cachemon.cli", "run", "--config", str(cfg),
                                      "--listen", f"127.0.0.1:{self.port}"], stdout=self.log, stderr=subprocess.STDOUT,
                                     env=dict(os.environ, PYTHONPATH=str(ROOT / "src")))
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        self.until(lambda _: True, 30)

    def metrics(self) -> tuple[dict[str, float], float]:
        """{name{labels}: value} of the cachemon_kv_ lines, and the scrape's seconds."""
        t0 = time.monotonic()
        text = requests.get(self.url, timeout=10).text
        took = time.monotonic() - t0
        out = {}
        for line in text.splitlines():
            if line.startswith("cachemon_kv_") and " " in line:
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out, took

    def get(self, key: str) -> float:
        return self.metrics()[0].get(key, float("nan"))

    def until(self, pred, timeout: float) -> dict[str, float]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                m = self.metrics()[0]
                if pred(m):
                    return m
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"cachemon did not reach the state within {timeout} s")
            time.sleep(0.1)

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def status(self, key: str) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return float(line.split()[1])
        return float("nan")

    def rss_mb(self) -> float:
        return self.status("VmRSS") / 1024

    def peak_mb(self) -> float:
        return self.status("VmHWM") / 1024

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def logs(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


K_SYNC = 'cachemon_kv_ledger_in_sync{upstream="vllm-0"}'
K_STORED = 'cachemon_kv_events_total{upstream="vllm-0",type="stored"}'
K_GAP = 'cachemon_kv_lost_batches_total{upstream="vllm-0",reason="gap"}'
K_UP = 'cachemon_kv_stream_up{upstream="vllm-0"}'
K_CACHED = 'cachemon_kv_cached_blocks{upstream="vllm-0",model_name="m"}'
K_OVERFLOW = 'cachemon_kv_ledger_anomalies_total{upstream="vllm-0",kind="overflow_blocks"}'


def _scrapes(cm: Cachemon, stop: threading.Event, out: list[float]) -> None:
    while not stop.is_set():
        try:
            out.append(cm.metrics()[1])
        except requests.RequestException:
            out.append(float("inf"))                 # a failed scrape: counted as infinitely slow
        stop.wait(0.2)


def _drained(cm: Cachemon) -> None:
    """Until cachemon has taken what was queued: its stored-event count stops moving for a second."""
    last, still = -1.0, 0
    while still < 5:
        now = cm.get(K_STORED)
        still = still + 1 if now == last else 0
        last = now
        time.sleep(0.2)


def _p99(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[98] if len(xs) >= 2 else (xs[0] if xs else float("nan"))


def flood(work: Path) -> list[dict]:
    port = _free_port()
    pub = Pub(port)
    cm = Cachemon(work, port)
    try:
        assert pub.subscribed(15), "no subscription"
        pub.send(0, store(0, 1))
        cm.until(lambda m: m.get(K_STORED) == 1, 10)
        idle: list[float] = []
        stop = threading.Event()
        t = threading.Thread(target=_scrapes, args=(cm, stop, idle))
        t.start()
        cpu0 = cm.cpu_s()
        time.sleep(FLOOD_S / 2)
        stop.set()
        t.join()
        idle_cpu = (cm.cpu_s() - cpu0) / (FLOOD_S / 2)
        rss_idle = cm.rss_mb()
        payloads = [store(s, 1) for s in range(1, 1001)]     # 1 000 distinct contents, re-sent
        busy: list[float] = []
        stop = threading.Event()
        t = threading.Thread(target=_scrapes, args=(cm, stop, busy))
        t.start()
        cpu0, t0 = cm.cpu_s(), time.monotonic()
        seq = 1
        total = int(FLOOD_RATE * FLOOD_S)
        while seq <= total:
            for _ in range(500):                       # paced in steps of 10 ms
                pub.send(seq, payloads[seq % 1000])
                seq += 1
            lag = t0 + seq / FLOOD_RATE - time.monotonic()
            if lag > 0:
                time.sleep(lag)
        sent_s = time.monotonic() - t0
        _drained(cm)
        cpu = cm.cpu_s() - cpu0
        stop.set()
        t.join()
        pub.send(seq, CLEARED)                         # also shows a gap at the tail, if any
        m = cm.until(lambda m: m.get(K_SYNC) == 1, 30)
        ledgered, gap = m[K_STORED] - 1, m[K_GAP]
        # a burst as fast as this process sends, unpaced: beyond what cachemon takes, ZMQ drops (a gap)
        seq += 1
        burst0, stored0 = seq, m[K_STORED]
        t1 = time.monotonic()
        for _ in range(BURST):
            pub.send(seq, payloads[seq % 1000])
            seq += 1
        burst_s = time.monotonic() - t1
        _drained(cm)
        pub.send(seq, payloads[seq % 1000])            # the next batch: shows a gap at the burst's tail
        seq += 1
        try:
            burst_sync = cm.until(lambda m: m.get(K_GAP, 0) > gap, 30)[K_SYNC]    # a loss shows (no reset yet)
        except RuntimeError:
            burst_sync = float("nan")                  # nothing lost: cachemon kept up
        pub.send(seq, CLEARED)
        m = cm.until(lambda m: m.get(K_SYNC) == 1 and m[K_STORED] - stored0 + m[K_GAP] - gap == BURST + 1, 60)
        burst_lost, burst_resync = m[K_GAP] - gap, m[K_SYNC]
        peak = cm.peak_mb()
        assert seq == burst0 + BURST + 1
    finally:
        cm.stop()
        pub.close()
    rate = total / sent_s
    note = (f"sent {total} messages in {sent_s:.1f} s ({rate:,.0f}/s); ledgered {ledgered:,.0f}, counted lost (gap) "
            f"{gap:,.0f}, sum {ledgered + gap:,.0f}; cachemon CPU {cpu:.1f} s ({cpu / sent_s:.0%} of a core while "
            f"sending; idle {idle_cpu:.0%}); scrapes {len(busy)}, failed {sum(x == float('inf') for x in busy)}")
    burst_note = (f"{BURST:,} messages unpaced in {burst_s:.1f} s ({BURST / burst_s:,.0f}/s): lost (gap) {burst_lost:,.0f}, "
                  f"in sync after it {burst_sync:.0f}, after the next reset {burst_resync:.0f}")
    ok = ledgered + gap == total and max(busy) < 2.0 and peak <= 128
    return [
        result(f"flood {rate:,.0f} msg/s for {FLOOD_S:.0f} s: /metrics p99 (baseline: the same process idle)",
               _p99(busy), _p99(idle), "idle", "every scrape answered, max < 2 s", passed=ok,
               note=note + f"; max {max(busy) * 1000:.0f} ms"),
        result("flood: cachemon peak RSS (VmHWM; baseline: RSS idle before the flood)", peak, rss_idle, "idle",
               "<= 128 MB", unit="MB", passed=peak <= 128),
        result("burst: batches counted lost (ZMQ drops past the high-water marks) / sent; the ledger out of sync, then "
               "in sync after a reset", burst_lost / BURST, None, "", "lost > 0 counted, in sync 0 then 1",
               unit="ratio", passed=burst_lost > 0 and burst_sync == 0 and burst_resync == 1, note=burst_note),
    ]


def hashes(work: Path) -> list[dict]:
    port = _free_port()
    pub = Pub(port)
    cm = Cachemon(work, port)
    per = 5000
    cap = 1 << 20
    try:
        assert pub.subscribed(15), "no subscription"
        rss_at: dict[int, float] = {}
        seq = 0
        cpu0 = cm.cpu_s()
        for stage_end in (cap, HASHES):
            while seq * per < stage_end:
                pub.send(seq, store(seq, per))
                seq += 1
                if seq % 20 == 0:                          # do not outrun the ledger (ZMQ would drop: a gap)
                    cm.until(lambda m, s=seq: m.get(K_STORED, 0) >= s - 10, 120)
            cm.until(lambda m, s=seq: m.get(K_STORED, 0) == s, 120)
            rss_at[stage_end] = cm.rss_mb()
        m = cm.metrics()[0]
        cached, overflow, sync = m[K_CACHED], m[K_OVERFLOW], m[K_SYNC]
        cpu = cm.cpu_s() - cpu0
        # churn: every batch stores `per` new blocks and removes the previous batch's
        pub.send(seq, CLEARED)
        seq += 1
        cm.until(lambda m: m.get(K_SYNC) == 1 and m.get(K_CACHED) == 0, 30)
        prev: range | None = None
        for _ in range(400):
            blocks = range(seq * per + 1, seq * per + 1 + per)
            pub.send(seq, store(seq, per, removed=prev))
            prev = blocks
            seq += 1
            if seq % 20 == 0:
                cm.until(lambda m, s=seq: m.get(K_STORED, 0) >= s - 10 - 2, 120)
        churn = cm.until(lambda m: m.get('cachemon_kv_events_total{upstream="vllm-0",type="removed"}', 0)
                         == 399 * per, 120)
        rss_churn = cm.rss_mb()
        peak = cm.peak_mb()
    finally:
        cm.stop()
        pub.close()
    note = (f"{HASHES:,} distinct blocks in {HASHES // per} batches of {per}: cached {cached:,.0f} (max_blocks {cap:,}), "
            f"overflow counted {overflow:,.0f}, in sync {sync:.0f}; CPU {cpu:.1f} s; then 400 churn batches "
            f"({399 * per:,} removals): cached {churn[K_CACHED]:,.0f}, in sync {churn[K_SYNC]:.0f}, RSS {rss_churn:.0f} MB;"
            f" peak {peak:.0f} MB")
    grown = rss_at[HASHES] - rss_at[cap]
    ok = cached == cap and overflow == HASHES - cap and sync == 0 and churn[K_SYNC] == 1 and grown < 16
    return [result(f"{HASHES:,} distinct hashes at the default bounds: RSS after all (baseline: after the first "
                   f"{cap:,}, the cap)", rss_at[HASHES], rss_at[cap], f"after {cap:,}",
                   "no growth past max_blocks (< 16 MB)", unit="MB", passed=ok, note=note)]


def storm(work: Path) -> list[dict]:
    port, rport = _free_port(), _free_port()
    pub = Pub(port, rport)
    cm = Cachemon(work, port, rport)
    try:
        assert pub.subscribed(15)
        pub.send(0, store(0, 2, 16), keep=True)
        cm.until(lambda m: m.get(K_STORED) == 1, 10)
        before = (cm.fds(), cm.status("Threads"), cm.rss_mb())
        cpu0, t0 = cm.cpu_s(), time.monotonic()
        subscribed = 0
        for i in range(STORM):
            pub.close()
            pub = Pub(port, rport)                               # a new process on the same ports
            for s in range(3):                                   # it publishes before we are back (PUB drops them)
                pub.send(s, store(1000 * i + s, 2, 16), keep=True)
            subscribed += pub.subscribed(0.3)                    # ... or after: whichever comes first
        took = time.monotonic() - t0
        back = time.monotonic()
        m = cm.until(lambda m: m.get(K_UP) == 1, 30)
        up_after = time.monotonic() - back
        pub.send(3, store(99_999, 2, 16), keep=True)
        m = cm.until(lambda m: m.get(K_SYNC) is not None and m.get(K_STORED, 0) >= 2, 30)
        cpu = cm.cpu_s() - cpu0
        after = (cm.fds(), cm.status("Threads"), cm.rss_mb())
        restarts = cm.logs().count("publisher restarted")
    finally:
        cm.stop()
        pub.close()
    note = (f"{STORM} publisher restarts in {took:.1f} s ({subscribed} re-subscribed within 0.3 s); restarts logged "
            f"{restarts}; up again {up_after:.1f} s after the last; fds {before[0]} -> {after[0]}, threads "
            f"{before[1]:.0f} -> {after[1]:.0f}, RSS {before[2]:.0f} -> {after[2]:.0f} MB; CPU {cpu:.1f} s; "
            f"stored events {m[K_STORED]:.0f}, in sync {m[K_SYNC]:.0f}")
    ok = after[0] <= before[0] + 4 and after[1] <= before[1] and after[2] - before[2] < 16
    return [result(f"reconnect storm ({STORM} publisher restarts): open fds after (baseline: before)",
                   after[0], before[0], "before the storm", "fds, threads and RSS back where they were",
                   unit="fds", passed=ok, note=note)]


BOMB = r"""
import json, resource, sys
import msgspec
from cachemon.normalise import kv_decode
from cachemon.normalise.kv_decode import KvDecoder, KvDecodeError
if sys.argv[1] == "off":
    kv_decode.MAX_EVENTS = kv_decode.MAX_FIELDS = 1 << 62
payload = b"\x93\xcb" + b"\x00" * 8 + b"\xdd" + (16_000_000).to_bytes(4, "big") + b"\x00" * 16_000_000 + b"\x00"
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
try:
    KvDecoder().decode(payload, 0)
    reason = "ok"
except KvDecodeError as e:
    reason = e.reason
print(json.dumps({"reason": reason, "grew_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before}))
"""


def bomb() -> list[dict]:
    def child(mode: str) -> dict:
        p = subprocess.run([sys.executable, "-c", BOMB, mode], capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, PYTHONPATH=str(ROOT / "src")))
        return json.loads(p.stdout.strip().splitlines()[-1])
    ours, base = child("on"), child("off")
    return [result("a 16 MB frame of 16 million one-byte events: RSS growth while decoding", ours["grew_mb"],
                   base["grew_mb"], "the decoder without the event bound", "< 8 MB (the frame itself is held by ZMQ)",
                   unit="MB", passed=ours["grew_mb"] < 8,
                   note=f"ours: {ours['reason']}; without the bound: {base['reason']}")]


def junk(work: Path) -> list[dict]:
    """Frames cachemon must refuse, as fast as they come: JUNK garbage payloads, then JUNK // 10 stale
    seqs of the same process (each one checked against the replay socket: a round trip)."""
    port, rport = _free_port(), _free_port()
    pub = Pub(port, rport)
    cm = Cachemon(work, port, rport)
    try:
        assert pub.subscribed(15)
        for s in range(10):
            pub.send(s, store(s, 2, 16), keep=True)
        cm.until(lambda m: m.get(K_STORED) == 10, 10)
        before = (cm.fds(), cm.rss_mb())
        cpu0, t0 = cm.cpu_s(), time.monotonic()
        seq = 10
        for _ in range(JUNK):
            pub.send(seq, b"\x93\xcb" + b"\x00" * 8 + b"\xdd\xff\xff\xff\xff")
            seq += 1
        key = 'cachemon_kv_lost_batches_total{upstream="vllm-0",reason="decode_error"}'
        cm.until(lambda m: m.get(key) == JUNK, 120)
        garbage_s, garbage_cpu = time.monotonic() - t0, cm.cpu_s() - cpu0
        pub.send(seq, store(seq, 2, 16), keep=True)          # our last batch, still in the replay buffer
        cpu1, t1 = cm.cpu_s(), time.monotonic()
        stale = JUNK // 10
        for _ in range(stale):
            pub.send(5, store(5, 2, 16))                     # an old seq, not buffered again
        dup = 'cachemon_kv_lost_batches_total{upstream="vllm-0",reason="duplicate"}'
        m = cm.until(lambda m: m.get(dup) == stale, 300)
        stale_s, stale_cpu = time.monotonic() - t1, cm.cpu_s() - cpu1
        sync_after, restarts = m[K_SYNC], cm.logs().count("publisher restarted")
        pub.send(seq + 1, CLEARED, keep=True)
        resync = cm.until(lambda m: m.get(K_SYNC) == 1, 30)[K_SYNC]
        after = (cm.fds(), cm.rss_mb())
    finally:
        cm.stop()
        pub.close()
    note = (f"{JUNK:,} garbage frames taken in {garbage_s:.1f} s, cachemon CPU {garbage_cpu:.1f} s; {stale:,} stale seqs "
            f"in {stale_s:.1f} s ({stale / stale_s:,.0f}/s, a replay round trip each), CPU {stale_cpu:.1f} s, "
            f"restarts {restarts}, in sync {sync_after:.0f} then {resync:.0f} after a reset; fds {before[0]} -> "
            f"{after[0]}, RSS {before[1]:.0f} -> {after[1]:.0f} MB")
    ok = restarts == 0 and sync_after == 0 and resync == 1 and after[0] <= before[0] + 4 and after[1] - before[1] < 16
    return [result(f"junk: {JUNK:,} garbage frames, then {stale:,} stale seqs of the same process: cachemon CPU s per "
                   "1 000 frames (garbage; baseline: stale)", garbage_cpu / JUNK * 1000, stale_cpu / stale * 1000,
                   "a stale seq (checked against the replay socket)", "all counted, none a restart, fds and RSS flat",
                   passed=ok, note=note)]


def _following(work: Path, replay_port: int | None = None) -> tuple[Pub, Cachemon, float]:
    """A publisher, a cachemon following it that has taken one batch (seq 0), and its RSS then."""
    port = _free_port()
    pub = Pub(port)
    cm = Cachemon(work, port, replay_port)
    assert pub.subscribed(15), "no subscription"
    pub.send(0, store(0, 1))
    cm.until(lambda m: m.get(K_STORED) == 1, 10)
    return pub, cm, cm.rss_mb()


def _big_frames(pub: Pub, first: int, n: int) -> None:
    """n frames of 20 MB (one buffer, not copied), seqs from first, as fast as ZMQ takes them."""
    big = b"\x00" * (20 * 1000 * 1000)
    for s in range(first, first + n):
        pub.pub.send_multipart([TOPIC, s.to_bytes(8, "big"), big], copy=False)


def oversized(work: Path) -> list[dict]:
    """BIG frames of 20 MB (over the default max_frame_bytes of 16 MiB, under ZMQ's 4x limit) as fast as
    they go: each counted oversized, never copied into Python; cachemon's peak RSS."""
    pub, cm, idle = _following(work)
    try:
        cpu0, t0 = cm.cpu_s(), time.monotonic()
        _big_frames(pub, 1, BIG)
        key = 'cachemon_kv_lost_batches_total{upstream="vllm-0",reason="oversized"}'
        m = cm.until(lambda m: m.get(key) == BIG, 120)
        took, cpu, peak = time.monotonic() - t0, cm.cpu_s() - cpu0, cm.peak_mb()
        sync = m[K_SYNC]
        pub.send(BIG + 1, CLEARED)
        resync = cm.until(lambda m: m.get(K_SYNC) == 1, 30)[K_SYNC]
    finally:
        cm.stop()
        pub.close()
    note = (f"{BIG} frames of 20 MB ({BIG * 20 / 1000:.0f} GB) in {took:.1f} s, all counted oversized; cachemon CPU "
            f"{cpu:.1f} s; in sync {sync:.0f}, then {resync:.0f} after a reset")
    return [result(f"{BIG} oversized frames of 20 MB: cachemon peak RSS (baseline: RSS before them)", peak, idle,
                   "before", "<= 128 MB", unit="MB", passed=peak <= 128 and sync == 0 and resync == 1, note=note)]


def stall(work: Path) -> list[dict]:
    """A gap the replay socket never answers stalls the stream for replay_timeout (2 s); meanwhile STALL
    frames of 20 MB arrive (each under max_frame_bytes: they would decode). ZMQ counts its queue in
    messages: cachemon's RSS during the stall (sampled every 50 ms) against its RSS before."""
    rport = _free_port()
    ctx = zmq.Context()
    silent = ctx.socket(zmq.ROUTER)                     # a replay socket that never answers
    silent.setsockopt(zmq.LINGER, 0)
    silent.bind(f"tcp://127.0.0.1:{rport}")
    pub, cm, idle = _following(work, rport)
    try:
        pub.send(5, store(5, 1))                         # seqs 1-4 missed: the stream asks, and waits 2 s
        t0 = time.monotonic()
        _big_frames(pub, 6, STALL)
        peak = 0.0
        while time.monotonic() - t0 < 6:
            peak = max(peak, cm.rss_mb())
            time.sleep(0.05)
    finally:
        cm.stop()
        pub.close()
        ctx.destroy(linger=0)
    return [result(f"a stream stalled 2 s (silent replay socket) while {STALL} frames of 20 MB arrive: cachemon peak "
                   "RSS (baseline: before)", peak, idle, "before", "<= 128 MB + 8 queued frames (ZMQ's queue held "
                   "to 512 MiB of its largest frames)", unit="MB", passed=peak - idle <= 8 * 20 + 40,
                   note="without the byte bound (RCVHWM = queue_messages, 10 000) the same run measured 1 184 MB")]


def run() -> list[dict]:
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        return bomb() + flood(work) + hashes(work) + storm(work) + junk(work) + oversized(work) + stall(work)


if __name__ == "__main__":
    for row in run():
        print(json.dumps(row))
