"""The log source's state file: read offsets and the counters derived from the lines
before them, in ONE snapshot, replaced atomically.

Write: temp file in the same directory, fsync, ``os.replace``, fsync the directory.
A crash at any point leaves either the old or the new snapshot, never a mix: each is
self-consistent (offset and counters agree), so resuming from either counts every
line exactly once. One process owns a state file at a time: ``StateLock`` holds an
exclusive ``flock`` on ``<state>.lock`` (not on the state file, which each save replaces),
so a second cachemon on it refuses to start instead of taking the first one's offsets.
A lock path that is a symlink is refused (it could be shared with, or swapped by, anyone), and
the lock is re-checked before each save: a lock file (or state directory) removed under a running
cachemon lets a second one lock a new file beside it, so a save first makes sure the file at the
path is still the one locked (re-taking it if the path is free) and, if another process holds it
now, stops writing the state for good, loudly, instead of both writing it.
A leftover temp file is ignored and removed (it may be half written; the stable file is
complete). The payload carries a SHA-256 so a file that parses as JSON but was damaged is
still rejected.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import math
import os
import stat
import time
from collections.abc import Mapping
from pathlib import Path
from typing import cast

from cachemon.config import ConfigError, read_small_file
from cachemon.sources.logs.state_doc import StatePayload

SCHEMA = "cachemon-log-state/1"
# Far above what the tailer writes (at most HARD_MAX_KNOWN files per source, ~200 bytes each: 3 MiB).
MAX_STATE_BYTES = 64 * 1024 * 1024
_replace = os.replace        # the commit point of a save (tests simulate a crash just before it)


log = logging.getLogger("cachemon.logs")


class StateError(Exception):
    """The state file exists but cannot be used (unreadable, corrupt, other schema)."""


class StateLocked(Exception):
    """Another process holds the state file's lock."""


class StateLock:
    """An exclusive lock on ``<state>.lock``, held for the life of the process (the kernel drops it
    when the process dies, so a crash never leaves a stale lock). A lock file that cannot be created
    (a read-only directory) is logged and skipped: the saves then fail and are counted. A symlink
    there is refused (StateLocked). ``held`` re-checks it before each save."""

    def __init__(self, path: Path) -> None:
        self.state = path
        self.path = path.with_name(path.name + ".lock")
        self.fd: int | None = None
        self.lost = ""          # why the lock is no longer ours (then nothing may write the state)
        try:
            self.fd = self._take()
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise StateLocked(f"the state file's lock {self.path} is a symlink: refused (a lock must be "
                                  "this cachemon's own file; remove the link)") from None
            log.warning("cannot create or lock the state file's lock %s: %s; running without it", self.path,
                        e.strerror or e)

    def _take(self) -> int:
        """Create (if need be) and lock the lock file; its read-only descriptor. StateLocked if
        another process holds it; OSError if it cannot be created or locked."""
        self.state.parent.mkdir(parents=True, exist_ok=True)
        wfd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
        try:
            # the lock is held on a read-only descriptor: an open writer would keep the file
            # system from being remounted read-only under us
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                holder = _read_pid(fd)
                os.close(fd)
                if e.errno in (errno.EWOULDBLOCK, errno.EACCES):
                    raise StateLocked(f"{self.state} is in use by another cachemon"
                                      f"{f' (pid {holder})' if holder else ''}: each cachemon needs its own "
                                      "state file (--state-file / logs.state_file)") from None
                raise
            try:
                os.ftruncate(wfd, 0)
                os.write(wfd, f"{os.getpid()}\n".encode())
            except OSError:
                pass       # the pid is only a hint for the refusal message
            return fd
        finally:
            os.close(wfd)

    def held(self) -> bool:
        """Whether the file at the lock's path is still the one this process locked. If it was
        removed (or its directory was), it is taken again when nobody else has; if another process
        holds the file there now, the lock is lost for good (``lost`` says why)."""
        if self.fd is None or self.lost:
            return not self.lost
        try:
            mine, there = os.fstat(self.fd), os.lstat(self.path)
            if (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino):
                return True
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("cannot check the state file's lock %s: %s", self.path, e.strerror or e)
            return True     # an unreadable path is not another holder; the save will say more
        try:
            fd = self._take()
        except StateLocked as e:
            self.lost = (f"its lock file {self.path} was removed or replaced while this cachemon ran, and "
                         f"another process locked the new one ({e})")
            return False
        except OSError as e:
            if e.errno == errno.ELOOP:
                self.lost = f"its lock file {self.path} was replaced by a symlink while this cachemon ran"
                return False
            log.warning("the state file's lock %s was removed and cannot be re-created: %s", self.path,
                        e.strerror or e)
            return True
        os.close(self.fd)
        self.fd = fd
        log.warning("the state file's lock %s was removed while this cachemon ran: re-created and locked",
                    self.path)
        return True

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)        # closing drops the flock
            self.fd = None


def _read_pid(fd: int) -> str:
    try:
        raw = os.pread(fd, 16, 0).decode("ascii", "replace").strip()
    except OSError:
        return ""
    return raw if raw.isdigit() else ""


