"""Fetch an upstream's /metrics page with hard limits on time and size.

A hung or hostile upstream must never hang or exhaust the sidecar: the connect
and read timeouts bound each socket wait, a deadline bounds the whole transfer
(a slow upstream trickling bytes), and the body is capped.
"""
from __future__ import annotations

import time

import requests

from cachemon import __version__

USER_AGENT = f"cachemon/{__version__}"


class FetchError(Exception):
    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def fetch_text(session: requests.Session, url: str, timeout: float, max_bytes: int,
               accept: str = "text/plain;version=0.0.4;q=1,*/*;q=0.1") -> str:
    deadline = time.monotonic() + timeout
    try:
        resp = session.get(url, timeout=(timeout, timeout), stream=True,
                           headers={"Accept": accept, "User-Agent": USER_AGENT})
    except requests.exceptions.Timeout as e:
        raise FetchError("timeout", f"timed out after {timeout:g}s connecting to {url}") from e
    except requests.exceptions.ConnectionError as e:
        raise FetchError("refused", f"cannot connect to {url}: {_root(e)}") from e
    except requests.exceptions.RequestException as e:
        raise FetchError("other", f"request to {url} failed: {_root(e)}") from e
    with resp:
        if resp.status_code != 200:
            raise FetchError("http_status", f"{url} answered HTTP {resp.status_code} {resp.reason or ''}".strip())
        declared = resp.headers.get("Content-Length")
        if declared and declared.isdigit() and int(declared) > max_bytes:
            raise FetchError("too_large", f"{url} body is {declared} bytes, over the {max_bytes}-byte cap")
        chunks: list[bytes] = []
        size = 0
        try:
            for chunk in resp.iter_content(chunk_size=65536):
                size += len(chunk)
                if size > max_bytes:
                    raise FetchError("too_large", f"{url} body exceeds the {max_bytes}-byte cap")
                chunks.append(chunk)
                if time.monotonic() > deadline:
                    raise FetchError("timeout", f"{url} did not finish sending within {timeout:g}s")
        except requests.exceptions.RequestException as e:
            # urllib3 enforces Content-Length: a connection cut mid-body lands here.
            raise FetchError("truncated", f"{url} body was cut off: {_root(e)}") from e
        except OSError as e:
            raise FetchError("truncated", f"{url} body was cut off: {e}") from e
    body = b"".join(chunks)
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FetchError("not_exposition", f"{url} body is not UTF-8 text (byte {e.start})") from None


def _root(e: BaseException) -> str:
    """The innermost cause, which names the real problem (refused, reset, DNS...)."""
    seen = set()
    while e.__context__ is not None and id(e) not in seen:
        seen.add(id(e))
        inner = e.args[0] if e.args and isinstance(e.args[0], BaseException) else None
        if inner is None:
            break
        e = inner
    text = str(e)
    return text[:200]
