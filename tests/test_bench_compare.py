"""benchmarks/compare.py (`make bench-compare BASE=<ref>`): its statistics, and one run of the gate
against this very tree (no regression can be found: the same code on both sides)."""
from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import compare  # noqa: E402

from assert_support import nonempty  # noqa: E402


def test_the_interval_holds_the_ratio_and_flags_only_a_real_slowdown():
    rng = random.Random(3)
    same = [rng.uniform(0.95, 1.05) for _ in range(15)]
    lo, hi = compare.interval(same, random.Random(1))
    assert lo <= 1.0 <= hi and lo > 0.9 and hi < 1.1
    slower = [r * 1.3 for r in same]
    lo, hi = compare.interval(slower, random.Random(1))
    assert lo > 1.1                                      # what the gate calls a regression


@pytest.mark.slow
def test_the_gate_against_this_tree_itself_passes_and_prints_every_case():
    # Three rounds on a shared 2-core machine: a burst of load during one side's rounds can push the
    # same code past the gate once (seen: render 1.57 [1.25, 1.80] against itself). The same false
    # alarm twice in a row is what would mean the gate is broken, so a second run decides.
    outputs = []
    for _ in nonempty(range(2)):
        r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "compare.py"), "HEAD", "--rounds", "3",
                            "--cases", "parse,render"], capture_output=True, text=True, timeout=300, cwd=ROOT)
        rows = [line.split()[0] for line in r.stdout.splitlines()[2:4]]
        assert rows == ["parse", "render"], r.stdout + r.stderr
        outputs.append(r.stdout + r.stderr)
        if r.returncode == 0 and "REGRESSED" not in r.stdout:
            return
    pytest.fail("the same tree was called a regression twice in a row:\n" + "\n".join(outputs))


@pytest.mark.slow
def test_an_unknown_ref_is_exit_2_with_one_line():
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "compare.py"), "no-such-ref-xyz"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2 and "cannot check out 'no-such-ref-xyz'" in r.stderr
