"""Config errors, durations (Prometheus' grammar) and the value parsers: ``(value, key) -> typed value``."""
from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import TypeVar
from urllib.parse import urlsplit

from cachemon.urls import redact_url

DEFAULT_PORT = 9867
DEFAULT_UPSTREAM = "http://127.0.0.1:8000/metrics"
DEFAULT_WINDOWS = ("1m", "5m")

T = TypeVar("T")
# A setting's parser: (the raw YAML value, whatever the loader read, and its key) -> the typed value.
Parser = Callable[[object, str], T]


class ConfigError(ValueError):
    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}" if key else message)
        self.key = key


def subkey(key: str, name: str | int) -> str:
    if isinstance(name, int):
        return f"{key}[{name}]"
    return f"{key}.{name}" if key else str(name)


# --- durations: Prometheus' grammar ---------------------------------------------------------------

# Exactly prometheus/common model.ParseDuration: integer amounts, units in descending order,
# each at most once; "0" alone is zero. No fractions ("1.5h"), no bare numbers ("5").
DURATION_RE = re.compile(r"(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?")
_UNIT_SECONDS = (365 * 86400.0, 7 * 86400.0, 86400.0, 3600.0, 60.0, 1.0, 0.001)
MINUTE, HOUR, DAY = 60.0, 3600.0, 86400.0
# Unless a setting says otherwise: positive and at most a day. An unbounded interval would reach
# threading's TIMEOUT_MAX (the thread dies) and NaN would make a poll loop spin.
DEFAULT_MAX_DURATION = DAY


def format_duration(seconds: float) -> str:
    """The shortest h/m/s/ms spelling (window labels keep the spelling they always had: 24h, not 1d)."""
    for unit, size in (("h", HOUR), ("m", MINUTE), ("s", 1.0)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{round(seconds * 1000)}ms"


def parse_duration(value: object, key: str, *, lo: float = 0.001, hi: float = DEFAULT_MAX_DURATION) -> float:
    """A Prometheus duration string (``1h30m``, ``1d``, ``250ms``) as seconds, within [lo, hi]."""
    m = DURATION_RE.fullmatch(value) if isinstance(value, str) and value not in ("", "0") else None
    if value == "0":
        seconds = 0.0
    elif m is None:
        raise ConfigError(key, f"expected a duration like 250ms, 5s, 1m30s or 2h (Prometheus syntax: integers, "
                               f"units y w d h m s ms in that order), got {value!r}")
    else:
        seconds = sum(int(g) * u for g, u in zip(m.groups(), _UNIT_SECONDS, strict=True) if g is not None)
    if seconds < lo:
        raise ConfigError(key, f"must be at least {format_duration(lo)}, got {value!r}" if lo > 0.001
                          else f"must be positive, got {value!r}")
    if seconds > hi:
        raise ConfigError(key, f"must be at most {format_duration(hi)}, got {value!r}")
    return seconds


# --- parsers: (value, key) -> typed value ---------------------------------------------------------

def type_error(key: str, what: str, value: object) -> ConfigError:
    return ConfigError(key, f"expected {what}, got {type(value).__name__} {value!r}")


def duration(lo: float = 0.001, hi: float = DEFAULT_MAX_DURATION) -> Parser[float]:
    return lambda v, k: parse_duration(v, k, lo=lo, hi=hi)


def integer(lo: int | None = None, hi: int | None = None) -> Parser[int]:
    def parse(v: object, k: str) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise type_error(k, "an integer", v)
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise ConfigError(k, _range_text(lo, hi, v))
        return v
    return parse


def number(lo: float | None = None, hi: float | None = None, *, positive: bool = False) -> Parser[float]:
    """A finite int or float (YAML's .inf and .nan are rejected)."""
    def parse(v: object, k: str) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise type_error(k, "a finite number", v)
        if (lo is not None and v < lo) or (hi is not None and v > hi) or (positive and v <= 0):
            raise ConfigError(k, "must be positive" if positive and v <= 0 else _range_text(lo, hi, v))
        return float(v)
    return parse


def _range_text(lo: float | None, hi: float | None, v: object) -> str:
    def num(x: float | None) -> str:
        return f"{x:g}" if isinstance(x, float) else str(x)     # integers in full: 1000000, not 1e+06
    if lo is not None and hi is not None:
        return f"must be between {num(lo)} and {num(hi)}, got {v!r}"
    return f"must be at least {num(lo)}, got {v!r}" if lo is not None else f"must be at most {num(hi)}, got {v!r}"


def boolean(v: object, k: str) -> bool:
    if not isinstance(v, bool):
        raise type_error(k, "true or false", v)
    return v


def string(v: object, k: str) -> str:
    """Any string, empty included."""
    if not isinstance(v, str):
        raise type_error(k, "a string", v)
    return v


def text(v: object, k: str) -> str:
    """A non-empty string."""
    if not isinstance(v, str) or not v.strip():
        raise type_error(k, "a non-empty string", v)
    return v


def choice(*allowed: str) -> Parser[str]:
    def parse(v: object, k: str) -> str:
        if v not in allowed:
            raise ConfigError(k, f"expected one of {', '.join(allowed)}, got {v!r}")
        return str(v)
    return parse


def optional(parse: Parser[T]) -> Parser[T | None]:
    """None (YAML null) stays None; anything else goes through ``parse``."""
    return lambda v, k: None if v is None else parse(v, k)


def or_empty(parse: Parser[str]) -> Parser[str]:
    """None (YAML null) is "": a name left out, which the section derives (its ``__post_init__``)."""
    return lambda v, k: "" if v is None else parse(v, k)


def list_of(parse: Parser[T], *, what: str = "a list") -> Parser[list[T]]:
    def parse_list(v: object, k: str) -> list[T]:
        if not isinstance(v, list):
            raise type_error(k, what, v)
        return [parse(x, subkey(k, i)) for i, x in enumerate(v)]
    return parse_list


def mapping_of(parse_value: Parser[T], *, what: str = "a mapping") -> Parser[dict[str, T]]:
    def parse(v: object, k: str) -> dict[str, T]:
        if not isinstance(v, dict):
            raise type_error(k, what, v)
        return {str(name): parse_value(x, subkey(k, str(name))) for name, x in v.items()}
    return parse


def port(v: object, k: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not (0 <= v <= 65535):
        raise ConfigError(k, f"expected a port number 0-65535, got {v!r}")
    return v


_URL_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


def http_url(v: object, k: str) -> str:
    """An http(s) URL with a host; a bad IPv6 literal or a port outside 0-65535 is an error, not a traceback."""
    if not isinstance(v, str) or not v:
        raise type_error(k, "an http:// or https:// URL", v)
    bad = _URL_CONTROL_RE.search(v)
    if bad:
        # urlsplit silently strips CR, LF and TAB (WHATWG): the URL polled would not be the one written
        raise ConfigError(k, f"control character {bad.group()!r} at position {bad.start()} in URL "
                             f"{redact_url(_URL_CONTROL_RE.sub('?', v))!r}")
    try:
        parts = urlsplit(v)
        parts.port            # noqa: B018 -- raises ValueError for a port out of range or not a number
    except ValueError as e:
        raise ConfigError(k, f"invalid URL {redact_url(v)!r}: {e}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(k, f"expected an http:// or https:// URL, got {redact_url(v)!r}")
    return v
