"""Bytes read from a file -> blocks of complete lines, with bounded memory.

The framer never splits work per line: it hands back one ``bytes`` block that ends
with ``\\n`` per read, and the caller counts lines with ``block.count(b"\\n")`` and
looks for candidate lines with substring searches (see ``candidates``). The bytes
after the last newline wait in ``pending`` until their newline arrives, and
``line_start`` (the file offset where ``pending`` starts) is the only offset that is
ever persisted, so a partial line that spans a restart is read, and counted, once.

A line longer than ``max_line_bytes`` is dropped as it streams past (counted as
too_long, never parsed: its numbers may be cut). Leading NUL bytes at a line start are
skipped: a writer without O_APPEND leaves a NUL-filled hole after copytruncate.
Reads must be at most ``max_line_bytes`` long: then a too-long line always spans a
read and is caught here, without measuring every line.
"""
from __future__ import annotations

from collections.abc import Iterator


class LineFramer:
    __slots__ = ("max_line_bytes", "pending", "line_start", "pos", "discarding", "too_long", "nul_bytes")

    def __init__(self, offset: int, max_line_bytes: int):
        self.max_line_bytes = max_line_bytes
        self.pending = b""
        self.line_start = offset     # file offset of the first byte not yet consumed as a line
        self.pos = offset            # file offset of the next byte to read
        self.discarding = False      # inside a too-long line, dropping bytes until its newline
        self.too_long = 0
        self.nul_bytes = 0

    def reset(self, offset: int) -> None:
        """Start over at ``offset`` (truncation): the partial line is gone with the old content."""
        self.pending = b""
        self.line_start = self.pos = offset
        self.discarding = False

    def feed(self, data: bytes) -> bytes:
        """Add bytes read at ``self.pos``; return the complete lines they finish (maybe b"")."""
        start = self.pos
        self.pos += len(data)
        nl = data.rfind(b"\n")
        if nl < 0:
            self._hold(data, start)
            return b""
        head, tail = data[: nl + 1], data[nl + 1:]
        if self.discarding:
            # the too-long line ends at the first newline; it was counted when it overflowed
            head = head[head.find(b"\n") + 1:]
            self.discarding = False
        elif self.pending:
            first = head.find(b"\n")
            if len(self.pending) + first > self.max_line_bytes:
                self.too_long += 1
                head = head[first + 1:]
            else:
                head = self.pending + head
            self.pending = b""
        if head[:1] == b"\x00":
            n = len(head)
            head = head.lstrip(b"\x00")
            self.nul_bytes += n - len(head)
        self.line_start = start + nl + 1
        self._hold(tail, self.line_start)
        return head

    def _hold(self, data: bytes, at: int) -> None:
        if self.discarding or not data:
            return
        if not self.pending and data[:1] == b"\x00":
            n = len(data)
            data = data.lstrip(b"\x00")
            self.nul_bytes += n - len(data)
            self.line_start = at + (n - len(data))
            if not data:
                return
        if len(self.pending) + len(data) > self.max_line_bytes:
            self.too_long += 1
            self.pending = b""
            self.discarding = True
            return
        self.pending += data


def candidates(block: bytes, needles: tuple[bytes, ...]) -> Iterator[tuple[int, int]]:
    """Yield (start, end) of each line of ``block`` that contains one of ``needles``, in order.

    Substring search runs in C over the whole block, so lines without a needle cost
    nothing in Python: this is what makes the tailer fast on ordinary log lines.
    """
    found: dict[int, int] = {}
    find, rfind = block.find, block.rfind
    for needle in needles:
        i = find(needle)
        while i >= 0:
            s = rfind(b"\n", 0, i) + 1
            e = find(b"\n", i)
            if e < 0:
                e = len(block)
            found[s] = e
            i = find(needle, e)
    for s in sorted(found):
        yield s, found[s]
