"""cachemon's configuration: YAML file + command-line flags (flags win).

Laid out like a pipeline (sources -> normalise -> sinks)::

    upstreams:                 # sources: vLLM /metrics endpoints
      - name: vllm-0
        url: http://127.0.0.1:8000/metrics
        timeout: 3s
    logs: {...}                # sources: log files (see README, "Log source")
    poll_interval: 2s
    normalise:
      max_series_per_upstream: 256
    windows: [1m, 5m]
    listen:                    # sink: cachemon's own /metrics
      address: 0.0.0.0
      port: 9867
      web_config_file: null

Every error names the offending key (``upstreams[1].url: ...``); the CLI turns a
ConfigError into exit code 2.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from cachemon.sources.urls import host_port, redact_url

DEFAULT_PORT = 9867
DEFAULT_UPSTREAM = "http://127.0.0.1:8000/metrics"
DEFAULT_WINDOWS = ("1m", "5m")


class ConfigError(ValueError):
    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}" if key else message)
        self.key = key


_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(value: Any, key: str) -> float:
    """'250ms', '5s', '1m', '2h' or a number of seconds."""
    if isinstance(value, bool):
        raise ConfigError(key, f"expected a duration like 5s or 1m, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        m = _DURATION_RE.match(str(value))
        if not m:
            raise ConfigError(key, f"expected a duration like 250ms, 5s, 1m or 2h, got {value!r}")
        seconds = float(m.group(1)) * _UNITS[m.group(2)]
    if seconds <= 0:
        raise ConfigError(key, f"must be positive, got {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds * 1000)}ms"


@dataclass
class Upstream:
    name: str
    url: str
    timeout: float = 3.0
    max_body_bytes: int = 16 * 1024 * 1024

    @property
    def base_url(self) -> str:
        """http://host:port of the vLLM server (for /version, /v1/models)."""
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc}"


@dataclass
class Listen:
    address: str = "0.0.0.0"
    port: int = DEFAULT_PORT
    web_config_file: str | None = None


@dataclass
class Config:
    upstreams: list[Upstream] = field(default_factory=list)
    poll_interval: float = 2.0
    max_series_per_upstream: int = 256
    windows: dict[str, float] = field(default_factory=dict)   # label -> seconds
    listen: Listen = field(default_factory=Listen)
    logs: Any = None          # cachemon.sources.logs.config.LogConfig, when configured
    raw: dict = field(default_factory=dict)   # the parsed YAML, for sections owned by other modules


def _expect(value: Any, types, key: str, what: str):
    types = types if isinstance(types, tuple) else (types,)
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        raise ConfigError(key, f"expected {what}, got {type(value).__name__} {value!r}")
    return value


def check_keys(d: dict, allowed, key: str) -> None:
    """Reject a key not in `allowed`, naming it (every config section uses this)."""
    for k in d:
        if k not in allowed:
            where = f"{key}.{k}" if key else str(k)
            raise ConfigError(where, f"unknown key (allowed: {', '.join(sorted(allowed))})")


def parse_upstream_spec(spec: str, key: str, index: int) -> Upstream:
    """'URL' or 'NAME=URL' (the --upstream flag)."""
    name, sep, url = spec.partition("=")
    if not sep or "://" in name:
        name, url = "", spec
    return _upstream({"name": name or None, "url": url}, key, index)


def _upstream(d: Any, key: str, index: int) -> Upstream:
    if isinstance(d, str):
        d = {"url": d}
    _expect(d, dict, key, "a mapping with url (and optional name, timeout, max_body_bytes)")
    check_keys(d, {"name", "url", "timeout", "max_body_bytes"}, key)
    url = d.get("url")
    if not isinstance(url, str) or not url:
        raise ConfigError(f"{key}.url", "required: the upstream's /metrics URL")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"{key}.url", f"expected an http:// or https:// URL, got {redact_url(url)!r}")
    name = d.get("name") or host_port(url)      # never the userinfo: names are labels
    if not isinstance(name, str):
        raise ConfigError(f"{key}.name", "expected a string")
    up = Upstream(name=name, url=url)
    if "timeout" in d:
        up.timeout = parse_duration(d["timeout"], f"{key}.timeout")
    if "max_body_bytes" in d:
        v = _expect(d["max_body_bytes"], int, f"{key}.max_body_bytes", "an integer number of bytes")
        if v < 1024:
            raise ConfigError(f"{key}.max_body_bytes", "must be at least 1024")
        up.max_body_bytes = v
    return up


