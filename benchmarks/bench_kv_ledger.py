"""KV-event ledger benchmarks (issue 16, item 10).

- ledger ingest, block events/s on one core, from pre-decoded batches shaped like vLLM's: a pool
  of 20 000 blocks under LRU eviction, prompts of 64-block documents (a Zipf-like popularity)
  storing 4-32 new blocks per BlockStored, each store preceded in its batch by the BlockRemoved
  events that made room (one hash each, as vLLM 0.32.0 sends them); block_size 16 and 128; token
  ids msgpack-encoded as the decoder hands them over. Informational (the ledger now reads the token
  ids). Baseline: a naive ledger (a dict of per-block objects, the same classification rules, given
  the token ids as ints) measured in the same run.
- decode + ledger: the same batches encoded as vLLM 0.32.0 publishes them, through
  normalise/kv_decode.py and the ledger. Target >= 500 000 block events/s (issue 16), block_size 16
  and 128. Baseline in the same run: the int path (token ids made Python ints, keyed from the ints).
- bytes per tracked block (tracemalloc over 200 000 cached blocks; and per departed content in
  the history). Target <= 300 bytes.
- a fleet ledger of 64 replicas x 50 000 cached blocks of one model (the routing index built), with
  every history at its default cap: RSS delta. Target <= 1 GB.
"""
from __future__ import annotations

import gc
import random
import statistics
import time
import tracemalloc
from collections import OrderedDict
from dataclasses import dataclass, replace

from common import median_seconds, result

from cachemon.normalise.kv_batch import Cleared, KvBatch, Removed, Stored
from cachemon.normalise.kv_tokens import EncodedTokens
from cachemon.state.ledger.fleet import DEFAULT_HISTORY_BLOCKS, FleetLedger

M64 = (1 << 64) - 1


def workload(bs: int, n_batches: int, docs: int = 4_000, seed: int = 7) -> tuple[list[KvBatch], int]:
    """Pre-decoded batches of a simulated vLLM pool of 320 000 tokens (20 000 blocks of 16, 2 500 of
    128), and their count of block events (stored blocks + removed hashes)."""
    pool = 320_000 // bs
    rng = random.Random(seed)
    doc_blocks = 64
    blocks: dict[tuple[int, int], tuple[int, ...]] = {}
    hashes: dict[tuple[int, int], int] = {}

    def block(d: int, i: int) -> tuple[int, int]:
        key = (d, i)
        if key not in blocks:
            # documents share a few system prompts in their first blocks, like real traffic
            src = (d % 8, i) if i < 4 else key
            r = random.Random(hash(src))
            blocks[key] = tuple(r.randrange(150_000) for _ in range(bs))
            parent = hashes[(d, i - 1)] if i else 0
            hashes[key] = hash((parent, blocks[key], src)) & M64
        return hashes[key], key

    lru: OrderedDict[int, None] = OrderedDict()
    out: list[KvBatch] = []
    events = 0
    seq = 0
    t = 1_000_000.0
    while len(out) < n_batches:
        d = min(int(rng.paretovariate(1.1)) - 1, docs - 1) if rng.random() < 0.7 else rng.randrange(docs)
        i = 0
        while i < doc_blocks and block(d, i)[0] in lru:
            lru.move_to_end(block(d, i)[0])
            i += 1
        if i >= doc_blocks - 4:
            continue
        n = rng.randint(4, min(32, doc_blocks - i))
        new = [block(d, j) for j in range(i, i + n)]
        evs: list = []
        while len(lru) + n > pool:
            h, _ = lru.popitem(last=False)
            evs.append(Removed((h,), "GPU"))
        toks = tuple(tok for _, key in new for tok in blocks[key])
        parent = block(d, i - 1)[0] if i else None
        evs.append(Stored(tuple(h for h, _ in new), parent, toks, bs, None, "GPU", None, 0))
        for h, _ in new:
            lru[h] = None
        events += len(evs) - 1 + n
        t += 0.005
        out.append(KvBatch(seq, t, evs))
        seq += 1
    return out, events


