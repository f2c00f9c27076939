"""Fetch an upstream's page with hard limits on time and size.

A hung or hostile upstream must never hang or exhaust the sidecar. The configured
timeout bounds the WHOLE transfer (connect, headers and body): an upstream trickling a
few bytes a second satisfies every per-read socket timeout, so a timer shuts the
transfer's socket down when the time is up, which ends any blocked read at once. The
body is capped in size too.

Credentials in the URL (userinfo) are sent as basic auth; every URL in a message is
redacted (``cachemon.urls``).

This uses urllib3 (which `requests` is built on) directly: importing `requests`
costs the sidecar ~6 MB of RSS for features a poller does not need.
"""
from __future__ import annotations

import logging
import os
import re
import socket
import threading
from collections.abc import Callable
from typing import Any

import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ConnectTimeoutError, HTTPError, NewConnectionError, ProtocolError, ReadTimeoutError

from cachemon import __version__
from cachemon.sources import hints
from cachemon.urls import redact_queries, redact_url, request_target, upstream_text

USER_AGENT = f"cachemon/{__version__}"


class _RedactQueries(logging.Filter):
    """urllib3 logs each request line at debug (``"GET /metrics?token=... HTTP/1.1" 200``): its query
    values are redacted before any handler sees the record."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        if "?" in msg:
            record.msg, record.args = redact_queries(msg), ()
        return True


logging.getLogger("urllib3.connectionpool").addFilter(_RedactQueries())
METRICS_ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"


class FetchError(Exception):
    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class _Deadline:
    """The end of one transfer. Sockets the transfer uses are registered with ``watch``;
    at expiry each is shut down (a dup of its descriptor is kept, so this works for TLS
    sockets and never touches a descriptor number another thread may have reused)."""

    def __init__(self, seconds: float):
        self.expired = False
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def watch(self, sock: socket.socket | None) -> None:
        if sock is None:
            return
        try:
            dup = socket.socket(fileno=os.dup(sock.fileno()))
        except OSError:
            return
        with self._lock:
            self._socks.append(dup)
            if self.expired:
                _shutdown(dup)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for s in self._socks:
                _shutdown(s)

    def finish(self) -> None:
        self._timer.cancel()
        with self._lock:
            for s in self._socks:
                s.close()
            self._socks.clear()


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


# The deadline of the transfer running in this thread, for the connections it uses.
_current = threading.local()


def _watch(sock: socket.socket | None) -> None:
    deadline: _Deadline | None = getattr(_current, "deadline", None)
    if deadline is not None:
        deadline.watch(sock)


class _WatchedHTTPConnection(HTTPConnection):
    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        _watch(sock)             # before a TLS handshake: the dup covers the wrapped socket
        return sock

    def request(self, *args: Any, **kwargs: Any) -> None:
        _watch(self.sock)        # a kept-alive connection, reused
        super().request(*args, **kwargs)


class _WatchedHTTPSConnection(HTTPSConnection):
    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        _watch(sock)
        return sock

    def request(self, *args: Any, **kwargs: Any) -> None:
        _watch(self.sock)
        super().request(*args, **kwargs)


class _HTTPPool(HTTPConnectionPool):
    ConnectionCls = _WatchedHTTPConnection


class _HTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPSConnection


def new_session() -> urllib3.PoolManager:
    """A keep-alive connection pool; one per poller thread."""
    pm = urllib3.PoolManager(num_pools=4, maxsize=2, retries=False, headers={"User-Agent": USER_AGENT})
    pm.pool_classes_by_scheme = {"http": _HTTPPool, "https": _HTTPSPool}
    return pm


_pool: urllib3.PoolManager | None = None


def _shared_pool() -> urllib3.PoolManager:
    global _pool
    if _pool is None:
        _pool = new_session()
    return _pool


def fetch_text(session: urllib3.PoolManager | None, url: str, timeout: float, max_bytes: int,
               accept: str = METRICS_ACCEPT, expect: hints.Endpoint = hints.VLLM) -> str:
    """The body of ``url`` as text, all of it within ``timeout`` seconds. Raises FetchError
    with a reason (refused, timeout, http_status, too_large, truncated, not_exposition,
    other) and a message that never shows a credential; its hint is about ``expect`` (what the
    URL should serve)."""
    if not isinstance(session, urllib3.PoolManager) or session.pool_classes_by_scheme.get("http") is not _HTTPPool:
        session = _shared_pool()      # only our pools register their sockets with the deadline
    target = request_target(url)
    headers = {"Accept": accept, "User-Agent": USER_AGENT}
    if target.authorization:
        headers["Authorization"] = target.authorization
    deadline = _Deadline(timeout)
    _current.deadline = deadline
    try:
        return _transfer(session, target.url, url, headers, timeout, max_bytes, deadline, expect)
    finally:
        _current.deadline = None
        deadline.finish()


def _request(session: urllib3.PoolManager, request_url: str, url: str, headers: dict[str, str], timeout: float,
             fail: Callable[[str, str], FetchError], expect: hints.Endpoint) -> urllib3.BaseHTTPResponse:
    """The GET, its failures named as the exporter reports them (refused, timeout, other)."""
    shown = redact_url(url)
    try:
        return session.request("GET", request_url, headers=headers,
                               timeout=urllib3.Timeout(connect=timeout, read=timeout),
                               preload_content=False, retries=False, redirect=False)
    except NewConnectionError as e:     # before ConnectTimeoutError: urllib3 makes it a subclass
        raise fail("refused", f"cannot connect to {shown}: "
                              f"{hints.refused(url, str(e), expect) or _short(e, url)}") from None
    except (ConnectTimeoutError, ReadTimeoutError):
        raise fail("timeout", f"timed out after {timeout:g}s waiting for {shown}") from None
    except (ProtocolError, OSError) as e:
        raise fail("refused", f"connection to {shown} failed: "
                              f"{hints.refused(url, str(e), expect) or hints.tls(url, str(e), expect) or _short(e, url)}"
                   ) from None
    except HTTPError as e:
        raise fail("other", f"request to {shown} failed: {hints.tls(url, str(e), expect) or _short(e, url)}") from None


def _read_body(resp: urllib3.BaseHTTPResponse, url: str, timeout: float, max_bytes: int,
               fail: Callable[[str, str], FetchError]) -> list[bytes]:
    """The body's chunks, at most ``max_bytes`` in all; a stall or a cut is named."""
    shown = redact_url(url)
    chunks: list[bytes] = []
    size = 0
    try:
        for chunk in resp.stream(65536):
            size += len(chunk)
            if size > max_bytes:
                raise fail("too_large", f"{shown} body exceeds the {max_bytes}-byte cap")
            chunks.append(chunk)
    except ReadTimeoutError:
        raise fail("timeout", f"{shown} stalled mid-body for {timeout:g}s") from None
    except (ProtocolError, HTTPError, OSError) as e:
        # urllib3 enforces Content-Length: a connection cut mid-body lands here.
        raise fail("truncated", f"{shown} body was cut off: {_short(e, url)}") from None
    return chunks


