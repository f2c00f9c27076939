"""Per-upstream state: reset-corrected counters, current gauges, ratio windows, health.

Sources (the scrape poller, the log tailer) call ``apply`` / ``record_error``; the
collector reads a consistent copy under the same lock at scrape time.
"""
from __future__ import annotations

import threading
from collections import Counter as Tally
from dataclasses import dataclass, field

from cachemon import catalog as C
from cachemon.state.counters import ResetCorrectedCounter
from cachemon.state.windows import RatioWindow

Key = tuple[str, tuple[str, ...]]

# A counter that moves backwards by less than this is float noise, not a restart.
_EPSILON = 1e-6


@dataclass
class UpstreamInfo:
    kind: str = "metrics"          # metrics | log
    era: str = ""
    vllm_version: str = ""
    prefix_caching: str = ""
    block_size: str = ""
    hash_algo: str = ""
    counter_unit: str = ""


@dataclass
class Update:
    """One successful observation of a source, already normalised to raw token values."""
    counters: dict[Key, float] = field(default_factory=dict)
    gauges: dict[Key, float] = field(default_factory=dict)
    # restart evidence: *_created timestamps per series, process start time
    created: dict[str, float] = field(default_factory=dict)
    process_start_time: float | None = None
    info: UpstreamInfo | None = None
    overflow: int = 0
    # counters that are exact running totals kept by cachemon itself (log sources):
    # they never reset, so no restart detection on them
    trusted_monotonic: bool = False


class UpstreamState:
    def __init__(self, name: str, horizon: float, kind: str = "metrics"):
        self.name = name
        self.info = UpstreamInfo(kind=kind)
        self.counters: dict[Key, ResetCorrectedCounter] = {}
        self.gauges: dict[Key, float] = {}
        self.windows: dict[tuple[str, ...], RatioWindow] = {}
        self.horizon = horizon
        self.created: dict[str, float] = {}
        self.process_start_time: float | None = None
        self.up = False
        self.ever_up = False
        self.scrapes = 0
        self.errors: Tally[str] = Tally()
        self.last_error: tuple[str, str] | None = None
        self.last_duration: float | None = None
        self.last_success: float | None = None
        self.restarts = 0
        self.last_restart: float | None = None
        self.overflow_total = 0
        self._overflow_last = 0

    # -- restart detection ---------------------------------------------------------
    def _restarted(self, upd: Update) -> str | None:
        if not self.ever_up:
            return None
        if (upd.process_start_time is not None and self.process_start_time is not None
                and abs(upd.process_start_time - self.process_start_time) > 1e-3):
            return "process_start_time changed"
        for sig, ts in upd.created.items():
            old = self.created.get(sig)
            if old is not None and abs(old - ts) > 1e-3:
                return f"{sig.split('|', 1)[0]} created timestamp changed"
        if not upd.trusted_monotonic:
            for key, raw in upd.counters.items():
                c = self.counters.get(key)
                if c is not None and raw < c.last_raw - _EPSILON:
                    return f"{key[0]} went down"
        return None

    def apply(self, upd: Update, now: float) -> str | None:
        """Fold one observation in. Returns the restart reason if one was detected."""
        reason = self._restarted(upd)
        if reason:
            self.restarts += 1
            self.last_restart = now
            for counter in self.counters.values():
                counter.fold_restart()
        for key, raw in upd.counters.items():
            c = self.counters.get(key)
            if c is None:
                # A series first seen after a restart started counting at the restart.
                c = self.counters[key] = ResetCorrectedCounter(raw)
            else:
                c.observe(raw)
        self.gauges = dict(upd.gauges)
        if upd.created:
            self.created.update(upd.created)
        if upd.process_start_time is not None:
            self.process_start_time = upd.process_start_time
        if upd.info is not None:
            kind = self.info.kind
            self.info = upd.info
            self.info.kind = kind
        # Count overflow once per newly dropped label set, not once per poll.
        if upd.overflow > self._overflow_last:
            self.overflow_total += upd.overflow - self._overflow_last
        self._overflow_last = upd.overflow
        self._update_windows(now)
        self.up = True
        self.ever_up = True
        self.scrapes += 1
        self.last_error = None
        self.last_success = now
        return reason

    def _update_windows(self, now: float) -> None:
        q_name, h_name = C.QUERY_TOKENS.name, C.HIT_TOKENS.name
        for (metric, labels), q in self.counters.items():
            if metric != q_name:
                continue
            h = self.counters.get((h_name, labels))
            if h is None:
                continue
            w = self.windows.get(labels)
            if w is None:
                w = self.windows[labels] = RatioWindow(self.horizon)
            w.add(now, h.value, q.value)

    def record_error(self, reason: str, message: str) -> None:
        self.up = False
        self.scrapes += 1
        self.errors[reason] += 1
        self.last_error = (reason, message[:200])
        # Gauges describe "now": stale once the upstream is unreachable.
        self.gauges = {}


class Store:
    def __init__(self, windows: dict[str, float]):
        self.lock = threading.Lock()
        self.windows = dict(windows)             # label ("5m") -> seconds
        self.horizon = max(self.windows.values(), default=300.0)
        self.upstreams: dict[str, UpstreamState] = {}

    def upstream(self, name: str, kind: str = "metrics") -> UpstreamState:
        with self.lock:
            st = self.upstreams.get(name)
            if st is None:
                st = self.upstreams[name] = UpstreamState(name, self.horizon, kind)
            return st
