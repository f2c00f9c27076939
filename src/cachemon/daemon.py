"""`cachemon run`: wire sources -> normalise -> state -> expose, and keep them running."""
from __future__ import annotations

import importlib
import logging
import signal
import threading

from cachemon.config import Config
from cachemon.expose.collector import CachemonCollector
from cachemon.expose.http import Registry, make_server, serve_in_thread
from cachemon.expose.webconfig import WebConfig, load_web_config
from cachemon.runtime.poller import UpstreamPoller
from cachemon.state.store import Store

log = logging.getLogger("cachemon")

# Every optional stage of the pipeline, registered in this one place (node_exporter-style):
# "module:factory", where factory(daemon) returns a component, or None when its config
# section is absent. Modules are imported here only, so the sidecar never loads the analyzer.
STAGES = (
    "cachemon.runtime.logsource:log_component",      # log files -> store
    "cachemon.runtime.changes:changes_component",    # models/version/config/tokenizer changes, resets, warm-up
    "cachemon.runtime.cost:cost_component",          # estimated cost counters (with `cost:`)
)


class Daemon:
    """Everything `cachemon run` starts. ``start`` returns once it is serving."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.store = Store(cfg.windows)
        self.stop_event = threading.Event()
        self.registry = Registry()
        self.registry.register(CachemonCollector(self.store))
        self.pollers = [UpstreamPoller(u, self.store, cfg.max_series_per_upstream) for u in cfg.upstreams]
        self.threads: list[threading.Thread] = []
        self.server = None
        # The optional stages, each with start(stop_event), optional close() and collector.
        self.components: list = []
        for ref in STAGES:
            module, _, factory = ref.partition(":")
            comp = getattr(importlib.import_module(module), factory)(self)
            if comp is not None:
                self.components.append(comp)
        for comp in self.components:
            coll = getattr(comp, "collector", None)
            if coll is not None:
                self.registry.register(coll)

    def start(self) -> None:
        web = load_web_config(self.cfg.listen.web_config_file) if self.cfg.listen.web_config_file else WebConfig()
        self.server = make_server(self.cfg.listen.address, self.cfg.listen.port, self.registry, web)
        for p in self.pollers:
            t = threading.Thread(target=p.run, args=(self.stop_event, self.cfg.poll_interval),
                                 name=f"poll-{p.upstream.name}", daemon=True)
            t.start()
            self.threads.append(t)
        for comp in self.components:
            comp.start(self.stop_event)
        self.threads.append(serve_in_thread(self.server))
        scheme = "https" if web.ssl_context else "http"
        log.info("cachemon serving on %s://%s:%d/metrics; upstreams: %s", scheme, self.cfg.listen.address,
                 self.port, ", ".join(f"{u.name}={u.url}" for u in self.cfg.upstreams) or "none")

    @property
    def port(self) -> int:
        return self.server.server_address[1] if self.server else self.cfg.listen.port

    def shutdown(self) -> None:
        self.stop_event.set()
        for comp in self.components:
            stop = getattr(comp, "close", None)
            if stop:
                stop()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def run_forever(self) -> None:
        done = threading.Event()

        def on_signal(signum, _frame):
            log.info("received signal %d, shutting down", signum)
            done.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        self.start()
        while not done.wait(1.0):
            pass
        self.shutdown()
