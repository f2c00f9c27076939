"""cachemon's own HTTP listener: /metrics, /-/healthy, /-/ready and a landing page.

Built so that no client can starve the scraper or the probes (issue 17), the way a Go exporter
holds up with a goroutine per connection and ``ReadHeaderTimeout``:

- one event-loop thread (stdlib ``selectors``) owns every socket: it accepts, runs TLS
  handshakes non-blocking, reads requests and writes replies. An idle, half-sent or
  pre-handshake connection costs a socket and a few hundred bytes, never a thread;
- deadlines: the TLS handshake, the request's headers (and body) from its first byte (or from
  the connection's start), keep-alive idleness, and writing the reply;
- at most ``max_connections`` open connections: when full, the connection idle the longest
  (waiting for a handshake or a request, never one being answered) is closed first;
- only complete requests reach a thread: probes and fixed replies are answered by the loop,
  ``/-/ready`` by its own thread, ``/metrics`` by a small pool of render workers;
- basic auth: credentials whose outcome is cached are answered at once; the rest wait in a
  bounded queue for the one bcrypt thread, and get 429 when it is full (counted), so a flood
  of wrong passwords never delays a scraper whose credentials are already verified;
- the web config file is re-read on change (``WebConfigSource``): users per request, the
  certificate per connection, as exporter-toolkit does;
- IPv4, IPv6 and dual-stack (``[::]:9867``); OpenMetrics and gzip when the scraper asks;
- one short log line, rate-limited, per failed connection (control characters escaped by
  cachemon.logformat, never logged raw).
"""
from __future__ import annotations

import errno
import gzip
import ipaddress
import logging
import os
import queue
import resource
import selectors
import socket
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any, Protocol

from cachemon import catalog as C
from cachemon.expose.render import (
    CONTENT_TYPE,
    OPENMETRICS_CONTENT_TYPE,
    Family,
    format_labels,
    render,
    render_openmetrics,
)
from cachemon.expose.webconfig import WebConfig, WebConfigSource

log = logging.getLogger("cachemon.http")


class Collector(Protocol):
    def collect(self) -> Any: ...


class DuplicateFamilyError(ValueError):
    """Two collectors (or one, twice) export a metric family of the same name."""


def _family_names(collector: Collector) -> list[str]:
    """The family names a collector exports: its ``describe()`` when it has one, else what one
    ``collect()`` yields now (prometheus_client's Registry.register does the same)."""
    describe = getattr(collector, "describe", None)
    fams = describe() if callable(describe) else collector.collect()
    return [f.name for f in fams]


