"""What each complete HTTP request gets: request parsing, replies, and the one routing function.

``handle`` is pure: the listener's loop thread and its password-checking thread both call it, so
routing and the 401 reply are written once. Work that must not run on the loop thread (a
render, the readiness check, a bcrypt) comes back as a ``Route`` for the listener to hand on.
"""
from __future__ import annotations

import enum
import gzip
import time
from dataclasses import dataclass
from email.utils import formatdate

from cachemon.expose.render import CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE
from cachemon.web.web_config import WebConfig

LANDING = b"""<html><head><title>cachemon</title></head><body>
<h1>cachemon</h1><p>vLLM prefix-cache exporter. <a href="/metrics">Metrics</a></p>
</body></html>
"""
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
            413: "Content Too Large", 429: "Too Many Requests", 431: "Request Header Fields Too Large",
            500: "Internal Server Error", 503: "Service Unavailable", 505: "HTTP Version Not Supported"}
_TEXT = "text/plain; charset=utf-8"


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    close: bool

    @property
    def head(self) -> bool:
        return self.method == "HEAD"


class BadRequest(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


_date: tuple[int, str] = (0, "")


def http_date() -> str:
    """The Date header's value, formatted once per second: a flood of refused requests (429s to
    wrong passwords) otherwise spends a noticeable share of the loop thread on formatting it."""
    global _date
    now = int(time.time())
    stamp, text = _date
    if stamp != now:
        text = formatdate(now, usegmt=True)
        _date = (now, text)
    return text


def response_head(code: int, length: int, ctype: str = _TEXT, headers: dict[str, str] | None = None,
                  extra: tuple[tuple[str, str], ...] = (), close: bool = False) -> bytes:
    lines = [f"HTTP/1.1 {code} {_REASONS.get(code, 'Error')}", "Server: cachemon",
             f"Date: {http_date()}", f"Content-Type: {ctype}", f"Content-Length: {length}"]
    lines += [f"{k}: {v}" for k, v in (*(headers or {}).items(), *extra)]
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def response(code: int, body: bytes, ctype: str = _TEXT, headers: dict[str, str] | None = None,
             extra: tuple[tuple[str, str], ...] = (), head: bool = False, close: bool = False) -> bytes:
    data = response_head(code, len(body), ctype, headers, extra, close)
    return data if head else data + body


def parse_request(head: bytes) -> Request:
    """One request head (request line + headers, without the blank line). Raises BadRequest."""
    text = head.decode("latin-1")      # latin-1 decodes every byte
    line, *fields = text.split("\r\n")
    parts = line.split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[0].isupper():
        raise BadRequest(400, "malformed request line")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise BadRequest(505 if version.startswith("HTTP/") else 400, "unsupported HTTP version")
    if len(fields) > 100:
        raise BadRequest(431, "too many header fields")
    headers: dict[str, str] = {}
    for f in fields:
        name, colon, value = f.partition(":")
        if not colon or not name or name != name.strip() or any(c in name for c in " \t"):
            raise BadRequest(400, "malformed header field")    # includes obsolete line folding
        key, value = name.lower(), value.strip(" \t")
        if key in headers:
            if key in ("content-length", "host", "authorization", "transfer-encoding"):
                if headers[key] != value or key != "content-length":
                    raise BadRequest(400, f"repeated {name} header")
            headers[key] += ", " + value
        else:
            headers[key] = value
    conn = headers.get("connection", "").lower()
    close = version == "HTTP/1.0" or "close" in (t.strip() for t in conn.split(","))
    path = target.split("?", 1)[0]
    return Request(method, path, headers, close)


def body_length(req: Request, max_body_bytes: int) -> tuple[int, bool]:
    """(bytes of body to read and discard, chunked). Raises BadRequest."""
    te = req.headers.get("transfer-encoding")
    cl = req.headers.get("content-length")
    if te is not None and cl is not None:
        raise BadRequest(400, "both Content-Length and Transfer-Encoding")
    if cl is not None:
        if not cl.isdigit() or len(cl) > 18:
            raise BadRequest(400, "bad Content-Length")
        if int(cl) > max_body_bytes:
            raise BadRequest(413, "request body too large")
        return int(cl), False
    return 0, te is not None


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


class Route(enum.Enum):
    REPLY = "reply"         # the reply is ready: write it
    READY = "ready"         # run the readiness check (its own thread)
    METRICS = "metrics"     # render the page (a render thread)
    VERIFY = "verify"       # check the password (the bcrypt thread), then handle() again


@dataclass(frozen=True)
class Action:
    route: Route
    reply: bytes = b""
    refused_credentials: bool = False     # a 401: the listener holds it back (Limits.refusal_delay)


def handle(req: Request, conf: WebConfig, config_error: str | None, auth: object) -> Action:
    """What a request gets. ``auth`` is the credentials' outcome: True (verified, or no auth
    configured), False (wrong), anything else (not yet known: verify it first)."""
    def reply(data: bytes) -> Action:
        return Action(Route.REPLY, data)

    if req.method not in ("GET", "HEAD"):
        return reply(response(405, b"Method Not Allowed\n", extra=(("Allow", "GET, HEAD"),), close=req.close))
    if req.path == "/-/healthy":
        return reply(response(200, b"OK\n", headers=conf.headers, head=req.head, close=req.close))
    # Probes answer without basic auth: a kubelet cannot send credentials without putting them in
    # the pod spec, and "OK" / "not ready" discloses nothing.
    if req.path == "/-/ready":
        return Action(Route.READY)
    if config_error is not None:     # the file on disk is broken: refuse what needs it (as exporter-toolkit)
        return reply(response(500, b"Internal Server Error: web config cannot be loaded\n", head=req.head,
                              close=req.close))
    if auth is False:
        return Action(Route.REPLY, response(401, b"Unauthorized\n", headers=conf.headers,
                                            extra=(("WWW-Authenticate", 'Basic realm="cachemon"'),), head=req.head,
                                            close=req.close), refused_credentials=True)
    if auth is not True:
        return Action(Route.VERIFY)
    if req.path == "/metrics":
        return Action(Route.METRICS)
    if req.path == "/":
        return reply(response(200, LANDING, "text/html; charset=utf-8", conf.headers, head=req.head,
                              close=req.close))
    return reply(response(404, b"Not Found\n", headers=conf.headers, head=req.head, close=req.close))


def auth_outcome(req: Request, conf: WebConfig) -> object:
    """The loop thread's first look at the credentials (cached outcomes only; no bcrypt here)."""
    return True if conf.auth is None else conf.auth.lookup(req.headers.get("authorization"))


# --- the replies of the worker threads --------------------------------------------------------

def page_variant(req: Request) -> tuple[bool, bool]:
    """(OpenMetrics, gzip) as the scraper asked: requests of one variant share one rendered page."""
    return (accepts(req.headers.get("accept"), "application/openmetrics-text"),
            accepts(req.headers.get("accept-encoding"), "gzip"))


def encode_page(body: bytes, variant: tuple[bool, bool]) -> bytes:
    return gzip.compress(body, compresslevel=6) if variant[1] else body


def metrics_reply(req: Request, conf: WebConfig, variant: tuple[bool, bool], page: bytes) -> tuple[bytes, ...]:
    """A rendered (and, for gzip, already compressed) page as the reply to one request: its own
    head, and the page's bytes shared with every other request of the batch (not copied)."""
    openmetrics, gzipped = variant
    extra: tuple[tuple[str, str], ...] = (("Vary", "Accept, Accept-Encoding"),)
    if gzipped:
        extra += (("Content-Encoding", "gzip"),)
    head = response_head(200, len(page), OPENMETRICS_CONTENT_TYPE if openmetrics else CONTENT_TYPE, conf.headers,
                         extra, close=req.close)
    return (head,) if req.head else (head, page)


def collect_failed_reply(req: Request, conf: WebConfig, error: BaseException) -> bytes:
    return response(500, f"collect failed: {error}\n".encode(), headers=conf.headers, head=req.head, close=req.close)


def ready_reply(req: Request, conf: WebConfig, ok: bool) -> bytes:
    body = b"OK\n" if ok else b"not ready: first poll pending\n"
    return response(200 if ok else 503, body, headers=conf.headers, head=req.head, close=req.close)


def busy_reply(req: Request, code: int, message: bytes) -> bytes:
    """429 / 503 with Retry-After: a queue the request needed is full."""
    return response(code, message, extra=(("Retry-After", "1"),), head=req.head, close=req.close)
