"""First-contact errors in words a person acts on: what is wrong with the URL, and the likely fix.

A wrong port, vLLM's root URL and https to a plain-HTTP server are what a new user meets first;
urllib3's own text (``_WatchedHTTPConnection(host=..., port=...)``, ``WRONG_VERSION_NUMBER``) says
neither. Each helper returns the sentence, or "" when it has nothing better to say.
"""
from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass(frozen=True)
class Endpoint:
    """What a URL was configured to serve, for the hints' sentences: vLLM's /metrics (an upstream) by
    default; a router's Prometheus page for a ``routers:`` entry (``router_endpoint``)."""
    what: str                   # "vLLM", "the router front (vllm-router)"
    start: str                  # how it is started on a port ("{port}": the URL's) and where the URL is configured
    metrics: str                # where it serves its metrics
    setting: str                # the configuration that holds the URL


VLLM = Endpoint("vLLM", "vllm serve MODEL --port {port}; cachemon's default upstream is http://127.0.0.1:8000/metrics",
                "vLLM serves its metrics there", "--upstream")


def router_endpoint(name: str, kind: str) -> Endpoint:
    """A ``routers:`` entry's page: the hints name the router and its setting, never vLLM's."""
    setting = f"routers[{name}].url"
    return Endpoint(f"the {kind} router {name!r} with its Prometheus page on that port",
                    f"{setting} is the router's Prometheus page, not its API port (vllm-router: --prometheus-port); "
                    "docs/configuration.md, Routers",
                    f"a router serves its Prometheus page there: check {setting} and the router's kind",
                    setting)


def _host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    host = parts.hostname or "?"
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        port = 0
    return host, port


def refused(url: str, error: str, expect: Endpoint = VLLM) -> str:
    """A connection that failed before any byte: nothing listening, or a name that does not resolve."""
    host, port = _host_port(url)
    if "refused" in error.lower():
        return (f"nothing is listening at {host}:{port} — is {expect.what} running? "
                f"({expect.start.replace('{port}', str(port))})")
    if "name or service not known" in error.lower() or "nodename nor servname" in error.lower() \
            or "temporary failure in name resolution" in error.lower():
        return f"the host name {host!r} does not resolve — check the spelling, or use an IP address"
    return ""


def not_found(url: str, status: int, expect: Endpoint = VLLM) -> str:
    """vLLM answers 404 everywhere but its API paths: its metrics are at /metrics."""
    if status != 404:
        return ""
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    # /metrics itself, or vLLM's API paths (an older vLLM has no /version: not a wrong URL)
    if path.endswith("/metrics") or path in ("/version", "/health", "/ping") or path.startswith("/v1/"):
        return ""
    base = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"
    return f"did you mean {base}/metrics? ({expect.metrics})"


def tls(url: str, error: str, expect: Endpoint = VLLM) -> str:
    """https to a server that speaks plain HTTP (vLLM without --ssl-certfile)."""
    if urlsplit(url).scheme != "https":
        return ""
    if "WRONG_VERSION_NUMBER" in error or "wrong version number" in error or "record layer failure" in error:
        host, port = _host_port(url)
        if expect is not VLLM:
            return f"{host}:{port} answers plain HTTP, not HTTPS — use http://{host}:{port}/metrics in {expect.setting}"
        return (f"{host}:{port} answers plain HTTP, not HTTPS — use http://{host}:{port}/metrics "
                "(vLLM serves HTTPS only when started with --ssl-keyfile/--ssl-certfile)")
    if "CERTIFICATE_VERIFY_FAILED" in error:
        if expect is not VLLM:
            return (f"the TLS certificate at {urlsplit(url).hostname} is not trusted (a routers: entry has no TLS "
                    f"settings) — use http:// in {expect.setting}")
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
