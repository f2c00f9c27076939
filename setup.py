"""Build hooks: stamp the git revision into the sdist and the wheel as cachemon/_revision.py.

Everything else about the package is in pyproject.toml. The stamp is the short sha of HEAD
when building from cachemon's own git checkout; a wheel built from an unpacked sdist (no
.git) keeps the sdist's stamp. src/cachemon/_revision.py is never written into the checkout
(.gitignore lists it anyway); ``cachemon.__revision__`` reads it, see src/cachemon/__init__.py.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

ROOT = Path(__file__).resolve().parent
STAMP = Path("cachemon") / "_revision.py"


def git_revision() -> str | None:
    if not (ROOT / ".git").exists():
        return None
    try:
        r = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                           timeout=30, check=False)
    except OSError:
        return None
    return r.stdout.strip() if r.returncode == 0 and r.stdout.strip() else None


def write_stamp(path: Path, revision: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'"""Generated at build time by setup.py; not in git."""\nREVISION = "{revision}"\n', encoding="utf-8")


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        revision = git_revision()
        if revision:                     # else: the stamp copied from an unpacked sdist, if any
            write_stamp(Path(self.build_lib) / STAMP, revision)


class Sdist(sdist):
    def make_release_tree(self, base_dir, files) -> None:
        super().make_release_tree(base_dir, files)
        revision = git_revision()
        if revision:
            target = Path(base_dir) / "src" / STAMP
            target.unlink(missing_ok=True)   # a hard link to the source tree's copy, if one was made
            write_stamp(target, revision)


setup(cmdclass={"build_py": BuildPy, "sdist": Sdist})