def _canonical(payload: Mapping[str, object]) -> bytes:
    return json.dumps(payload, sort_keys=True, separators=(",", ":")).encode("utf-8")


def tmp_path(path: Path) -> Path:
    return path.with_name(path.name + ".tmp")


def save(path: Path, payload: StatePayload) -> None:
    """Atomically replace the state file. Raises OSError (caller logs and retries later)."""
    body = _canonical(payload)
    doc = {"schema": SCHEMA, "saved_at": time.time(), "sha256": hashlib.sha256(body).hexdigest(),
           "payload": payload}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_path(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        data = json.dumps(doc, sort_keys=True).encode("utf-8")
        view = memoryview(data)
        while view:               # a short write (a nearly full disk) is not a complete file
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except OSError:
        os.close(fd)
        _unlink_quietly(tmp)      # a full disk: give the space back; the stable file is untouched
        raise
    os.close(fd)
    _replace(tmp, path)
    try:
        dfd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)      # make the rename itself durable
    except OSError:
        pass
    finally:
        os.close(dfd)


def _unlink_quietly(p: Path) -> None:
    try:
        p.unlink()
    except OSError:
        pass


def set_aside(path: Path) -> Path | None:
    """Move an unusable state file to ``<state>.corrupt`` (a regular file only), so the next save
    does not overwrite the offsets it may still hold for a person to recover. Returns where."""
    aside = path.with_name(path.name + ".corrupt")
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None
        os.replace(path, aside)
    except OSError:
        return None
    return aside


def load(path: Path) -> StatePayload | None:
    """The saved payload; None if there is no state file yet. Raises StateError if unusable."""
    tmp = tmp_path(path)
    if tmp.exists():
        try:
            tmp.unlink()          # an interrupted save: the stable file is the consistent one
        except OSError:
            pass
    if not os.path.lexists(path):
        return None
    try:     # the path is configurable (logs.state_file): /dev/zero or a FIFO there must not hang us
        raw = read_small_file(path, "", MAX_STATE_BYTES, what="log state file")
    except ConfigError as e:
        raise StateError(str(e)) from None
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise StateError(f"{path} is not valid JSON ({len(raw)} bytes)") from None
    except RecursionError:      # json's decoder recurses per nesting level; save never nests deeply
        raise StateError(f"{path} is not a state file: JSON nested too deeply ({len(raw)} bytes)") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise StateError(f"{path} is not a {SCHEMA} file")
    payload = doc.get("payload")
    if not isinstance(payload, dict) or hashlib.sha256(_canonical(payload)).hexdigest() != doc.get("sha256"):
        raise StateError(f"{path}: checksum mismatch (damaged file)")
    problem = shape_problem(payload)
    if problem:
        raise StateError(f"{path}: checksum valid but content unusable: {problem}")
    return cast(StatePayload, payload)     # the shape shape_problem checked


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _is_num(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


_FILE_INTS = ("dev", "ino", "offset", "fp_len")
_FILE_STRS = ("fp_sha", "marker_sha")


def shape_problem(payload: Mapping[str, object]) -> str | None:
    """Why a payload does not have the shape ``save`` writes (None if it does). A checksum only
    proves the file is what was written; a bug or a hand edit re-hashed can still be the wrong
    type, and restoring it would crash the source or restore wrong counters."""
    sources = payload.get("sources")
    if not isinstance(sources, dict):
        return "'sources' is not a mapping"
    for name, src in sources.items():
        where = f"sources.{name}"
        if not isinstance(src, dict) or not isinstance(src.get("stream"), dict) or not isinstance(src.get("files"), list):
            return f"{where}: expected {{stream: mapping, files: list}}"
        counters = src["stream"].get("counters", [])
        if not isinstance(counters, list) or not all(
                isinstance(c, list) and len(c) == 3 and isinstance(c[0], str) and isinstance(c[1], list)
                and all(isinstance(x, str) for x in c[1]) and _is_num(c[2]) for c in counters):
            return f"{where}.stream.counters: expected [[metric, [label, ...], value >= 0], ...]"
        engines = src["stream"].get("engine_last", {})
        if not isinstance(engines, dict) or not all(
                isinstance(v, list) and len(v) == 3 and _is_num(v[0]) and isinstance(v[1], str)
                and isinstance(v[2], list) and all(_is_num(g) for g in v[2]) for v in engines.values()):
            return f"{where}.stream.engine_last: expected {{engine: [time, pid, [gaps]]}}"
        lines = src["stream"].get("lines", {})
        if not isinstance(lines, dict) or not all(isinstance(k, str) and _is_int(v) for k, v in lines.items()):
            return f"{where}.stream.lines: expected {{outcome: count >= 0}}"
        for i, f in enumerate(src["files"]):
            if (not isinstance(f, dict) or not all(_is_int(f.get(k)) for k in _FILE_INTS)
                    or not all(isinstance(f.get(k), str) for k in _FILE_STRS)
                    or not isinstance(f.get("path", ""), str)):
                return f"{where}.files[{i}]: expected integers {', '.join(_FILE_INTS)} and strings {', '.join(_FILE_STRS)}"
    return None
