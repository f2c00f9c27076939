#!/usr/bin/env python3
"""Print the facts of a rust_record.py capture (per frontend): content types per Accept, families
before/after traffic, counters around the restart, stats-line intervals, endpoints.

    python scripts/e2e/rust_summary.py tests/fixtures/vllm-0.32.0-cpu-rust-frontend
"""
from __future__ import annotations

import json
import re
import sys
from datetime import datetime
from pathlib import Path

ANSI = re.compile(r"\x1b\[[0-9;]*m")
COUNTERS = ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:prompt_tokens", "vllm:request_success")


def families(text: str) -> set[str]:
    return {ln.split()[2] for ln in text.splitlines() if ln.startswith("# TYPE ")}


def total(text: str, name: str) -> float | None:
    """Sum of a counter's samples (text format `name_total`, OpenMetrics the same sample name)."""
    vals = [float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
            if (ln.startswith(name + "_total{") or ln.startswith(name + "_total ")
                or ln.startswith(name + "{") or ln.startswith(name + " "))]
    return sum(vals) if vals else None


def summary(folder: Path) -> None:
    print(f"== {folder.name}")
    lines = [json.loads(ln) for ln in (folder / "metrics.jsonl").read_text().splitlines()]
    meta = json.loads((folder / "metadata.json").read_text())
    starts = meta["ready"]
    ctypes: dict = {}
    for ln in lines:
        ctypes.setdefault(ln["accept"], set()).add(ln["content_type"])
    for acc, ct in ctypes.items():
        print(f"  Accept {acc!r} -> Content-Type {sorted(ct)}")
    texts = [ln for ln in lines if "text" in ln and ln["accept"] == "text/plain"]
    phases = meta["phases"]
    t_traffic = [p["t"] for p in phases if p["phase"].startswith("traffic round") and "shared" in p["phase"]]
    before = [ln for ln in texts if ln["t"] < t_traffic[0]]
    after = [ln for ln in texts if t_traffic[0] < ln["t"] < meta["stops"][0]]
    if before and after:
        fb, fa = families(before[-1]["text"]), families(after[-1]["text"])
        print(f"  families: {len(fb)} before traffic, {len(fa)} after; new: {sorted(fa - fb)}")
        sb = {ln.split("{")[0].split(" ")[0] for ln in before[-1]["text"].splitlines() if ln and not ln.startswith("#")}
        sa = {ln.split("{")[0].split(" ")[0] for ln in after[-1]["text"].splitlines() if ln and not ln.startswith("#")}
        print(f"  sample names: {len(sb)} before traffic, {len(sa)} after; appeared: {sorted(sa - sb)[:40]}")
    last = after[-1]["text"] if after else ""
    print("  has process_start_time_seconds:", "process_start_time_seconds" in last,
          "| _created samples:", sum(1 for ln in last.splitlines() if "_created" in ln and not ln.startswith("#")),
          "| cache_config_info:", "vllm:cache_config_info" in last, "| # EOF:", last.rstrip().endswith("# EOF"))
    for name in COUNTERS:
        seq = []
        for ln in texts:
            v = total(ln["text"], name)
            seq.append(v)
        first_after_restart = [total(ln["text"], name) for ln in texts if ln["t"] > starts[1]][:1]
        print(f"  {name}: before stop {[v for v, ln in zip(seq, texts, strict=True) if ln['t'] < meta['stops'][0]][-1]},"
              f" first poll after restart {first_after_restart}, final {seq[-1]}")
    log = (folder / "vllm-server.log").read_text(errors="replace")
    stats = [ln for ln in log.splitlines() if "Prefix cache hit rate" in ln]
    ts = [datetime.strptime(m.group(1), "%m-%d %H:%M:%S") for ln in stats
          if (m := re.search(r"(\d\d-\d\d \d\d:\d\d:\d\d)", ANSI.sub("", ln)))]
    gaps = sorted({int((b - a).total_seconds()) for a, b in zip(ts, ts[1:], strict=False)})
    print(f"  stats lines: {len(stats)}, gaps between them (s): {gaps}; ANSI in them: {any(ANSI.search(s) for s in stats)}")
    if stats:
        print("  example:", repr(stats[0])[:400])
    ep = json.loads((folder / "endpoints.json").read_text())
    first = next(iter(ep.values()))
    print("  endpoints 200:", [p for p, v in first.items() if v.get("status") == 200],
          "| not 200:", [(p, v.get("status")) for p, v in first.items() if v.get("status") != 200])


if __name__ == "__main__":
    root = Path(sys.argv[1])
    for sub in sorted(p for p in root.iterdir() if p.is_dir()):
        summary(sub)
