"""The log state file's document as types: what ``statefile.save`` writes and ``statefile.load`` returns
once ``statefile.shape_problem`` has checked it. A module of its own: statefile.py imports config (its
size bound), which normalise/log_stream.py, whose counters are saved here, may not import."""
from __future__ import annotations

from typing import TypedDict

from cachemon.sources.logs.identity import StateRecord


class StreamState(TypedDict, total=False):
    """A log stream's counters (normalise/log_stream.LogStream.saved_state); a key may be missing."""
    counters: list[tuple[str, list[str], float]]            # [metric, [label values], total]
    engine_last: dict[str, tuple[float, str, list[float]]]  # engine -> [time, pid, recent gaps]
    lines: dict[str, int]                                   # outcome -> lines


class SourceState(TypedDict, total=False):
    """One log source: its stream's counters and its follower's files."""
    stream: StreamState
    files: list[StateRecord]           # a TruncatedRecord among them for a file since truncated
    scanned_at: float | None
    history_before: float | None


class StatePayload(TypedDict):
    """What the state file holds (JSON: tuples are arrays), by log source name."""
    sources: dict[str, SourceState]
