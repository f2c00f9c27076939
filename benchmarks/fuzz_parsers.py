#!/usr/bin/env python3
"""The long fuzz run of cachemon's two hand-written parsers (the suite runs a short Hypothesis
budget of the same checks: tests/test_fuzz_parsers.py, oracles in tests/fuzz_support.py).

- exposition: sources/exposition.py against prometheus_client's text parser; on every page both
  accept, the numbers must agree.
- kv: normalise/kv_decode.py raises nothing but KvDecodeError, within KV_BUDGET_SECONDS an input.

Engine: atheris (coverage-guided libFuzzer; `pip install atheris`) when it imports, else Hypothesis.
Each target runs in its own process; seeds are the real captures (tests/fixtures) and the
constructed pages and msgpack bombs of fuzz_support. An input that fails is written to --out
(atheris: crash-<sha1>) and belongs in tests/test_fuzz_parsers.py's *_FOUND lists.

Usage: nice -n 19 python benchmarks/fuzz_parsers.py [--target exposition|kv|both] [--runs 1000000]
                                                      [--engine atheris|hypothesis] [--out DIR]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
MAX_LEN = 4096


def _seeds(target: str, corpus: Path) -> None:
    import fuzz_support as F
    corpus.mkdir(parents=True, exist_ok=True)
    if target == "exposition":
        seeds = [p.read_bytes()[:MAX_LEN] for p in sorted((ROOT / "tests" / "fixtures").glob("vllm-*/metrics-*.txt"))]
        seeds += [b"# TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits_total{model_name=\"m\",engine=\"0\"} 7\n"]
    else:
        seeds = F.real_payloads(64) + [b[:MAX_LEN] for b in F.BOMBS]
    for i, s in enumerate(seeds):
        (corpus / f"seed-{i:03d}").write_bytes(s)


def _check(target: str):
    import fuzz_support as F

    if target == "exposition":
        def one(data: bytes) -> None:
            why = F.differential(data.decode("utf-8", "replace"))
            if why:
                raise AssertionError(why)
    else:
        def one(data: bytes) -> None:
            why = F.kv_decode_checked(data)
            if why:
                raise AssertionError(why)
    return one


def run_atheris(target: str, runs: int, out: Path) -> int:
    import atheris
    with atheris.instrument_imports(include=["cachemon", "fuzz_support"]):
        import cachemon.normalise.kv_decode  # noqa: F401  (imported here: instrumented for coverage)
        import cachemon.sources.exposition  # noqa: F401
        one = _check(target)
    corpus = Path(tempfile.mkdtemp(prefix=f"fuzz-{target}-"))
    _seeds(target, corpus)
    out.mkdir(parents=True, exist_ok=True)
    atheris.Setup([sys.argv[0], f"-runs={runs}", f"-max_len={MAX_LEN}", f"-artifact_prefix={out}/{target}-",
                   "-print_final_stats=1", "-timeout=5", str(corpus)], one)
    atheris.Fuzz()        # exits the process: 0 when every run passed
    return 0


def run_hypothesis(target: str, runs: int, out: Path) -> int:
    from hypothesis import HealthCheck, given, settings

    import fuzz_support as F
    check = _check(target)
    strategy = F.pages().map(lambda s: s.encode("utf-8", "surrogatepass")) if target == "exposition" else F.kv_payloads()
    done = [0]

    @settings(max_examples=runs, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(strategy)
    def fuzz(data: bytes) -> None:
        done[0] += 1
        try:
            check(data)
        except BaseException:
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{target}-failing-{done[0]}").write_bytes(data)
            raise

    fuzz()
    print(f"{target}: {done[0]} inputs, no failure")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", choices=["exposition", "kv", "both"], default="both")
    ap.add_argument("--runs", type=int, default=1_000_000)
    ap.add_argument("--engine", choices=["atheris", "hypothesis"], default=None)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "fuzz-findings")
    args = ap.parse_args()
    engine = args.engine
    if engine is None:
        try:
            import atheris  # noqa: F401
            engine = "atheris"
        except ImportError:
            engine = "hypothesis"
    targets = ["exposition", "kv"] if args.target == "both" else [args.target]
    if len(targets) > 1:       # each target in its own process (atheris.Fuzz() exits)
        rc = 0
        for t in targets:
            rc |= subprocess.call([sys.executable, __file__, "--target", t, "--runs", str(args.runs),
                                   "--engine", engine, "--out", str(args.out)])
        return rc
    t0 = time.monotonic()
    print(f"fuzzing {targets[0]} with {engine}: {args.runs} inputs (pid {os.getpid()})", flush=True)
    run = run_atheris if engine == "atheris" else run_hypothesis
    rc = run(targets[0], args.runs, args.out)
    print(f"{targets[0]}: done in {time.monotonic() - t0:.0f} s", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
