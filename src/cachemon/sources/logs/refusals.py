"""Refused files (``Refusals.check``), checked on the opened descriptor before a byte is read:
cachemon's own output (its stdout, stderr or a log handler's file: tailing it with debug logging
is a feedback loop), and, when running as root, a file the service user could not read (see
``foreign_owner``). Each is said once per file and counted by reason."""
from __future__ import annotations

import logging
import os
import stat as statmod

from cachemon.sources.logs.identity import Ident
from cachemon.sources.logs.paths import symlink_refusal

OWN_OUTPUT = "own_output"
FOREIGN_OWNER = "foreign_owner"
SYMLINK = "symlink"
# the reasons a file is refused for: each said once per file here (Refusals.refuse), so a caller that
# reports the source's status says nothing more of them
REFUSAL_REASONS = frozenset({OWN_OUTPUT, FOREIGN_OWNER, SYMLINK})

log = logging.getLogger("cachemon.logs")


def own_output_idents() -> set[Ident]:
    """(st_dev, st_ino) of every regular file cachemon writes its own log lines to: fds 1 and 2
    (a shell's ``2>>file``) and the files of the logging handlers (``logging.FileHandler``)."""
    fds = {1, 2}
    for lg in (logging.getLogger(), log):
        for h in lg.handlers:
            stream = getattr(h, "stream", None)
            try:
                if stream is not None:
                    fds.add(stream.fileno())
            except (OSError, ValueError, AttributeError):   # StringIO, closed stream
                pass
    out: set[Ident] = set()
    for fd in fds:
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if statmod.S_ISREG(st.st_mode):
            out.add((st.st_dev, st.st_ino))
    return out


def foreign_owner(st: os.stat_result, path: str, expected: tuple[int, int] | None) -> str:
    """Why root must not read this file for the service ("" if it may).

    Running as root, the kernel's permission check says yes to everything, so a log symlink
    switched to another user's 0600 file would be read, and rule matches exported as labels. The
    file is accepted if it is owned by the expected owner (``logs.expected_owner``, else the owner
    of the directory the configured path is in), or readable by everyone, or readable by its group
    when that is the expected owner's group."""
    if os.geteuid() != 0:
        return ""                   # the kernel already refuses what we may not read
    where = "logs.expected_owner"
    if expected is None:
        d = os.path.dirname(path) or "."
        try:
            dst = os.stat(d)
        except OSError:
            return ""
        expected, where = (dst.st_uid, dst.st_gid), f"the owner of {d}"
    uid, gid = expected
    if st.st_uid == uid or st.st_mode & statmod.S_IROTH or (st.st_mode & statmod.S_IRGRP and st.st_gid == gid):
        return ""
    return (f"owned by uid {st.st_uid} gid {st.st_gid} with mode {statmod.S_IMODE(st.st_mode):04o}: the service user "
            f"(uid {uid}, {where}) could not read it, and running as root we would")


class Refusals:
    """The files of one configured path that must not be read: each said once per file and reason,
    and counted by reason. ``last`` is (message, reason) of the latest refusal (the follower's status)."""

    def __init__(self, expected_owner: tuple[int, int] | None):
        self.expected_owner = expected_owner
        self.counts: dict[str, int] = {}             # reason -> files refused (each file once per reason)
        self._seen: set[tuple[Ident, str]] = set()
        self.paths: set[str] = set()                 # their file-system events must not wake the poll
        self.last = ("", "")

    def link(self, path: str) -> str:
        """A symlink the mode does not follow: its refusal reason ("" when it may be read)."""
        try:
            lst = os.lstat(path)
        except OSError:
            return ""                # gone: the stat that follows says so
        if not statmod.S_ISLNK(lst.st_mode):
            return ""
        why = symlink_refusal(path)
        return self.refuse(path, (lst.st_dev, lst.st_ino), SYMLINK, why) if why else ""

    def check(self, path: str, ident: Ident, st: os.stat_result) -> str:
        """The reason this file must not be read ("" if it may); said once per file and reason."""
        if ident in own_output_idents():
            reason, why = OWN_OUTPUT, ("it is cachemon's own output (its stdout, stderr or log file): tailing it "
                                         "would read cachemon's own lines")
        else:
            why = foreign_owner(st, path, self.expected_owner)
            reason = FOREIGN_OWNER if why else ""
        if not reason:
            return ""
        return self.refuse(path, ident, reason, why)

    def refuse(self, path: str, ident: Ident, reason: str, why: str) -> str:
        self.last = (f"refused {path}: {why}", reason)
        self.paths.add(os.path.abspath(path))
        if (ident, reason) not in self._seen:
            self._seen.add((ident, reason))
            self.counts[reason] = self.counts.get(reason, 0) + 1
            log.warning("log %s not read: %s", path, why)
        return reason
