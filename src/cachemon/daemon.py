"""`cachemon run`: wire sources -> normalise -> state -> expose, and keep them running."""
from __future__ import annotations

import importlib
import logging
import signal
import threading
from collections.abc import Callable
from typing import Any

from prometheus_client import ProcessCollector

from cachemon.expose.collector import CachemonCollector
from cachemon.expose.http import Registry, Server, host_port, make_server, serve_in_thread
from cachemon.runconfig import Config
from cachemon.runtime.component import Component
from cachemon.runtime.poller import UpstreamPoller
from cachemon.state.store import Store
from cachemon.urls import redact_url

log = logging.getLogger("cachemon")

# Every optional stage of the pipeline, registered in this one place (node_exporter-style):
# "module:factory", where factory(daemon) returns a component, or None when its config
# section is absent. Modules are imported here only, so the sidecar never loads the analyzer.
STAGES = (
    "cachemon.runtime.logsource:log_component",      # log files -> store
    "cachemon.runtime.changes:changes_component",    # models/version/config/tokenizer changes, resets, warm-up
    "cachemon.runtime.cost:cost_component",          # estimated cost counters (with `cost:`)
    "cachemon.runtime.kv_stage:kv_component",        # KV-cache event streams -> the ledger (with upstreams[].kv_events)
    "cachemon.runtime.attribution_stage:attribution_component",   # why the ratio is low (after changes and kv: reads them)
)


class Daemon:
    """Everything `cachemon run` starts. ``start`` returns once it is serving."""

    def __init__(self, cfg: Config, kv_sink_factory: Callable[..., Any] | None = None):
        """``kv_sink_factory``: what the KV-event stage feeds (default: the fleet ledger); for tests."""
        self.cfg = cfg
        self.kv_sink_factory = kv_sink_factory
        self.kv_ledger: Any = None      # the FleetLedger, set by the KV-event stage when events are followed
        self.store = Store(cfg.windows, cfg.max_series_per_upstream, cfg.evict_after)
        self.stop_event = threading.Event()
        self.registry = Registry()
        self.registry.register(CachemonCollector(self.store))
        self.registry.register(ProcessCollector(registry=None))   # process_* of cachemon itself
        self.pollers = [UpstreamPoller(u, self.store, interval=cfg.poll_interval) for u in cfg.upstreams]
        self.threads: list[threading.Thread] = []
        self.server: Server | None = None
        # Every stage is a Component: started, registered on /metrics, closed on shutdown.
        self.components: list[Component] = list(self.pollers)
        for ref in STAGES:
            module, _, factory = ref.partition(":")
            comp = getattr(importlib.import_module(module), factory)(self)
            if comp is not None:
                self.components.append(comp)
        for comp in self.components:
            self.registry.register(comp)

    def start(self) -> None:
        web = self.cfg.web
        self.server = make_server(self.cfg.listen.address, self.cfg.listen.port, self.registry, web, self.ready)
        for comp in self.components:
            comp.start(self.stop_event)
        self.threads.append(serve_in_thread(self.server))
        scheme = "https" if web.ssl_context else "http"
        log.info("cachemon serving on %s://%s/metrics; upstreams: %s", scheme,
                 host_port(self.cfg.listen.address, self.port),
                 ", ".join(f"{u.name}={redact_url(u.url)}" for u in self.cfg.upstreams) or "none")

    def ready(self) -> bool:
        """/-/ready: listening and every upstream polled once, successfully or not. Never "vLLM is
        up": in a sidecar an unready container takes the whole pod, vLLM included, out of the Service."""
        with self.store.lock:
            return self.server is not None and all(p.state.scrapes > 0 for p in self.pollers)

    @property
    def port(self) -> int:
        return self.server.server_address[1] if self.server else self.cfg.listen.port

    def shutdown(self) -> None:
        self.stop_event.set()
        for comp in self.components:
            comp.close()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def run_forever(self) -> None:
        done = threading.Event()

        def on_signal(signum: int, _frame: object) -> None:
            log.info("received signal %d, shutting down", signum)
            done.set()

        def on_hup(_signum: int, _frame: object) -> None:
            # Like exporter-toolkit, the web config file is re-read on change anyway; SIGHUP forces it
            # now. Other settings are read at start only (SIGHUP used to kill the process silently).
            outcome = self.server.reload_web_config() if self.server is not None else "not serving yet"
            log.info("received SIGHUP: %s; other settings need a restart", outcome)

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGHUP, on_hup)
        self.start()
        while not done.wait(1.0):
            pass
        self.shutdown()
