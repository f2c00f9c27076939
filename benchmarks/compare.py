#!/usr/bin/env python3
"""The benchmark gate: this tree against BASE, interleaved in one run (`make bench-compare BASE=<ref>`).

BASE is checked out with `git worktree add --detach` into a temporary directory. Two worker
processes run the same benchmark cases (this file's CASES), one importing cachemon from this
tree's src/, the other from BASE's. Each round runs every case once in each worker, in a random
order, back to back, so both see the same machine load; a case's batch is sized to take ~BATCH_S.
Times are the worker's CPU time (time.process_time: what other processes on a shared machine run
does not count). Per round the ratio this/BASE of the time per operation; over the rounds the geometric mean and a
95 % bootstrap confidence interval. A case regresses when the interval's LOWER end is above
1 + THRESHOLD (slower by more than 10 %, with confidence): the exit code is then 1.

Cases (the hot paths): parse (a real 52 KB vLLM 0.32.0 page through the normaliser), render
(cachemon's /metrics of 320 token series), ledger (KV ledger ingest of 4 000 pre-decoded batches,
block_size 16) and tail (the log source over a 20 000-line vLLM log).

Usage: python benchmarks/compare.py BASE [--rounds 15] [--threshold 0.10] [--cases parse,render]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BATCH_S = 0.05


# -- the cases: setup() -> one operation (run in a worker, with cachemon from the tree under test) --
def _parse():
    from cachemon.normalise.normaliser import Normaliser
    page = (ROOT / "tests" / "fixtures" / "vllm-0.32.0-cpu" / "metrics-static-system-prompt.txt").read_text()
    n = Normaliser()
    return lambda: n.normalise_text(page)


def _render():
    from common import token_series_store

    from cachemon.expose.collector import CachemonCollector
    from cachemon.expose.render import render
    store = token_series_store()
    collectors = [CachemonCollector(store)]
    return lambda: render(collectors)


def _ledger():
    from bench_kv_ledger import _encoded, workload

    from cachemon.state.ledger.fleet import FleetLedger
    batches = _encoded(workload(16, 4000)[0])

    def one():
        f = FleetLedger()
        for b in batches:
            f.on_batch("vllm", "m", b, b.ts)
    return one


def _tail():
    from bench_logs import generate, tail_with_cachemon
    d = Path(tempfile.mkdtemp(prefix="bench-compare-"))
    path = d / "vllm.log"
    generate(path, 20_000, 40)
    return lambda: tail_with_cachemon(path)


CASES = {"parse": _parse, "render": _render, "ledger": _ledger, "tail": _tail}


def worker(src: str) -> None:
    """Serve {"case", "n"} requests on stdin: the seconds n operations took, one JSON line each."""
    sys.path[:0] = [src, str(HERE)]
    import cachemon
    assert Path(cachemon.__file__).resolve().is_relative_to(Path(src).resolve()), cachemon.__file__
    ops: dict = {}
    import gc
    for line in sys.stdin:
        req = json.loads(line)
        try:
            if req["case"] not in ops:
                ops[req["case"]] = CASES[req["case"]]()
            op = ops[req["case"]]
            gc.collect()
            # CPU time of this process: on a shared machine, others' load does not count
            t0 = time.process_time()
            for _ in range(req["n"]):
                op()
            out = {"t": time.process_time() - t0}
        except Exception as e:          # a case BASE does not support: reported, not fatal
            out = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(out), flush=True)


class Worker:
    def __init__(self, src: Path) -> None:
        self.p = subprocess.Popen([sys.executable, __file__, "--worker", str(src)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, cwd=ROOT)

    def run(self, case: str, n: int) -> dict:
        assert self.p.stdin and self.p.stdout
        self.p.stdin.write(json.dumps({"case": case, "n": n}) + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            return {"error": "the worker died"}
        return json.loads(line)

    def close(self) -> None:
        if self.p.stdin:
            self.p.stdin.close()
        self.p.wait(30)


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def interval(ratios: list[float], rng: random.Random, n: int = 2000) -> tuple[float, float]:
    """95 % bootstrap percentile interval of the geometric mean of the per-round ratios."""
    means = sorted(geomean([rng.choice(ratios) for _ in ratios]) for _ in range(n))
    return means[int(0.025 * n)], means[int(0.975 * n) - 1]


def compare(base_src: Path, head_src: Path, cases: list[str], rounds: int, threshold: float, seed: int) -> int:
    rng = random.Random(seed)
    workers = {"base": Worker(base_src), "head": Worker(head_src)}
    per_op: dict[str, dict[str, list[float]]] = {c: {"base": [], "head": []} for c in cases}
    errors: dict[str, str] = {}
    try:
        sizes = {}
        for c in cases:      # warm-up and batch size: ~BATCH_S on BASE
            got = {k: w.run(c, 1) for k, w in workers.items()}
            bad = [f"{k}: {g['error']}" for k, g in got.items() if "error" in g]
            if bad:
                errors[c] = "; ".join(bad)
                continue
            sizes[c] = max(1, round(BATCH_S / max(got["base"]["t"], 1e-9)))
        for _ in range(rounds):
            for c in sizes:
                order = list(workers)
                rng.shuffle(order)
                for k in order:
                    got = workers[k].run(c, sizes[c])
                    if "error" in got:
                        errors[c] = f"{k}: {got['error']}"
                        break
                    per_op[c][k].append(got["t"] / sizes[c])
    finally:
        for w in workers.values():
            w.close()
    print(f"{'case':8} {'BASE/op':>10} {'this/op':>10} {'this/BASE':>9}  95% interval   verdict")
    failed = False
    for c in cases:
        if c in errors or not per_op[c]["head"]:
            print(f"{c:8} {'-':>10} {'-':>10} {'-':>9}  {'-':13}  not compared ({errors.get(c, 'no data')})")
            continue
        b, h = per_op[c]["base"], per_op[c]["head"]
        ratios = [x / y for x, y in zip(h, b, strict=False)]
        lo, hi = interval(ratios, rng)
        g = geomean(ratios)
        regressed = lo > 1 + threshold
        failed |= regressed
        verdict = (f"REGRESSED (> {threshold:.0%} slower with 95% confidence)" if regressed
                   else "faster" if hi < 1 else "same within noise" if lo <= 1 else "slower, under the gate")
        print(f"{c:8} {fmt(sorted(b)[len(b) // 2]):>10} {fmt(sorted(h)[len(h) // 2]):>10} {g:9.3f}  "
              f"[{lo:.3f}, {hi:.3f}]  {verdict}")
    print(f"{rounds} interleaved rounds; load average {os.getloadavg()[0]:.2f} at the end")
    return 1 if failed else 0


def fmt(s: float) -> str:
    return f"{s * 1e6:.1f} us" if s < 1e-3 else f"{s * 1e3:.2f} ms"


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base", help="a git ref: the tree to compare against")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threshold", type=float, default=0.10)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {unknown}: choose from {', '.join(CASES)}")
    tmp = Path(tempfile.mkdtemp(prefix="cachemon-base-"))
    wt = tmp / "base"
    r = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(wt), args.base],
                       capture_output=True, text=True)
    if r.returncode != 0:
        print(f"bench-compare: cannot check out {args.base!r}: {r.stderr.strip()}", file=sys.stderr)
        return 2
    try:
        rev = subprocess.run(["git", "-C", str(wt), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True).stdout.strip()
        print(f"BASE {args.base} ({rev}) against this tree ({ROOT})")
        return compare(wt / "src", ROOT / "src", cases, args.rounds, args.threshold, args.seed)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(wt)], capture_output=True)


if __name__ == "__main__":
    sys.exit(main())
