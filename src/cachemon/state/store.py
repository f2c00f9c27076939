"""Per-upstream state: reset-corrected counters, current gauges, ratio windows, health.

Writers (the scrape poller, the log source) call ``Store.apply`` / ``Store.record_error`` with a
normalised ``Update`` (or the reason a read failed); the store takes its lock and folds it into the
upstream's ``UpstreamState``, whose fields no writer touches. Every reader goes through one read API:
``Store.read()``, a context that holds the lock and hands out read-only views (``StoreView``,
``UpstreamView``, with ``models()`` and ``local_totals()``), valid inside the ``with`` block: the
collector at scrape time, change detection, attribution, the cost and KV-event stages, readiness and
the demo. What must outlive the lock is copied out by the reader (judge/snapshots.UpstreamCopy).

Every counter sample carries its source series. Reset detection and correction run per
source series (``state.series.SourceState``); the exported series is the sum of its
corrected sources, so one series restarting never touches another, and one replica
restarting never adds the other replicas' totals. A restart must be corroborated:
a process restart (``process_start_time_seconds`` changed to a later value and
every counter fell, or the new process answered twice) corrects every series of that process,
a later ``*_created`` with a fall, or a fall to at most half its value, the series it belongs to; a
smaller fall is a glitch, held, and a later ``*_created`` on a counter that did not fall is refused
(the increase taken: series.py). A process that is not the exported one (an older start time, or one
that answered once and went) is a second process behind the URL: its samples are refused.

The cardinality guard (``state/cardinality.CardinalityGuard``) decides which (model_name, engine)
label sets an upstream keeps; the upstream drops the series of those it lets go.
"""
from __future__ import annotations

import logging
import threading
from collections import Counter as Tally
from collections.abc import Iterator
from contextlib import contextmanager
from types import MappingProxyType

from cachemon import catalog as C
from cachemon.normalise.server_profile import ServerProfile
from cachemon.normalise.updates import CounterSample, SeriesKey, SourceId, SourceKind, Update, UpstreamInfo
from cachemon.state.cardinality import CardinalityGuard
from cachemon.state.series import OTHER_PROCESS, RESTART_FRACTION, SAME_PROCESS, SeriesState, SourceState
from cachemon.state.views import (
    Applied,
    CounterView,
    Ident,
    RatioView,
    SourceView,
    StoreReader,
    StoreView,
    StoreWriter,
    UpstreamView,
)
from cachemon.state.windows import RatioWindow

__all__ = [
    "Applied",
    "CounterView",
    "RatioView",
    "SourceView",
    "DEFAULT_EVICT_AFTER",
    "SourceKind",
    "Store",
    "StoreReader",
    "StoreView",
    "StoreWriter",
    "Update",
    "UpstreamInfo",
    "UpstreamState",
    "UpstreamView",
]

DEFAULT_EVICT_AFTER = 600.0
# Polls that must read a (queries, hits) pair again unchanged, and seconds it must have stood unchanged,
# before its miss bound counts as settled: polls alone made the settling time the poll interval's (two
# re-reads at 250 ms: a hit counter 1 s behind had its phantom misses exported for good).
CONFIRM_REPEATS = 2
SETTLE_S = 5.0
# Pages in a row from another process (and none from the exported one) after which it is followed.
ADOPT_AFTER = 5
log = logging.getLogger("cachemon.state")
# Series whose first label is model_name (a log's reset counter names none).
_PER_MODEL = frozenset(spec.name for spec in C.ALL if spec.labels[1:2] == (C.MODEL,))


def _ident(key: tuple[str, tuple[str, ...]]) -> Ident:
    return key[1][:2]


