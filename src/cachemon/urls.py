"""Upstream URLs carry credentials (``http://user:pass@host/metrics``, ``?token=...``):
split them off for the request, and the one way to show a URL anywhere (logs, metric
labels, ``cachemon check`` text and JSON).

Redaction keeps what helps a diagnosis (scheme, host, port, path, the user name and the
query's parameter names) and replaces every password and every query value: we cannot
know which parameter an upstream treats as a secret.
"""
from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from urllib.parse import SplitResult, unquote, urlsplit, urlunsplit

REDACTED = "xxxxx"
# Secrets shorter than this are not scrubbed from free text (they would garble it); the
# URL itself is always shown redacted, whatever the length of its secrets.
_MIN_SCRUB = 3


@dataclass(frozen=True)
class RequestTarget:
    """What to request: the URL without userinfo, and the basic-auth header it implies."""
    url: str
    authorization: str | None


def _split(url: str) -> SplitResult | None:
    try:
        parts = urlsplit(url)
        _ = parts.port      # raises ValueError for a port out of range or not a number
    except ValueError:
        return None
    return parts


def _redact_query(query: str) -> str:
    return "&".join(k + sep + (REDACTED if v else "")
                    for k, sep, v in (piece.partition("=") for piece in query.split("&")))


def redact_url(url: str) -> str:
    """``url`` safe to show: password (or a lone user name, often a token) and query values
    replaced by ``xxxxx``, fragment dropped."""
    parts = _split(url)
    if parts is None:
        # not parseable: still never show what looks like userinfo or a query
        return re.sub(r"\?.*", "?" + REDACTED, re.sub(r"//[^/?#]*@", f"//{REDACTED}@", url))
    netloc = parts.netloc
    userinfo, at, host = netloc.rpartition("@")
    if at:
        user, colon, _ = userinfo.partition(":")
        netloc = f"{user}:{REDACTED}@{host}" if colon else f"{REDACTED}@{host}"
    query = _redact_query(parts.query) if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def _secrets(url: str) -> list[str]:
    parts = _split(url)
    if parts is None:
        return []
    found: list[str] = []
    userinfo, at, _ = parts.netloc.rpartition("@")
    if at:
        user, colon, password = userinfo.partition(":")
        found.append(password if colon else user)
    for piece in parts.query.split("&") if parts.query else ():
        found.append(piece.partition("=")[2])
    out: list[str] = []
    for s in found:
        for form in (s, unquote(s)):
            if len(form) >= _MIN_SCRUB and form not in out:
                out.append(form)
    return sorted(out, key=len, reverse=True)


def scrub(text: str, url: str) -> str:
    """``text`` (e.g. an exception message) with ``url`` and each of its secrets redacted."""
    text = text.replace(url, redact_url(url))
    for secret in _secrets(url):
        text = text.replace(secret, REDACTED)
    return text


# C0/C1 control characters and the Unicode controls that reorder or hide text on a terminal:
# text from an upstream (a reason phrase, a label value) is shown with these escaped, so it can
# neither fake a line (CR, LF) nor drive the terminal (ESC sequences, e.g. a window title).
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))}
_CONTROLS.update({ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"})
_CONTROLS.update({c: f"\\u{c:04x}" for c in (*range(0x200B, 0x2010), *range(0x202A, 0x202F), *range(0x2066, 0x206A))})


def escape_controls(text: str) -> str:
    """``text`` with control characters shown as escapes (``\\n``, ``\\x1b``, ``\\u202e``)."""
    return text.translate(_CONTROLS)


def upstream_text(text: str, url: str, limit: int = 100) -> str:
    """Free text an upstream chose (e.g. its HTTP reason phrase), safe to show or put in a label:
    the URL's secrets redacted, control characters escaped, at most ``limit`` characters."""
    return escape_controls(scrub(text, url))[:limit]


_QUERY_IN_TEXT_RE = re.compile(r"\?([^\s\"'#]*)")


def redact_queries(text: str) -> str:
    """Every ``?query`` in free text (e.g. urllib3's debug line ``"GET /metrics?token=... HTTP/1.1"``)
    with its values redacted, as ``redact_url`` shows them."""
    return _QUERY_IN_TEXT_RE.sub(lambda m: "?" + _redact_query(m.group(1)) if m.group(1) else m.group(0), text)


def request_target(url: str) -> RequestTarget:
    """Userinfo becomes an ``Authorization: Basic`` header (the way Prometheus' basic_auth
    sends it); urllib3 alone would drop it silently."""
    parts = _split(url)
    if parts is None or "@" not in parts.netloc:
        return RequestTarget(url, None)
    userinfo, _, host = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode("ascii")
    return RequestTarget(urlunsplit((parts.scheme, host, parts.path, parts.query, "")), f"Basic {token}")


def host_port(url: str) -> str:
    """``host[:port]`` of ``url``, never its userinfo (the default name of an upstream)."""
    parts = _split(url)
    netloc = parts.netloc if parts is not None else url
    return netloc.rpartition("@")[2]
