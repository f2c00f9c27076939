"""Follow the files behind one configured path or glob, like ``tail -F``, without losing lines.

The poll (``Follower.poll``) is authoritative; file-system events only make it run
sooner (watchdog drops inotify overflows silently). Each poll:

1. for every open file: ``fstat`` it; size below our read position, or first bytes /
   the bytes before our offset no longer what we read -> truncation (copytruncate, or
   truncated and rewritten past our offset between two polls): start over at 0;
2. read every open file to its end (``os.pread`` in chunks of at most max_line_bytes);
3. expand the glob and ``stat`` each path: a path now naming another file than last
   time is a rotation (rename+create, delete+recreate, symlink switch). New files are
   opened: from their start if they appeared after we started, from the end of their
   last complete line on a first start (unless from_beginning), from the saved offset
   if we know them (same device+inode AND same first bytes AND same bytes before the
   offset: inodes get reused);
4. a file no longer matched (renamed away, deleted) stays open and is read for
   ``rotate_wait`` seconds (late writes through the writer's old descriptor), then
   closed and remembered with its offset, so a rotated name that the glob matches
   later resumes instead of being read twice.

Rotated names of the path (``PATH*``: ``server.log.1``, ``server.log-20260101``;
compressed ones excepted) are accounted for by identity, not by time: a file there that
we follow or remember (device+inode, verified by content) resumes at its offset; any
other one is new to us and is read from its start -- a file created and rotated away
while cachemon was down, since its last save, or between two polls. The only time
test left is the history cut-off: files last written before cachemon's very first
start (``history_before``, persisted) are history, never read. This scan runs on the
first poll of every run, after each rotation or truncation, on the poll after a scan
that raced with a rename (a directory listed mid-rotation, a file renamed between its
stat and its open), and every RESCAN_INTERVAL: a file one scan missed is found by the
next one, however late, instead of falling out of a "written since the last scan"
window. Files in the state file are found by device+inode even after a rename.

With a glob that also matches rotated names, a copytruncate copy is recognised by
content: while it is a byte prefix of a followed file it is left alone; once the
original is truncated (or after a restart) it resumes where we had read the original.

Refused files (own output, a foreign owner when running as root, symlinks the mode does not
follow) are checked on the opened descriptor before a byte is read: ``refusals.py``.

A glob or a directory (``paths``: a directory means its ``*.log`` files, as vllm-ascend writes
them) follows a set of files that grows: a new file appearing after the first poll is read
from its start, every other one from where we were. Of such a set, a file unchanged for
IDLE_CLOSE seconds is closed and remembered (offset, size, mtime): it is reopened, and
resumed at its offset, when it grows again, so a directory of hundreds of finished files
does not hold hundreds of descriptors (at most MAX_OPEN: past it, the files read to their end
that grew least recently are closed at once; a restore leaves unchanged files closed). Idle
files are stat'ed every IDLE_RESTAT, not every poll, and the directory is listed again only
when its mtime moves (``discovery.Listing``). Nothing is read twice across the switch to a new
file: the old one keeps its offset, the new one starts at 0.

Beside this file: ``identity.py`` (device+inode plus a fingerprint of the content; the state-file
records), ``memory.py`` (what we remember of files not open), ``openfile.py`` (an open file, read
line by line), ``refusals.py``.
"""
from __future__ import annotations

import logging
import os
import stat as statmod
import time
from collections.abc import Callable

from cachemon.sources.logs.discovery import MTIME_SLACK, Listing
from cachemon.sources.logs.identity import (
    FP_MAX,
    Ident,
    Known,
    StateRecord,
    find_by_ident,
    is_deleted,
    verify,
)
from cachemon.sources.logs.memory import Memory
from cachemon.sources.logs.openfile import OpenFile, copy_of_open_file
from cachemon.sources.logs.paths import is_multi
from cachemon.sources.logs.refusals import Refusals

log = logging.getLogger("cachemon.logs")

