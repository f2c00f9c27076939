"""The sections every layer shares: upstreams and the listener, and their command-line specs."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

from cachemon.config.kv import KvEventsEndpoint, kv_events_endpoint, zmq_endpoint
from cachemon.config.sections import load_section, setting
from cachemon.config.values import (
    DEFAULT_PORT,
    MINUTE,
    ConfigError,
    duration,
    format_duration,
    http_url,
    integer,
    optional,
    or_empty,
    parse_duration,
    port,
    text,
    type_error,
)
from cachemon.urls import host_port


@dataclass
class Upstream:
    url: str = setting(http_url)
    name: str = setting(or_empty(text), "")
    timeout: float = setting(duration(hi=10 * MINUTE), 3.0)
    max_body_bytes: int = setting(integer(lo=1024), 16 * 1024 * 1024)
    kv_events: KvEventsEndpoint | None = setting(optional(kv_events_endpoint), None)

    def __post_init__(self) -> None:
        if not self.name:
            self.name = host_port(self.url)       # never the userinfo: names are labels

    @property
    def base_url(self) -> str:
        """http://host:port of the vLLM server (for /version, /v1/models)."""
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc}"


def upstream(v: object, k: str) -> Upstream:
    """An upstream: a URL string or a mapping {url, name, timeout, max_body_bytes}."""
    return load_section(Upstream, {"url": v} if isinstance(v, str) else v, k)


@dataclass
class Listen:
    address: str = setting(text, "0.0.0.0")
    port: int = setting(port, DEFAULT_PORT)
    web_config_file: str | None = setting(optional(text), None)


def parse_kv_events_spec(spec: str, key: str) -> tuple[str, str]:
    """'ENDPOINT' or 'NAME=ENDPOINT' (the --kv-events flag) -> (upstream name or "", endpoint)."""
    name, sep, endpoint = spec.partition("=")
    if not sep or "://" in name:
        name, endpoint = "", spec
    return name, zmq_endpoint(endpoint, key)


def parse_upstream_spec(spec: str, key: str) -> Upstream:
    """'URL' or 'NAME=URL' (the --upstream flag)."""
    name, sep, url = spec.partition("=")
    if not sep or "://" in name:
        name, url = "", spec
    return load_section(Upstream, {"url": url, "name": name or None}, key)


class Named(Protocol):
    """A source with the name its series carry (an upstream, a log source)."""

    @property
    def name(self) -> str: ...


def check_unique_names(sources: Sequence[Named], key: str, taken: set[str] | None = None) -> None:
    """Upstream and log-source names label the same series (`upstream`): each must be unique.
    `taken` holds names already used by the other kind of source."""
    seen: set[str] = set(taken or ())
    for i, src in enumerate(sources):
        if src.name in seen:
            raise ConfigError(f"{key}[{i}].name", f"duplicate source name {src.name!r}: give each upstream "
                                                  "and log file its own name")
        seen.add(src.name)


def parse_windows(values: object, key: str) -> dict[str, float]:
    """Hit-ratio windows, label -> seconds (``[1m, 5m]``)."""
    if not isinstance(values, list):
        raise type_error(key, "a list of durations like [1m, 5m]", values)
    out: dict[str, float] = {}
    for i, w in enumerate(values):
        seconds = parse_duration(w, f"{key}[{i}]")
        out[format_duration(seconds)] = seconds
    if not out:
        raise ConfigError(key, "at least one window is needed")
    return out


def parse_listen(spec: str, key: str = "--listen") -> tuple[str, int]:
    """':9867', '127.0.0.1:9867', '[::1]:9867' or '9867'."""
    host, sep, port_text = spec.rpartition(":")
    if not sep:
        host, port_text = "", spec
    try:
        p = int(port_text)
    except ValueError:
        raise ConfigError(key, f"expected [ADDRESS]:PORT, got {spec!r}") from None
    return host.strip("[]") or "0.0.0.0", port(p, key)