class UpstreamState:
    def __init__(self, name: str, horizon: float, kind: SourceKind = "metrics", max_series: int = 256,
                 evict_after: float = DEFAULT_EVICT_AFTER):
        self.name = name
        self.info = UpstreamInfo(kind=kind)
        self.counters: dict[SeriesKey, SeriesState] = {}
        self.sources: dict[SourceId, SourceState] = {}
        self.gauges: dict[SeriesKey, float] = {}
        # what each admitted (model_name, engine) said of its cache, as the newest page or log stated it
        self.profiles: dict[Ident, ServerProfile] = {}
        self.windows: dict[tuple[str, ...], RatioWindow] = {}
        self.horizon = horizon
        self.process_start_time: float | None = None
        self.up = False
        self.scrapes = 0
        self.errors: Tally[str] = Tally()
        self.rejected: Tally[str] = Tally()
        self.last_error: tuple[str, str] | None = None
        self.last_duration: float | None = None
        self.last_success: float | None = None
        self.restarts = 0
        self.last_restart: float | None = None
        self.guard = CardinalityGuard(name, max_series, evict_after)
        # two processes behind one URL: a new start time waiting for its second page, and the
        # start times of processes that are not the one exported
        self.pending_pst: float | None = None
        self.pending_samples = 0
        self.other_psts: list[float] = []
        self.other_seen: float | None = None
        self.other_streak = 0        # consecutive pages from another process
        self.multiple_processes_logged = False

    # -- the cardinality guard's decisions (state/cardinality.py) -----------------------
    @property
    def idents(self) -> dict[Ident, list[float]]:
        return self.guard.idents

    @property
    def max_series(self) -> int:
        return self.guard.max_series

    @property
    def overflow_total(self) -> int:
        return self.guard.overflow_total

    @property
    def evicted_total(self) -> int:
        return self.guard.evicted_total

    def _purge(self, gone: set[Ident]) -> None:
        if not gone:
            return
        self.counters = {k: s for k, s in self.counters.items() if k.labels[:2] not in gone}
        self.sources = {k: s for k, s in self.sources.items() if s.key.labels[:2] not in gone}
        self.windows = {k: w for k, w in self.windows.items() if k[:2] not in gone}

    # -- observations ----------------------------------------------------------------
    def _process_verdict(self, upd: Update, now: float) -> str:
        """Which process the page comes from: "same" (or the first), "restart" (a new process,
        corroborated), "hold" (a new process_start_time whose counters did not all drop:
        a restart or a second process, told apart by the next page) or "other" (a process
        already known not to be the one exported: a load balancer alternating replicas)."""
        pst = upd.process_start_time
        cur = self.process_start_time
        if pst is None or cur is None or abs(pst - cur) <= SAME_PROCESS:
            self.other_streak = 0
            if self.pending_pst is not None and pst is not None:
                # a new process answered once and the old one is back: two processes, not a restart
                self._second_process(self.pending_pst, now, self.pending_samples)
            self.pending_pst = None
            return "same"
        if not (any(abs(pst - o) <= SAME_PROCESS for o in self.other_psts) or pst < cur):
            self.other_streak = 0
        else:
            # an older start time cannot be a restart: the process we export was running after it
            self.other_streak += 1
            if self.other_streak >= ADOPT_AFTER:
                # only the other process has answered for a while: the exported one is gone (or the
                # host's clock stepped back across a restart); follow the one that answers
                self.other_psts = [o for o in self.other_psts if abs(pst - o) > SAME_PROCESS]
                self.other_streak = 0
                return "restart"
            self._second_process(pst, now, len(upd.counters))
            return "other"
        if self.pending_pst is not None and abs(pst - self.pending_pst) <= SAME_PROCESS:
            return "restart"                 # the new process answered twice in a row: confirmed
        # Corroborated at once when every counter of the process fell to near 0 (a real restart).
        dropped = [smp.value <= RESTART_FRACTION * src.last_raw
                   for smp in upd.counters if smp.pair is None
                   for src in (self.sources.get(smp.source),) if src is not None and src.last_raw > 0]
        if all(dropped):
            return "restart"
        self.pending_pst = pst
        self.pending_samples = len(upd.counters)
        return "hold"

    def _second_process(self, pst: float, now: float, samples: int) -> None:
        if not any(abs(pst - o) <= SAME_PROCESS for o in self.other_psts):
            self.other_psts = (self.other_psts + [pst])[-8:]     # bounded
        self.rejected[OTHER_PROCESS] += samples
        self.other_seen = now
        if not self.multiple_processes_logged:
            self.multiple_processes_logged = True
            log.warning("upstream %s: two processes answer behind one URL (process_start_time_seconds %s and %s): "
                        "only the first one's series are exported; point cachemon at each replica instead",
                        self.name, f"{self.process_start_time:.3f}", f"{pst:.3f}")

    @property
    def multiple_processes(self) -> bool:
        """Another process answered on this URL within the last evict_after seconds."""
        return self.other_seen is not None and self.last_success is not None and (
            self.last_success - self.other_seen <= self.guard.evict_after)

    def apply(self, upd: Update, now: float) -> str | None:
        """Fold one observation in. Returns why series restarted, or None."""
        # Evict first, so a label set arriving as a stale one ages out takes its slot at once.
        guard = self.guard
        self._purge(guard.evict(now))
        guard.overflow_new = 0
        on_page = self._mark_seen(upd, now)
        verdict = "same" if upd.trusted_monotonic else self._process_verdict(upd, now)
        taken = verdict in ("same", "restart")
        if taken and guard.any_refused:
            guard.admit_waiting(on_page, now)
        reasons: Tally[str] = Tally()
        refused: Tally[str] = Tally()
        admit = guard.admit
        for smp in upd.counters if taken else ():
            if admit(_ident(smp.key), now):
                self._fold(smp, verdict == "restart", upd.process_start_time, now, reasons, refused)
        if taken:
            self.gauges = {k: v for k, v in upd.gauges.items() if admit(_ident(k), now)}
            self.profiles = {i: p for i, p in upd.profiles.items() if i in guard.idents}
        self._purge(guard.take_victims())
        self._cap_hits()
        guard.log_refusals(upd, now)
        if taken:
            self._accept_page(upd)
        self.rejected.update(refused)
        self._update_windows(now)
        self.up = True
        self.scrapes += 1
        self.last_error = None
        self.last_success = now
        if not reasons or upd.trusted_monotonic:
            return None
        self.restarts += 1
        self.last_restart = now
        return "; ".join(f"{r} ({n} series)" if n > 1 else r for r, n in sorted(reasons.items()))

    def _mark_seen(self, upd: Update, now: float) -> set[Ident]:
        """Every admitted label set on the page is seen now, before any new one asks for room: a known
        model listed after churn keeps its slot. Returns the page's label sets."""
        idents = self.idents
        on_page = {_ident(smp.key) for smp in upd.counters} | {_ident(k) for k in upd.gauges}
        for ident in on_page:
            seen = idents.get(ident)
            if seen is not None and seen[0] != now:
                seen[0] = now
                seen[1] += 1
        return on_page

    def _fold(self, smp: CounterSample, restart: bool, pst: float | None, now: float,
              reasons: Tally[str], refused: Tally[str]) -> None:
        """One counter sample into its source series (reset-corrected) and its exported series."""
        key = smp.key
        sources = self.sources
        src = sources.get(smp.source)
        if smp.pair is not None:
            delta = self._derived(smp, src, now)
        elif src is None:
            # First sight (also of a series born after a restart): vLLM's own value.
            src = sources[smp.source] = SourceState(smp.source, key, 0.0, smp.value, smp.created, pst, now)
            delta = smp.value
        else:
            before = src.value
            if restart:
                src.restart(smp.value)
                src.process_start, src.created, src.last_seen = pst, smp.created, now
                reasons["process_start_time changed"] += 1
            else:
                last_seen = src.last_seen
                reason, why = src.observe(smp.value, smp.created, pst, now)
                if reason is not None and self.last_restart is not None and last_seen < self.last_restart:
                    # absent since the last restart (a frontend whose series appear only with traffic, and
                    # no process_start_time to tell: eras.Frontend.series_with_traffic_only): back below
                    # its old value, it is folded like any reset, but that restart is already counted
                    reason = None
                if reason is not None:
                    reasons[reason] += 1
                if why is not None:
                    refused[why] += 1
            delta = src.value - before
        series = self.counters.get(key)
        if series is None:
            series = self.counters[key] = SeriesState(key, 0.0, now)
        series.acc += delta
        if key.metric != C.HIT_TOKENS.name:
            series.value = series.acc
        series.last_seen = now

    def _accept_page(self, upd: Update) -> None:
        """A page of the followed process: its start time, its info and its rejected samples."""
        if upd.process_start_time is not None:
            self.process_start_time = upd.process_start_time
        if upd.info is not None:
            kind = self.info.kind
            self.info = upd.info
            self.info.kind = kind
        self.rejected.update(upd.rejected)
        self.pending_pst = None

    def _derived(self, smp: CounterSample, src: SourceState | None, now: float) -> float:
        """Miss tokens of one source series: its corrected queries minus its corrected hits,
        so a restart or glitch of either is already handled. vLLM increments queries, then hits,
        in two statements (vllm/v1/metrics/loggers.py, PrometheusStatLogger.record, 0.32.0): a
        page read between them shows q - h too high by that batch's hits. Each page's q - h is
        thus an upper bound of the true miss count, which never decreases, so the exported value
        advances to the smaller of the bounds of the last two different pages: exact when a lag
        lasts one page, one page behind otherwise. A page polled again unchanged (cachemon polls
        faster than the counters move) is the same evidence, not a second page: counted as one, a
        lagging page read twice would confirm its own phantom misses. Unchanged for CONFIRM_REPEATS
        more polls and SETTLE_S seconds, it is taken as settled (traffic stopped: its last batch's
        misses are exported); so no miss is published that hits lagging less than SETTLE_S take back,
        and once the two counters agree the misses are exact. Returns the increment."""
        assert smp.pair is not None
        q, h = self.sources.get(smp.pair[0]), self.sources.get(smp.pair[1])
        if q is None or h is None:
            return 0.0
        pair = (q.value, h.value)
        bound = max(pair[0] - pair[1], 0.0)
        if src is None:
            self.sources[smp.source] = SourceState(smp.source, smp.key, 0.0, bound, None, None, now, prev_obs=bound,
                                                   prev_pair=pair, pair_since=now)
            return bound
        src.last_seen = now
        prev = src.prev_obs if src.prev_obs is not None else bound
        if pair == src.prev_pair:
            src.pair_repeats += 1
            if src.pair_repeats < CONFIRM_REPEATS or now - src.pair_since < SETTLE_S:
                return 0.0
            prev = bound                # unchanged long enough: settled
        else:
            src.pair_repeats = 0
            src.pair_since = now
        new = max(src.last_raw, min(bound, prev))
        delta = new - src.last_raw
        src.last_raw, src.prev_obs, src.prev_pair = new, bound, pair
        return delta

    def _cap_hits(self) -> None:
        """Hit tokens never exceed query tokens in what is exported: a page renders the query
        counter before the hit counter, so an increment between the two reads shows hits ahead.
        min(hits, queries) of two non-decreasing sums never decreases; the capped part is
        exported as soon as the queries catch up."""
        h_name, q_name = C.HIT_TOKENS.name, C.QUERY_TOKENS.name
        for key, series in self.counters.items():
            if key.metric == h_name:
                q = self.counters.get(SeriesKey(q_name, key.labels))
                series.value = max(series.value, series.acc if q is None else min(series.acc, q.value))

    def _update_windows(self, now: float) -> None:
        q_name, h_name = C.QUERY_TOKENS.name, C.HIT_TOKENS.name
        for (metric, labels), q in self.counters.items():
            if metric != q_name:
                continue
            h = self.counters.get(SeriesKey(h_name, labels))
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
        self.profiles = {}

    # -- the read view's derived figures -------------------------------------------------
    def models(self) -> list[str]:
        """Every model the upstream reports, first seen first: those with a per-model counter, then
        those with only vLLM's own hit ratio (V0 pages without counters, a log's stats lines)."""
        seen = dict.fromkeys(labels[0] for metric, labels in self.counters if metric in _PER_MODEL)
        seen.update(dict.fromkeys(labels[0] for metric, labels in self.gauges if metric == C.REPORTED_HIT_RATIO.name))
        return list(seen)

    def local_totals(self) -> tuple[float, float]:
        """(query, hit) tokens of vLLM's local prefix cache, reset-corrected, summed over every series."""
        q_name, h_name = C.QUERY_TOKENS.name, C.HIT_TOKENS.name
        q = h = 0.0
        for (metric, labels), c in self.counters.items():
            if labels[-1] != "local":
                continue
            if metric == q_name:
                q += c.value
            elif metric == h_name:
                h += c.value
        return q, h


