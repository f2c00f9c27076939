"""Typed configuration definitions: the one way every config section is read.

A section is a dataclass whose fields are declared with ``setting(parse, default)``;
``load_section(cls, raw, key)`` rejects unknown keys, runs each present value through its
field's parser with the full key path, and fills defaults. Parsers are small functions
``(value, key) -> typed value`` built here (``duration()``, ``integer()``, ``http_url`` ...).
Every error is a ``ConfigError`` whose message starts with the key path
(``upstreams[1].url: ...``); the CLI prints it on one line and exits 2.

This module sits below every layer (sources, state, expose, runtime all declare their
sections with it); ``cachemon.runconfig`` assembles the sections of `cachemon run`'s file.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import stat
import types
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import yaml

from cachemon import install_hint
from cachemon.urls import host_port, redact_url

DEFAULT_PORT = 9867
DEFAULT_UPSTREAM = "http://127.0.0.1:8000/metrics"
DEFAULT_WINDOWS = ("1m", "5m")

T = TypeVar("T")
Parser = Callable[[Any, str], Any]


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


def parse_duration(value: Any, key: str, *, lo: float = 0.001, hi: float = DEFAULT_MAX_DURATION) -> float:
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

def _type_error(key: str, what: str, value: Any) -> ConfigError:
    return ConfigError(key, f"expected {what}, got {type(value).__name__} {value!r}")


def duration(lo: float = 0.001, hi: float = DEFAULT_MAX_DURATION) -> Parser:
    return lambda v, k: parse_duration(v, k, lo=lo, hi=hi)


def integer(lo: int | None = None, hi: int | None = None) -> Parser:
    def parse(v: Any, k: str) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise _type_error(k, "an integer", v)
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise ConfigError(k, _range_text(lo, hi, v))
        return v
    return parse


def number(lo: float | None = None, hi: float | None = None, *, positive: bool = False) -> Parser:
    """A finite int or float (YAML's .inf and .nan are rejected)."""
    def parse(v: Any, k: str) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise _type_error(k, "a finite number", v)
        if (lo is not None and v < lo) or (hi is not None and v > hi) or (positive and v <= 0):
            raise ConfigError(k, "must be positive" if positive and v <= 0 else _range_text(lo, hi, v))
        return float(v)
    return parse


def _range_text(lo: float | None, hi: float | None, v: Any) -> str:
    def num(x: float | None) -> str:
        return f"{x:g}" if isinstance(x, float) else str(x)     # integers in full: 1000000, not 1e+06
    if lo is not None and hi is not None:
        return f"must be between {num(lo)} and {num(hi)}, got {v!r}"
    return f"must be at least {num(lo)}, got {v!r}" if lo is not None else f"must be at most {num(hi)}, got {v!r}"


def boolean(v: Any, k: str) -> bool:
    if not isinstance(v, bool):
        raise _type_error(k, "true or false", v)
    return v


def string(v: Any, k: str) -> str:
    """Any string, empty included."""
    if not isinstance(v, str):
        raise _type_error(k, "a string", v)
    return v


def text(v: Any, k: str) -> str:
    """A non-empty string."""
    if not isinstance(v, str) or not v.strip():
        raise _type_error(k, "a non-empty string", v)
    return v


def choice(*allowed: str) -> Parser:
    def parse(v: Any, k: str) -> str:
        if v not in allowed:
            raise ConfigError(k, f"expected one of {', '.join(allowed)}, got {v!r}")
        return str(v)
    return parse


def optional(parse: Parser) -> Parser:
    """None (YAML null) stays None; anything else goes through ``parse``."""
    return lambda v, k: None if v is None else parse(v, k)


def list_of(parse: Parser, *, what: str = "a list") -> Parser:
    def parse_list(v: Any, k: str) -> list[Any]:
        if not isinstance(v, list):
            raise _type_error(k, what, v)
        return [parse(x, subkey(k, i)) for i, x in enumerate(v)]
    return parse_list


def mapping_of(parse_value: Parser, *, what: str = "a mapping") -> Parser:
    def parse(v: Any, k: str) -> dict[str, Any]:
        if not isinstance(v, dict):
            raise _type_error(k, what, v)
        return {str(name): parse_value(x, subkey(k, str(name))) for name, x in v.items()}
    return parse


def port(v: Any, k: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not (0 <= v <= 65535):
        raise ConfigError(k, f"expected a port number 0-65535, got {v!r}")
    return v


_URL_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


def http_url(v: Any, k: str) -> str:
    """An http(s) URL with a host; a bad IPv6 literal or a port outside 0-65535 is an error, not a traceback."""
    if not isinstance(v, str) or not v:
        raise _type_error(k, "an http:// or https:// URL", v)
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


# --- sections ----------------------------------------------------------------------------------

def setting(parse: Parser, default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING,
            secret: bool = False) -> Any:
    """A section field read from YAML through ``parse``; without a default it is required. A ``secret``
    stays out of the section's repr."""
    if default_factory is not dataclasses.MISSING:
        return field(default_factory=default_factory, metadata={"parse": parse}, repr=not secret)
    return field(default=default, metadata={"parse": parse}, repr=not secret)


def _inferred(hint: Any) -> Parser | None:
    """The parser a plain annotated field gets: str, int, float, bool, X | None, list[X], tuple[X, ...]."""
    simple: dict[Any, Parser] = {str: string, int: integer(), float: number(), bool: boolean}
    if hint in simple:
        return simple[hint]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType) and len(args) == 2 and type(None) in args:
        inner = _inferred(next(a for a in args if a is not type(None)))
        return optional(inner) if inner else None
    if origin is list and len(args) == 1 and (inner := _inferred(args[0])):
        return list_of(inner)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis and (inner := _inferred(args[0])):
        item = inner
        return lambda v, k: tuple(list_of(item)(v, k))
    return None


@functools.cache
def section_parsers(cls: type) -> dict[str, Parser]:
    """YAML key -> parser of a section: ``setting(parse)`` fields, and plain fields whose type
    is simple enough to check (so a field added to a section is validated without more code)."""
    hints = typing.get_type_hints(cls)
    out: dict[str, Parser] = {}
    for f in dataclasses.fields(cls):
        parse = f.metadata.get("parse") or (_inferred(hints[f.name]) if f.init else None)
        if parse is not None:
            out[f.name] = parse
    return out


def load_section(cls: type[T], raw: Any, key: str) -> T:
    """Build section ``cls`` from the mapping ``raw`` (None = every default); fields without a
    parser (not read from YAML) keep their defaults."""
    if raw is None:
        raw = {}
    parsers = section_parsers(typing.cast(type, cls))
    if not isinstance(raw, dict):
        raise _type_error(key or "config", f"a mapping with {', '.join(parsers)}", raw)
    check_keys(raw, parsers, key)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):   # type: ignore[arg-type]
        if f.name in raw:
            values[f.name] = parsers[f.name](raw[f.name], subkey(key, f.name))
        elif f.name in parsers and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(subkey(key, f.name), "required")
    return cls(**values)


