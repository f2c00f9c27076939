"""`cachemon analyze --plot FILE` (issue 37, Build 4): the pool-size curve drawn, the current pool marked; matplotlib
an optional extra that the sidecar never loads.

Real: tests/fixtures/vllm-0.32.0-cpu-analyze-v2, the 36-block server's 35 requests (vLLM hit 54.9 %)."""
from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from cachemon.cli import main
from helpers import FIXTURES

V2 = FIXTURES / "vllm-0.32.0-cpu-analyze-v2"
ARGS = ["analyze", str(V2 / "requests-pool36.jsonl"), "--tokenizer", str(V2 / "model"),
        "--metrics-file", str(V2 / "metrics-pool36.txt"), "--top", "0"]


def test_the_svg_draws_the_curve_and_marks_the_current_pool(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "pool.svg"
    r = CliRunner().invoke(main, [*ARGS, "--plot", str(out)])
    assert r.exit_code == 0, r.output
    svg = out.read_text()
    # the legend states the current pool and what it hits: 54.9 % is vLLM's own hit ratio on this capture
    assert "current pool: 36 blocks -&gt; 54.9 %" in svg
    assert "unlimited pool: 59.3 %" in svg and "KV pool size (blocks of 128 tokens" in svg


def test_png(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "pool.png"
    assert CliRunner().invoke(main, [*ARGS, "--plot", str(out)]).exit_code == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_clear_errors(tmp_path, monkeypatch):
    r = CliRunner().invoke(main, [*ARGS, "--plot", str(tmp_path / "pool.jpg")])
    assert r.exit_code == 2 and "give a .png or .svg file name" in r.output
    r = CliRunner().invoke(main, [*ARGS, "--no-curve", "--plot", str(tmp_path / "pool.png")])
    assert r.exit_code == 2 and "no pool-size curve to draw" in r.output
    monkeypatch.setitem(sys.modules, "matplotlib", None)          # as if the extra were not installed
    r = CliRunner().invoke(main, [*ARGS, "--plot", str(tmp_path / "pool.png")])
    assert r.exit_code == 2 and "pip install 'cachemon[plot]'" in r.output
    assert not (tmp_path / "pool.png").exists()


@pytest.mark.slow
def test_the_sidecar_and_the_cli_never_load_matplotlib():
    code = ("import sys\nfrom cachemon.runconfig import build_config\nfrom cachemon.daemon import Daemon\n"
            "import cachemon.cli\n"
            "d = Daemon(build_config(None, ('http://127.0.0.1:9/metrics',)))\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib'))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