class Store:
    def __init__(self, windows: dict[str, float], max_series: int = 256,
                 evict_after: float = DEFAULT_EVICT_AFTER):
        self.lock = threading.Lock()
        self.windows = dict(windows)             # label ("5m") -> seconds
        self.horizon = max(self.windows.values(), default=300.0)
        self.max_series = max_series
        self.evict_after = evict_after
        self.upstreams: dict[str, UpstreamState] = {}

    def upstream(self, name: str, kind: SourceKind = "metrics") -> UpstreamView:
        """Register ``name`` (of ``kind``) if it is new; its read-only view (read it inside ``read()``)."""
        with self.lock:
            return self._state(name, kind)

    def _state(self, name: str, kind: SourceKind) -> UpstreamState:
        st = self.upstreams.get(name)
        if st is None:
            st = self.upstreams[name] = UpstreamState(name, self.horizon, kind, self.max_series, self.evict_after)
        return st

    def apply(self, name: str, upd: Update, now: float, *, kind: SourceKind = "metrics",
              duration: float | None = None) -> Applied:
        """Fold one read of ``name`` in (``duration``: how long the read took, when timed)."""
        with self.lock:
            st = self._state(name, kind)
            was_down = not st.up and st.scrapes > 0
            restart = st.apply(upd, now)
            if duration is not None:
                st.last_duration = duration
            return Applied(restart, was_down)

    def record_error(self, name: str, reason: str, message: str, *, kind: SourceKind = "metrics",
                     duration: float | None = None) -> bool:
        """A failed read of ``name``; returns whether it was down already (read before, and failed)."""
        with self.lock:
            st = self._state(name, kind)
            was_down = not st.up and st.scrapes > 0
            st.record_error(reason, message)
            if duration is not None:
                st.last_duration = duration
            return was_down

    @contextmanager
    def read(self) -> Iterator[StoreView]:
        """The one read API: ``with store.read() as view:`` holds the lock for the block; keep it short
        (the pollers wait) and copy out what must outlive it."""
        with self.lock:
            yield StoreView(MappingProxyType(self.upstreams), MappingProxyType(self.windows))