class Registry:
    """The collectors served on /metrics (cachemon's own plus those of optional stages).

    ``register`` refuses a collector whose families clash by name with a registered one's (or
    with each other), as prometheus_client's registry does: two families of one name are an
    invalid exposition that Prometheus rejects whole."""

    def __init__(self) -> None:
        self.collectors: list[Collector] = []
        self._names: dict[str, Collector] = {}
        self._before_collect: list[Callable[[], None]] = []

    def before_collect(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` at the start of every render, before any collector (scrape mode's polls,
        runtime.poller.ScrapeSync). It must bound its own time; an exception is logged, not served."""
        self._before_collect.append(hook)

    def register(self, collector: Collector) -> None:
        names = _family_names(collector)
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise DuplicateFamilyError(f"{type(collector).__name__} exports these metric families more than once: "
                                       f"{', '.join(twice)}")
        clash = sorted(n for n in set(names) if n in self._names)
        if clash:
            owners = sorted({type(self._names[n]).__name__ for n in clash})
            raise DuplicateFamilyError(f"{type(collector).__name__} exports metric families already registered by "
                                       f"{', '.join(owners)}: {', '.join(clash)}")
        self.collectors.append(collector)
        for n in names:
            self._names[n] = collector

    def render(self, openmetrics: bool = False) -> bytes:
        for hook in self._before_collect:
            try:
                hook()
            except Exception:     # the collectors still serve what the store holds
                log.exception("before-collect hook failed")
        return render_openmetrics(self.collectors) if openmetrics else render(self.collectors)


@dataclass(frozen=True)
class Limits:
    # The kernel caps the backlog at net.core.somaxconn (4096 on current kernels).
    backlog: int = 1024
    # Open connections held at once (also capped by the file-descriptor limit); when full, the
    # one idle the longest is closed to make room.
    max_connections: int = 1024
    handshake_timeout: float = 5.0
    # Go's ReadHeaderTimeout: from a request's first byte (a new connection: from its start or
    # the end of its TLS handshake) until its headers and body are read.
    request_timeout: float = 5.0
    # A keep-alive connection waiting for its next request (Prometheus scrapes every 15-60 s).
    idle_timeout: float = 120.0
    write_timeout: float = 30.0
    workers: int = 2                # /metrics render threads
    auth_queue: int = 16            # unverified credentials waiting for the bcrypt thread
    auth_per_client: int = 2        # ... of which from one client address (a flood from one host
                                    # cannot keep a scraper elsewhere from being verified)
    render_queue: int = 64          # /metrics requests waiting for a render thread
    max_header_bytes: int = 65536
    max_body_bytes: int = 65536     # a GET/HEAD body is read and discarded up to this size


_LANDING = b"""<html><head><title>cachemon</title></head><body>
<h1>cachemon</h1><p>vLLM prefix-cache exporter. <a href="/metrics">Metrics</a></p>
</body></html>
"""

# Probes answer without basic auth: a kubelet cannot send credentials without putting them in
# the pod spec, and "OK" / "not ready" discloses nothing.
_OPEN_PATHS = frozenset({"/-/healthy", "/-/ready"})
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
            413: "Content Too Large", 429: "Too Many Requests", 431: "Request Header Fields Too Large",
            500: "Internal Server Error", 503: "Service Unavailable", 505: "HTTP Version Not Supported"}
_TEXT = "text/plain; charset=utf-8"
_LOG_BURST = 20          # failed-connection log lines per _LOG_WINDOW seconds, then a summary
_LOG_WINDOW = 10.0


def host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def accepts(header: str | None, wanted: str) -> bool:
    """Whether an Accept / Accept-Encoding header lists `wanted` with a non-zero q."""
    for part in (header or "").split(","):
        media, *params = (p.strip() for p in part.split(";"))
        if media.lower() != wanted:
            continue
        q = 1.0
        for param in params:
            k, _, v = param.partition("=")
            if k.strip().lower() == "q":
                try:
                    q = float(v)
                except ValueError:
                    q = 0.0
        if q > 0:
            return True
    return False


def _family(address: str, port: int) -> tuple[socket.AddressFamily, bool]:
    """(address family, dual-stack) for a listen address; `::` listens on IPv4 too, as in Go."""
    if not address:
        return socket.AF_INET, False     # "" binds every IPv4 interface
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:   # a host name: listen on what it resolves to first
        try:
            infos = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except socket.gaierror as e:
            raise OSError(f"cannot listen on {host_port(address, port)}: {e.strerror}") from e
        return infos[0][0], False
    if ip.version == 6:
        return socket.AF_INET6, ip == ipaddress.IPv6Address("::")
    return socket.AF_INET, False


def _reason(exc: BaseException | None) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason)
    if isinstance(exc, TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__


# Connection states. Idle ones (evictable when the server is full): HELLO, HANDSHAKE, READ, DRAIN.
HELLO, HANDSHAKE, READ, BUSY, WRITE, DRAIN = range(6)
_IDLE = frozenset({HELLO, HANDSHAKE, READ, DRAIN})


class _Conn:
    __slots__ = ("buf", "close_after", "deadline", "deadline_why", "events", "out", "peer", "served", "since",
                 "sock", "state")

    def __init__(self, sock: socket.socket, peer: str, state: int, deadline: float, why: str) -> None:
        self.sock: socket.socket = sock
        self.peer = peer
        self.state = state
        self.buf = bytearray()
        self.out: memoryview | None = None
        self.close_after = False
        self.served = 0
        self.since = time.monotonic()         # when it became idle (eviction order)
        self.deadline = deadline
        self.deadline_why = why
        self.events = 0                       # what the selector watches (0: not registered)


@dataclass
class _Request:
    method: str
    path: str
    headers: dict[str, str]
    close: bool


class _BadRequest(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _response(code: int, body: bytes, ctype: str = _TEXT, headers: dict[str, str] | None = None,
              extra: tuple[tuple[str, str], ...] = (), head: bool = False, close: bool = False) -> bytes:
    lines = [f"HTTP/1.1 {code} {_REASONS.get(code, 'Error')}", "Server: cachemon",
             f"Date: {formatdate(usegmt=True)}", f"Content-Type: {ctype}", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in (*(headers or {}).items(), *extra)]
    if close:
        lines.append("Connection: close")
    data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return data if head else data + body


def _parse(head: bytes) -> _Request:
    """One request head (request line + headers, without the blank line). Raises _BadRequest."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:    # pragma: no cover - latin-1 decodes every byte
        raise _BadRequest(400, "undecodable request") from None
    line, *fields = text.split("\r\n")
    parts = line.split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[0].isupper():
        raise _BadRequest(400, "malformed request line")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise _BadRequest(505 if version.startswith("HTTP/") else 400, "unsupported HTTP version")
    if len(fields) > 100:
        raise _BadRequest(431, "too many header fields")
    headers: dict[str, str] = {}
    for f in fields:
        name, colon, value = f.partition(":")
        if not colon or not name or name != name.strip() or any(c in name for c in " \t"):
            raise _BadRequest(400, "malformed header field")    # includes obsolete line folding
        key, value = name.lower(), value.strip(" \t")
        if key in headers:
            if key in ("content-length", "host", "authorization", "transfer-encoding"):
                if headers[key] != value or key != "content-length":
                    raise _BadRequest(400, f"repeated {name} header")
            headers[key] += ", " + value
        else:
            headers[key] = value
    conn = headers.get("connection", "").lower()
    close = version == "HTTP/1.0" or "close" in (t.strip() for t in conn.split(","))
    path = target.split("?", 1)[0]
    return _Request(method, path, headers, close)


class _LogLimiter:
    """At most _LOG_BURST failed-connection lines per _LOG_WINDOW s; the rest are counted and summed up."""

    def __init__(self) -> None:
        self.window_start = 0.0
        self.lines = 0
        self.suppressed = 0

    def __call__(self, level: int, msg: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self.window_start >= _LOG_WINDOW:
            if self.suppressed:
                log.warning("%d more failed-connection lines suppressed in the last %gs", self.suppressed, _LOG_WINDOW)
            self.window_start, self.lines, self.suppressed = now, 0, 0
        if self.lines >= _LOG_BURST:
            self.suppressed += 1
            return
        self.lines += 1
        log.log(level, msg, *args)


class _ListenerCollector:
    """cachemon_http_refused_total{reason}: what the listener refused or cut, and why."""

    def __init__(self, server: Server) -> None:
        self.server = server

    def collect(self) -> Iterator[Family]:
        spec = C.HTTP_REFUSED
        f = Family.of(spec)
        for reason, n in sorted(self.server.refused.copy().items()):
            f.add(format_labels(spec.labels, (reason,)), float(n))
        if f.samples:        # a labelled counter appears with its first increment
            yield f


def _fd_headroom() -> int:
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):   # pragma: no cover
        return 1 << 30
    return max(16, soft - 64) if soft != resource.RLIM_INFINITY else 1 << 30


class Server:
    """The listener. ``serve_forever`` runs the event loop; ``shutdown`` stops it; ``server_close``
    closes the sockets. ``server_address`` is the bound (host, port, ...)."""

    def __init__(self, address: tuple[str, int], family: socket.AddressFamily, dual_stack: bool,
                 limits: Limits, registry: Registry, web: WebConfig, ready: Callable[[], bool]) -> None:
        self.limits = limits
        self.registry = registry
        self.ready = ready
        self.web = WebConfigSource(web)
        self.tls = web.ssl_context is not None
        self.max_connections = min(limits.max_connections, _fd_headroom())
        self.refused: Counter[str] = Counter()
        self.address_family = family
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if dual_stack else 1)
            self.socket.bind(address)
            self.socket.listen(limits.backlog)
        except OSError:
            self.socket.close()
            raise
        self.socket.setblocking(False)
        self.server_address: tuple[Any, ...] = self.socket.getsockname()
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.socket, selectors.EVENT_READ, None)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._conns: dict[int, _Conn] = {}          # by id(conn)
        self._replies: queue.SimpleQueue[tuple[_Conn, bytes, bool]] = queue.SimpleQueue()
        self._auth_q: queue.Queue[tuple[_Conn, _Request, WebConfig, Any] | None] = queue.Queue(limits.auth_queue)
        self._auth_lock = threading.Lock()
        self._auth_pending: Counter[str] = Counter()      # queued or being checked, by client address
        self._render_q: queue.Queue[tuple[_Conn, _Request, WebConfig] | None] = queue.Queue(limits.render_queue)
        self._ready_q: queue.Queue[tuple[_Conn, _Request, WebConfig] | None] = queue.Queue(limits.render_queue)
        self._closing = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()
        self._accept_paused_until = 0.0
        self._log = _LogLimiter()
        self._threads: list[threading.Thread] = []
        for i in range(max(1, limits.workers)):
            self._start(self._render_worker, f"cachemon-http-render-{i}")
        self._start(self._ready_worker, "cachemon-http-ready")
        self._start(self._auth_worker, "cachemon-http-auth")

    def _start(self, target: Callable[[], None], name: str) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    # --- the event loop -------------------------------------------------------------------

    def serve_forever(self, poll_interval: float = 0.1) -> None:
        self._stopped.clear()
        try:
            last_sweep = 0.0
            while not self._closing.is_set():
                timeout = poll_interval
                if self._accept_paused_until and time.monotonic() >= self._accept_paused_until:
                    self._accept_paused_until = 0.0
                    self._sel.register(self.socket, selectors.EVENT_READ, None)
                for key, _events in self._sel.select(timeout):
                    if key.data is None:
                        self._accept()
                    elif key.data == "wake":
                        self._drain_wake()
                    else:
                        self._guarded(key.data)
                self._take_replies()
                now = time.monotonic()
                if now - last_sweep >= 0.05:
                    last_sweep = now
                    self._sweep(now)
        finally:
            self._stopped.set()

    def shutdown(self) -> None:
        self._closing.set()
        self._wake()
        self._stopped.wait(10)

    def server_close(self) -> None:
        if not self._stopped.is_set():
            self.shutdown()
        self._closing.set()
        for q in (self._auth_q, self._render_q, self._ready_q):
            try:
                q.put_nowait(None)
            except queue.Full:
                pass
        for c in list(self._conns.values()):
            self._close(c)
        for s in (self.socket, self._wake_r, self._wake_w):
            s.close()
        self._sel.close()

    def reload_web_config(self) -> str:
        """SIGHUP: re-read the web config now."""
        return self.web.reload()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:     # buffer full (a wake-up is already pending) or closed
            pass

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass

    def _watch(self, c: _Conn, events: int) -> None:
        if events == c.events:
            return
        try:
            if not events:
                self._sel.unregister(c.sock)
            elif not c.events:
                self._sel.register(c.sock, events, c)
            else:
                self._sel.modify(c.sock, events, c)
        except (KeyError, ValueError, OSError):
            pass
        c.events = events

    def _accept(self) -> None:
        for _ in range(64):     # a burst at a time, so the rest of the loop keeps running
            try:
                sock, addr = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self.refused["fd_limit"] += 1
                    self._log(logging.WARNING, "cannot accept a connection: %s", e.strerror)
                    if not self._evict_one():
                        # nothing to close: stop accepting for a moment instead of spinning
                        self._sel.unregister(self.socket)
                        self._accept_paused_until = time.monotonic() + 0.1
                    return
                if e.errno in (errno.ECONNABORTED, errno.EPROTO):
                    continue
                self._log(logging.WARNING, "cannot accept a connection: %s", _reason(e))
                return
            sock.setblocking(False)
            if len(self._conns) >= self.max_connections and not self._evict_one():
                self.refused["connection_limit"] += 1
                sock.close()
                continue
            peer = host_port(*addr[:2]) if isinstance(addr, tuple) else "?"
            now = time.monotonic()
            if self.tls:
                c = _Conn(sock, peer, HELLO, now + self.limits.handshake_timeout, "handshake")
            else:
                c = _Conn(sock, peer, READ, now + self.limits.request_timeout, "request")
            self._conns[id(c)] = c
            self._watch(c, selectors.EVENT_READ)

    def _evict_one(self) -> bool:
        idle = [c for c in self._conns.values() if c.state in _IDLE]
        if not idle:
            return False
        oldest = min(idle, key=lambda c: c.since)
        self.refused["connection_limit"] += 1
        self._log(logging.INFO, "closed idle connection from %s: %d connections open, the limit",
                  oldest.peer, len(self._conns))
        self._close(oldest)
        return True

    def _close(self, c: _Conn) -> None:
        self._watch(c, 0)
        self._conns.pop(id(c), None)
        try:
            c.sock.close()
        except OSError:
            pass

    def _sweep(self, now: float) -> None:
        for c in [c for c in self._conns.values() if c.deadline <= now and c.state != BUSY]:
            why = c.deadline_why
            if why == "handshake":
                self.refused["handshake_timeout"] += 1
                self._log(logging.INFO, "TLS handshake with %s failed: timed out", c.peer)
            elif why == "request":
                self.refused["request_timeout"] += 1
                self._log(logging.INFO, "connection with %s ended: no complete request within %gs",
                          c.peer, self.limits.request_timeout)
            elif why == "write":
                self.refused["write_timeout"] += 1
                self._log(logging.INFO, "connection with %s ended: reply not read within %gs",
                          c.peer, self.limits.write_timeout)
            else:   # idle keep-alive or lingering close: routine
                log.debug("connection with %s closed: %s", c.peer, why)
            self._close(c)

    def _guarded(self, c: _Conn) -> None:
        """One connection's event; a bug there costs that connection, never the listener."""
        try:
            self._on_event(c)
        except Exception as e:
            self.refused["internal_error"] += 1
            log.error("error serving %s, connection closed: %s", c.peer, _reason(e), exc_info=e)
            self._close(c)

    def _on_event(self, c: _Conn) -> None:
        # the connection's state says what it waits for; the selector registration matches it
        if id(c) not in self._conns:
            return
        if c.state == HELLO:
            self._hello(c)
        elif c.state == HANDSHAKE:
            self._handshake(c)
        elif c.state == READ:
            self._read(c)
        elif c.state == WRITE:
            self._write(c)
        elif c.state == DRAIN:
            self._drain(c)

    # --- TLS ------------------------------------------------------------------------------

    def _hello(self, c: _Conn) -> None:
        """First bytes on the TLS port: a TLS record starts the handshake; plain HTTP gets a 400
        in plain text, as Go answers "client sent an HTTP request to an HTTPS server"."""
        try:
            first = c.sock.recv(8, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._log(logging.INFO, "TLS handshake with %s failed: %s", c.peer, _reason(e))
            self._close(c)
            return
        if not first:
            self._log(logging.INFO, "TLS handshake with %s failed: client closed the connection", c.peer)
            self._close(c)
            return
        if first[:1] != b"\x16" and first[:1].isalpha():
            self.refused["plain_http_on_tls"] += 1
            self._log(logging.WARNING, "TLS handshake with %s failed: client sent an HTTP request to an HTTPS server",
                      c.peer)
            self._reply(c, _response(400, b"Client sent an HTTP request to an HTTPS server.\n", close=True), True)
            return
        conf, _ = self.web.current()     # the certificate as of this connection (GetConfigForClient)
        assert conf.ssl_context is not None
        self._watch(c, 0)
        try:
            c.sock = conf.ssl_context.wrap_socket(c.sock, server_side=True, do_handshake_on_connect=False)
        except (OSError, ValueError) as e:
            self._log(logging.WARNING, "TLS handshake with %s failed: %s", c.peer, _reason(e))
            self._close(c)
            return
        c.state = HANDSHAKE
        self._handshake(c)

    def _handshake(self, c: _Conn) -> None:
        sock = c.sock
        assert isinstance(sock, ssl.SSLSocket)
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            self._watch(c, selectors.EVENT_READ)
            return
        except ssl.SSLWantWriteError:
            self._watch(c, selectors.EVENT_WRITE)
            return
        except (OSError, ValueError) as e:
            gone = isinstance(e, (ssl.SSLEOFError, ConnectionError))
            self.refused["handshake_failed"] += 1
            self._log(logging.INFO if gone else logging.WARNING, "TLS handshake with %s failed: %s", c.peer, _reason(e))
            self._close(c)
            return
        c.state = READ
        c.deadline, c.deadline_why = time.monotonic() + self.limits.request_timeout, "request"
        self._watch(c, selectors.EVENT_READ)
        self._read(c)     # the client may have sent its request with the handshake's last flight

    # --- reading requests -----------------------------------------------------------------

    def _recv_into_buffer(self, c: _Conn) -> bool:
        """Read what is available; False when the connection ended (and was closed)."""
        cap = self.limits.max_header_bytes + self.limits.max_body_bytes + 1
        while len(c.buf) < cap:
            try:
                data = c.sock.recv(65536)
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError):
                return True
            except ssl.SSLWantWriteError:
                self._watch(c, selectors.EVENT_READ | selectors.EVENT_WRITE)
                return True
            except OSError as e:
                self._log(logging.INFO, "connection with %s ended: %s", c.peer, _reason(e))
                self._close(c)
                return False
            if not data:
                if c.buf:
                    self._log(logging.INFO, "connection with %s ended: closed mid-request", c.peer)
                else:
                    log.debug("connection with %s closed by the client", c.peer)
                self._close(c)
                return False
            if not c.buf and c.served:
                # the next request's first byte: its header deadline starts (ReadHeaderTimeout)
                c.deadline, c.deadline_why = time.monotonic() + self.limits.request_timeout, "request"
            c.buf += data
        return True

    def _read(self, c: _Conn) -> None:
        if not self._recv_into_buffer(c):
            return
        self._next_request(c)

    def _next_request(self, c: _Conn) -> None:
        """Parse a complete request from the buffer and dispatch it, or keep waiting."""
        while c.buf[:2] == b"\r\n":       # RFC 9112 2.2: ignore empty lines before a request
            del c.buf[:2]
        end = c.buf.find(b"\r\n\r\n")
        if end < 0:
            if len(c.buf) > self.limits.max_header_bytes:
                self._refuse(c, 431, "headers_too_large", "Request headers too large.\n")
            return
        if end > self.limits.max_header_bytes:
            self._refuse(c, 431, "headers_too_large", "Request headers too large.\n")
            return
        try:
            req = _parse(bytes(c.buf[:end]))
            body_len, chunked = self._body(req)
        except _BadRequest as e:
            self._refuse(c, e.code, "bad_request", f"{e}\n")
            return
        start = end + 4
        if len(c.buf) < start + body_len:
            return                        # the body is still coming (same deadline)
        # The body of a GET/HEAD is read and discarded: it can never be taken as a second request.
        del c.buf[:start + body_len]
        if chunked:
            req.close = True              # a chunked body is not read: the connection ends after the reply
        c.state = BUSY
        self._watch(c, 0)
        self._dispatch(c, req)

    def _body(self, req: _Request) -> tuple[int, bool]:
        te = req.headers.get("transfer-encoding")
        cl = req.headers.get("content-length")
        if te is not None and cl is not None:
            raise _BadRequest(400, "both Content-Length and Transfer-Encoding")
        if cl is not None:
            if not cl.isdigit() or len(cl) > 18:
                raise _BadRequest(400, "bad Content-Length")
            if int(cl) > self.limits.max_body_bytes:
                raise _BadRequest(413, "request body too large")
            return int(cl), False
        return 0, te is not None

    def _refuse(self, c: _Conn, code: int, reason: str, message: str) -> None:
        self.refused[reason] += 1
        self._log(logging.INFO, "connection with %s ended: %d %s", c.peer, code, message.strip())
        c.buf.clear()
        self._reply(c, _response(code, message.encode(), close=True), True)

    # --- answering ------------------------------------------------------------------------

    def _dispatch(self, c: _Conn, req: _Request) -> None:
        head = req.method == "HEAD"
        if req.method not in ("GET", "HEAD"):
            self._reply(c, _response(405, b"Method Not Allowed\n", extra=(("Allow", "GET, HEAD"),),
                                     close=req.close), req.close)
            return
        conf, error = self.web.current()
        if req.path == "/-/healthy":
            self._reply(c, _response(200, b"OK\n", headers=conf.headers, head=head, close=req.close), req.close)
            return
        if req.path == "/-/ready":
            self._enqueue(self._ready_q, (c, req, conf), c, req, "busy")
            return
        if error is not None:     # the file on disk is broken: refuse what needs it (as exporter-toolkit)
            self._reply(c, _response(500, b"Internal Server Error: web config cannot be loaded\n", head=head,
                                     close=req.close), req.close)
            return
        if conf.auth is not None:
            outcome = conf.auth.lookup(req.headers.get("authorization"))
            if outcome is False:
                self._unauthorized(c, req, conf)
                return
            if outcome is not True:
                self._enqueue_auth(c, req, conf, outcome)
                return
        self._authorized(c, req, conf)

    def _authorized(self, c: _Conn, req: _Request, conf: WebConfig) -> None:
        head = req.method == "HEAD"
        if req.path == "/metrics":
            self._enqueue(self._render_q, (c, req, conf), c, req, "busy")
        elif req.path == "/":
            self._reply(c, _response(200, _LANDING, "text/html; charset=utf-8", conf.headers, head=head,
                                     close=req.close), req.close)
        else:
            self._reply(c, _response(404, b"Not Found\n", headers=conf.headers, head=head, close=req.close), req.close)

    def _unauthorized(self, c: _Conn, req: _Request, conf: WebConfig) -> None:
        self._reply(c, _response(401, b"Unauthorized\n", headers=conf.headers,
                                 extra=(("WWW-Authenticate", 'Basic realm="cachemon"'),),
                                 head=req.method == "HEAD", close=req.close), req.close)

    def _enqueue_auth(self, c: _Conn, req: _Request, conf: WebConfig, pending: Any) -> None:
        host = c.peer.rpartition(":")[0]
        with self._auth_lock:
            if self._auth_q.full():
                reason = "auth_queue_full"
            elif self._auth_pending[host] >= self.limits.auth_per_client:
                reason = "auth_per_client"
            else:
                self._auth_pending[host] += 1
                self._auth_q.put_nowait((c, req, conf, pending))
                return
        self.refused[reason] += 1
        self._reply(c, _response(429, b"Too many unverified credentials waiting; retry later.\n",
                                 extra=(("Retry-After", "1"),), head=req.method == "HEAD", close=req.close), req.close)

    def _enqueue(self, q: queue.Queue[Any], item: Any, c: _Conn, req: _Request, reason: str) -> None:
        try:
            q.put_nowait(item)
        except queue.Full:
            self.refused[reason] += 1
            code = 429 if reason == "auth_queue_full" else 503
            self._reply(c, _response(code, b"Too many requests waiting; retry later.\n",
                                     extra=(("Retry-After", "1"),), head=req.method == "HEAD", close=req.close),
                        req.close)

    def _reply(self, c: _Conn, data: bytes, close: bool) -> None:
        """Start writing a reply (loop thread)."""
        c.state = WRITE
        c.out = memoryview(data)
        c.close_after = close
        c.deadline, c.deadline_why = time.monotonic() + self.limits.write_timeout, "write"
        self._write(c)

    def _post(self, c: _Conn, data: bytes, close: bool) -> None:
        """A worker's reply, handed to the loop thread."""
        self._replies.put((c, data, close))
        self._wake()

    def _take_replies(self) -> None:
        while True:
            try:
                c, data, close = self._replies.get_nowait()
            except queue.Empty:
                return
            if id(c) in self._conns:
                try:
                    self._reply(c, data, close)
                except Exception as e:
                    self.refused["internal_error"] += 1
                    log.error("error answering %s, connection closed: %s", c.peer, _reason(e), exc_info=e)
                    self._close(c)

    def _write(self, c: _Conn) -> None:
        while c.out is not None and len(c.out):
            try:
                n = c.sock.send(c.out[:1 << 18])
            except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError):
                self._watch(c, selectors.EVENT_WRITE)
                return
            except ssl.SSLWantReadError:
                self._watch(c, selectors.EVENT_READ)
                return
            except OSError as e:
                self._log(logging.INFO, "connection with %s ended: %s", c.peer, _reason(e))
                self._close(c)
                return
            c.out = c.out[n:]
        c.out = None
        c.served += 1
        now = time.monotonic()
        c.since = now
        if c.close_after:
            self._linger(c)
            return
        c.state = READ
        c.deadline, c.deadline_why = now + self.limits.idle_timeout, "idle keep-alive timeout"
        if c.buf:                 # a pipelined request already read
            c.deadline, c.deadline_why = now + self.limits.request_timeout, "request"
        self._watch(c, selectors.EVENT_READ)
        if c.buf:
            self._next_request(c)
        elif isinstance(c.sock, ssl.SSLSocket) and c.sock.pending():
            self._read(c)

    def _linger(self, c: _Conn) -> None:
        """Close after the reply without losing it: stop sending, then read and drop what the client
        still sends for up to a second (closing with unread input would reset the connection)."""
        if isinstance(c.sock, ssl.SSLSocket):    # TLS: the reply is complete; close at once
            self._close(c)
            return
        c.state = DRAIN
        c.buf.clear()
        c.deadline, c.deadline_why = time.monotonic() + 1.0, "closing"
        try:
            c.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(c)
            return
        self._watch(c, selectors.EVENT_READ)
        self._drain(c)

    def _drain(self, c: _Conn) -> None:
        try:
            while True:
                if not c.sock.recv(65536):
                    self._close(c)
                    return
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(c)

    # --- workers --------------------------------------------------------------------------

    def _render_worker(self) -> None:
        while True:
            item = self._render_q.get()
            if item is None or self._closing.is_set():
                self._render_q.put(None)     # pass the stop on to the next worker
                return
            c, req, conf = item
            self._post(c, self._metrics(req, conf), req.close)

    def _metrics(self, req: _Request, conf: WebConfig) -> bytes:
        head = req.method == "HEAD"
        openmetrics = accepts(req.headers.get("accept"), "application/openmetrics-text")
        try:
            body = self.registry.render(openmetrics)
        except Exception as e:   # a collector bug must not take the listener down
            log.exception("collect failed")
            return _response(500, f"collect failed: {e}\n".encode(), headers=conf.headers, head=head, close=req.close)
        extra: tuple[tuple[str, str], ...] = (("Vary", "Accept, Accept-Encoding"),)
        if accepts(req.headers.get("accept-encoding"), "gzip"):
            body = gzip.compress(body, compresslevel=6)
            extra += (("Content-Encoding", "gzip"),)
        return _response(200, body, OPENMETRICS_CONTENT_TYPE if openmetrics else CONTENT_TYPE, conf.headers, extra,
                         head=head, close=req.close)

    def _ready_worker(self) -> None:
        while True:
            item = self._ready_q.get()
            if item is None:
                return
            c, req, conf = item
            try:
                ok = self.ready()
            except Exception:
                log.exception("readiness check failed")
                ok = False
            body = b"OK\n" if ok else b"not ready: first poll pending\n"
            self._post(c, _response(200 if ok else 503, body, headers=conf.headers, head=req.method == "HEAD",
                                    close=req.close), req.close)

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
            if ok:
                self._post_authorized(c, req, conf)
            else:
                self._post(c, _response(401, b"Unauthorized\n", headers=conf.headers,
                                        extra=(("WWW-Authenticate", 'Basic realm="cachemon"'),),
                                        head=req.method == "HEAD", close=req.close), req.close)

    def _post_authorized(self, c: _Conn, req: _Request, conf: WebConfig) -> None:
        if req.path == "/metrics":
            try:
                self._render_q.put_nowait((c, req, conf))
            except queue.Full:
                self.refused["busy"] += 1
                self._post(c, _response(503, b"Too many requests waiting; retry later.\n",
                                        extra=(("Retry-After", "1"),), close=req.close), req.close)
            return
        head = req.method == "HEAD"
        if req.path == "/":
            data = _response(200, _LANDING, "text/html; charset=utf-8", conf.headers, head=head, close=req.close)
        else:
            data = _response(404, b"Not Found\n", headers=conf.headers, head=head, close=req.close)
        self._post(c, data, req.close)


def make_server(address: str, port: int, registry: Registry, web: WebConfig | None = None,
                ready: Callable[[], bool] = lambda: True, limits: Limits = Limits()) -> Server:
    conf = web or WebConfig()
    family, dual_stack = _family(address, port)
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