def load_yaml(path: str | Path) -> dict:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError("", f"cannot read config file {path}: {e.strerror or e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigError("", f"config file {path} is not valid YAML{where}: {getattr(e, 'problem', e)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("", f"config file {path}: the top level must be a mapping")
    return data


TOP_KEYS = {"upstreams", "logs", "poll_interval", "normalise", "windows", "listen",
            # sections owned by the diagnostics modules
            "models", "cost", "warmup", "events"}


def from_dict(data: dict) -> Config:
    check_keys(data, TOP_KEYS, "")
    cfg = Config(raw=data)
    ups = data.get("upstreams", [])
    _expect(ups, list, "upstreams", "a list")
    cfg.upstreams = [_upstream(u, f"upstreams[{i}]", i) for i, u in enumerate(ups)]
    check_unique_names(cfg.upstreams, "upstreams")
    if "poll_interval" in data:
        cfg.poll_interval = parse_duration(data["poll_interval"], "poll_interval")
    norm = data.get("normalise", {}) or {}
    _expect(norm, dict, "normalise", "a mapping")
    check_keys(norm, {"max_series_per_upstream"}, "normalise")
    if "max_series_per_upstream" in norm:
        v = _expect(norm["max_series_per_upstream"], int, "normalise.max_series_per_upstream", "an integer")
        if v < 1:
            raise ConfigError("normalise.max_series_per_upstream", "must be at least 1")
        cfg.max_series_per_upstream = v
    wins = data.get("windows", list(DEFAULT_WINDOWS))
    _expect(wins, list, "windows", "a list of durations like [1m, 5m]")
    cfg.windows = parse_windows(wins, "windows")
    lst = data.get("listen", {}) or {}
    _expect(lst, dict, "listen", "a mapping")
    check_keys(lst, {"address", "port", "web_config_file"}, "listen")
    cfg.listen = Listen(
        address=str(lst.get("address", "0.0.0.0")),
        port=_port(lst.get("port", DEFAULT_PORT), "listen.port"),
        web_config_file=lst.get("web_config_file"),
    )
    if data.get("logs") is not None:
        from cachemon.sources.logs.config import parse_log_config
        cfg.logs = parse_log_config(data["logs"], "logs")
        check_unique_names(cfg.logs.files, "logs.files", {u.name for u in cfg.upstreams})
    return cfg


def check_unique_names(sources: list, key: str, taken: set[str] | None = None) -> None:
    """Upstream and log-source names label the same series (`upstream`): each must be unique.
    `taken` holds names already used by the other kind of source."""
    seen: set[str] = set(taken or ())
    for i, src in enumerate(sources):
        if src.name in seen:
            raise ConfigError(f"{key}[{i}].name", f"duplicate source name {src.name!r}: give each upstream "
                                                  "and log file its own name")
        seen.add(src.name)


def parse_windows(values: list, key: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for i, w in enumerate(values):
        seconds = parse_duration(w, f"{key}[{i}]")
        out[format_duration(seconds)] = seconds
    if not out:
        raise ConfigError(key, "at least one window is needed")
    return out


def _port(v: Any, key: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not (0 <= v <= 65535):
        raise ConfigError(key, f"expected a port number 0-65535, got {v!r}")
    return v


def parse_listen(spec: str, key: str = "--listen") -> tuple[str, int]:
    """':9867', '127.0.0.1:9867', '[::1]:9867' or '9867'."""
    host, sep, port = spec.rpartition(":")
    if not sep:
        host, port = "", spec
    try:
        p = int(port)
    except ValueError:
        raise ConfigError(key, f"expected [ADDRESS]:PORT, got {spec!r}") from None
    return host.strip("[]") or "0.0.0.0", _port(p, key)
