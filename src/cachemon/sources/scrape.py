"""Fetch an upstream's page with hard limits on time and size.

A hung or hostile upstream must never hang or exhaust the sidecar: the connect
and read timeouts bound each socket wait, a deadline bounds the whole transfer
(a slow upstream trickling bytes), and the body is capped.

This uses urllib3 (which `requests` is built on) directly: importing `requests`
costs the sidecar ~6 MB of RSS for features a poller does not need.
"""
from __future__ import annotations

import time

import urllib3
from urllib3.exceptions import ConnectTimeoutError, HTTPError, NewConnectionError, ProtocolError, ReadTimeoutError

from cachemon import __version__

USER_AGENT = f"cachemon/{__version__}"
METRICS_ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"


class FetchError(Exception):
    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def new_session() -> urllib3.PoolManager:
    """A keep-alive connection pool; one per poller thread."""
    return urllib3.PoolManager(num_pools=4, maxsize=2, retries=False, headers={"User-Agent": USER_AGENT})


_pool: urllib3.PoolManager | None = None


def _shared_pool() -> urllib3.PoolManager:
    global _pool
    if _pool is None:
        _pool = new_session()
    return _pool


def fetch_text(session: urllib3.PoolManager | None, url: str, timeout: float, max_bytes: int,
               accept: str = METRICS_ACCEPT) -> str:
    if not isinstance(session, urllib3.PoolManager):
        session = _shared_pool()
    deadline = time.monotonic() + timeout
    try:
        resp = session.request("GET", url, headers={"Accept": accept, "User-Agent": USER_AGENT},
                               timeout=urllib3.Timeout(connect=timeout, read=timeout),
                               preload_content=False, retries=False, redirect=False)
    except NewConnectionError as e:     # before ConnectTimeoutError: urllib3 makes it a subclass
        raise FetchError("refused", f"cannot connect to {url}: {_short(e)}") from e
    except (ConnectTimeoutError, ReadTimeoutError) as e:
        raise FetchError("timeout", f"timed out after {timeout:g}s waiting for {url}") from e
    except (ProtocolError, OSError) as e:
        raise FetchError("refused", f"connection to {url} failed: {_short(e)}") from e
    except HTTPError as e:
        raise FetchError("other", f"request to {url} failed: {_short(e)}") from e
    try:
        if resp.status != 200:
            raise FetchError("http_status", f"{url} answered HTTP {resp.status} {resp.reason or ''}".strip())
        declared = resp.headers.get("Content-Length")
        if declared and declared.isdigit() and int(declared) > max_bytes:
            raise FetchError("too_large", f"{url} body is {declared} bytes, over the {max_bytes}-byte cap")
        chunks: list[bytes] = []
        size = 0
        try:
            for chunk in resp.stream(65536):
                size += len(chunk)
                if size > max_bytes:
                    raise FetchError("too_large", f"{url} body exceeds the {max_bytes}-byte cap")
                chunks.append(chunk)
                if time.monotonic() > deadline:
                    raise FetchError("timeout", f"{url} did not finish sending within {timeout:g}s")
        except ReadTimeoutError as e:
            raise FetchError("timeout", f"{url} stalled mid-body for {timeout:g}s") from e
        except (ProtocolError, HTTPError, OSError) as e:
            # urllib3 enforces Content-Length: a connection cut mid-body lands here.
            raise FetchError("truncated", f"{url} body was cut off: {_short(e)}") from e
    finally:
        resp.release_conn()
    body = b"".join(chunks)
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FetchError("not_exposition", f"{url} body is not UTF-8 text (byte {e.start})") from None


def _short(e: BaseException) -> str:
    return str(e)[:200]
