"""Which paths the configured pattern names now: the glob (a directory means its ``*.log`` files),
listed again only when its directory changed."""
from __future__ import annotations

import glob as globmod
import os
from collections.abc import Callable

from cachemon.sources.logs.paths import effective_glob

# mtimes come from the kernel's coarse clock and some file systems store whole seconds:
# a file written just after a scan may carry an mtime up to this much before it.
MTIME_SLACK = 1.0
# Rotated names that are compressed: their lines are not text to read.
COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".lz4", ".zip", ".Z")


class Listing:
    def __init__(self, pattern: str, wall: Callable[[], float]):
        self.pattern = pattern
        self.wall = wall                  # the file system's clock (mtimes), injectable for tests
        self._listing: tuple[tuple[str, int, int, int], float, list[str]] | None = None   # (directory key, wall, paths)

    def glob(self) -> str:
        return effective_glob(self.pattern)

    def paths(self) -> list[str]:
        pattern = self.glob()
        if pattern != self.pattern or globmod.has_magic(pattern):
            return self._list(pattern)
        return [pattern]

    def _list(self, pattern: str) -> list[str]:
        """The glob's matches, listed again only when its directory changed: a directory's
        mtime moves on every create, rename or delete in it. A listing made less than
        MTIME_SLACK after that mtime is not trusted (a change in the same clock tick would
        not move it)."""
        d = os.path.dirname(pattern)
        if globmod.has_magic(d):
            return sorted(globmod.glob(pattern))
        try:
            st = os.stat(d or ".")
        except OSError:
            self._listing = None
            return []
        key = (d, st.st_dev, st.st_ino, st.st_mtime_ns)
        got = self._listing
        if got is not None and got[0] == key and got[1] - st.st_mtime >= MTIME_SLACK:
            return got[2]
        wall = self.wall()
        paths = sorted(globmod.glob(pattern))
        self._listing = (key, wall, paths)
        return paths

    def rotated_names(self) -> list[str]:
        """The paths under a rotated name of the pattern (``PATH*``), compressed ones excepted."""
        pattern = self.glob()
        if pattern == self.pattern and not globmod.has_magic(pattern):
            pattern = globmod.escape(pattern)
        return [p for p in sorted(globmod.glob(pattern + "*")) if not p.endswith(COMPRESSED)]
