"""cachemon's own HTTP listener: /metrics, /-/healthy, /-/ready and a landing page.

Built to behave like an exporter-toolkit listener under real scrapers:
- IPv4, IPv6 and dual-stack (``[::]:9867``) addresses;
- a listen backlog sized for many concurrent scrapers (the old 5 overflowed with 20);
- a bounded number of handler threads (further connections wait in the kernel's backlog);
- deadlines for the TLS handshake, for waiting for and reading a request, and for writing a
  reply, so an idle, silent or trickling client cannot hold a thread for ever;
- OpenMetrics and gzip when the scraper asks for them;
- one short log line, not a traceback, for a failed handshake or a client that went away
  (control characters a client sends are escaped by cachemon.logformat, never logged raw).
"""
from __future__ import annotations

import errno
import gzip
import io
import ipaddress
import logging
import socket
import socketserver
import ssl
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from cachemon.expose.render import (
    CONTENT_TYPE,
    OPENMETRICS_CONTENT_TYPE,
    render,
    render_openmetrics,
)
from cachemon.expose.webconfig import WebConfig

log = logging.getLogger("cachemon.http")


class Collector(Protocol):
    def collect(self) -> Any: ...


class Registry:
    """The collectors served on /metrics (cachemon's own plus those of optional stages)."""

    def __init__(self) -> None:
        self.collectors: list[Collector] = []

    def register(self, collector: Collector) -> None:
        self.collectors.append(collector)

    def render(self, openmetrics: bool = False) -> bytes:
        return render_openmetrics(self.collectors) if openmetrics else render(self.collectors)


@dataclass(frozen=True)
class Limits:
    # The kernel caps the backlog at net.core.somaxconn (4096 on current kernels).
    backlog: int = 1024
    # Handler threads; a connection beyond this waits in the backlog until one finishes.
    max_connections: int = 64
    handshake_timeout: float = 10.0
    # From the end of the previous reply (keep-alive idle) until the request's headers are read.
    request_timeout: float = 30.0
    write_timeout: float = 30.0


_LANDING = b"""<html><head><title>cachemon</title></head><body>
<h1>cachemon</h1><p>vLLM prefix-cache exporter. <a href="/metrics">Metrics</a></p>
</body></html>
"""

# Probes answer without basic auth: a kubelet cannot send credentials without putting them in
# the pod spec, and "OK" / "not ready" discloses nothing.
_OPEN_PATHS = frozenset({"/-/healthy", "/-/ready"})

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


class _HandshakeFailed(Exception):
    pass


