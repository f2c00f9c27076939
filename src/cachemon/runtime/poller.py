"""One vLLM upstream: poll /metrics, normalise, fold into the store.

Two poll modes (runconfig ``poll_mode``; README, "Polling cost and mode"):

- ``background``: each poller's thread polls every ``poll_interval``, whatever Prometheus does.
- ``scrape``: each scrape of cachemon's /metrics first polls every upstream (``ScrapeSync``, called
  by the registry before it collects), as Prometheus' "Writing exporters" guide recommends; the
  poller's thread only polls when no scrape did for ``scrape_mode.background_interval``, so a
  restart or a counter reset between two scrapes is still seen and corrected.

Either way one poller polls one upstream at a time (``poll_if_stale``): a caller that finds a poll
in flight waits for it and takes its result, and a poll that ended less than ``max_age`` ago is
reused, so concurrent scrapes (two Prometheus servers, a retry) cost vLLM one request.

The poller is the one reader of ``/version``: at its first poll, and once per new process (a new
``process_start_time`` or a restart); change detection reads it here (``UpstreamMeta``).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Protocol

import urllib3

from cachemon.config import Upstream
from cachemon.expose.render import Family
from cachemon.normalise.normaliser import Normalised, Normaliser, Problem, to_update
from cachemon.sources import hints
from cachemon.sources.exposition import ExpositionError, LabelBudget
from cachemon.sources.scrape import FetchError, fetch_text, new_session
from cachemon.sources.vllm_api import VllmApi
from cachemon.state.events import EventKind, EventLog
from cachemon.state.store import Store

log = logging.getLogger("cachemon.upstream")
# New label sets read per page, times max_series_per_upstream (None: no budget and no deadline over
# parsing: benchmarks/bench_hostile.py's baseline only).
BUDGET_FACTOR: int | None = 2
# A poll fetches /metrics (bounded by the upstream's timeout) and, after a start or a restart,
# /version (bounded by min(timeout, 2 s)); a caller waits for someone else's poll at most that
# long plus this margin, so a stuck poll never holds a scrape longer.
POLL_WAIT_MARGIN = 1.0
# /version is read at the first poll and after each restart (change detection reads it from here); a
# server that did not answer it is asked again at most this often.
VERSION_RETRY = 30.0


class UpstreamMeta(Protocol):
    """One polled upstream's metadata as its poller last read it: what other stages read of a poller."""

    @property
    def upstream(self) -> Upstream: ...
    @property
    def vllm_version(self) -> str: ...          # /version, read at the first poll and for each new process ("": none)
    @property
    def last(self) -> Normalised | None: ...    # the last page read (None: none yet)


