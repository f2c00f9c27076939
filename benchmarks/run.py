#!/usr/bin/env python3
"""Run every benchmark (benchmarks/bench_*.py), each in its own process, and print one table.

Usage: python benchmarks/run.py [--only NAME] [--json FILE] [--soak-minutes M]
Each row: the work, cachemon's median, the baseline's median measured in the same run,
the ratio (baseline / cachemon, higher is better for cachemon), the target, and the
peak RSS of the benchmark's process.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def fmt_time(v, unit):
    if v is None:
        return "-"
    if unit.startswith("s"):
        suffix = unit[1:]
        if v < 1e-6:
            return f"{v * 1e9:.0f} ns{suffix}"
        if v < 1e-3:
            return f"{v * 1e6:.1f} us{suffix}"
        if v < 1:
            return f"{v * 1e3:.2f} ms{suffix}"
        return f"{v:.2f} s{suffix}"
    return f"{v:g} {unit}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", help="substring of a benchmark module name")
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds allowed per benchmark module")
    ap.add_argument("--list", action="store_true", help="list the benchmark modules that would run, and exit")
    ap.add_argument("--soak-minutes", type=float, default=float(os.environ.get("CACHEMON_SOAK_MINUTES", "2")),
                    help="loaded phase of bench_soak (default 2; the full 10-minute soak: "
                         "`make soak`, i.e. `python benchmarks/bench_soak.py --full`)")
    args = ap.parse_args()
    env = dict(os.environ, CACHEMON_SOAK_MINUTES=str(args.soak_minutes))
    modules = sorted(p.stem for p in HERE.glob("bench_*.py") if not args.only or args.only in p.stem)
    if args.list:
        print("\n".join(modules))
        return 0
    if not modules:
        print(f"no benchmark module matches {args.only!r} in {HERE}", file=sys.stderr)
        return 2
    rows, failed = [], []
    for mod in modules:
        print(f"running {mod} ...", file=sys.stderr, flush=True)
        try:
            proc = subprocess.run([sys.executable, str(HERE / "_one.py"), mod], capture_output=True, text=True,
                                  timeout=args.timeout, env=env)
        except subprocess.TimeoutExpired:
            failed.append(mod)
            print(f"{mod} FAILED: timed out after {args.timeout:g}s", file=sys.stderr)
            continue
        if proc.returncode != 0:
            failed.append(mod)
            print(f"{mod} FAILED:\n{proc.stderr[-2000:]}", file=sys.stderr)
            continue
        try:
            rows.extend(json.loads(proc.stdout.strip().splitlines()[-1]))
        except (IndexError, ValueError):
            failed.append(mod)
            print(f"{mod} FAILED: no JSON rows on its last output line", file=sys.stderr)
    print(f"cachemon benchmarks, {time.strftime('%Y-%m-%d')}, {platform.machine()}, "
          f"{platform.python_implementation()} {platform.python_version()}, {_cpu()}")
    header = ["work", "cachemon", "baseline", "ratio", "target", "ok", "peak RSS"]
    table = [header]
    for r in rows:
        table.append([
            r["work"] + (f" (baseline: {r['baseline_name']})" if r["baseline_name"] else ""),
            fmt_time(r["cachemon"], r["unit"]), fmt_time(r["baseline"], r["unit"]),
            f"{r['ratio']:.1f}x" if r["ratio"] else "-", r["target"] or "-",
            {True: "yes", False: "NO", None: "-"}[r["passed"]], f"{r['peak_rss_mb']:.0f} MB",
        ])
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
    for i, row in enumerate(table):
        print("| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)) + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        if r.get("note"):
            print(f"- {r['work']}: {r['note']}")
    if failed:
        print(f"- FAILED modules (no rows above): {', '.join(failed)}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 1 if failed or any(r["passed"] is False for r in rows) else 0


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                import os
                return f"{line.split(':', 1)[1].strip()} x{os.cpu_count()}"
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


if __name__ == "__main__":
    sys.exit(main())