def _transfer(session: urllib3.PoolManager, request_url: str, url: str, headers: dict[str, str],
              timeout: float, max_bytes: int, deadline: _Deadline, expect: hints.Endpoint) -> str:
    shown = redact_url(url)

    def fail(reason: str, message: str) -> FetchError:
        if deadline.expired:    # whatever the socket said after we shut it down
            return FetchError("timeout", f"{shown} did not answer completely within {timeout:g}s")
        return FetchError(reason, message)

    resp = _request(session, request_url, url, headers, timeout, fail, expect)
    ok = False
    try:
        if resp.status != 200:
            # The reason phrase is the upstream's free text: it may echo a credential or carry
            # control characters (a fake log line, a terminal escape); never shown raw.
            reason = upstream_text(resp.reason or "", url, 60)
            hint = hints.not_found(url, resp.status, expect)
            raise fail("http_status", f"{shown} answered HTTP {resp.status} {reason}".strip()
                       + (f" — {hint}" if hint else ""))
        declared = resp.headers.get("Content-Length")
        if declared and declared.isdigit() and int(declared) > max_bytes:
            raise fail("too_large", f"{shown} body is {declared} bytes, over the {max_bytes}-byte cap")
        chunks = _read_body(resp, url, timeout, max_bytes, fail)
        if deadline.expired:
            raise fail("timeout", "")
        ok = True
    finally:
        if not ok:
            resp.close()        # never hand a half-read connection back to the pool
        resp.release_conn()
    body = b"".join(chunks)
    if _is_openmetrics(resp.headers.get("Content-Type")) and not body.rstrip(b"\n").endswith(b"# EOF"):
        # OpenMetrics' last line is "# EOF": a body cut at a line boundary before it (a connection closed
        # without a length, a proxy) would read as a complete text page, with the samples before the cut
        raise fail("truncated", f"{shown} OpenMetrics body does not end with its # EOF line: it was cut off")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FetchError("not_exposition", f"{shown} body is not UTF-8 text (byte {e.start})") from None


def _is_openmetrics(content_type: str | None) -> bool:
    return content_type is not None and content_type.split(";", 1)[0].strip().lower() == "application/openmetrics-text"


def _short(e: BaseException, url: str) -> str:
    # urllib3 prefixes its connection object's repr (``_WatchedHTTPConnection(host=..., port=...): ``)
    text = re.sub(r"^<?_?\w*HTTPS?Connection(?:Pool)?\([^)]*\)>?:\s*", "", str(e))
    return upstream_text(text, url, 200)
