"""cachemon's own HTTP listener: /metrics, /-/healthy, /-/ready and a landing page.

Built so that no client can starve the scraper or the probes, the way a Go exporter
holds up with a goroutine per connection and ``ReadHeaderTimeout``:

- one event-loop thread (stdlib ``selectors``) owns every socket: it accepts, runs TLS
  handshakes non-blocking, reads requests and writes replies. An idle, half-sent or
  pre-handshake connection costs a socket and a few hundred bytes, never a thread;
- deadlines: the TLS handshake, the request's headers (and body) from its first byte (or from
  the connection's start), keep-alive idleness, and writing the reply;
- at most ``max_connections`` open connections: when full, slow readers (a reply that has not
  moved for a second, a pipelined request held for unread replies) are closed first, then the
  connection idle the longest (waiting for a handshake or a request, never one being answered);
- slow readers are bounded: reading stops at a complete request head, a pipelined request waits
  while 64 KiB of earlier replies are unread, reply bytes held for clients have a budget;
- only complete requests reach a thread: probes and fixed replies are answered by the loop,
  ``/-/ready`` by its own thread, ``/metrics`` by a small pool of render workers;
- basic auth: credentials whose outcome is cached are answered at once; the rest wait in a
  bounded queue for the one bcrypt thread, and get 429 when it is full or their address is over
  its budget of wrong passwords (counted); every refusal of credentials is answered a second
  later, so a flood of wrong passwords costs neither the loop nor a core of bcrypt, and never
  delays a scraper whose credentials are already verified;
- the web config file is re-read on change (``WebConfigSource``): users per request, the
  certificate per connection, as exporter-toolkit does;
- IPv4, IPv6 and dual-stack (``[::]:9867``); OpenMetrics and gzip when the scraper asks;
- one short log line, rate-limited, per failed connection (control characters escaped by
  cachemon.logformat, never logged raw).

The parts: expose/registry.py (what /metrics serves), web/handler.py (the pure routing and
replies), web/listener.py and web/connection.py (the event loop and connection states);
this module wires them to the worker threads.
"""
from __future__ import annotations

import errno
import logging
import os
import queue
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

from cachemon import catalog as C
from cachemon.expose.registry import DuplicateFamilyError, Registry
from cachemon.expose.render import Collector, Family, format_labels
from cachemon.web.connection import Conn, Limits, address_family, host_port
from cachemon.web.handler import (
    Request,
    Route,
    auth_outcome,
    busy_reply,
    collect_failed_reply,
    encode_page,
    handle,
    metrics_reply,
    page_variant,
    ready_reply,
)
from cachemon.web.listener import Listener
from cachemon.web.web_config import WebConfig, WebConfigSource

__all__ = ["Collector", "DuplicateFamilyError", "Limits", "Registry", "Server", "host_port", "make_server",
           "serve_in_thread"]

log = logging.getLogger("cachemon.http")


class _ListenerCollector:
    """cachemon_http_refused_total{reason}: what the listener refused or cut, and why;
    cachemon_web_config_reloads_total{outcome}: the web config's re-reads."""

    def __init__(self, server: Server) -> None:
        self.server = server

    def collect(self) -> Iterator[Family]:
        for spec, counts in ((C.HTTP_REFUSED, self.server.refused), (C.WEB_CONFIG_RELOADS, self.server.web.outcomes)):
            f = Family.of(spec)
            for label, n in sorted(counts.copy().items()):
                f.add(format_labels(spec.labels, (label,)), float(n))
            if f.samples:        # a labelled counter appears with its first increment
                yield f


_Job = tuple[Conn, Request, WebConfig]
# Client addresses whose failed checks are remembered (a bucket each, a few dozen bytes).
_AUTH_BUDGET_HOSTS = 4096


