"""The layer contract, the type check and the linter run with the tests, so `make test` and CI
enforce them (configuration: [tool.importlinter], [tool.mypy], [tool.ruff] in pyproject.toml)."""
from __future__ import annotations

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
    r = run(tool("ruff"), "check", "src", "tests")
    assert r.returncode == 0, r.stdout + r.stderr
