"""The store's read and write API as its users see it: read-only views and the two ports.

``Store.read()`` hands out a ``StoreView`` whose upstreams are ``UpstreamView``s (state.store.
UpstreamState, read-only, valid inside the ``with`` block). A stage that only reads is handed a
``StoreReader``; a source that writes (the poller, the log source) a ``StoreWriter``.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from cachemon.normalise.server_profile import ServerProfile
from cachemon.normalise.updates import SeriesKey, SourceId, SourceKind, Update, UpstreamInfo

__all__ = ["Applied", "CounterView", "Ident", "RatioView", "SourceKind", "SourceView", "StoreReader", "StoreView",
           "StoreWriter", "UpstreamView"]

Ident = tuple[str, ...]


class Applied(NamedTuple):
    """What one write did: why series restarted (None: they did not), and whether the upstream was
    down before it (it had been read and its last read failed)."""

    restart: str | None
    was_down: bool


class CounterView(Protocol):
    @property
    def value(self) -> float: ...


class SourceView(Protocol):
    """One source series of an exported one (diagnostics: which replica restarted, by how much)."""

    @property
    def source(self) -> SourceId: ...
    @property
    def key(self) -> SeriesKey: ...
    @property
    def last_raw(self) -> float: ...
    @property
    def offset(self) -> float: ...
    @property
    def resets(self) -> int: ...


class RatioView(Protocol):
    def ratio(self, window: float) -> tuple[float, float] | None: ...


class UpstreamView(Protocol):
    """What a reader may see of one upstream (``UpstreamState``, read-only), inside ``Store.read()``."""

    @property
    def name(self) -> str: ...
    @property
    def info(self) -> UpstreamInfo: ...
    @property
    def up(self) -> bool: ...
    @property
    def scrapes(self) -> int: ...
    @property
    def errors(self) -> Mapping[str, int]: ...
    @property
    def rejected(self) -> Mapping[str, int]: ...
    @property
    def last_error(self) -> tuple[str, str] | None: ...
    @property
    def last_duration(self) -> float | None: ...
    @property
    def last_success(self) -> float | None: ...
    @property
    def restarts(self) -> int: ...
    @property
    def last_restart(self) -> float | None: ...
    @property
    def process_start_time(self) -> float | None: ...
    @property
    def multiple_processes(self) -> bool: ...
    @property
    def overflow_total(self) -> int: ...
    @property
    def evicted_total(self) -> int: ...
    @property
    def max_series(self) -> int: ...
    @property
    def counters(self) -> Mapping[SeriesKey, CounterView]: ...
    @property
    def sources(self) -> Mapping[SourceId, SourceView]: ...
    @property
    def gauges(self) -> Mapping[SeriesKey, float]: ...
    @property
    def profiles(self) -> Mapping[Ident, ServerProfile]: ...   # (model_name, engine) -> what it said of its cache
    @property
    def windows(self) -> Mapping[tuple[str, ...], RatioView]: ...
    @property
    def idents(self) -> Mapping[Ident, Sequence[float]]: ...   # admitted (model_name, engine) -> [last seen, polls]
    def models(self) -> list[str]: ...
    def local_totals(self) -> tuple[float, float]: ...


@dataclass(frozen=True)
class StoreView:
    """The store as ``Store.read()`` hands it out: valid while the ``with`` block holds the lock."""

    upstreams: Mapping[str, UpstreamView]
    windows: Mapping[str, float]            # ratio window label ("5m") -> seconds


class StoreReader(Protocol):
    """The store as a stage reads it: ``with store.read() as view:`` and nothing else."""

    def read(self) -> AbstractContextManager[StoreView]: ...


class StoreWriter(StoreReader, Protocol):
    """The store as a source writes it (the pollers, the log source)."""

    def upstream(self, name: str, kind: SourceKind = "metrics") -> UpstreamView: ...
    def apply(self, name: str, upd: Update, now: float, *, kind: SourceKind = "metrics",
              duration: float | None = None) -> Applied: ...
    def record_error(self, name: str, reason: str, message: str, *, kind: SourceKind = "metrics",
                     duration: float | None = None) -> bool: ...
