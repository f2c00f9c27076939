"""Which file is which. Identity is (st_dev, st_ino) plus a fingerprint: the first bytes (up to 1 KiB,
growing with the file, as Grafana Alloy does) and a hash of the 32 bytes before the
offset (Fluent Bit's offset marker). Only hashes of them are persisted.

A file read before is a ``Known`` (its offset and fingerprint hashes), saved in the state file as a
``StateRecord``; an open one is an ``openfile.OpenFile``. The content checks compare a descriptor with a
``Known`` by those hashes."""
from __future__ import annotations

import hashlib
import os
import stat as statmod
from dataclasses import dataclass
from typing import TypedDict

Ident = tuple[int, int]
FP_MAX = 1024
MARKER = 32


class StateRecord(TypedDict):
    """One file in the state file: where we were, and hashes of its bytes (never the bytes)."""
    dev: int
    ino: int
    offset: int
    fp_len: int
    fp_sha: str
    marker_sha: str
    path: str


class TruncatedRecord(StateRecord):
    """What we had read of a file since truncated (dev = ino = 0): its copy resumes there."""
    truncated: bool


def digest(b: bytes) -> str:
    return hashlib.sha1(b).hexdigest()


@dataclass
class Known:
    """A file we read before (closed now, or from the state file)."""
    offset: int
    fp_len: int
    fp_sha: str
    marker_sha: str
    path: str = ""


    def record(self, ident: Ident) -> StateRecord:
        return {"dev": ident[0], "ino": ident[1], "offset": self.offset, "fp_len": self.fp_len,
                "fp_sha": self.fp_sha, "marker_sha": self.marker_sha, "path": self.path}

    def truncated_record(self) -> TruncatedRecord:
        return {"dev": 0, "ino": 0, "offset": self.offset, "fp_len": self.fp_len, "fp_sha": self.fp_sha,
                "marker_sha": self.marker_sha, "path": self.path, "truncated": True}

    @classmethod
    def from_record(cls, e: StateRecord) -> Known:
        """A record read back from the state file (checked for shape by statefile.shape_problem)."""
        return cls(int(e["offset"]), int(e["fp_len"]), str(e["fp_sha"]), str(e["marker_sha"]), str(e.get("path", "")))



def is_deleted(fd: int) -> bool:
    try:
        return os.fstat(fd).st_nlink == 0
    except OSError:
        return True


def find_by_ident(path: str, ident: Ident, max_entries: int = 10000) -> tuple[str, os.stat_result] | None:
    """(path, stat) of the file ``ident`` at ``path`` or, if it was renamed while we were
    stopped (logrotate renames within the directory), elsewhere in the same directory."""
    try:
        st = os.stat(path)
        if (st.st_dev, st.st_ino) == ident and statmod.S_ISREG(st.st_mode):
            return path, st
    except OSError:
        pass
    try:
        with os.scandir(os.path.dirname(path) or ".") as it:
            for i, entry in enumerate(it):
                if i >= max_entries:
                    break
                if entry.inode() == ident[1]:
                    st = os.stat(entry.path)
                    if (st.st_dev, st.st_ino) == ident and statmod.S_ISREG(st.st_mode):
                        return entry.path, st
    except OSError:
        pass
    return None


def prefix_matches(fd: int, k: Known) -> bool:
    return digest(os.pread(fd, k.fp_len, 0)) == k.fp_sha if k.fp_len else True


def verify(path: str, k: Known, size: int) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return False
    try:
        return same_content(fd, k, size)
    finally:
        os.close(fd)


def same_content(fd: int, k: Known, size: int) -> bool:
    if size < k.offset or not prefix_matches(fd, k):
        return False
    lo = max(0, k.offset - MARKER)
    return digest(os.pread(fd, k.offset - lo, lo)) == k.marker_sha
