"""The warm-up settings and inputs that `cachemon run`'s config and `cachemon warmup` share: the
``warmup:`` section, the prompts file, the API base and the rate."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from cachemon.config import (
    HOUR,
    ConfigError,
    choice,
    duration,
    integer,
    list_of,
    load_section,
    number,
    optional,
    setting,
    text,
)
from cachemon.jsontypes import JsonObject

DEFAULT_MAX_LOAD: float = 4


TRIGGERS = ("restart", "model_change")


class WarmupError(Exception):
    """A problem that stops the warm-up before it sends anything (exit code 2)."""


@dataclass
class Prompt:
    line: int
    endpoint: str          # /v1/chat/completions | /v1/completions
    body: JsonObject


@dataclass
class Prompts:
    items: list[Prompt] = field(default_factory=list)
    skipped: list[tuple[int, str]] = field(default_factory=list)   # (line, reason)
    duplicates: int = 0


def load_prompts(path: str) -> Prompts:
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        raise WarmupError(f"cannot read prompts file {path}: {e.strerror or e}") from None
    out = Prompts()
    seen: set[str] = set()
    with f:
        try:
            lines = list(f)
        except UnicodeDecodeError as e:
            raise WarmupError(f"prompts file {path} is not UTF-8 text (byte {e.start})") from None
    for n, line in enumerate(lines, 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        try:
            obj = json.loads(s)
        except json.JSONDecodeError as e:
            out.skipped.append((n, f"not JSON ({e.msg} at column {e.colno})"))
            continue
        if isinstance(obj, dict) and isinstance(obj.get("request"), dict):
            obj = obj["request"]
        if not isinstance(obj, dict):
            out.skipped.append((n, "not a JSON object"))
            continue
        msgs, prompt = obj.get("messages"), obj.get("prompt")
        if isinstance(msgs, list) and msgs and all(isinstance(m, dict) and "role" in m for m in msgs):
            endpoint = "/v1/chat/completions"
        elif isinstance(prompt, (str, list)) and prompt:
            endpoint = "/v1/completions"
        elif "messages" in obj:
            out.skipped.append((n, "'messages' must be a non-empty list of {role, content} objects"))
            continue
        else:
            out.skipped.append((n, "neither 'messages' (chat) nor 'prompt' (completions)"))
            continue
        key = json.dumps(obj, sort_keys=True)
        if key in seen:
            out.duplicates += 1
            continue
        seen.add(key)
        out.items.append(Prompt(n, endpoint, obj))
    return out


def api_base(url: str) -> str:
    """http://host:port from the --api URL (accepts .../v1 or .../metrics too)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise WarmupError(f"--api: expected an http:// or https:// URL, got {url!r}")
    path = parts.path.rstrip("/")
    for tail in ("/metrics", "/v1"):
        if path.endswith(tail):
            path = path[: -len(tail)]
    return f"{parts.scheme}://{parts.netloc}{path}"


def parse_rate(value: str) -> float:
    """Requests per second like ``2`` or ``2/s``; ValueError carries the one-line reason."""
    v = value.strip().lower().removesuffix("/s")
    try:
        r = float(v)
    except ValueError:
        raise ValueError(f"expected requests per second like 2 or 2/s, got {value!r}") from None
    if not r > 0 or r == float("inf"):
        raise ValueError("must be a positive, finite number")
    return r


def _prompts_file(v: object, key: str) -> str:
    path = text(v, key)
    try:
        p = load_prompts(path)
    except WarmupError as e:
        raise ConfigError(key, str(e)) from None
    if not p.items:
        raise ConfigError(key, f"no usable prompt in {path}")
    return path


def _api(v: object, key: str) -> str:
    try:
        return api_base(str(v))
    except WarmupError as e:
        raise ConfigError(key, str(e)) from None


def _rate(v: object, key: str) -> float:
    try:
        return parse_rate(str(v))
    except ValueError as e:
        raise ConfigError(key, str(e)) from None


@dataclass
class WarmupConfig:
    """The ``warmup:`` section (the daemon's warm-up after a restart or a model change)."""
    prompts: str = setting(_prompts_file)
    warmup_on: tuple[str, ...] = setting(lambda v, k: tuple(list_of(choice(*TRIGGERS))(v, k)), TRIGGERS)
    api: str | None = setting(optional(_api), None)
    concurrency: int = setting(integer(lo=1, hi=64), 1)
    rate: float = setting(_rate, 1.0)
    max_tokens: int = setting(integer(lo=1, hi=4096), 1)
    max_load: float = setting(number(lo=0), DEFAULT_MAX_LOAD)
    delay: float = setting(duration(hi=HOUR), 10.0)
    timeout: float = setting(duration(hi=HOUR), 60.0)


def parse_warmup_config(raw: object, key: str = "warmup") -> WarmupConfig:
    return load_section(WarmupConfig, raw, key)
