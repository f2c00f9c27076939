"""Shared helpers for the benchmarks: medians, peak RSS, one result format.

Every benchmark module ``bench_*.py`` defines ``run() -> list[dict]`` built with
``result(...)``; ``benchmarks/run.py`` runs each module in its own process (so peak
RSS belongs to that benchmark alone) and prints one table.
"""
from __future__ import annotations

import gc
import os
import resource
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"


def token_series_store():
    """A store with 32 (model, engine) pairs x (query, hit, miss) x 2 caches, applied three times 30 s
    apart: the 320 token series (plus their window ratios) the exporter benchmark and the gate render.
    cachemon is imported here, so the gate's workers take it from the tree they measure."""
    from cachemon import catalog as C
    from cachemon.state.store import Store, Update

    store = Store({"1m": 60, "5m": 300})
    st = store.upstream("vllm")
    counters = {}
    for m in range(8):
        for e in range(4):
            for cache in ("local", "external"):
                key = (f"model-{m}", str(e), cache)
                counters[(C.QUERY_TOKENS.name, key)] = 1000.0
                counters[(C.HIT_TOKENS.name, key)] = 800.0
                counters[(C.MISS_TOKENS.name, key)] = 200.0
    for i, t in enumerate((0.0, 30.0, 60.0)):
        st.apply(Update.from_totals({k: v * (i + 1) for k, v in counters.items()}), t)
    return store


def median_seconds(fn, repeat: int = 15, number: int = 1, warmup: int = 1) -> float:
    """Median wall time of one call of fn, over `repeat` batches of `number` calls."""
    for _ in range(warmup):
        fn()
    times = []
    gc.disable()
    try:
        for _ in range(repeat):
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            times.append((time.perf_counter() - t0) / number)
    finally:
        gc.enable()
    return statistics.median(times)


def peak_rss_mb() -> float:
    # Linux reports ru_maxrss in KiB.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def result(work: str, cachemon_s: float, baseline_s: float | None = None, baseline: str = "",
           target: str = "", unit: str = "s", passed: bool | None = None, note: str = "") -> dict:
    """One row. `unit` is what the two medians measure (s, s/line, ...); ratio = baseline / cachemon."""
    ratio = (baseline_s / cachemon_s) if (baseline_s and cachemon_s) else None
    return {"work": work, "cachemon": cachemon_s, "baseline": baseline_s, "baseline_name": baseline,
            "ratio": ratio, "target": target, "unit": unit, "passed": passed, "note": note,
            "peak_rss_mb": round(peak_rss_mb(), 1)}


# --- the machine's load, to state beside a figure measured on a shared machine ---------------------

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def loadavg_1m() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def busy_seconds() -> float:
    """CPU seconds the whole machine spent busy since boot (every core; /proc/stat, idle and iowait excluded)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / CLK_TCK


def process_cpu_seconds(pid: int) -> float:
    """user + system CPU seconds of one process (all its threads), from /proc; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class MachineSampler:
    """Over one phase: the 1-minute loadavg sampled every `every` seconds, and the CPU the machine spent
    beyond `ours` (the benchmark's own processes): what the other users of a shared machine took."""

    def __init__(self, ours: list[int], every: float = 5.0):
        self.ours, self.every = ours, every
        self.loads: list[float] = []
        self._next = 0.0
        self._t0 = time.monotonic()
        self._busy0 = busy_seconds()
        self._ours0 = {p: process_cpu_seconds(p) for p in ours}

    def tick(self) -> None:
        now = time.monotonic()
        if now >= self._next:
            self.loads.append(loadavg_1m())
            self._next = now + self.every

    def summary(self) -> dict:
        elapsed = max(time.monotonic() - self._t0, 1e-9)
        ours = {p: process_cpu_seconds(p) - c for p, c in self._ours0.items()}
        busy = busy_seconds() - self._busy0
        loads = self.loads or [loadavg_1m()]
        return {"seconds": elapsed, "nproc": os.cpu_count(), "load_min": min(loads), "load_max": max(loads),
                "load_mean": sum(loads) / len(loads), "load_samples": len(loads),
                "cpu_ours": ours, "busy_cores": busy / elapsed,
                "others_cores": max(0.0, busy - sum(ours.values())) / elapsed}