READ_SIZE = 1024 * 1024
# Bytes read from one file in one poll: keeps a scrape (which waits for the poll's
# lock) and the state file's cadence bounded while a large backlog is read.
POLL_BUDGET = 32 * 1024 * 1024
# What a shutdown still reads of each file (a SIGTERM must end the process in seconds, state saved:
# the rest is read after the restart, from the saved offsets).
SHUTDOWN_BUDGET = 1024 * 1024
# Remembered files (closed, or from the state file). Over this many, those whose file was
# not under a rotated name at the last scan are forgotten first: forgetting one that is
# still there would make it new again, i.e. read twice.
MAX_KNOWN = 256
# Never more, still there or not (4 096 made 840 of 5 000 files read again after a restart); one
# state-file record each (~190 bytes). Past it, each forgotten file is counted and warned of.
HARD_MAX_KNOWN = 16384
# Scan the rotated names at least this often (seconds of the poll clock).
RESCAN_INTERVAL = 10.0
# A file of a glob or directory unchanged this long (poll clock) is closed until it grows.
IDLE_CLOSE = 30.0
# Size and mtime of idle-closed files, to skip them cheaply (bounded; oldest dropped first).
MAX_IDLE = 65536
# Idle-closed files of a glob or directory are stat'ed this often (seconds of the poll clock), not
# every poll: a file growing again is read at most this late (open files are watched every poll).
IDLE_RESTAT = 1.0
# A glob or directory keeps at most this many files open: past it, the files read to their end
# that grew least recently are closed at once (a first start over hundreds of files, a restore).
MAX_OPEN = 64


