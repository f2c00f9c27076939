"""A file a follower holds open: read line by line from its offset, with the fingerprint (first
bytes) and the marker (the bytes before the offset) that tell whether it still holds what we read."""
from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable

from cachemon.sources.logs.framing import LineFramer
from cachemon.sources.logs.identity import FP_MAX, MARKER, Ident, Known, digest

log = logging.getLogger("cachemon.logs")


class OpenFile:
    def __init__(self, fd: int, ident: Ident, path: str, offset: int, max_line_bytes: int):
        self.fd = fd
        self.ident = ident
        self.path = path
        self.framer = LineFramer(offset, max_line_bytes)
        self.fp = b""                  # first bytes of the file as we read them
        self.marker = b""              # the MARKER bytes before framer.line_start
        self.marker_at = -1
        self.last_stat: tuple[int, int] = (-1, -1)
        self.gone_since: float | None = None
        self.last_stats_wall: float | None = None   # time we parsed its last stats line
        self.active_at: float | None = None         # poll clock of its last growth (idle close)

    def known(self) -> Known:
        return Known(self.framer.line_start, len(self.fp), digest(self.fp), digest(self.marker), self.current_path())

    def current_path(self) -> str:
        # Linux names the file an fd points at, even after a rename: lets a restart find
        # a rotated file that the glob does not match.
        try:
            p = os.readlink(f"/proc/self/fd/{self.fd}")
            if not p.endswith(" (deleted)"):
                return p
        except OSError:
            pass
        return self.path

    def update_marker(self) -> None:
        at = self.framer.line_start
        if at != self.marker_at:
            lo = max(0, at - MARKER)
            self.marker = os.pread(self.fd, at - lo, lo) if at else b""
            self.marker_at = at

    def replaced(self) -> os.stat_result | None:
        """The file's stat if it no longer holds what we read (truncated, or truncated and rewritten
        past our offset: smaller, other first bytes, or other bytes before our offset); None if it
        does, or is unchanged since the last look."""
        try:
            st = os.fstat(self.fd)
        except OSError:
            return None
        key = (st.st_size, st.st_mtime_ns)
        if key == self.last_stat:
            return None                  # unchanged since the last poll: nothing to verify
        self.last_stat = key
        replaced = st.st_size < self.framer.pos
        if not replaced and self.fp:
            replaced = os.pread(self.fd, len(self.fp), 0) != self.fp
        if not replaced and self.marker_at > 0:
            replaced = os.pread(self.fd, len(self.marker), self.marker_at - len(self.marker)) != self.marker
        return st if replaced else None

    def restart(self) -> None:
        """Read it again from its start (it was replaced)."""
        self.framer.reset(0)
        self.fp = b""
        self.marker, self.marker_at = b"", -1

    def read(self, sink: Callable[[bytes, OpenFile], None], read_size: int, limit: Callable[[], int]) -> int | None:
        """Read on from our offset, handing complete lines to ``sink``, until the end or ``limit()``
        bytes (asked each chunk: it drops at shutdown, mid-read too). Bytes read; None if a read
        failed (logged)."""
        fr, fd = self.framer, self.fd
        total = 0
        while total < limit():
            try:
                data = os.pread(fd, read_size, fr.pos)
            except OSError as e:
                log.warning("reading log %s failed: %s", self.path, e.strerror or e)
                return None
            if not data:
                break
            total += len(data)
            block = fr.feed(data)
            if block:
                sink(block, self)
        if total:
            if len(self.fp) < FP_MAX and fr.pos > len(self.fp):
                head = os.pread(fd, min(FP_MAX, fr.pos), 0)
                if head.startswith(self.fp):
                    self.fp = head
            self.update_marker()
        return total


def copy_of_open_file(fd: int, size: int, files: Iterable[OpenFile]) -> bool:
    """The file at ``fd`` (``size`` bytes) holds a byte prefix of one of ``files`` (a copy in progress)."""
    if size <= 0:
        return False
    for f in files:
        n = min(len(f.fp), size)
        if n <= 0:
            continue
        try:
            if os.fstat(f.fd).st_size < size or os.pread(fd, n, 0) != f.fp[:n]:
                continue
            lo = max(0, size - MARKER)
            if os.pread(fd, size - lo, lo) == os.pread(f.fd, size - lo, lo):
                return True
        except OSError:
            continue
    return False
