"""Counters that keep increasing across upstream restarts.

vLLM's counters restart from 0 with the process. cachemon exposes
``offset + raw``: on a restart the last raw value seen is folded into the offset,
so the exported counter never goes down while cachemon runs. Increments between
the last poll before a restart and the restart itself are unavoidably lost; the
short poll interval keeps that gap small.
"""
from __future__ import annotations


class ResetCorrectedCounter:
    __slots__ = ("offset", "last_raw")

    def __init__(self, raw: float):
        # First sight: export vLLM's own value, so the two agree exactly.
        self.offset = 0.0
        self.last_raw = raw

    @property
    def value(self) -> float:
        return self.offset + self.last_raw

    def observe(self, raw: float) -> None:
        self.last_raw = raw

    def fold_restart(self) -> None:
        """The upstream restarted: whatever it counts from now on starts at 0."""
        self.offset += self.last_raw
        self.last_raw = 0.0