class Follower:
    """The files of one configured path. ``sink(block, openfile)`` receives complete lines."""

    def __init__(self, pattern: str, sink: Callable[[bytes, OpenFile], None], *, max_line_bytes: int,
                 rotate_wait: float, initial: str = "end", wall: Callable[[], float] = time.time,
                 expected_owner: tuple[int, int] | None = None, follow_symlinks: bool = False):
        self.pattern = pattern
        self.follow_symlinks = follow_symlinks       # glob / directory: every symlink (see symlink_refusal)
        self.budget_cap = POLL_BUDGET     # bytes a file may be read per poll; SHUTDOWN_BUDGET once stopping
        self.refusals = Refusals(expected_owner)
        self.sink = sink
        self.max_line_bytes = max_line_bytes
        self.read_size = min(READ_SIZE, max_line_bytes)
        self.rotate_wait = rotate_wait
        self.initial = initial            # "end" | "beginning": files present at our first poll
        self.first_poll = True
        self.files: dict[Ident, OpenFile] = {}
        self.memory = Memory()
        self.path_ident: dict[str, Ident] = {}
        self.rotations = 0
        self.truncations = 0
        self.bytes_read = 0
        self.too_long_closed = 0      # too-long lines of files closed since
        self.status: tuple[str, str] | None = None    # (reason, message) while no file is readable
        self._warned: set[tuple[str, Ident]] = set()
        self._raced = False
        self._denied = ""
        # the file system's clock (mtimes), injectable for tests
        self.wall = wall
        self.listing = Listing(pattern, wall)
        self.scanned_at: float | None = None         # wall time of the last scan (informational)
        # Files under a rotated name last written before this (our very first start; kept
        # in the state file) are history; any other file there that we do not know is new.
        self.history_before: float = wall()
        self.rescan_due = True        # scan the rotated names on the next poll
        self.rescanned_at = float("-inf")
        self.present: set[Ident] = set()             # under a rotated name at the last scan
        # glob / directory: several files at once, the idle ones closed until they grow
        self.multi = is_multi(pattern)
        self.idle: dict[Ident, tuple[int, int]] = {}  # idle-closed file -> (size, mtime_ns) then
        self.idle_closes = 0
        self.stats_wall: float | None = None          # last stats line of a file closed since
        self._now = 0.0
        self._seen: set[Ident] = set()                # matched by the last _discover
        self._restat_at = float("-inf")               # poll clock of the last stat of every matched path

    # -- public --------------------------------------------------------------------
    def poll(self, now: float) -> bool:
        """One pass. Returns True if a file still has unread data (budget exhausted)."""
        self._more = False
        self._raced = False
        self._now = now
        turned = self.rotations + self.truncations
        for f in list(self.files.values()):
            self._check_truncation(f)
            self._drain(f)
        if self.multi:
            self._cap_open()
        seen = self._discover()
        if (self.rescan_due or self.rotations + self.truncations != turned
                or now - self.rescanned_at >= RESCAN_INTERVAL):
            # a file may have been created and rotated away since we last looked (while
            # down, a stalled poll, a fast rotation): it is under a rotated name now
            self._scan_rotated_names(now)
        if self._raced:
            self.rescan_due = True
        for ident, f in list(self.files.items()):
            if ident in seen:
                f.gone_since = None
                continue
            if f.gone_since is None:
                f.gone_since = now
            elif now - f.gone_since >= self.rotate_wait:
                self._drain(f, budget=1 << 62)
                self._close(f)
        if self.multi:
            self._close_idle(seen, now)
        self.first_poll = False
        if self.files:
            self.status = None
        elif self._denied:
            self.status = (self._denied_reason, self._denied)
        else:
            self.status = ("missing", f"no file matches {self.pattern}")
        return self._more

    def restore(self, entries: list[StateRecord], scanned_at: float | None = None,
                history_before: float | None = None) -> None:
        """Files from the state file: remember them, and reopen those still at their saved path
        (or renamed within its directory). ``history_before``: the saved history cut-off. A
        state file written before it was kept has only ``scanned_at`` (when the directory was
        scanned before that save): everything older is taken as accounted for, once."""
        if history_before is not None:
            self.history_before = history_before
        elif scanned_at is not None:
            self.history_before = scanned_at
        self.memory.load(entries)
        for ident, k in list(self.known.items()):
            # Reopen outside the glob only with evidence that it is the file we read (we
            # read some of it, and its first bytes and the bytes before the offset agree):
            # an inode number alone may belong to a new file by now.
            if k.path and k.offset > 0 and k.fp_len > 0 and ident not in self.files:
                found = find_by_ident(k.path, ident)
                if found is None or not verify(found[0], k, found[1].st_size):
                    continue
                st = found[1]
                if self.multi and st.st_size == k.offset:
                    # read to its end: idle (no descriptor) until it grows; _discover reopens it then
                    self.idle[ident] = (st.st_size, st.st_mtime_ns)
                else:
                    self._open(found[0], ident, st, drain=False)

    def saved_state(self) -> list[StateRecord]:
        entries = {**self.known, **{i: f.known() for i, f in self.files.items() if not is_deleted(f.fd)}}
        out = [k.record(ident) for ident, k in entries.items()]
        # What we had read of files since truncated: their copytruncate copies, found after
        # a restart, resume there instead of being read again.
        out += [k.truncated_record() for k in self.truncated]
        return out

    @property
    def known(self) -> dict[Ident, Known]:
        return self.memory.known

    @property
    def truncated(self) -> list[Known]:
        return self.memory.truncated

    @property
    def unreadable(self) -> dict[Ident, int]:
        return self.memory.unreadable

    @property
    def refused(self) -> dict[str, int]:
        """reason -> files refused (each file once per reason)."""
        return self.refusals.counts

    @property
    def refused_paths(self) -> set[str]:
        """Refused files: their file-system events must not wake the poll."""
        return self.refusals.paths

    def _refused(self, reason: str) -> bool:
        """A refusal (``reason`` not empty) is what the status says while no file is readable."""
        if reason:
            self._denied, self._denied_reason = self.refusals.last
        return bool(reason)

    def close(self) -> None:
        for f in list(self.files.values()):
            self._close(f)

    def last_stats_wall(self) -> float | None:
        """When a stats line of any of the files was last parsed (None: never)."""
        walls = [f.last_stats_wall for f in self.files.values() if f.last_stats_wall is not None]
        if self.stats_wall is not None:
            walls.append(self.stats_wall)
        return max(walls) if walls else None

    def _close_idle(self, seen: set[Ident], now: float) -> None:
        """Close the matched files unchanged for IDLE_CLOSE (a glob or directory of many
        finished files); ``_discover`` reopens one when its size or mtime moves."""
        for ident, f in list(self.files.items()):
            if ident not in seen:
                continue                    # rotated away: rotate_wait applies
            if f.active_at is None:
                f.active_at = now
            if now - f.active_at >= IDLE_CLOSE:
                self._idle_close(f)

    def _cap_open(self) -> None:
        """At most MAX_OPEN files of a glob or directory open: close the least recently grown
        of those read to their end."""
        if len(self.files) <= MAX_OPEN:
            return
        order = sorted(self.files.values(), key=lambda f: (f.active_at is not None, f.active_at or 0.0))
        for f in order:
            if len(self.files) <= MAX_OPEN:
                break
            if f.gone_since is None:
                self._idle_close(f)

    def _idle_close(self, f: OpenFile) -> bool:
        """Close a file read to its end (at a line boundary), remembering its size and mtime:
        it stays closed while both stay the same. False if it has more to read."""
        try:
            st = os.fstat(f.fd)
        except OSError:
            return False
        if st.st_nlink == 0 or f.framer.pos != st.st_size or f.framer.line_start != f.framer.pos:
            return False                    # deleted (rotate_wait), unread data, or a partial last line
        self._close(f)
        self.idle[f.ident] = (st.st_size, st.st_mtime_ns)
        self.idle_closes += 1
        while len(self.idle) > MAX_IDLE:
            self.idle.pop(next(iter(self.idle)))
        return True

    # -- discovery -------------------------------------------------------------------
    def _unchanged_idle(self, ident: Ident, st: os.stat_result) -> bool:
        return self.idle.get(ident) == (st.st_size, st.st_mtime_ns)

    def _scan_rotated_names(self, now: float) -> None:
        """Open every file under a rotated name of the pattern that may hold lines we have
        not counted: one we remember with more bytes than we read (or other content), or
        one we do not know that was written since ``history_before``. Not matched by the
        pattern, they are read to their end and closed after rotate_wait, like any
        rotated file. A scan that raced with a rename is repeated on the next poll."""
        self.rescan_due = False
        self.rescanned_at = now
        present: set[Ident] = set()
        for path in self.listing.rotated_names():
            # a glob match, whatever the mode (the configured path itself is followed as named)
            if not self.follow_symlinks and path != self.pattern and self._refused(self.refusals.link(path)):
                continue
            try:
                st = os.stat(path)
            except FileNotFoundError:
                self._raced = True          # renamed since the listing: it is elsewhere now
                continue
            except OSError:
                continue
            ident = (st.st_dev, st.st_ino)
            if not statmod.S_ISREG(st.st_mode):
                continue
            present.add(ident)
            if ident in self.files or self._unchanged_idle(ident, st):
                continue
            k = self.known.get(ident)
            if k is not None:
                if st.st_size == k.offset and verify(path, k, st.st_size):
                    continue                # read to its end, unchanged
            elif st.st_mtime < self.history_before - MTIME_SLACK:
                continue                    # there before our very first start: history
            log.log(logging.DEBUG if k is not None else logging.INFO,
                    "log %s (a rotated name) holds lines we have not read: reading it", path)
            self._open(path, ident, st, written_since_start=True)
            if self.multi:
                self._cap_open()
        self.present = present

    def _discover(self) -> set[Ident]:
        seen: set[Ident] = set()
        self.scanned_at = self.wall()
        self._denied, self._denied_reason = "", "permission"
        found = []
        # idle-closed files are stat'ed every IDLE_RESTAT only (a directory of hundreds of
        # finished files): until then their path is taken to name the same, unchanged file
        full = not self.multi or self._now - self._restat_at >= IDLE_RESTAT
        if full:
            self._restat_at = self._now
        paths = self.listing.paths()
        for path in paths:
            prev = self.path_ident.get(path)
            if not full and prev is not None and prev in self.idle:
                seen.add(prev)
                continue
            if self.multi and not self.follow_symlinks and self._refused(self.refusals.link(path)):
                continue
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue
            except OSError as e:
                self._denied = f"cannot stat {path}: {e.strerror or e}"
                continue
            if not statmod.S_ISREG(st.st_mode):
                continue
            ident = (st.st_dev, st.st_ino)
            if prev is not None and prev != ident:
                self.rotations += 1
                log.info("log %s rotated (now another file)", path)
            self.path_ident[path] = ident
            seen.add(ident)
            found.append((path, ident, st))
        if full and self.multi and len(self.path_ident) > len(paths):
            current = set(paths)           # forget the names gone (a directory only grows otherwise)
            self.path_ident = {p: i for p, i in self.path_ident.items() if p in current}
        # All identities first: a remembered file that is no longer here may have a copy
        # here. Remembered files are reopened first, so one found truncated is a
        # candidate for its copy among the new files.
        self._seen = seen
        found.sort(key=lambda x: x[1] not in self.known)
        for path, ident, st in found:
            f = self.files.get(ident)
            if f is not None:
                f.path = path
            elif not self._unchanged_idle(ident, st):
                self.idle.pop(ident, None)
                self._open(path, ident, st)
                if self.multi:
                    self._cap_open()
        return seen

    def _start_offset(self, fd: int, ident: Ident, st: os.stat_result, written_since_start: bool = False) -> int:
        offset, replaced = self.memory.resume(fd, ident, st, self._seen)
        if replaced:
            self.truncations += 1
        if offset is not None:
            return offset
        if not replaced and self.first_poll and self.initial == "end" and not written_since_start:
            return st.st_size
        return 0

    def _open(self, path: str, ident: Ident, st: os.stat_result, drain: bool = True,
              written_since_start: bool = False) -> OpenFile | None:
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            self._raced = True              # renamed between its stat and its open
            if ident not in self.unreadable:
                self.unreadable[ident] = st.st_size if (
                    self.first_poll and self.initial == "end" and not written_since_start) else 0
            return None
        except OSError as e:
            self._denied = f"cannot open {path}: {e.strerror or e}"
            if ident not in self.unreadable:
                # decided now (first sight), applied once it can be opened: lines written
                # while it was unreadable are not lost
                self.unreadable[ident] = st.st_size if (self.first_poll and self.initial == "end") else 0
            if (path, ident) not in self._warned:
                self._warned.add((path, ident))
                log.warning("cannot open log %s: %s; retrying every poll", path, e.strerror or e)
            return None
        fst = os.fstat(fd)
        if (fst.st_dev, fst.st_ino) != ident:       # replaced between stat and open: next poll
            os.close(fd)
            self._raced = True
            return None
        if self._refused(self.refusals.check(path, ident, fst)):
            os.close(fd)
            return None
        if ident not in self.known and copy_of_open_file(fd, fst.st_size, self.files.values()):
            # a copy (in progress) of a file we follow, e.g. logrotate copytruncate with a
            # glob that matches the copy: its lines come from the original; once that is
            # truncated, the copy matches what we had read and is resumed from there
            os.close(fd)
            return None
        offset = self._start_offset(fd, ident, fst, written_since_start)
        f = OpenFile(fd, ident, path, offset, self.max_line_bytes)
        if offset > 0 and os.pread(fd, 1, offset - 1) not in (b"\n", b"\x00"):
            # started inside a line (from the end of a file being written): drop its tail.
            # A NUL before the offset is a skipped hole, i.e. a line start.
            f.framer.discarding = True
        f.fp = os.pread(fd, min(FP_MAX, max(offset, 0)), 0) if offset else b""
        f.update_marker()
        self.files[ident] = f
        self.idle.pop(ident, None)     # open now: watched every poll
        if drain:
            self._drain(f)
        return f

    def _close(self, f: OpenFile) -> None:
        self.too_long_closed += f.framer.too_long
        if f.last_stats_wall is not None and (self.stats_wall is None or f.last_stats_wall > self.stats_wall):
            self.stats_wall = f.last_stats_wall
        if not is_deleted(f.fd):
            # a deleted file cannot come back, but its inode number can (on a new file)
            self.known[f.ident] = f.known()
        # still matched, under a rotated name, or closed idle: forgetting it would read it again
        self.memory.trim(self.present | self._seen | self.idle.keys(), MAX_KNOWN, HARD_MAX_KNOWN, self.pattern)
        self.files.pop(f.ident, None)
        try:
            os.close(f.fd)
        except OSError:
            pass

    # -- truncation ------------------------------------------------------------------------
    def _check_truncation(self, f: OpenFile) -> None:
        st = f.replaced()
        if st is not None:
            self.memory.remember_content(f.known())
            self.truncations += 1
            log.info("log %s truncated (size %d, we had read %d bytes): reading it from the start",
                     f.path, st.st_size, f.framer.pos)
            f.restart()

    # -- reading -----------------------------------------------------------------------
    def _drain(self, f: OpenFile, budget: int | None = None) -> bool:
        budget = POLL_BUDGET if budget is None else budget
        total = f.read(self.sink, self.read_size, lambda: min(budget, self.budget_cap))
        if total is None:
            return False
        if total:
            self.bytes_read += total
            f.active_at = self._now
        if total >= budget or total >= self.budget_cap:
            self._more = True
        return total >= budget or total >= self.budget_cap
