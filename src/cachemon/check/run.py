"""`cachemon check`'s reads and verdict: one route and one judge for every source, the daemon's.

check wires `cachemon run`'s ``Store``, ``UpstreamPoller`` per upstream and ``LogSource``
(``Polls``), reads them once or twice ``--interval`` apart, turns the store into snapshots with the
daemon's builder (judge/snapshots.py) and asks the daemon's attribution engine
(judge/attribute.py) for the hit-ratio verdict and its causes, fleet-aware across the
upstreams of one check.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from cachemon.check.kv_window import KvWindow, add_kv_reports
from cachemon.check.log_report import log_report, log_reset_events
from cachemon.check.report import (
    SourceReport,
    add_attribution,
    add_gauge_rows,
    diagnose,
    finding,
    multiprocess_findings,
    new_report,
    series_rows,
)
from cachemon.config import Upstream, check_unique_names, parse_upstream_spec
from cachemon.config.routers import RouterEntry
from cachemon.judge import attribute as A
from cachemon.judge.snapshots import (
    KvProfileFn,
    LedgerViewFn,
    SnapshotBuilder,
    UpstreamCopy,
    engines_profile,
    read_store,
)
from cachemon.normalise.normaliser import Normalised
from cachemon.normalise.server_profile import ServerProfile, combine, merge
from cachemon.runconfig import apply_kv_events_flag
from cachemon.runtime.attribution_stage import AttributionSettings
from cachemon.runtime.logsource import LogSource
from cachemon.runtime.poller import UpstreamPoller
from cachemon.runtime.router_stage import RouterStage
from cachemon.sources.logs.settings import LogConfig
from cachemon.sources.scrape import new_session
from cachemon.state.events import EventKind, EventLog
from cachemon.state.routers import RouterBook
from cachemon.state.store import SourceKind, Store
from cachemon.urls import redact_url

if TYPE_CHECKING:
    import urllib3

ROUTER_WINDOW = 3600.0     # check's interval is its two reads: the router's view spans them
JUDGED_KINDS: tuple[SourceKind, ...] = ("metrics", "log")      # check judges every source; the daemon's Attributor metrics only


class Polls:
    """check's reads: one ``Store``, one ``UpstreamPoller`` per upstream and the ``LogSource`` of the logs,
    wired as `cachemon run` wires them and read once, or twice ``interval`` apart. After each read the
    shared snapshot builder (judge/snapshots.py) records its point, so the attribution engine judges
    check's interval as it judges the daemon's window. ``session`` and ``clock`` are injected by tests."""

    def __init__(self, ups: Sequence[Upstream], logs: LogConfig | None, thresholds: dict[str, A.Thresholds],
                 session: urllib3.PoolManager | None = None, clock: Callable[[], float] = time.time,
                 routers: Sequence[RouterEntry] = ()):
        self.store = Store({"check": 3600.0})
        self.clock = clock
        session = session or new_session()
        self.events = EventLog()
        self.pollers = [UpstreamPoller(u, self.store, session=session, clock=clock, events=self.events)
                        for u in ups]
        self.logs = LogSource(logs, self.store, clock=clock, events=self.events) if logs is not None else None
        self.builder = SnapshotBuilder(AttributionSettings(thresholds=thresholds), kinds=JUDGED_KINDS,
                                       events=self.events)
        self.pages: dict[str, list[Normalised]] = {u.name: [] for u in ups}
        self.times: list[float] = []
        # the routers of --config (`routers:`), read with every read, as the daemon's router stage reads them
        self.router_book = RouterBook() if routers else None
        self.routers = RouterStage(routers, ups, self.router_book, 0.0, clock) if self.router_book else None

    def read(self) -> None:
        """One read of every source. An upstream down at the first read is not read again: that error
        is its report, as it always was."""
        for p in self.pollers:
            pages = self.pages[p.upstream.name]
            if self.times and not pages:
                continue
            n = p.poll_once()
            if n is not None:
                pages.append(n)
        if self.logs is not None:
            while self.logs.poll():
                pass
        if self.routers is not None:
            self.routers.poll_once()
        self.times.append(round(self.clock(), 3))

    def wants_interval(self, from_beginning: bool) -> bool:
        """A second read can say something: an upstream answered, or a log is followed from its end."""
        return any(self.pages.values()) or (self.logs is not None and not from_beginning)

    @property
    def seconds(self) -> float | None:
        return round(self.times[-1] - self.times[0], 3) if len(self.times) > 1 else None

    def record(self) -> None:
        """The builder's point of the first read; its snapshots have no interval yet and are not judged.
        No ledger view here: the KV window's split covers the whole window, from before the first read."""
        self.builder.build(read_store(self.store), self.times[-1])

    def judge(self, ledger_view: LedgerViewFn | None, kv_profile: KvProfileFn | None = None) -> list[A.Attribution]:
        """The engine's verdict on every (source, model) after the last read (fleet-aware across them)."""
        book = self.router_book
        router_view = None if book is None else (lambda up, now: book.view(up, now, ROUTER_WINDOW))
        snaps = self.builder.build(read_store(self.store), self.times[-1], ledger_view=ledger_view,
                                   router_view=router_view, kv_profile=kv_profile)
        return [A.attribute(snap, self.builder.settings.lookback) for snap in snaps]

    def close(self) -> None:
        if self.logs is not None:
            for e in self.logs.entries:
                e.follower.close()


