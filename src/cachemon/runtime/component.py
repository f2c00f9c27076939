"""The shape of every stage `cachemon run` starts (pollers, log source, change detection, warm-up,
cost, KV events, attribution), and the collector that times them on /metrics.

The daemon starts each component, collects it on /metrics, and closes it on shutdown; it needs
nothing else from a stage. What a stage needs from the others comes through its StageContext
(runtime/context.py).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol, runtime_checkable

from cachemon import catalog as C
from cachemon.expose.render import Family

log = logging.getLogger("cachemon")


class Collectable(Protocol):
    def collect(self) -> Iterable[Family]:
        """Metric families (expose.render.Family), built at scrape time."""


@runtime_checkable
class Component(Protocol):
    def start(self, stop_event: threading.Event) -> None:
        """Start the stage's threads; return at once. ``stop_event`` is set on shutdown."""

    def close(self) -> None:
        """Finish: flush and persist what the stage holds (called after ``stop_event`` is set)."""

    def collect(self) -> Iterable[Family]:
        """The stage's own metric families (expose.render.Family), read at scrape time."""


class LoopStage:
    """The start and close of a stage whose work is one loop on a daemon thread of its own, named
    ``thread_name``: the subclass writes ``_loop(stop_event)`` (change detection, attribution, routers)."""
    thread_name = "stage"
    _thread: threading.Thread | None = None

    def _loop(self, stop: threading.Event) -> None:
        raise NotImplementedError

    def start(self, stop_event: threading.Event) -> None:
        self._thread = threading.Thread(target=self._loop, args=(stop_event,), name=self.thread_name, daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self._thread is not None:
            self._thread.join(timeout=5)

class StagesCollector:
    """Every stage's families, each stage timed, as node_exporter times its collectors
    (node_scrape_collector_duration_seconds / node_scrape_collector_success{collector}):
    STAGE_DURATION and STAGE_SUCCESS{stage}. A stage whose ``collect`` raises is logged and
    reported as failed; the other stages are still exported."""

    def __init__(self, stages: Sequence[tuple[str, Collectable]]) -> None:
        names = [n for n, _ in stages]
        if len(set(names)) != len(names):
            raise ValueError(f"stage names must be unique, got {names}")
        self.stages = list(stages)

    def collect(self) -> Iterator[Family]:
        duration, success = Family.of(C.STAGE_DURATION), Family.of(C.STAGE_SUCCESS)
        for name, stage in self.stages:
            t0 = time.perf_counter()
            try:
                fams = list(stage.collect())
                ok = 1.0
            except Exception:      # one stage's bug must not take /metrics down
                log.exception("stage %s: collecting its metrics failed", name)
                fams, ok = [], 0.0
            duration.put(C.STAGE_DURATION, (name,), time.perf_counter() - t0)
            success.put(C.STAGE_SUCCESS, (name,), ok)
            yield from fams
        yield duration
        yield success
