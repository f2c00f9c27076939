"""Helpers for the log-source tests: writers that keep their descriptor open, a fake
clock, a LogSource built on real files, and readers of its counters."""
from __future__ import annotations

import os
from pathlib import Path

from cachemon import catalog as C
from cachemon.runtime.logsource import LogSource
from cachemon.sources.logs.settings import LogConfig, LogFileSpec
from cachemon.sources.logs.user_rules import parse_rules
from cachemon.state.store import Store

GATEWAY_RULE = {"name": "gw", "regex": r"cache_hit=(?P<hit>\d+) cache_miss=(?P<miss>\d+)",
                "counters": {"hit_tokens": "hit", "miss_tokens": "miss"}}


class Clock:
    def __init__(self, t: float = 1_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


class Writer:
    """A log writer holding its fd open across rotations, like vLLM's stdout redirect."""

    def __init__(self, path: Path, append: bool = True):
        self.path = path
        self.append = append
        self.open()

    def open(self) -> None:
        flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if self.append else 0)
        self.fd = os.open(self.path, flags, 0o644)
        if not self.append:
            os.lseek(self.fd, 0, os.SEEK_END)

    def write(self, data: str | bytes) -> None:
        os.write(self.fd, data.encode() if isinstance(data, str) else data)

    def reopen(self) -> None:
        os.close(self.fd)
        self.open()

    def close(self) -> None:
        os.close(self.fd)


def gw(hit: int, miss: int = 1, seq: int | None = None) -> str:
    """A gateway line; ``seq`` makes it unique, as real log lines are (they carry timestamps)."""
    stamp = "2026-11-29T10:00:00Z" if seq is None else f"2026-11-29T10:00:00.{seq:06d}Z"
    return f"{stamp} INFO gateway model=m cache_hit={hit} cache_miss={miss}\n"


def config(paths, tmp: Path, *, from_beginning: bool = False, state: bool = True, rules=(GATEWAY_RULE,),
           watch_events: bool = False, **kw) -> LogConfig:
    files = [LogFileSpec(path=str(p), name=f"log{i}") for i, p in enumerate(paths)]
    cfg = LogConfig(files=files, from_beginning=from_beginning,
                    state_file=str(tmp / "state.json") if state else "", watch_events=watch_events,
                    rules=parse_rules(list(rules), "rules"), **kw)
    return cfg


def source(cfg: LogConfig, clock: Clock | None = None, store: Store | None = None) -> LogSource:
    return LogSource(cfg, store or Store({"1m": 60.0}), clock=clock or Clock())


def hits(src: LogSource, i: int = 0) -> float:
    """The exact hit-token counter of entry i (sum over label sets)."""
    s = src.entries[i].stream
    return sum(v for (m, _), v in s.counters.items() if m == C.HIT_TOKENS.name)


def queries(src: LogSource, i: int = 0) -> float:
    s = src.entries[i].stream
    return sum(v for (m, _), v in s.counters.items() if m == C.QUERY_TOKENS.name)


def kill(src: LogSource) -> None:
    """Simulate SIGKILL: drop the source without its final poll or save (fds closed by the 'OS')."""
    for e in src.entries:
        for f in list(e.follower.files.values()):
            os.close(f.fd)
        e.follower.files.clear()
    if src.state_lock is not None:      # the OS drops a dead process's flock
        src.state_lock.release()
