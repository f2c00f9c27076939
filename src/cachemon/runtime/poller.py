"""One vLLM upstream: poll /metrics, normalise, fold into the store."""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

import urllib3

from cachemon.config import Upstream
from cachemon.expose.render import Family
from cachemon.normalise.normaliser import Normalised, Normaliser, Problem, to_update
from cachemon.runtime.events import EventKind, EventLog
from cachemon.sources.exposition import ExpositionError, LabelBudget
from cachemon.sources.scrape import FetchError, fetch_text, new_session
from cachemon.sources.vllm_api import VllmApi
from cachemon.state.store import Store

log = logging.getLogger("cachemon.upstream")
# New label sets read per page, times max_series_per_upstream (None: no budget and no deadline over
# parsing, as before issue 17; benchmarks/bench_hostile.py's baseline only).
BUDGET_FACTOR: int | None = 2


class UpstreamPoller:
    """Polls one upstream; ``poll_once`` is the whole job, the thread just repeats it."""

    def __init__(self, upstream: Upstream, store: Store, session: urllib3.PoolManager | None = None,
                 clock: Callable[[], float] = time.time, interval: float = 2.0, events: EventLog | None = None):
        """``events``: where restarts are published (the daemon's shared log; a private one without it)."""
        self.upstream = upstream
        self.interval = interval
        self._thread: threading.Thread | None = None
        self._problems: list[Problem] = []
        self.store = store
        self.state = store.upstream(upstream.name, "metrics")
        self.session = session or new_session()
        self.clock = clock
        self.vllm_version = ""
        self._need_version = True
        self.last: Normalised | None = None
        self.events = events if events is not None else EventLog()
        self.normaliser = Normaliser()     # this upstream's repeat-poll caches

    def _fetch_version(self) -> None:
        # /version exists on vLLM's OpenAI server; absent elsewhere, which is fine.
        api = VllmApi(self.upstream.base_url, self.session)
        self.vllm_version = api.version(min(self.upstream.timeout, 2.0)) or ""
        self._need_version = False

    def poll_once(self) -> Normalised | None:
        st = self.state
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
                keep = frozenset((i[0], i[1]) for i in view.upstreams[self.upstream.name].idents)
            budget = LabelBudget(BUDGET_FACTOR * st.max_series, keep)
        try:
            body = fetch_text(self.session, self.upstream.url, self.upstream.timeout, self.upstream.max_body_bytes)
            n = self.normaliser.normalise_text(body, budget, deadline)
        except (FetchError, ExpositionError) as e:
            with self.store.lock:
                was_up = st.up or not st.scrapes
                st.record_error(e.reason, str(e))
                st.last_duration = time.perf_counter() - t0
            if was_up:
                log.warning("upstream %s: %s (%s)", self.upstream.name, e, e.reason)
            return None
        if self._need_version:
            self._fetch_version()
        now = self.clock()
        upd = to_update(n, self.vllm_version)
        with self.store.lock:
            was_down = not st.up and st.scrapes > 0
            restart = st.apply(upd, now)
            st.last_duration = time.perf_counter() - t0
        if was_down:
            log.info("upstream %s is back up (era %s)", self.upstream.name, n.era.name)
        if n.problems != self._problems:    # log a page's problems when they change, not every poll
            for problem in n.problems:
                log.warning("upstream %s: %s", self.upstream.name, problem)
            self._problems = n.problems
        if restart:
            log.warning("upstream %s restarted (%s); counters corrected", self.upstream.name, restart)
            self._need_version = True   # an upgrade is a restart: re-read the version
            self.events.publish(EventKind.RESTART, self.upstream.name, now, restart)
        self.last = n
        return n

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
        while not stop.is_set():
            started = time.monotonic()
            try:
                self.poll_once()
            except Exception:   # never let one bad poll kill the thread
                log.exception("upstream %s: unexpected error while polling", self.upstream.name)
                with self.store.lock:
                    self.state.record_error("other", "internal error while polling (see cachemon's log)")
            stop.wait(max(0.0, interval - (time.monotonic() - started)))