def section(cls: type[T]) -> Parser:
    return lambda v, k: load_section(cls, v, k)


def check_keys(d: dict[str, Any], allowed: Iterable[str], key: str) -> None:
    """Reject a key not in `allowed`, naming it (every config section uses this)."""
    allowed = list(allowed)
    for k in d:
        if k not in allowed:
            raise ConfigError(subkey(key, str(k)), f"unknown key (allowed: {', '.join(sorted(allowed))})")


# --- user-supplied files: small, regular, bounded ------------------------------------------------

# Caps on what cachemon reads whole into memory. A config of thousands of log rules is well under
# 4 MiB; tokenizer.json of the largest vocabularies (Gemma 3: 33 MB) is under 256 MiB.
MAX_CONFIG_BYTES = 4 * 1024 * 1024
MAX_TOKENIZER_FILE_BYTES = 256 * 1024 * 1024
# YAML structure bounds: no config is nested more than a handful of levels or needs an integer of
# more than a few digits; past these PyYAML recurses into a RecursionError and Python's int()
# refuses 4300 digits (sys.int_info.default_max_str_digits), both as tracebacks.
MAX_YAML_DEPTH = 64
MAX_INT_DIGITS = 64

_FILE_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
               (stat.S_ISDIR, "a directory"), (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str:
    return next((name for test, name in _FILE_KINDS if test(mode)), "of an unknown type")


def read_small_file(path: str | Path, key: str, max_bytes: int, *, what: str = "file") -> bytes:
    """The whole of the regular file ``path``, at most ``max_bytes``; else one ConfigError(key) line.

    Opened non-blocking, so a FIFO is refused at once instead of waiting for a writer; a device
    (/dev/zero), directory or socket is refused by its type before any byte is read; the read is
    capped too, since st_size is only a hint (a file being written, /proc files report 0)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise ConfigError(key, f"cannot read {what} {path}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(key, f"{what} {path} is {_kind(st.st_mode)}, not a regular file")
        if st.st_size > max_bytes:
            raise ConfigError(key, f"{what} {path} is larger than {max_bytes} bytes ({st.st_size})")
        chunks, total = [], 0
        while total <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > max_bytes:
            raise ConfigError(key, f"{what} {path} is larger than {max_bytes} bytes")
        return b"".join(chunks)
    except OSError as e:
        raise ConfigError(key, f"cannot read {what} {path}: {e.strerror or e}") from None
    finally:
        os.close(fd)


def regular_file(path: str | Path, key: str, *, what: str = "file") -> str:
    """``path`` if it names a regular file, for readers that take a path (ssl's load_cert_chain):
    a FIFO there would block the reader, a device would be read forever."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise ConfigError(key, f"cannot read {what} {path}: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(key, f"{what} {path} is {_kind(st.st_mode)}, not a regular file")
    return str(path)


def _path_text(path: list[str | int], limit: int = 8) -> str:
    key = ""
    for name in path[:limit]:
        key = subkey(key, name)
    return key + ("..." if len(path) > limit else "")


_INT_TAG = "tag:yaml.org,2002:int"


def _at(mark: Any) -> str:
    return f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""


def _check_yaml_bounds(text_: str, what: str, path_: str | Path, key: str) -> None:
    """Walk the event stream (PyYAML's parser is not recursive, its composer is) and refuse, naming
    the key path, nesting deeper than MAX_YAML_DEPTH and integers longer than MAX_INT_DIGITS digits."""
    resolver = yaml.resolver.Resolver()
    # per open collection: [kind, next index or pending key, expecting a key?]
    stack: list[list[Any]] = []
    base = [key] if key else []

    def where() -> list[str | int]:
        out: list[str | int] = list(base)
        for kind, at, expecting_key in stack:
            if kind == "seq":
                out.append(at)
            elif not expecting_key and at is not None:
                out.append(at)
        return out

    def advance(scalar: str | None = None) -> None:
        """A node ended inside the innermost collection."""
        if not stack:
            return
        top = stack[-1]
        if top[0] == "seq":
            top[1] += 1
        elif top[2]:                       # that node was a key
            top[1], top[2] = (scalar if scalar is not None else "?"), False
        else:
            top[1], top[2] = None, True

    for ev in yaml.parse(text_, Loader=yaml.SafeLoader):
        if isinstance(ev, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            if len(stack) >= MAX_YAML_DEPTH:
                raise ConfigError(_path_text(where()), f"{what} {path_} is nested deeper than {MAX_YAML_DEPTH} "
                                                       f"levels{_at(ev.start_mark)}")
            stack.append(["seq", 0, False] if isinstance(ev, yaml.SequenceStartEvent) else ["map", None, True])
        elif isinstance(ev, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            stack.pop()
            advance()
        elif isinstance(ev, yaml.ScalarEvent):
            tag = ev.tag if ev.tag not in (None, "!") else resolver.resolve(yaml.ScalarNode, ev.value, ev.implicit)  # type: ignore[no-untyped-call]
            if tag == _INT_TAG:
                digits = sum(c.isalnum() for c in ev.value.lower().removeprefix("0x").removeprefix("0o")
                             .removeprefix("0b").lstrip("+-"))
                if digits > MAX_INT_DIGITS:
                    raise ConfigError(_path_text(where()), f"an integer of {digits} digits (at most {MAX_INT_DIGITS}) "
                                                           f"in {what} {path_}{_at(ev.start_mark)}")
            advance(ev.value)
        elif isinstance(ev, yaml.AliasEvent):
            advance()


def load_yaml(path: str | Path, *, what: str = "config file", key: str = "") -> dict[str, Any]:
    """A YAML file whose top level is a mapping; every failure is one ConfigError line. ``key``
    prefixes the key paths of structural errors (the web config's ``web_config``)."""
    data_bytes = read_small_file(path, "", MAX_CONFIG_BYTES, what=what)
    try:
        text_ = data_bytes.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError("", f"{what} {path} is not valid UTF-8 (byte {e.start}: {e.reason})") from None
    try:
        _check_yaml_bounds(text_, what, path, key)
        data = yaml.safe_load(text_)
    except ConfigError:
        raise
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = str(getattr(e, "problem", None) or e).replace("\n", " ")
        raise ConfigError("", f"{what} {path} is not valid YAML{where}: {problem}") from None
    except (RecursionError, ValueError) as e:     # belt and braces: the bounds above come first
        raise ConfigError("", f"{what} {path}: {type(e).__name__}: {str(e)[:200]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("", f"{what} {path}: the top level must be a mapping")
    return data


# --- KV-cache events (docs/kv-events.md): where a replica publishes them, and the ledger's bounds ----

KV_EVENTS_EXTRA = install_hint("kv-events")
MiB = 1024 * 1024


def check_kv_event_deps(key: str) -> None:
    """Following KV events needs pyzmq and msgspec (the extra); say so on one line, without importing them."""
    import importlib.util
    missing = [dist for mod, dist in (("zmq", "pyzmq"), ("msgspec", "msgspec")) if importlib.util.find_spec(mod) is None]
    if missing:
        raise ConfigError(key, f"following KV events needs {' and '.join(missing)}: {KV_EVENTS_EXTRA}")


def zmq_endpoint(v: Any, k: str) -> str:
    """Where to connect: tcp://HOST:PORT (the publisher binds; a wildcard host is a bind address) or ipc://PATH."""
    if not isinstance(v, str) or not v:
        raise _type_error(k, "a ZMQ endpoint like tcp://127.0.0.1:5557", v)
    if v.startswith("ipc://") and len(v) > len("ipc://"):
        return v
    host, sep, port_text = v[len("tcp://"):].rpartition(":") if v.startswith("tcp://") else ("", "", "")
    if not sep or not host or host in ("*", "0.0.0.0", "[::]") or not port_text.isdigit() \
            or not (1 <= int(port_text) <= 65535):
        raise ConfigError(k, f"expected tcp://HOST:PORT (a host to connect to, port 1-65535) or ipc://PATH, got {v!r}")
    return v


@dataclass
class KvEventsEndpoint:
    """``upstreams[].kv_events``: one replica's event publisher (vLLM's --kv-events-config)."""
    endpoint: str = setting(zmq_endpoint)                        # vLLM's "endpoint", as a host to connect to
    replay: str | None = setting(optional(zmq_endpoint), None)   # vLLM's "replay_endpoint": recovers gaps
    topic: str = setting(string, "")                             # vLLM's "topic" (its default is "")
    model: str | None = setting(optional(text), None)            # default: the model the metrics report
    max_frame_bytes: int | None = setting(optional(integer(lo=1024, hi=1024 * MiB)), None)  # None: kv_events'


def kv_events_endpoint(v: Any, k: str) -> KvEventsEndpoint:
    """``tcp://HOST:PORT`` or a mapping {endpoint, replay, topic, model, max_frame_bytes}."""
    out = load_section(KvEventsEndpoint, {"endpoint": v} if isinstance(v, str) else v, k)
    check_kv_event_deps(k)
    return out


_SHA256_HEX = re.compile(r"[0-9a-fA-F]{64}")
_RESERVED_TENANTS = ("", "other", "unnamed")


def tenant_names(v: Any, k: str) -> dict[str, str]:
    """``kv_events.tenants``: sha256(cache_salt) hex digest -> tenant name. A key that is not a digest
    may be a raw salt (a secret): errors never repeat a key, only its position."""
    if not isinstance(v, dict):
        raise ConfigError(k, f"expected a mapping of sha256(cache_salt) hex digests to tenant names, got "
                             f"{type(v).__name__}")
    out: dict[str, str] = {}
    for i, (digest, name) in enumerate(v.items()):
        where = f"{k} (entry {i + 1})"
        if not isinstance(digest, str) or not _SHA256_HEX.fullmatch(digest):
            raise ConfigError(where, "keys are the sha256 hex digest of a cache_salt (printf %s SALT | sha256sum), "
                                     "64 hex digits; a raw salt does not belong in the config")
        if not isinstance(name, str) or len(name) > 64 or not name.isprintable() or name in _RESERVED_TENANTS \
                or name.startswith("h-"):
            raise ConfigError(where, "a tenant name is 1-64 printable characters, not other, unnamed or h-...")
        out[digest.lower()] = name
    return out


def tenant_key(v: Any, k: str) -> str:
    """``kv_events.tenant_key``: the HMAC key of hashed tenant labels (a secret: never repeated)."""
    if not isinstance(v, str) or len(v) < 16:
        raise ConfigError(k, "expected a string of at least 16 characters (the HMAC key of tenant labels)")
    return v


@dataclass
class KvEventsSettings:
    """The top-level ``kv_events:`` section: bounds of every followed stream and of the ledger."""
    # The ledger (state/kv_ledger), per replica: departed block contents remembered (evicted, cleared,
    # lost at a restart) to name why a block is stored again; older ones count as first. The default
    # keeps a fleet of 64 replicas x 50 000 cached blocks, every history full, under 1 GB (the ledger's
    # own defaults; benchmarks/bench_kv_ledger.py).
    history_blocks: int = setting(integer(lo=0, hi=100_000_000), 32_768)
    # The ledger, per replica: cached blocks tracked at most. 1 Mi: a vLLM pool's num_gpu_blocks on the
    # largest GPUs at block_size 16.
    max_blocks: int = setting(integer(lo=1, hi=100_000_000), 1 << 20)
    # The source, per stream: a frame larger than this is dropped and counted (reason oversized).
    max_frame_bytes: int = setting(integer(lo=1024, hi=1024 * MiB), 16 * MiB)
    # The source, per stream: messages ZMQ queues before it drops (RCVHWM); a drop shows as a gap, which
    # the replay socket (10 000 batches deep in vLLM) can still fill. vLLM publishes one batch per engine
    # step, so the queue only fills if the ledger stalls; memory is at most this x the batch size.
    queue_messages: int = setting(integer(lo=100, hi=10_000_000), 10_000)
    # How long a gap's recovery from the replay socket may take before the rest counts as lost.
    replay_timeout: float = setting(duration(0.01, 10 * MINUTE), 2.0)
    # Per-tenant accounting (docs/kv-events.md, "Tenants and adapters"): names for cache_salts, keyed by
    # sha256(salt) hex so the config holds no secret; unnamed salts are labelled h-<12 hex of
    # HMAC-SHA256(tenant_key, salt)> (or "unnamed" without a key); at most tenant_top_k hashed tenants
    # get their own series, later ones count under tenant="other".
    tenants: dict[str, str] = setting(tenant_names, default_factory=dict)
    tenant_key: str | None = setting(optional(tenant_key), None, secret=True)
    tenant_top_k: int = setting(integer(lo=1, hi=1000), 20)
    # The isolation reason: a stored block whose token content is cached at that moment under another salt
    # or adapter. Costs one index entry per cached block of a model whose chain heads carry two keys or more
    # (salt, adapter; docs/kv-events.md, "Per-tenant accounting"); false keeps the per-tenant split without it.
    isolation: bool = setting(boolean, True)


# --- the sections every layer shares: upstreams and the listener ---------------------------------

@dataclass
class Upstream:
    url: str = setting(http_url)
    name: str = setting(optional(text), "")
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


def upstream(v: Any, k: str) -> Upstream:
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


def check_unique_names(sources: Sequence[Any], key: str, taken: set[str] | None = None) -> None:
    """Upstream and log-source names label the same series (`upstream`): each must be unique.
    `taken` holds names already used by the other kind of source."""
    seen: set[str] = set(taken or ())
    for i, src in enumerate(sources):
        if src.name in seen:
            raise ConfigError(f"{key}[{i}].name", f"duplicate source name {src.name!r}: give each upstream "
                                                  "and log file its own name")
        seen.add(src.name)


def parse_windows(values: Any, key: str) -> dict[str, float]:
    """Hit-ratio windows, label -> seconds (``[1m, 5m]``)."""
    if not isinstance(values, list):
        raise _type_error(key, "a list of durations like [1m, 5m]", values)
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
