"""The collectors served on /metrics, and the one check that keeps their exposition valid.

Like prometheus_client's registry: two families whose *sample* names collide make an exposition
Prometheus rejects whole, so ``register`` compares every name a family emits, not only its bare
name: counter ``x`` emits ``x_total`` and ``x_created``, and clashes with a gauge named
``x_total``. Registration takes a lock; rendering reads an immutable tuple of collectors.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from cachemon.expose.render import Collector, Family, render, render_openmetrics

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

log = logging.getLogger("cachemon.http")


class DuplicateFamilyError(ValueError):
    """Two collectors (or one, twice) export metric samples of the same name."""


# The sample-name suffixes each family type adds to its bare name, in either format.
_SUFFIXES: dict[str, tuple[str, ...]] = {
    "counter": ("_total", "_created"),
    "info": ("_info",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("_count", "_sum", "_created"),
    "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
    "stateset": (),
    "gauge": (),
    "unknown": (),
}


def sample_names(name: str, type_: str) -> tuple[str, ...]:
    """Every name a family of this type may emit: the bare name, then its suffixed forms."""
    return (name, *(name + s for s in _SUFFIXES.get(type_, ())))


def _families(collector: Collector) -> Iterable[Family | Metric]:
    """What a collector exports: its ``describe()`` when it has one, else one ``collect()`` now
    (prometheus_client's Registry.register does the same)."""
    describe = getattr(collector, "describe", None)
    return list(describe() if callable(describe) else collector.collect())


def _claimed(collector: Collector) -> dict[str, str]:
    """Sample name -> the family name that emits it, for one collector. Raises on a clash within it."""
    out: dict[str, str] = {}
    for fam in _families(collector):
        for n in sample_names(fam.name, fam.type):
            if n in out:
                raise DuplicateFamilyError(
                    f"{type(collector).__name__} exports these metric families more than once: "
                    f"{', '.join(sorted({out[n], fam.name}))} (sample name {n})")
            out[n] = fam.name
    return out


class Registry:
    """``register`` refuses a collector whose sample names clash with a registered one's (or with
    each other); ``render`` serves all of them, after the before-collect hooks."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._collectors: tuple[Collector, ...] = ()
        self._names: dict[str, tuple[str, Collector]] = {}     # sample name -> (family, owner)
        self._before_collect: tuple[Callable[[], None], ...] = ()

    @property
    def collectors(self) -> list[Collector]:
        return list(self._collectors)

    def before_collect(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` at the start of every render, before any collector (scrape mode's polls,
        runtime.poller.ScrapeSync). It must bound its own time; an exception is logged, not served."""
        with self._lock:
            self._before_collect += (hook,)

    def register(self, collector: Collector) -> None:
        claimed = _claimed(collector)
        with self._lock:
            taken = [n for n in claimed if n in self._names]
            if taken:
                owners = sorted({type(self._names[n][1]).__name__ for n in taken})
                clash = sorted({claimed[n] for n in taken} | {self._names[n][0] for n in taken})
                raise DuplicateFamilyError(
                    f"{type(collector).__name__} exports metric families already registered by "
                    f"{', '.join(owners)}: {', '.join(clash)}")
            self._collectors += (collector,)
            for n, fam in claimed.items():
                self._names[n] = (fam, collector)

    def render(self, openmetrics: bool = False) -> bytes:
        for hook in self._before_collect:
            try:
                hook()
            except Exception:     # the collectors still serve what the store holds
                log.exception("before-collect hook failed")
        collectors = self._collectors
        return render_openmetrics(collectors) if openmetrics else render(collectors)