@dataclass
class _Block:
    vhash: int
    cid: int
    refs: int
    stored_at: float
    depth: int


class NaiveLedger:
    """The baseline: the same classification (restart/reset/capacity/routing/first, reference counts,
    lifetimes), written the obvious way: a dict of per-block objects, per-block tuples of tokens."""

    def __init__(self) -> None:
        self.cached: dict[int, _Block] = {}
        self.history: dict[int, tuple[str, float]] = {}
        self.tokens: dict[str, int] = {}
        self.lifetimes: list[float] = []

    def on_batch(self, batch: KvBatch) -> None:
        for ev in batch.events:
            if isinstance(ev, Stored):
                parent = self.cached.get(ev.parent) if ev.parent is not None else None
                pc = parent.cid if parent else 0
                depth = parent.depth + 1 if parent else 0
                for k, h in enumerate(ev.hashes):
                    toks = list(ev.tokens[k * ev.block_size:(k + 1) * ev.block_size])
                    cid = hash((pc, tuple(toks))) & M64
                    if h in self.cached:
                        self.cached[h].refs += 1
                        why = "recompute_last_block"
                    else:
                        why = self.history.pop(cid, ("first", 0.0))[0]
                        self.cached[h] = _Block(h, cid, 1, batch.ts, depth + k)
                    self.tokens[why] = self.tokens.get(why, 0) + ev.block_size
                    pc = cid
            elif isinstance(ev, Removed):
                for h in ev.hashes:
                    b = self.cached.get(h)
                    if b is None:
                        continue
                    b.refs -= 1
                    if b.refs == 0:
                        del self.cached[h]
                        self.lifetimes.append(batch.ts - b.stored_at)
                        self.history[b.cid] = ("capacity", batch.ts)
            elif isinstance(ev, Cleared):
                for b in self.cached.values():
                    self.history[b.cid] = ("reset", batch.ts)
                self.cached.clear()


def median_cpu(fn, repeat: int = 5) -> float:
    """Median CPU time of fn (time.process_time): one core's work, whatever else shares the machine."""
    fn()
    times = []
    gc.disable()
    try:
        for _ in range(repeat):
            t0 = time.process_time()
            fn()
            times.append(time.process_time() - t0)
    finally:
        gc.enable()
    return statistics.median(times)


def _encoded(batches: list[KvBatch]) -> list[KvBatch]:
    """The same batches with token ids as the decoder hands them over: msgpack-encoded (EncodedTokens)."""
    import msgspec

    enc = msgspec.msgpack.encode
    return [KvBatch(b.seq, b.ts, [replace(e, tokens=EncodedTokens.of(enc(e.tokens))) if type(e) is Stored else e
                                  for e in b.events]) for b in batches]


def bench_ingest(bs: int, n_batches: int):
    batches, events = workload(bs, n_batches)
    removes = sum(1 for b in batches for e in b.events if type(e) is Removed)
    encoded = _encoded(batches)

    def ours():
        f = FleetLedger()
        for b in encoded:
            f.on_batch("vllm", "m", b, b.ts)

    def naive():
        led = NaiveLedger()
        for b in batches:
            led.on_batch(b)

    t_ours = median_cpu(ours)
    t_base = median_cpu(naive)
    wall = median_seconds(ours, repeat=3)
    rate = events / t_ours
    f = FleetLedger()
    for b in encoded:
        f.on_batch("vllm", "m", b, b.ts)
    v = f.view("vllm")
    split = ", ".join(f"{k} {x / bs:.0f}" for k, x in v.stored_tokens.items() if x) if v else ""
    return result(f"KV ledger ingest (CPU time), block_size {bs}: {events} block events ({removes} removes) in "
                  f"{len(batches)} batches, token ids encoded as the decoder gives them: {rate / 1e3:.0f}k events/s "
                  f"(wall on this machine: {events / wall / 1e3:.0f}k/s); blocks by reason: {split}",
                  t_ours / events, t_base / events, "naive dict-of-objects ledger, same rules, token ids given as "
                  "ints for free", "- (the ledger now reads the token ids the decoder no longer does: the issue's "
                  ">= 500k is judged on decode plus ledger, below)", unit="s/event", passed=None)


