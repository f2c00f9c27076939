"""cachemon: prefix-cache hit-rate monitoring for vLLM.

``__version__`` is the release (pyproject.toml's ``version``; a test keeps the two equal).
``__revision__`` is the git commit it was built from: the short sha that ``setup.py`` writes
into the sdist and wheel as ``cachemon/_revision.py``, else, in a git checkout, ``git rev-parse
--short HEAD`` run once on first access, else ``"unknown"``. It is computed lazily (module
``__getattr__``), so importing cachemon never runs git.
"""
from __future__ import annotations

import importlib
import subprocess
from pathlib import Path

__version__ = "0.1.0"

_revision_cache: list[str] = []


def install_hint(extra: str) -> str:
    """How to add an optional extra, in the two ways cachemon is installed today (not on PyPI yet)."""
    return (f"from a clone: .venv/bin/pip install -e '.[{extra}]' (or make setup, which installs every extra); "
            f"from the wheel: pip install 'cachemon-{__version__}-py3-none-any.whl[{extra}]'")


def _checkout_revision(root: Path) -> str | None:
    """The short sha of HEAD when `root` is cachemon's own git checkout (never an enclosing repository)."""
    if not ((root / ".git").exists() and (root / "pyproject.toml").is_file() and (root / "src" / "cachemon").is_dir()):
        return None
    try:
        r = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                           timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    sha = r.stdout.strip()
    return sha if r.returncode == 0 and sha else None


def _revision() -> str:
    try:   # written by setup.py into the sdist and wheel; absent in a checkout
        stamped = getattr(importlib.import_module("cachemon._revision"), "REVISION", None)
    except ImportError:
        stamped = None
    if isinstance(stamped, str) and stamped:
        return stamped
    return _checkout_revision(Path(__file__).resolve().parents[2]) or "unknown"


def __getattr__(name: str) -> str:
    if name == "__revision__":
        if not _revision_cache:
            _revision_cache.append(_revision())
        return _revision_cache[0]
    raise AttributeError(f"module 'cachemon' has no attribute {name!r}")
