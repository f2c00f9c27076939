"""Seeded before/after equivalence of the KV miss ledger (state/ledger/): scripts/equivalence.py covers the
scrape-to-page stages; this drives the ledger alone with the benchmark's simulated pools (constructed:
benchmarks/bench_kv_ledger.workload) on several replicas of one model, salted chain heads (the per-tenant
split and the isolation index), a restart, a reset and a replica moving to another model and back, and
prints every replica's snapshot as JSON lines. Run it with two trees' sources and compare the outputs:

    PYTHONPATH=<old>/src python scripts/ledger_equivalence.py > old.jsonl
    PYTHONPATH=src python scripts/ledger_equivalence.py > new.jsonl && cmp old.jsonl new.jsonl
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from bench_kv_ledger import _encoded, workload  # noqa: E402

from cachemon.normalise.kv_batch import Cleared, KvBatch, Stored  # noqa: E402
from cachemon.state.ledger.fleet import FleetLedger, Histogram  # noqa: E402
from cachemon.state.ledger.tenants import TenantLabels  # noqa: E402


def salted(batches: list[KvBatch], tenants: int, replica: int) -> list[KvBatch]:
    """Each chain head gets one of ``tenants`` salts (a third of the heads none), by its hash."""
    out = []
    for b in batches:
        evs = []
        for e in b.events:
            if type(e) is Stored and e.parent is None:
                t = (e.hashes[0] + replica) % tenants
                salt = None if t < tenants // 3 else f"salt-{t}"
                e = replace(e, extra=((salt,) if salt else None,) + (None,) * (len(e.hashes) - 1))
            evs.append(e)
        out.append(KvBatch(b.seq, b.ts, evs))
    return out


def run(seed: int, replicas: int, batches: int, isolation: bool) -> list[dict]:
    fleet = FleetLedger(max_blocks=15_000, tenants=TenantLabels({}, b"equivalence-key", 20), isolation=isolation)
    streams = [_encoded(salted(workload(16, batches, seed=seed + r)[0], 10, r)) for r in range(replicas)]
    out = []
    for i in range(batches):
        for r, stream in enumerate(streams):
            name, model = f"r{r}", "m"
            if r == replicas - 1 and batches // 3 <= i < batches // 2:
                model = "other"                                  # moved to another model, then back
            b = stream[i]
            fleet.on_batch(name, model, b, b.ts)
        if i == batches // 4:
            fleet.on_restart("r0", streams[0][i].ts)
        if i == (2 * batches) // 3:
            fleet.on_batch("r1", "m", KvBatch(streams[1][i].seq, streams[1][i].ts, [Cleared(None)]), streams[1][i].ts)
        if i % max(1, batches // 10) == 0 or i == batches - 1:
            out += [{"seed": seed, "batch": i, **asdict(s)} for s in fleet.snapshot()]
    return out


def plain(x: object) -> object:
    """A histogram as its cumulative buckets, sum and count (its repr names an address)."""
    if isinstance(x, Histogram):
        return {"buckets": x.cumulative(), "sum": x.sum, "count": x.count}
    raise TypeError(f"not JSON: {type(x).__name__}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--batches", type=int, default=3000)
    a = ap.parse_args()
    for seed in range(a.seeds):
        for isolation in (True, False):
            for row in run(seed, a.replicas, a.batches, isolation):
                print(json.dumps(row, sort_keys=True, default=plain))


if __name__ == "__main__":
    main()