def _encode_0_32(batches: list[KvBatch]) -> list[bytes]:
    """The batches as vLLM 0.32.0 publishes them: msgpack [ts, [event maps], dp_rank]."""
    import msgspec

    enc = msgspec.msgpack.Encoder()
    out = []
    for b in batches:
        evs = []
        for e in b.events:
            if type(e) is Stored:
                evs.append({"type": "BlockStored", "block_hashes": list(e.hashes), "parent_block_hash": e.parent,
                            "token_ids": list(e.tokens), "block_size": e.block_size, "lora_id": None, "medium": "GPU",
                            "lora_name": None, "extra_keys": [None] * len(e.hashes), "group_idx": 0,
                            "kv_cache_spec_kind": "full_attention"})
            elif type(e) is Removed:
                evs.append({"type": "BlockRemoved", "block_hashes": list(e.hashes), "medium": "GPU", "group_idx": 0})
        out.append(enc.encode([b.ts, evs, 0]))
    return out


def _as_ints(b: KvBatch) -> KvBatch:
    """The int path: every Stored's token ids made Python ints, as the decoder did before they stayed encoded."""
    return KvBatch(b.seq, b.ts, [replace(e, tokens=e.tokens.ids()) if type(e) is Stored else e for e in b.events],
                   b.dp_rank, b.unknown, b.release)


def bench_decode_and_ingest(bs: int, n_batches: int):
    """The issue's figure: cachemon's decoder (normalise/kv_decode.py, as the source runs it) + the ledger.
    Baseline in the same run: the int path (token ids decoded to Python ints, keyed from the ints)."""
    from cachemon.normalise.kv_decode import KvDecoder

    batches, events = workload(bs, n_batches)
    payloads = _encode_0_32(batches)

    def both():
        f = FleetLedger()
        dec = KvDecoder()
        for seq, p in enumerate(payloads):
            b = dec.decode(p, seq)
            f.on_batch("vllm", "m", b, b.ts)
        return f

    def int_path():
        f = FleetLedger()
        dec = KvDecoder()
        for seq, p in enumerate(payloads):
            b = _as_ints(dec.decode(p, seq))
            f.on_batch("vllm", "m", b, b.ts)
        return f

    def decode_only():
        dec = KvDecoder()
        for seq, p in enumerate(payloads):
            dec.decode(p, seq)

    a, b = both().view("vllm"), int_path().view("vllm")
    assert a is not None and b is not None and a.stored_tokens == b.stored_tokens     # same split both ways
    t = median_cpu(both, repeat=3)
    t_base = median_cpu(int_path, repeat=3)
    t_dec = median_cpu(decode_only, repeat=3)
    rate = events / t
    return result(f"KV decode (normalise/kv_decode, token ids kept encoded) + ledger (CPU time), block_size {bs}: "
                  f"{rate / 1e3:.0f}k events/s (int path {events / t_base / 1e3:.0f}k/s); decode alone "
                  f"{events / t_dec / 1e3:.0f}k events/s",
                  t / events, t_base / events, "the int path: same decoder, token ids made Python ints, keyed from "
                  "the ints", ">= 500k events/s (issue: decode plus ledger)", unit="s/event",
                  passed=rate >= 500_000)


