"""The layer contract, the type check and the linter run with the tests, so `make test` and CI
enforce them (configuration: [tool.importlinter], [tool.mypy], [tool.ruff] in pyproject.toml)."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    path = BIN / name if (BIN / name).exists() else shutil.which(name)
    if not path:
        pytest.fail(f"{name} is not installed: pip install -e '.[dev]'")
    return str(path)


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_import_layers_hold():
    r = run(tool("lint-imports"), "--no-cache")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout


def test_mypy_is_clean_on_src():
    r = run(sys.executable, "-m", "mypy", "src")
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_is_clean():
    r = run(tool("ruff"), "check", "src", "tests", "scripts", "benchmarks")
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_sidecar_loads_no_offline_tool_and_no_requests():
    """What `cachemon run` imports (config loader, every stage) stays in its layers at run time too:
    no cachemon.diagnostics module, and requests only when a warm-up is configured."""
    code = ("import sys\nfrom cachemon.runconfig import build_config\nfrom cachemon.daemon import Daemon\n"
            "d = Daemon(build_config(None, ('http://127.0.0.1:9/metrics',)))\n"
            "print(sorted(m for m in sys.modules if m.startswith('cachemon.diagnostics') or m in ('requests', 'click')))")
    r = run(sys.executable, "-c", code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_every_top_level_module_has_a_layer():
    """A module missing from the layers contract is checked by nothing: each must be placed."""
    block = re.search(r"^layers = \[(.*?)^\]", (ROOT / "pyproject.toml").read_text(), re.S | re.M)
    assert block, "no layers contract in pyproject.toml"
    listed = set(re.findall(r"[a-z_]+", block.group(1)))
    pkg = ROOT / "src" / "cachemon"
    modules = {p.stem for p in pkg.iterdir()
               if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()}
    assert modules - listed == set(), f"add these to [tool.importlinter] layers: {sorted(modules - listed)}"