def metrics_report(p: UpstreamPoller, view: UpstreamCopy | None, pages: list[Normalised],
                   seconds: float | None, log: UpstreamCopy | None = None,
                   kv: ServerProfile | None = None) -> SourceReport:
    """The report of one upstream from the pages its poller read (as vLLM wrote them) and its state.
    ``log``: the log linked to it; ``kv``: what its KV events said (``cache_config`` merges the three)."""
    url = redact_url(p.upstream.url)
    error = view.last_error if view is not None and not view.up else None
    rep = new_report("metrics", p.upstream.name, url=url, error=error)
    rep["vllm_version"] = p.vllm_version
    if error is not None or not pages:
        rep["findings"].append(finding("upstream_down", "critical",
                                       f"cannot read {url}: {error[1] if error else 'no page read'}"))
        return rep
    first, last = pages[0], pages[-1]
    rep["era"], rep["era_versions"], rep["counter_unit"] = last.era.name, last.era.versions, last.era.unit
    # the server's one profile: its newest page's engines, then the linked log's start-up lines, then KV events
    rep["cache_config"] = merge(combine(last.engines.values()),
                                engines_profile(log.profiles) if log is not None else None, kv).to_report()
    rep["series"] = series_rows(last.counters, first.counters, seconds if first is not last else None)
    add_gauge_rows(rep, last.gauges)
    rep["findings"] = diagnose(last) + multiprocess_findings(last)
    if first is not last and first.process_start_time != last.process_start_time:
        rep["findings"].append(finding("restarted_during_check", "info",
                                       "The upstream restarted between the two reads; the interval figures are unreliable."))
    # the attribution engine names a raised floor once the new process is confirmed (a later poll of `run`);
    # check's two reads straddle the restart, so it says it from the pages themselves
    before, after = first.match_floor or first.block_size, last.match_floor or last.block_size
    if before and after and after > before:
        rep["findings"].append(finding(
            str(A.CauseCode.MATCH_FLOOR_CHANGED), "warning",
            f"The match floor rose from {before} to {after} tokens between the two reads (block size "
            f"{first.block_size} -> {last.block_size}): a shared prefix shorter than {after} tokens no longer hits "
            f"and every hit is a multiple of {after}, a lasting loss that no refill brings back."))
    return rep


def run_checks(ups: Sequence[Upstream], seconds: float, thresholds: dict[str, A.Thresholds], *,
               logs: LogConfig | None = None, window: KvWindow | None = None,
               decode: Callable[[Sequence[int]], str] | None = None, session: urllib3.PoolManager | None = None,
               sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.time,
               routers: Sequence[RouterEntry] = ()) -> list[SourceReport]:
    """Read every source (twice, ``seconds`` apart, when a second read can say something), follow the
    KV events in between, and judge them all at once: one report per upstream, then one per log.
    ``routers``: the routers in front of them (`routers:` of --config), read with each read."""
    polls = Polls(ups, logs, thresholds, session, clock, routers)
    try:
        polls.read()
        if window is not None:
            for u in ups:         # the stream's model: the one its first page names
                window.set_model(u.name, next(iter(polls.pages[u.name]), None))
            window.start()
        try:
            if seconds > 0 and polls.wants_interval(logs is None or logs.from_beginning):
                polls.record()
                sleep(seconds)
                polls.read()
        finally:
            if window is not None:
                window.stop()
        views = read_store(polls.store)
        kv_profile = window.profile if window is not None else None
        sources = [metrics_report(p, views.get(name), polls.pages[name], polls.seconds,
                                  polls.builder.linked_log(views, name), kv_profile(name) if kv_profile else None)
                   for p in polls.pollers for name in (p.upstream.name,)]
        if window is not None:
            add_kv_reports(sources, window, decode)
        log_reps = [log_report(e, logs.from_beginning, seconds) for e in polls.logs.entries] \
            if polls.logs is not None and logs is not None else []
        # a log given beside exactly one upstream is that upstream's log: its resets explain its drops
        only = sources[0]["name"] if len(sources) == 1 else None
        if only is not None:      # the log's own lines, by their timestamps: published as the log source would
            for e in log_reset_events(log_reps, polls.times[-1]):
                polls.events.publish(EventKind.CACHE_RESET, only, e.at, e.detail)
        add_attribution(sources + log_reps, polls.judge(window.ledger.view if window is not None else None, kv_profile))
        return sources + log_reps
    finally:
        polls.close()


def check_upstreams(specs: Sequence[str], interval: float, timeout: float, session: urllib3.PoolManager | None = None,
                    sleep: Callable[[float], None] = time.sleep, thresholds: dict[str, A.Thresholds] | None = None,
                    clock: Callable[[], float] = time.time) -> list[SourceReport]:
    """Read upstreams (twice, ``interval`` apart) and judge them together, as `cachemon check` does."""
    ups = parse_upstreams(specs, (), timeout)
    return run_checks(ups, interval, thresholds or {}, session=session, sleep=sleep, clock=clock)


def check_upstream(spec: str, interval: float, timeout: float, session: urllib3.PoolManager | None = None,
                   sleep: Callable[[float], None] = time.sleep, thresholds: dict[str, A.Thresholds] | None = None,
                   clock: Callable[[], float] = time.time) -> SourceReport:
    """Read one upstream (twice, ``interval`` apart) and judge it."""
    return check_upstreams([spec], interval, timeout, session, sleep, thresholds, clock)[0]


def parse_upstreams(specs: Sequence[str], kv_specs: Sequence[str], timeout: float) -> list[Upstream]:
    """--upstream with --timeout, and --kv-events applied as `cachemon run` does (NAME= or the only one)."""
    ups = [parse_upstream_spec(u, "--upstream") for u in specs]
    for u in ups:
        u.timeout = timeout
    check_unique_names(ups, "--upstream")
    for i, spec in enumerate(kv_specs):
        apply_kv_events_flag(ups, spec, f"--kv-events[{i}]")
    return ups
