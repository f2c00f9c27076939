"""`cachemon analyze`'s input side: the stream of requests and events over several files, the counted
skips, the batches, and the resets given on the command line."""
from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, TypeVar

from cachemon.analyze.requests_io import LOG_INFO_REASON, LOG_OTHER_REASON, Event, Request, Skip, iter_requests

if TYPE_CHECKING:
    from cachemon.analyze.results import AnalyzeResult

T = TypeVar("T")
MAX_SKIPS_KEPT = 1000   # every skip is counted; the first ones keep their line and reason


def batches(items: Iterable[T], n: int) -> Iterator[list[T]]:
    batch: list[T] = []
    for it in items:
        batch.append(it)
        if len(batch) >= n:
            yield batch
            batch = []
    if batch:
        yield batch


class ResetPlan:
    """Resets given on the command line: before given lines (``N`` or ``FILE:N``) and at
    given times (epoch seconds; applies to lines carrying a ``time``)."""

    def __init__(self, at: Iterable[str], times: Iterable[float]):
        self.at = set(at)
        self.times = sorted(times)
        self.next_time = 0

    def before(self, req: Request) -> str | None:
        why = None
        if req.where in self.at or str(req.line) in self.at:
            why = "reset (--reset-at)"
        if req.time is not None:
            while self.next_time < len(self.times) and req.time >= self.times[self.next_time]:
                self.next_time += 1
                why = "reset (--reset-at-time)"
        return why


def skip(res: AnalyzeResult, s: Skip) -> None:
    res.skipped_count += 1
    if s.reason.endswith(LOG_INFO_REASON):
        res.log_info_requests += 1
    elif s.reason.endswith(LOG_OTHER_REASON):
        res.log_other_lines += 1
    if len(res.skipped) < MAX_SKIPS_KEPT:
        res.skipped.append(s)


def stream(paths: list[str], res: AnalyzeResult | None, progress: Callable[[int], None] | None) -> Iterator[Request | Event]:
    done = 0
    for idx, p in enumerate(paths):
        name = os.path.basename(p)
        cb = None if progress is None else (lambda n, done=done: progress(done + n))
        for item in iter_requests(p, cb):
            if isinstance(item, Event):
                item.where = f"{name}:{item.line}" if len(paths) > 1 else str(item.line)
                yield item
                continue
            if isinstance(item, Skip):
                if res is not None:
                    skip(res, Skip(item.line, item.reason) if len(paths) == 1 else Skip(item.line, f"{p}: {item.reason}"))
                continue
            item.source = idx
            if len(paths) > 1:
                item.where = f"{name}:{item.line}"
            yield item
        done += total_bytes([p])


def total_bytes(paths: list[str]) -> int:
    return sum(os.path.getsize(p) for p in paths)
