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

from cachemon.normalise.updates import SeriesKey, SourceId

# A counter that moves backwards by less than this is float noise, not a restart.
EPSILON = 1e-6
# *_created / process start times that differ by less than this are the same process.
SAME_PROCESS = 1e-3
# A counter that reads at most this fraction of its last value restarted, without corroboration.
# vLLM's counters live in the process and start from 0 with it (every era in tests/fixtures: the
# idle page after start-up reads 0 on every counter), and a restart takes tens of seconds (model
# load), so the first page of a new life holds at most a few polls of traffic: far below half of
# a running total. A smaller decrease (a reading one token low, a hit counter scraped between
# vLLM's two increments) is a glitch: the last value is held and the reading counted.
RESTART_FRACTION = 0.5
# No counter cachemon reads can grow faster than this per second per source series. Every
# counted token (and every request, block or preemption, which are fewer) came in a request
# body over the server's network, at least one byte each: 1e10/s would be 80 Gbit/s into one
# vLLM process. A larger step is refused (counted); the elapsed time is floored at 1 s.
MAX_RATE_PER_SECOND = 1e10
# A refused jump that persists this many polls at a steady or growing level is a new baseline:
# followed from there without counting the jump (never frozen forever).
JUMP_REBASE_POLLS = 3

# Outcomes of SourceState.observe that refuse the reading (the rejected-samples reasons).
GLITCH = "glitch"
JUMP = "implausible_jump"
OTHER_PROCESS = "other_process"
# A later *_created on a counter that did not fall: the _created is refused, the count taken (observe).
CREATED_MOVED = "created_moved"


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
    prev_created: float | None = None   # the *_created of its previous life
    jump_polls: int = 0                 # consecutive polls refused as implausible jumps
    jump_raw: float = 0.0               # the last refused jump's reading
    prev_obs: float | None = None       # derived (miss) series: the previous page's upper bound
    prev_pair: tuple[float, float] | None = None   # ... and the (queries, hits) it came from
    pair_repeats: int = 0               # ... and how many polls since read it again unchanged
    pair_since: float = 0.0             # ... and when that pair was first read

    @property
    def value(self) -> float:
        return self.offset + self.last_raw

    def restart(self, raw: float) -> None:
        self.offset += self.last_raw
        self.resets += 1
        self.last_raw = raw
        self.jump_polls = 0

    def observe(self, raw: float, created: float | None, process_start: float | None,
                now: float) -> tuple[str | None, str | None]:
        """Take a new raw value; returns (why the series restarted, why the reading was refused).

        The process start time is compared per series, so a series missing from the first
        page after a (confirmed, see UpstreamState) restart is still corrected when it comes
        back. A ``*_created`` older than the series' own, or its previous life's, is another
        process answering on the same URL: refused, never a restart. A later ``*_created`` is a
        restart when the counter fell (by any amount: the new creation corroborates it); on a
        counter that did not fall it is no new life (a new life starts from 0, and a restart takes
        far longer than a poll: its first page reads below a running total), so the increase is
        taken as the same life's and the moved ``_created`` refused (CREATED_MOVED). A page whose
        ``_created`` moves at every poll while the counter rises (+1 600) counted each poll's
        whole value as a new life's (+45 900) before."""
        reason = refused = None
        moved = created is not None and self.created is not None and abs(created - self.created) > SAME_PROCESS
        if (process_start is not None and self.process_start is not None
                and abs(process_start - self.process_start) > SAME_PROCESS):
            reason = "process_start_time changed"
        elif moved and (created < self.created or (self.prev_created is not None      # type: ignore[operator]
                                                   and abs(created - self.prev_created) <= SAME_PROCESS)):  # type: ignore[operator]
            return None, OTHER_PROCESS
        elif moved and raw < self.last_raw - EPSILON:
            reason = f"{self.source.stem} created timestamp changed"
            self.prev_created = self.created
        else:
            if moved:                       # on a counter that did not fall: the same life's count
                refused, created = CREATED_MOVED, None
            if raw < self.last_raw - EPSILON:
                if raw <= RESTART_FRACTION * self.last_raw:
                    reason = f"{self.source.stem} went down"
                else:
                    refused = GLITCH
            elif raw - self.last_raw > MAX_RATE_PER_SECOND * max(now - self.last_seen, 1.0):
                self.jump_polls = self.jump_polls + 1 if raw >= self.jump_raw else 1
                self.jump_raw = raw
                if self.jump_polls < JUMP_REBASE_POLLS:
                    return None, JUMP
                self.offset -= raw - self.last_raw       # a new level: follow it, without the jump
                self.last_raw = raw
                self.jump_polls = 0
            elif raw > self.last_raw:       # a step back within EPSILON is noise: keep the higher value
                self.last_raw = raw
                self.jump_polls = 0
        if reason is not None:
            self.restart(raw)
        if created is not None:
            self.created = created
        if process_start is not None:
            self.process_start = process_start
        self.last_seen = now
        return reason, refused


@dataclass(slots=True)
class SeriesState:
    """One exported series. For a counter, ``value`` is the sum of its sources' corrected
    values (kept after a source is evicted, so the counter never goes down); for hit tokens
    it is capped at the query tokens of the same labels (``acc`` holds the uncapped sum)."""

    key: SeriesKey
    value: float
    last_seen: float
    acc: float = 0.0
