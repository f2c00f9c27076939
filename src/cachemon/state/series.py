"""Per-series state: what reset correction, staleness and the cardinality guard read.

vLLM's counters restart from 0 with their process. cachemon exports, per source series,
``offset + last_raw``: when that series restarts, its last raw value is folded into its
offset, so the corrected value never goes down while cachemon runs. An exported series
is the sum of its source series' corrected values. Increments between the last poll
before a restart and the restart itself are unavoidably lost; the short poll interval
keeps that gap small.
"""
from __future__ import annotations

from dataclasses import dataclass

from cachemon.normalise.series import SeriesKey, SourceId

# A counter that moves backwards by less than this is float noise, not a restart.
EPSILON = 1e-6
# *_created / process start times that differ by less than this are the same process.
SAME_PROCESS = 1e-3


@dataclass(slots=True)
class SourceState:
    """One counter series as the upstream reports it."""

    source: SourceId
    key: SeriesKey          # the exported series it adds to
    offset: float           # raw totals of this series' earlier lives
    last_raw: float         # the last good raw value
    created: float | None   # its *_created timestamp, when the upstream exposes one
    process_start: float | None   # process_start_time_seconds of the page that last carried it
    last_seen: float        # cachemon's clock at the last poll that carried it
    resets: int = 0

    @property
    def value(self) -> float:
        return self.offset + self.last_raw

    def observe(self, raw: float, created: float | None, process_start: float | None, now: float) -> str | None:
        """Take a new raw value; returns why the series restarted, or None.

        The process start time is compared per series, so a series missing from the first
        page after a restart is still corrected when it comes back."""
        reason = None
        if (process_start is not None and self.process_start is not None
                and abs(process_start - self.process_start) > SAME_PROCESS):
            reason = "process_start_time changed"
        elif created is not None and self.created is not None and abs(created - self.created) > SAME_PROCESS:
            reason = f"{self.source.stem} created timestamp changed"
        elif raw < self.last_raw - EPSILON:
            reason = f"{self.source.stem} went down"
        if reason is not None:
            self.offset += self.last_raw
            self.resets += 1
            self.last_raw = raw
        elif raw > self.last_raw:       # a step back within EPSILON is noise: keep the higher value
            self.last_raw = raw
        if created is not None:
            self.created = created
        if process_start is not None:
            self.process_start = process_start
        self.last_seen = now
        return reason


@dataclass(slots=True)
class SeriesState:
    """One exported series. For a counter, ``value`` is the sum of its sources' corrected
    values (kept after a source is evicted, so the counter never goes down)."""

    key: SeriesKey
    value: float
    last_seen: float