class Server(Listener):
    """The listener with its application: probes and fixed replies from the loop thread,
    ``/-/ready`` from its own thread, ``/metrics`` from the render threads, passwords from the
    one bcrypt thread."""

    def __init__(self, address: tuple[str, int], family: socket.AddressFamily, dual_stack: bool,
                 limits: Limits, registry: Registry, web: WebConfig, ready: Callable[[], bool]) -> None:
        super().__init__(address, family, dual_stack, limits, WebConfigSource(web))
        self.registry = registry
        self.ready = ready
        self._auth_q: queue.Queue[tuple[Conn, Request, WebConfig, Any] | None] = queue.Queue(limits.auth_queue)
        self._auth_lock = threading.Lock()
        self._auth_pending: dict[str, int] = {}       # queued or being checked, by client address
        # failed checks a client address may still have: (tokens, when counted), least recent first
        self._auth_budget: OrderedDict[str, tuple[float, float]] = OrderedDict()
        # /metrics requests waiting for a render: no cap of their own (each holds a connection,
        # and connections are capped), so a crowd of scrapers never turns a scraper away
        self._pages = threading.Condition()
        self._page_jobs: list[_Job] = []
        self._ready_q: queue.Queue[_Job | None] = queue.Queue(limits.ready_queue)
        self._threads: list[threading.Thread] = []
        for i in range(max(1, limits.workers)):
            self._start(self._render_worker, f"cachemon-http-render-{i}")
        self._start(self._ready_worker, "cachemon-http-ready")
        self._start(self._auth_worker, "cachemon-http-auth")

    def _start(self, target: Callable[[], None], name: str) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def _stop_workers(self) -> None:
        with self._pages:
            self._pages.notify_all()
        for q in (self._auth_q, self._ready_q):
            try:
                q.put_nowait(None)
            except queue.Full:
                pass

    def reload_web_config(self) -> str:
        """SIGHUP: re-read the web config now."""
        return self.web.reload()

    # --- the loop thread --------------------------------------------------------------------

    def _dispatch(self, c: Conn, req: Request) -> None:
        conf, error = self.web.current()
        auth = auth_outcome(req, conf)
        action = handle(req, conf, error, auth)
        match action.route:
            case Route.REPLY if action.refused_credentials:
                self._reply_later(c, action.reply, req.close, self.limits.refusal_delay)
            case Route.REPLY:
                self._reply(c, action.reply, req.close)
            case Route.READY:
                self._enqueue(self._ready_q, (c, req, conf), c, req)
            case Route.METRICS:
                self._enqueue_page((c, req, conf))
            case Route.VERIFY:
                self._enqueue_auth(c, req, conf, auth)

    def _enqueue_auth(self, c: Conn, req: Request, conf: WebConfig, pending: Any) -> None:
        host = c.peer.rpartition(":")[0]
        with self._auth_lock:
            if self._auth_q.full():
                reason = "auth_queue_full"
            elif self._auth_pending.get(host, 0) >= self.limits.auth_per_client:
                reason = "auth_per_client"
            elif self._failures_left(host) < 1:
                reason = "auth_throttled"
            else:
                self._auth_pending[host] = self._auth_pending.get(host, 0) + 1
                self._auth_q.put_nowait((c, req, conf, pending))
                return
        self.refused[reason] += 1
        self._reply_later(c, busy_reply(req, 429, b"Too many unverified credentials waiting; retry later.\n"),
                          req.close, self.limits.refusal_delay)

    def _failures_left(self, host: str, spend: float = 0.0) -> float:
        """The client address's token bucket of failed checks, refilled to now, less `spend`
        (call with _auth_lock held). Addresses beyond _AUTH_BUDGET_HOSTS forget the oldest."""
        now = time.monotonic()
        burst = float(self.limits.auth_failure_burst)
        tokens, then = self._auth_budget.pop(host, (burst, now))
        tokens = min(burst, tokens + (now - then) * self.limits.auth_failure_rate) - spend
        if tokens < burst:        # a full bucket needs no entry
            self._auth_budget[host] = (tokens, now)
            if len(self._auth_budget) > _AUTH_BUDGET_HOSTS:
                self._auth_budget.popitem(last=False)
        return tokens

    def _enqueue_page(self, job: _Job) -> None:
        with self._pages:
            self._page_jobs.append(job)
            self._pages.notify()

    def _enqueue(self, q: queue.Queue[_Job | None], job: _Job, c: Conn, req: Request) -> None:
        """Hand a request to a worker thread, or answer 503 when its queue is full."""
        try:
            q.put_nowait(job)
        except queue.Full:
            self.refused["busy"] += 1
            self._reply(c, busy_reply(req, 503, b"Too many requests waiting; retry later.\n"), req.close)

    # --- workers ------------------------------------------------------------------------------

    def _render_worker(self) -> None:
        """Take every /metrics request waiting, render one page per format for all of them.

        A request that arrives while a page renders waits for the next render (never gets a page
        begun before it came), so a crowd costs one render per round, not one per request."""
        while True:
            with self._pages:
                while not self._page_jobs and not self._closing.is_set():
                    self._pages.wait()
                if self._closing.is_set():
                    return
                batch, self._page_jobs = self._page_jobs, []
            self._render_batch(batch)

    def _render_batch(self, batch: list[_Job]) -> None:
        rendered: dict[bool, bytes | Exception] = {}        # by OpenMetrics or not
        encoded: dict[tuple[bool, bool], bytes] = {}       # by (OpenMetrics, gzip)
        for c, req, conf in batch:
            variant = page_variant(req)
            if variant[0] not in rendered:
                try:
                    rendered[variant[0]] = self.registry.render(variant[0])
                except Exception as e:   # a collector bug must not take the listener down
                    log.exception("collect failed")
                    rendered[variant[0]] = e
            body = rendered[variant[0]]
            if isinstance(body, Exception):
                self._post(c, collect_failed_reply(req, conf, body), req.close)
                continue
            if variant not in encoded:
                encoded[variant] = encode_page(body, variant)
            self._post(c, metrics_reply(req, conf, variant, encoded[variant]), req.close)

    def _ready_worker(self) -> None:
        while True:
            job = self._ready_q.get()
            if job is None:
                return
            c, req, conf = job
            try:
                ok = self.ready()
            except Exception:
                log.exception("readiness check failed")
                ok = False
            self._post(c, ready_reply(req, conf, ok), req.close)

    def _auth_worker(self) -> None:
        # bcrypt is the one CPU-heavy task an unauthenticated client can start: at a lower
        # scheduling priority (Linux threads are tasks; nice 10 weighs ~1/10 of nice 0), a flood of
        # wrong passwords takes mostly CPU time the render threads, the loop and vLLM do not want.
        # Not 19: on a node busy with vLLM a scraper's first check would then take seconds.
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        except (AttributeError, OSError):   # not Linux: one bcrypt at a time still bounds it to a core
            pass
        while True:
            item = self._auth_q.get()
            if item is None:
                return
            c, req, conf, pending = item
            assert conf.auth is not None
            try:
                ok = conf.auth.verify(pending)
            except Exception:      # never let the one bcrypt thread die: the queue would stall
                log.exception("password check failed")
                ok = False
            finally:
                host = c.peer.rpartition(":")[0]
                with self._auth_lock:
                    self._auth_pending[host] -= 1
                    if self._auth_pending[host] <= 0:
                        del self._auth_pending[host]
                    if not ok:
                        self._failures_left(host, spend=1.0)
            action = handle(req, conf, None, ok)
            if action.route is Route.METRICS:
                self._enqueue_page((c, req, conf))
            else:
                self._post(c, action.reply, req.close, self.limits.refusal_delay if action.refused_credentials else 0.0)


def make_server(address: str, port: int, registry: Registry, web: WebConfig | None = None,
                ready: Callable[[], bool] = lambda: True, limits: Limits | None = None) -> Server:
    conf = web or WebConfig()
    limits = limits or Limits()
    family, dual_stack = address_family(address, port)
    try:
        server = Server((address, port), family, dual_stack, limits, registry, conf, ready)
    except OSError as e:
        if not (dual_stack and e.errno == errno.EAFNOSUPPORT):
            raise OSError(f"cannot listen on {host_port(address, port)}: {e.strerror or e}") from e
        # IPv6 disabled in this kernel or container: "all interfaces" means all IPv4 ones, as in Go.
        log.info("IPv6 unavailable (%s); listening on 0.0.0.0:%d instead of [::]", e.strerror, port)
        return make_server("0.0.0.0", port, registry, web, ready, limits)
    registry.register(_ListenerCollector(server))
    return server


def serve_in_thread(server: Server) -> threading.Thread:
    t = threading.Thread(target=server.serve_forever, name="cachemon-http", daemon=True)
    t.start()
    return t
