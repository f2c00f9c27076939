"""Shared helpers for the benchmarks: medians, peak RSS, one result format.

Every benchmark module ``bench_*.py`` defines ``run() -> list[dict]`` built with
``result(...)``; ``benchmarks/run.py`` runs each module in its own process (so peak
RSS belongs to that benchmark alone) and prints one table.
"""
from __future__ import annotations

import gc
import resource
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"


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
