"""Per-tenant accounting's cost in the KV-event ledger (issue 25, "Speed and memory").

The same ledger without per-tenant accounting, with it (``FleetLedger(tenants=..., isolation=False)``:
tenant codes in the records of salted / adapter chains, the per-tenant split and hits), and with it plus
the isolation index (the default: a token-content id per salted block and one index entry per cached
block of the model), measured in the same run on the same batches. Target (issue 25): per-tenant
accounting adds at most 20 % CPU time per block event and 40 bytes per cached block, with the isolation
index (the default) and without it.

- per event: bench_kv_ledger.py's workload (a 20 000-block pool of 16-token blocks under LRU eviction,
  4-32 new blocks per store, each store's evictions before it), token ids encoded as the decoder hands
  them over, every chain head carrying a cache_salt in its extra keys as vLLM 0.32.0 sends it (10
  tenants by chain, 3 of them without a salt). CPU time (time.process_time), median of 5, the two
  ledgers interleaved.
- bytes per cached block: tracemalloc over 200 000 cached blocks in stores of 16 blocks whose heads
  carry one of 10 salts (3 without), with and without accounting.
"""
from __future__ import annotations

import gc
import tracemalloc
from dataclasses import replace

from bench_kv_ledger import _encoded, median_cpu, workload
from common import result

from cachemon.normalise.kv_events import KvBatch, Stored
from cachemon.state.kv_ledger import FleetLedger
from cachemon.state.kv_tenants import TenantLabels

TENANTS = 10
LABELS = TenantLabels({}, b"benchmark-tenant-key", 20)


def _salt(h: int) -> str | None:
    t = h % TENANTS
    return None if t < 3 else f"tenant-salt-{t}"


def _one_salt(_e: int) -> str:
    return "tenant-salt-1"


def _salted(batches: list[KvBatch]) -> list[KvBatch]:
    out = []
    for b in batches:
        evs = []
        for e in b.events:
            if type(e) is Stored and e.parent is None:
                s = _salt(e.hashes[0])
                e = replace(e, extra=((s,) if s else None,) + (None,) * (len(e.hashes) - 1))
            evs.append(e)
        out.append(KvBatch(b.seq, b.ts, evs))
    return out


def bench_cost() -> list[dict]:
    batches, events = workload(16, 6000)
    enc = _encoded(_salted(batches))

    def feed(**kw):
        def go():
            f = FleetLedger(**kw)
            for b in enc:
                f.on_batch("vllm", "m", b, b.ts)
        return go

    runs = {"plain": feed(), "tenants": feed(tenants=LABELS, isolation=False), "isolation": feed(tenants=LABELS)}
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(3):                      # interleaved: the machine's load hits all three alike
        for k, fn in runs.items():
            times[k].append(median_cpu(fn, repeat=3))
    t = {k: sorted(v)[1] / events for k, v in times.items()}
    f = FleetLedger(tenants=LABELS)
    for x in enc:
        f.on_batch("vllm", "m", x, x.ts)
    series = len(f.snapshot()[0].tenants)
    rows = []
    for k, what, target, limit in (
            ("tenants", "per-tenant accounting (split and hits per tenant and adapter)", "<= +20 % per event", 0.20),
            ("isolation", "per-tenant accounting and the isolation index (the default)", "<= +20 % per event", 0.20)):
        over = t[k] / t["plain"] - 1.0
        rows.append(result(f"KV ledger with {what}, block_size 16: {events} block events, {series} (tenant, adapter) "
                           f"series; CPU time per event {t[k] * 1e9:.0f} ns against {t['plain'] * 1e9:.0f} ns "
                           f"without: +{over * 100:.1f} %",
                           t[k], t["plain"], "the same ledger without per-tenant accounting, same batches, same run",
                           target, unit="s/event", passed=None if limit is None else over <= limit))
    return rows


def _bytes(n: int, salt=_salt, **kw) -> float:
    gc.collect()
    tracemalloc.start()
    f = FleetLedger(**kw)
    f.on_batch("vllm", "m", KvBatch(0, 1.0, []), 1.0)
    before = tracemalloc.get_traced_memory()[0]
    t, per = 1_000_000.0, 16
    for e in range(n // per):
        base = (1 << 40) + e * per
        hs = tuple(range(base, base + per))
        s = salt(e)
        extra = ((s,) if s else None,) + (None,) * (per - 1)
        t += 0.001
        f.on_batch("vllm", "m", KvBatch(e, t, [Stored(hs, None, tuple(range(base * 16, (base + per) * 16)), 16,
                                                      None, "GPU", extra)]), t)
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return used / n


def bench_bytes() -> list[dict]:
    n = 200_000
    plain = _bytes(n)
    ten = _bytes(n, tenants=LABELS, isolation=False)
    iso = _bytes(n, tenants=LABELS)
    one = _bytes(n, _one_salt, tenants=LABELS)       # one key: the index never starts
    return [
        result(f"KV ledger bytes per cached block with per-tenant accounting (tracemalloc, {n} blocks, {TENANTS} "
               f"tenants, 3 without a salt): {ten:.0f} against {plain:.0f} without: +{ten - plain:.0f} bytes",
               ten, plain, "the same ledger without per-tenant accounting, same blocks", "<= +40 bytes per block",
               unit="bytes", passed=ten - plain <= 40),
        result(f"KV ledger bytes per cached block with per-tenant accounting and the isolation index: {iso:.0f} "
               f"against {plain:.0f} without: +{iso - plain:.0f} bytes", iso, plain,
               "the same ledger without per-tenant accounting, same blocks", "<= +40 bytes per block",
               unit="bytes", passed=iso - plain <= 40),
        result(f"KV ledger bytes per cached block with per-tenant accounting and isolation on, every chain under "
               f"one salt (a one-key model: no index): {one:.0f} against {plain:.0f} without: +{one - plain:.0f} "
               f"bytes", one, plain, "the same ledger without per-tenant accounting, same blocks",
               "<= +40 bytes per block", unit="bytes", passed=one - plain <= 40),
    ]


def run():
    return bench_cost() + bench_bytes()


if __name__ == "__main__":
    for row in run():
        print(row)