def _fill(f: FleetLedger, replica: str, n_blocks: int, start: int, bs: int = 16, per_event: int = 16) -> None:
    t = 1_000_000.0
    for e in range(n_blocks // per_event):
        base = start + e * per_event
        hs = tuple(range(base, base + per_event))
        toks = tuple(range(base * bs, (base + per_event) * bs))
        t += 0.001
        f.on_batch(replica, "m", KvBatch(e, t, [Stored(hs, None, toks, bs)]), t)


def bench_bytes_per_block():
    n = 200_000
    gc.collect()
    tracemalloc.start()
    f = FleetLedger()
    f.on_batch("vllm", "m", KvBatch(0, 1.0, []), 1.0)
    before = tracemalloc.get_traced_memory()[0]
    _fill(f, "vllm", n, 1 << 40)
    cached = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del f
    # departed contents: store 64 blocks and evict them, over and over (the cached dict stays small)
    gc.collect()
    tracemalloc.start()
    h = FleetLedger(history_blocks=2 * n)
    h.on_batch("vllm", "m", KvBatch(0, 1.0, []), 1.0)
    led = h.replica("vllm")
    assert led is not None
    h0 = tracemalloc.get_traced_memory()[0]
    for e in range(n // 64):
        base = (1 << 41) + e * 64
        hs = tuple(range(base, base + 64))
        h.on_batch("vllm", "m", KvBatch(1 + e, 2.0, [Stored(hs, None, tuple(range(base * 16, (base + 64) * 16)), 16),
                                                      *(Removed((x,)) for x in hs)]), 2.0)
    departed = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    kept = led.history_size()
    per_hist = (departed - h0) / kept
    per_cached = (cached - before) / n
    baseline = _naive_bytes(n)
    return [
        result(f"KV ledger bytes per cached block (tracemalloc, {n} blocks)", per_cached, baseline,
               "naive dict-of-objects ledger, same blocks", "<= 300 bytes", unit="bytes", passed=per_cached <= 300),
        result(f"KV ledger bytes per departed content in the history ({kept} kept of {n})", per_hist, None, "",
               "<= 300 bytes", unit="bytes", passed=per_hist <= 300),
    ]


def _naive_bytes(n: int) -> float:
    gc.collect()
    tracemalloc.start()
    led = NaiveLedger()
    before = tracemalloc.get_traced_memory()[0]
    for e in range(n // 16):
        base = (1 << 40) + e * 16
        led.on_batch(KvBatch(e, 1.0, [Stored(tuple(range(base, base + 16)), None, tuple(range(base * 16, (base + 16) * 16)),
                                             16)]))
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del led
    return (after - before) / n


def _rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return 0.0


def bench_fleet():
    """Worst case: every replica caches distinct content (the routing index holds every block)."""
    gc.collect()
    before = _rss_mb()
    t0 = time.perf_counter()
    f = FleetLedger()
    per, reps = 50_000, 64
    hist = DEFAULT_HISTORY_BLOCKS
    for r in range(reps):
        name = f"replica{r}"
        # the worst case: history full (cap - 1 departures, see _rotate), then `per` cached
        _fill(f, name, hist - 16, (r + 1) << 36)
        led = f.replica(name)
        assert led is not None
        gone = list(led._cached)
        for k in range(0, len(gone), 256):
            f.on_batch(name, "m", KvBatch(10_000 + k, 2.0, [Removed((h,)) for h in gone[k:k + 256]]), 2.0)
        _fill(f, name, per, ((r + 1) << 36) + (1 << 30))
    gc.collect()
    mb = _rss_mb() - before
    took = time.perf_counter() - t0
    cached = sum(s.cached_blocks for s in f.snapshot())
    hist_kept = sum(led.history_size() for led in (f.replica(f"replica{r}") for r in range(reps)) if led)
    return result(f"KV fleet ledger: {reps} replicas x {per} cached blocks ({cached} cached, {hist_kept} in histories, "
                  f"routing index of one model; built in {took:.0f} s), RSS delta", mb, None, "", "<= 1024 MB",
                  unit="MB", passed=mb <= 1024)


def run():
    rows = [bench_ingest(16, 6000), bench_ingest(128, 2500),
            bench_decode_and_ingest(16, 6000), bench_decode_and_ingest(128, 2500)]
    rows += bench_bytes_per_block()
    rows.append(bench_fleet())
    return rows


if __name__ == "__main__":
    for row in run():
        print(row)
