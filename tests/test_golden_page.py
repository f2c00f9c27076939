"""The golden whole page (tests/golden_page.py): any change to cachemon's exported surface over the
real vLLM captures shows as a diff of tests/golden/whole-page.prom in review. Regenerate it with
`make golden`."""
from __future__ import annotations

import difflib
import shutil
import subprocess

import pytest

from golden_page import GOLDEN, normalised, whole_page


def test_the_whole_page_matches_the_golden_file():
    got, want = normalised(whole_page()), GOLDEN.read_text()
    diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True), "golden", "now", n=1))
    assert got == want, f"the exported page changed (if on purpose: `make golden`):\n{diff[:6000]}"


@pytest.mark.slow
def test_promtool_check_metrics_accepts_the_golden_page():
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian package 'prometheus'; scripts/test-deps)")
    r = subprocess.run([promtool, "check", "metrics"], input=GOLDEN.read_text(), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), (r.stdout, r.stderr)
