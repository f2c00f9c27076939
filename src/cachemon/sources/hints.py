"""First-contact errors in words a person acts on: what is wrong with the URL, and the likely fix.

A wrong port, vLLM's root URL and https to a plain-HTTP server are what a new user meets first;
urllib3's own text (``_WatchedHTTPConnection(host=..., port=...)``, ``WRONG_VERSION_NUMBER``) says
neither. Each helper returns the sentence, or "" when it has nothing better to say.
"""
from __future__ import annotations

from urllib.parse import urlsplit


def _host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    host = parts.hostname or "?"
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        port = 0
    return host, port


def refused(url: str, error: str) -> str:
    """A connection that failed before any byte: nothing listening, or a name that does not resolve."""
    host, port = _host_port(url)
    if "refused" in error.lower():
        return (f"nothing is listening at {host}:{port} — is vLLM running? "
                f"(vllm serve MODEL --port {port}; cachemon's default upstream is http://127.0.0.1:8000/metrics)")
    if "name or service not known" in error.lower() or "nodename nor servname" in error.lower() \
            or "temporary failure in name resolution" in error.lower():
        return f"the host name {host!r} does not resolve — check the spelling, or use an IP address"
    return ""


def not_found(url: str, status: int) -> str:
    """vLLM answers 404 everywhere but its API paths: its metrics are at /metrics."""
    if status != 404:
        return ""
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    # /metrics itself, or vLLM's API paths (an older vLLM has no /version: not a wrong URL)
    if path.endswith("/metrics") or path in ("/version", "/health", "/ping") or path.startswith("/v1/"):
        return ""
    base = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"
    return f"did you mean {base}/metrics? (vLLM serves its metrics there)"


def tls(url: str, error: str) -> str:
    """https to a server that speaks plain HTTP (vLLM without --ssl-certfile)."""
    if urlsplit(url).scheme != "https":
        return ""
    if "WRONG_VERSION_NUMBER" in error or "wrong version number" in error or "record layer failure" in error:
        host, port = _host_port(url)
        return (f"{host}:{port} answers plain HTTP, not HTTPS — use http://{host}:{port}/metrics "
                "(vLLM serves HTTPS only when started with --ssl-keyfile/--ssl-certfile)")
    if "CERTIFICATE_VERIFY_FAILED" in error:
        return ("the server's TLS certificate is not trusted — give its CA with the upstream's TLS "
                "settings (docs/configuration.md), or use http:// on a loopback address")
    return ""


def cachemon_page(body: str, url: str) -> str:
    """cachemon pointed at a cachemon (its own /metrics, or another sidecar's): the sentence, or ""."""
    from cachemon import catalog as C
    marker = f"# TYPE {C.UPSTREAM_UP.name} "
    if marker not in body:
        return ""
    host, port = _host_port(url)
    return (f"{host}:{port} serves cachemon's own /metrics, not vLLM's: cachemon is pointed at a cachemon. "
            "Point --upstream at the vLLM server, e.g. http://127.0.0.1:8000/metrics (vllm serve MODEL --port 8000)")