class _DeadlineReader(io.RawIOBase):
    """Socket reads that share one deadline (a client trickling a byte at a time gets no more)."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self.sock = sock
        self.deadline: float | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.deadline is not None:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("request deadline passed")
            self.sock.settimeout(remaining)
        return self.sock.recv_into(buffer)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 family: socket.AddressFamily, dual_stack: bool, limits: Limits) -> None:
        self.address_family = family
        self.request_queue_size = limits.backlog
        self._dual_stack = dual_stack
        self._slots = threading.BoundedSemaphore(limits.max_connections)
        self._closing = threading.Event()
        super().__init__(address, handler)

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if self._dual_stack else 1)
        # HTTPServer.server_bind would also resolve our own name (getfqdn), a DNS lookup for nothing.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])

    def get_request(self) -> tuple[Any, Any]:
        # Take a thread slot before accept(): when all are busy, connections wait in the backlog.
        while not self._slots.acquire(timeout=0.25):
            if self._closing.is_set():
                raise OSError("listener closing")
        try:
            return super().get_request()
        except BaseException:
            self._slots.release()
            raise

    def process_request(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request(request, client_address)
        except BaseException:   # no thread started: give the slot back
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        peer = host_port(*client_address[:2]) if isinstance(client_address, tuple) else "?"
        if isinstance(exc, _HandshakeFailed):
            cause = exc.__cause__
            gone = isinstance(cause, (ssl.SSLEOFError, ConnectionError, TimeoutError))
            (log.info if gone else log.warning)("TLS handshake with %s failed: %s", peer, _reason(cause))
        elif isinstance(exc, OSError):   # reset, broken pipe, timeout, TLS error after the handshake
            log.info("connection with %s ended: %s", peer, _reason(exc))
        else:
            log.error("error serving %s", peer, exc_info=exc)

    def shutdown(self) -> None:
        self._closing.set()
        super().shutdown()


def _reason(exc: BaseException | None) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason)
    if isinstance(exc, TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__


def make_server(address: str, port: int, registry: Registry, web: WebConfig | None = None,
                ready: Callable[[], bool] = lambda: True, limits: Limits = Limits()) -> Server:
    conf = web or WebConfig()

    class Handler(BaseHTTPRequestHandler):
        server_version = "cachemon"
        protocol_version = "HTTP/1.1"   # keep-alive: a scraper reuses its connection (and TLS session)

        def log_message(self, format: str, *args: Any) -> None:   # quiet: Prometheus scrapes every 15 s
            log.debug("%s - %s", self.address_string(), format % args)

        def setup(self) -> None:
            sock = self.request
            if isinstance(sock, ssl.SSLSocket):
                sock.settimeout(limits.handshake_timeout)   # the whole handshake, not each read
                try:
                    sock.do_handshake()
                except (OSError, ValueError) as e:
                    raise _HandshakeFailed() from e
            super().setup()
            self.rfile.close()
            self.reader = _DeadlineReader(self.connection)
            self.rfile = io.BufferedReader(self.reader)

        def handle_one_request(self) -> None:
            self.reader.deadline = time.monotonic() + limits.request_timeout
            super().handle_one_request()

        def _send(self, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8",
                  extra: tuple[tuple[str, str], ...] = ()) -> None:
            self.connection.settimeout(limits.write_timeout)   # the whole reply (sendall's deadline)
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for k, v in (*conf.headers.items(), *extra):
                self.send_header(k, v)
            try:
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)
            except TimeoutError:
                # The base class would file this under "Request timed out" at debug, like an idle
                # keep-alive connection; a client that stops reading is worth a line.
                log.info("connection with %s ended: reply not read within %gs", host_port(*self.client_address[:2]),
                         limits.write_timeout)
                self.close_connection = True

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path not in _OPEN_PATHS and not conf.authorized(self.headers.get("Authorization")):
                self._send(401, b"Unauthorized\n", extra=(("WWW-Authenticate", 'Basic realm="cachemon"'),))
            elif path == "/metrics":
                self._metrics()
            elif path == "/-/healthy":
                self._send(200, b"OK\n")
            elif path == "/-/ready":
                is_ready = ready()
                self._send(200 if is_ready else 503, b"OK\n" if is_ready else b"not ready: first poll pending\n")
            elif path == "/":
                self._send(200, _LANDING, "text/html; charset=utf-8")
            else:
                self._send(404, b"Not Found\n")

        do_HEAD = do_GET

        def _metrics(self) -> None:
            openmetrics = accepts(self.headers.get("Accept"), "application/openmetrics-text")
            try:
                body = registry.render(openmetrics)
            except Exception as e:   # a collector bug must not take the listener down
                log.exception("collect failed")
                self._send(500, f"collect failed: {e}\n".encode())
                return
            extra: tuple[tuple[str, str], ...] = (("Vary", "Accept, Accept-Encoding"),)
            if accepts(self.headers.get("Accept-Encoding"), "gzip"):
                body = gzip.compress(body, compresslevel=6)
                extra += (("Content-Encoding", "gzip"),)
            self._send(200, body, OPENMETRICS_CONTENT_TYPE if openmetrics else CONTENT_TYPE, extra)

    family, dual_stack = _family(address, port)
    try:
        server = Server((address, port), Handler, family, dual_stack, limits)
    except OSError as e:
        if not (dual_stack and e.errno == errno.EAFNOSUPPORT):
            raise OSError(f"cannot listen on {host_port(address, port)}: {e.strerror or e}") from e
        # IPv6 disabled in this kernel or container: "all interfaces" means all IPv4 ones, as in Go.
        log.info("IPv6 unavailable (%s); listening on 0.0.0.0:%d instead of [::]", e.strerror, port)
        return make_server("0.0.0.0", port, registry, web, ready, limits)
    if conf.ssl_context is not None:
        # Handshake in the handler thread (Handler.setup), so one slow client cannot stall accept().
        server.socket = conf.ssl_context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    return server


def serve_in_thread(server: Server) -> threading.Thread:
    t = threading.Thread(target=server.serve_forever, name="cachemon-http", daemon=True)
    t.start()
    return t