class UpstreamPoller:
    """Polls one upstream; ``poll_once`` is the whole job, the thread just repeats it."""

    def __init__(self, upstream: Upstream, store: Store, session: urllib3.PoolManager | None = None,
                 clock: Callable[[], float] = time.time, interval: float = 5.0, events: EventLog | None = None,
                 scrape_mode: bool = False):
        """``events``: where restarts are published (the daemon's shared log; a private one without it).
        ``scrape_mode``: the thread is the slow background poll of scrape mode (it polls only when no
        scrape did for ``interval``); otherwise it polls every ``interval``."""
        self.upstream = upstream
        self.interval = interval
        self.scrape_mode = scrape_mode
        self._poll_lock = threading.Lock()
        self._polled_at: float | None = None      # time.monotonic() when the last poll ended
        self._thread: threading.Thread | None = None
        self._problems: list[Problem] = []
        self.store = store
        store.upstream(upstream.name, "metrics")
        self.session = session or new_session()
        self.clock = clock
        # /version as last read (what change detection reads), and the version the store's info carries:
        # the exported process's, which takes a new process's version once its restart is corroborated
        # (a new start time that is held may be a second process behind the URL).
        self.vllm_version = ""
        self._info_version = ""
        self._need_version = True       # the first poll reads /version, and the one after a restart takes it
        self._version_at = 0.0          # time.monotonic() of the last /version read
        self._version_pst: float | None = None    # the page's process start time at that read
        self.last: Normalised | None = None
        self.events = events if events is not None else EventLog()
        self.normaliser = Normaliser()     # this upstream's repeat-poll caches

    def _fetch_version(self, pst: float | None) -> None:
        # /version exists on vLLM's OpenAI server; absent elsewhere, which is fine.
        api = VllmApi(self.upstream.base_url, self.session)
        self.vllm_version = api.version(min(self.upstream.timeout, 2.0)) or ""
        self._version_at = time.monotonic()
        self._version_pst = pst

    def poll_once(self) -> Normalised | None:
        name = self.upstream.name
        t0 = time.perf_counter()
        # The timeout bounds the whole poll, parsing included; the label-set budget its work: the
        # label sets the state keeps are always read, and up to twice its capacity of new ones
        # (enough to take a freed slot and to count refusals).
        deadline: float | None = time.monotonic() + self.upstream.timeout
        budget = None
        if BUDGET_FACTOR is None:
            deadline = None
        else:
            with self.store.read() as view:
                keep = frozenset((i[0], i[1]) for i in view.upstreams[name].idents)
            budget = LabelBudget(BUDGET_FACTOR * self.store.max_series, keep)
        itself = ""
        try:
            body = fetch_text(self.session, self.upstream.url, self.upstream.timeout, self.upstream.max_body_bytes)
            itself = hints.cachemon_page(body, self.upstream.url)
            if itself:      # refused: its numbers would be cachemon's own, an era "none" and no alert
                raise FetchError("not_exposition", itself)
            n = self.normaliser.normalise_text(body, budget, deadline)
        except (FetchError, ExpositionError) as e:
            if not self.store.record_error(name, e.reason, str(e), duration=time.perf_counter() - t0):
                (log.error if itself else log.warning)("upstream %s: %s (%s)", name, e, e.reason)
            return None
        pst = n.process_start_time
        fetched = not self._version_at or (not self.vllm_version and time.monotonic() - self._version_at >= VERSION_RETRY)
        if fetched:
            self._fetch_version(pst)
        if self._need_version:
            self._info_version, self._need_version = self.vllm_version, False
        now = self.clock()
        upd = to_update(n, self._info_version)
        restart, was_down = self.store.apply(name, upd, now, duration=time.perf_counter() - t0)
        if was_down:
            log.info("upstream %s is back up (era %s)", self.upstream.name, n.era.name)
        if n.problems != self._problems:    # log a page's problems when they change, not every poll
            for problem in n.problems:
                log.warning("upstream %s: %s", self.upstream.name, problem)
            self._problems = n.problems
        if not fetched and (restart or (pst is not None and pst != self._version_pst)):
            self._fetch_version(pst)    # a new process (an upgrade is one): its version, before the stages hear of it
        if restart:
            log.warning("upstream %s restarted (%s); counters corrected", self.upstream.name, restart)
            self._need_version = True   # the store's info takes the new process's version from the next page on
            self.events.publish(EventKind.RESTART, self.upstream.name, now, restart)
        self.last = n
        return n

    @property
    def max_poll_seconds(self) -> float:
        """The longest one poll can take: /metrics and /version within their timeouts, plus a margin."""
        return self.upstream.timeout + min(self.upstream.timeout, 2.0) + POLL_WAIT_MARGIN

    def poll_age(self) -> float | None:
        """Seconds since the last poll ended (None: never polled)."""
        at = self._polled_at
        return None if at is None else time.monotonic() - at

    def poll_if_stale(self, max_age: float) -> bool:
        """Poll unless a poll ended less than ``max_age`` seconds ago; True if this call polled.

        One poll at a time: a caller that finds one in flight waits for it (at most
        ``max_poll_seconds``) and then reuses it, being younger than ``max_age``."""
        if not self._poll_lock.acquire(timeout=self.max_poll_seconds):
            return False       # a poll is stuck beyond its own bounds: serve what the store has
        try:
            age = self.poll_age()
            if age is not None and age < max_age:
                return False
            self._poll_guarded()
            return True
        finally:
            self._poll_lock.release()

    def _poll_guarded(self) -> None:
        try:
            self.poll_once()
        except Exception:   # never let one bad poll kill the thread or fail a scrape
            log.exception("upstream %s: unexpected error while polling", self.upstream.name)
            self.store.record_error(self.upstream.name, "other", "internal error while polling (see cachemon's log)")
        finally:
            self._polled_at = time.monotonic()

    # -- the daemon's Component protocol -------------------------------------------
    def start(self, stop_event: threading.Event) -> None:
        self._thread = threading.Thread(target=self.run, args=(stop_event, self.interval),
                                        name=f"poll-{self.upstream.name}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self._thread is not None:
            self._thread.join(timeout=self.upstream.timeout + 1.0)

    def collect(self) -> Iterator[Family]:
        return iter(())    # its numbers live in the store, exported by expose.collector

    def run(self, stop: threading.Event, interval: float) -> None:
        """Background mode: poll every ``interval``. Scrape mode: poll when the last poll (a scrape's
        or this thread's) ended ``interval`` ago."""
        while not stop.is_set():
            started = time.monotonic()
            if self.scrape_mode:
                self.poll_if_stale(interval)
                age = self.poll_age()
                stop.wait(max(0.0, interval - (age if age is not None else 0.0)))
            else:
                self.poll_if_stale(0.0)
                stop.wait(max(0.0, interval - (time.monotonic() - started)))


class ScrapeSync:
    """Scrape mode's hook, called before each render of cachemon's /metrics: poll every upstream
    whose last poll ended ``min_gap`` or more ago, all at once. A slow or dead upstream is bounded
    by its timeout (``max_poll_seconds``: a poll in flight is waited for at most that long, a poll
    of its own takes at most that long), and the scrape then shows what the store holds (an
    upstream whose poll failed is marked down)."""

    def __init__(self, pollers: Sequence[UpstreamPoller], min_gap: float) -> None:
        self.pollers = tuple(pollers)
        self.min_gap = min_gap
        self._pool: ThreadPoolExecutor | None = None
        if len(self.pollers) > 1:
            self._pool = ThreadPoolExecutor(max_workers=len(self.pollers), thread_name_prefix="scrape-poll")

    def __call__(self) -> None:
        if self._pool is None:
            for p in self.pollers:      # zero or one upstream: poll on the scraper's thread
                p.poll_if_stale(self.min_gap)
            return
        futures = [self._pool.submit(p.poll_if_stale, self.min_gap) for p in self.pollers]
        wait_futures(futures, timeout=max(p.max_poll_seconds for p in self.pollers))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
