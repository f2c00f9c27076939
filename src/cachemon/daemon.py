"""`cachemon run`: wire sources -> normalise -> state -> expose, and keep them running."""
from __future__ import annotations

import logging
import os
import select
import signal
import threading
from typing import TYPE_CHECKING

from prometheus_client import ProcessCollector

from cachemon.config import format_duration
from cachemon.expose.collector import CachemonCollector
from cachemon.runtime.component import Component, StagesCollector
from cachemon.runtime.context import StageContext
from cachemon.runtime.poller import ScrapeSync, UpstreamPoller
from cachemon.runtime.stages import STAGES  # every optional stage, registered in that one place
from cachemon.state.events import EventLog
from cachemon.state.store import Store
from cachemon.urls import redact_url
from cachemon.web.workers import Registry, Server, host_port, make_server, serve_in_thread

if TYPE_CHECKING:
    from cachemon.runconfig import Config
    from cachemon.runtime.kv_stage import SinkFactory

log = logging.getLogger("cachemon")


class Daemon:
    """Everything `cachemon run` starts. ``start`` returns once it is serving."""

    def __init__(self, cfg: Config, kv_sink_factory: SinkFactory | None = None) -> None:
        """``kv_sink_factory``: what the KV-event stage feeds (default: the fleet ledger); for tests."""
        self.cfg = cfg
        self.store = Store(cfg.windows, cfg.max_series_per_upstream, cfg.evict_after)
        self.events = EventLog()
        self.stop_event = threading.Event()
        # Background mode: each poller polls every poll_interval. Scrape mode: every scrape of
        # /metrics polls first (ScrapeSync), the pollers' threads only every background_interval.
        scrape_mode = cfg.poll_mode == "scrape"
        interval = cfg.scrape_mode.background_interval if scrape_mode else cfg.poll_interval
        self.pollers = [UpstreamPoller(u, self.store, interval=interval, events=self.events, scrape_mode=scrape_mode)
                        for u in cfg.upstreams]
        self.scrape_sync = ScrapeSync(self.pollers, cfg.scrape_mode.min_gap) if scrape_mode else None
        self.context = StageContext(cfg, self.store, self.events, {p.upstream.name: p for p in self.pollers},
                                    writer=self.store, kv_sink_factory=kv_sink_factory)
        self.threads: list[threading.Thread] = []
        self.server: Server | None = None
        # Every stage is a Component: started, collected on /metrics (timed per stage), closed on shutdown.
        self.components: list[Component] = list(self.pollers)
        named: list[tuple[str, Component]] = []
        for name, factory in STAGES:
            comp = factory(self.context)
            if comp is not None:
                self.components.append(comp)
                named.append((name, comp))
        self.registry = Registry()
        if self.scrape_sync is not None:
            self.registry.before_collect(self.scrape_sync)
        self.registry.register(StagesCollector([("store", CachemonCollector(self.store)), *named]))
        self.registry.register(ProcessCollector(registry=None))   # process_* of cachemon itself

    def start(self) -> None:
        web = self.cfg.web
        self.server = make_server(self.cfg.listen.address, self.cfg.listen.port, self.registry, web, self.ready)
        for comp in self.components:
            comp.start(self.stop_event)
        self.threads.append(serve_in_thread(self.server))
        scheme = "https" if web.ssl_context else "http"
        log.info("cachemon serving on %s://%s/metrics; upstreams: %s; %s", scheme,
                 host_port(self.cfg.listen.address, self.port),
                 ", ".join(f"{u.name}={redact_url(u.url)}" for u in self.cfg.upstreams) or "none",
                 self.poll_summary())

    def poll_summary(self) -> str:
        """How the upstreams are polled, for the start-up log line."""
        if self.scrape_sync is None:
            return f"polling every {format_duration(self.cfg.poll_interval)}"
        sm = self.cfg.scrape_mode
        return (f"polling on each scrape (reused for {format_duration(sm.min_gap)}), and every "
                f"{format_duration(sm.background_interval)} without scrapes")

    def ready(self) -> bool:
        """/-/ready: listening and every upstream polled once, successfully or not. Never "vLLM is
        up": in a sidecar an unready container takes the whole pod, vLLM included, out of the Service."""
        if self.server is None:
            return False
        with self.store.read() as view:
            return all(view.upstreams[p.upstream.name].scrapes > 0 for p in self.pollers)

    @property
    def port(self) -> int:
        return self.server.server_address[1] if self.server else self.cfg.listen.port

    def shutdown(self) -> None:
        self.stop_event.set()
        # the stages first, the pollers (which may wait out an upstream's timeout) last: the log
        # source cuts its reading short and saves its state within the first seconds of a SIGTERM
        for comp in reversed(self.components):
            comp.close()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        if self.scrape_sync is not None:
            self.scrape_sync.close()

    def run_forever(self) -> None:
        inbox = SignalInbox((signal.SIGTERM, signal.SIGINT, signal.SIGHUP))
        try:
            self.start()
            while True:
                received = inbox.wait(1.0)
                stop = next((s for s in (signal.SIGTERM, signal.SIGINT) if s in received), None)
                if stop is not None:
                    log.info("received signal %d, shutting down", stop)
                    break
                if signal.SIGHUP in received:      # a burst during one re-read is one more re-read
                    self.on_sighup()
            self.shutdown()
        finally:
            inbox.close()

    def on_sighup(self) -> None:
        """Like exporter-toolkit, the web config file is re-read on change anyway; SIGHUP forces it
        now. Other settings are read at start only (and SIGHUP must not end the process)."""
        try:
            outcome = self.server.reload_web_config() if self.server is not None else "not serving yet"
        except Exception as e:     # a bug in a re-read must not end the daemon
            log.exception("received SIGHUP: the web config's re-read failed")
            outcome = f"re-read failed ({type(e).__name__}), the config in force is kept"
        log.info("received SIGHUP: %s; other settings need a restart", outcome)


class SignalInbox:
    """Signals noted by their handlers and acted on by the main thread's loop, one at a time.

    A Python handler runs on the main thread between two bytecodes, possibly while that thread
    holds a lock (a web-config re-read, a log call, an Event's condition): a handler that took one
    would wait for itself for ever, and every later signal, SIGTERM included, would queue behind
    it. So a handler only sets a flag (a dict store: no lock) and writes one byte to a pipe that
    wakes the loop (a system call: no lock); the work runs in the loop.
    """

    def __init__(self, signums: tuple[int, ...]) -> None:
        self._pending: dict[int, bool] = {}
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._poll = select.poll()      # not select.select: no FD_SETSIZE limit on the pipe's number
        self._poll.register(self._r, select.POLLIN)
        self._previous = {s: signal.signal(s, self._note) for s in signums}

    def _note(self, signum: int, _frame: object) -> None:
        self._pending[signum] = True
        try:
            os.write(self._w, b"\0")
        except OSError:     # the pipe is full: wake-ups are pending already, and the flag is set
            pass

    def wait(self, timeout: float) -> set[int]:
        """The signals received since the last call (each once, however often it came); waits up
        to ``timeout`` seconds for one."""
        if not self._pending:
            self._poll.poll(timeout * 1000)
        try:
            while os.read(self._r, 4096):
                pass
        except OSError:     # drained (EAGAIN)
            pass
        return {s for s in list(self._pending) if self._pending.pop(s, False)}

    def close(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        os.close(self._r)
        os.close(self._w)
