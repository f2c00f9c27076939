"""Callgrind driver for bench_kv_tenants.py's per-event workload: deterministic instruction counts
(wall clock is noisy on a shared machine). One ledger per run, the same batches as the benchmark:

    PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=OUT \\
        .venv/bin/python benchmarks/callgrind_kv_tenants.py MODE [BATCHES]

MODE is ``load`` (the workload's loading only: subtract it), ``plain``, ``tenants`` or ``isolation``
(bench_kv_tenants.LEDGERS). Instructions per event: (total(MODE) - total(load)) / events, the events
printed by the run.
"""
from __future__ import annotations

import sys

from bench_kv_ledger import _encoded, workload
from bench_kv_tenants import LEDGERS, _salted

from cachemon.state.ledger.fleet import FleetLedger


def main() -> None:
    mode = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 6000
    batches, events = workload(16, n)
    enc = _encoded(_salted(batches))
    if mode != "load":
        f = FleetLedger(**LEDGERS[mode])
        for b in enc:
            f.on_batch("vllm", "m", b, b.ts)
    print(f"{mode}: {events} events")


if __name__ == "__main__":
    main()
