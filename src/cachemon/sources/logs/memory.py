"""What a follower remembers of files it does not hold open, and where a file it opens resumes.

``known``: files read before (closed, or from the state file), by device+inode; ``truncated``: what
we had read of files since truncated (their copytruncate copies resume there); ``unreadable``: files
seen but not openable yet, with the offset decided at first sight. A file is matched to what we
remember by identity and content (``identity.same_content``), never by inode number alone: inodes
get reused."""
from __future__ import annotations

import logging
import os
from collections.abc import Iterable

from cachemon.sources.logs.identity import Ident, Known, StateRecord, same_content

TRUNCATED_KEPT = 8

log = logging.getLogger("cachemon.logs")


class Memory:
    def __init__(self) -> None:
        self.known: dict[Ident, Known] = {}
        self.unreadable: dict[Ident, int] = {}       # seen, cannot open (yet): offset to start at
        self.truncated: list[Known] = []             # what we had read of files since truncated
        self.forgotten = 0                           # files still there forgotten by ``trim``'s hard bound

    def load(self, records: Iterable[StateRecord]) -> None:
        """The files of the state file (records checked for shape by statefile.shape_problem)."""
        for e in records:
            ident = (int(e["dev"]), int(e["ino"]))
            if int(e["fp_len"]) <= 0 or int(e["offset"]) <= 0:
                continue               # nothing consumed from it: no evidence, nothing to resume
            k = Known.from_record(e)
            if e.get("truncated") is True:
                self.remember_content(k)      # a copy of it found later resumes at k.offset
            else:
                self.known[ident] = k

    def remember_content(self, k: Known) -> None:
        if k.offset > 0 and k.fp_len > 0:
            self.truncated.append(k)
            del self.truncated[:-TRUNCATED_KEPT]

    def resume(self, fd: int, ident: Ident, st: os.stat_result, seen: set[Ident]) -> tuple[int | None, bool]:
        """(where the file at ``fd`` resumes, None when we remember nothing of it; whether its inode
        now holds other content than we read: truncated, or the inode reused). ``seen``: the
        identities matched by the pattern now (a remembered file among them is not a copy)."""
        k = self.known.pop(ident, None)
        replaced = False
        # A file we consumed nothing from gives no evidence beyond an inode number, which
        # may be reused: treat it as new (which also reads it from its start).
        if k is not None and k.offset > 0 and k.fp_len > 0:
            if same_content(fd, k, st.st_size):
                return k.offset, False
            # same inode, other content: truncated (or the inode was reused) while we
            # were not reading it
            self.remember_content(k)
            replaced = True
        if ident in self.unreadable:
            return self.unreadable.pop(ident), replaced
        # A file holding exactly what we read from a file that was then truncated is its
        # copytruncate copy (the glob matches rotated names): go on from where we were,
        # which reads the lines the truncate took from us, and nothing twice.
        for i, c in enumerate(self.truncated):
            if same_content(fd, c, st.st_size):
                del self.truncated[i]
                return c.offset, replaced
        # ... the same for a copy of a remembered file that is gone (e.g. copied, then
        # deleted while we were stopped)
        for kid, c in list(self.known.items()):
            if kid not in seen and c.offset > 0 and c.fp_len > 0 and same_content(fd, c, st.st_size):
                del self.known[kid]
                return c.offset, replaced
        return None, replaced

    def trim(self, keep: set[Ident], soft: int, hard: int, pattern: str) -> None:
        """Over ``soft`` remembered files, forget those not in ``keep`` first (forgetting one that is
        still there would make it new again, i.e. read twice); never more than ``hard``: the files of
        ``keep`` forgotten then are counted in ``forgotten`` and warned of (the first, then each 10x)."""
        known = self.known
        if len(known) > soft:
            for ident in [i for i in known if i not in keep][:len(known) - soft]:
                del known[ident]
        before = self.forgotten
        while len(known) > hard:
            ident = next(iter(known))
            del known[ident]
            self.forgotten += ident in keep
        if self.forgotten > before and (before == 0 or len(str(before)) < len(str(self.forgotten))):
            log.warning("%s: more than %d files remembered; %d still matched are forgotten so far and will be "
                        "read again from their start after a restart (their lines counted twice): keep fewer "
                        "files under the glob or directory", pattern, hard, self.forgotten)
