"""Stream request bodies out of a JSONL file, one line at a time.

Shared by `cachemon analyze` and `cachemon fingerprint --compare --prompts`.
Accepted line shapes (each a JSON object):

* an OpenAI chat-completions body: ``{"messages": [...], "tools": [...]?}``
* an OpenAI completions body: ``{"prompt": "..."}`` (a string, a list of token ids,
  or a list of those; a list of several prompts becomes several requests, as vLLM
  runs them as separate requests)
* either of those wrapped as ``{"request": <body>, "usage": {...}?}`` — the shape of
  the real captures in ``tests/fixtures/vllm-0.32.0-cpu/requests-*.jsonl``. When
  ``usage`` is there, vLLM's own ``prompt_tokens`` / ``cached_tokens`` are kept so the
  prediction can be compared with what vLLM reported. ``usage.completion_tokens`` (and
  a top-level ``completion_token_ids`` list, when recorded) say how many blocks the
  generation took; a ``time`` field (epoch seconds or ISO 8601) places the line in time.
  Who sent it: the body's ``cache_salt`` and ``user``, and the LoRA adapter as ``model`` (with
  ``--lora-model``) or a ``lora_name`` field (on the body or the wrapper).
* a line of vLLM's own log at ``--log-level DEBUG --enable-log-requests``: ``... Request ID JSON
  body: {...}`` is read as that body (the INFO ``Received request`` line has no prompt: a skip
  saying so); a server log can be given as it is.
* an event: ``{"event": "reset_prefix_cache"}`` (vLLM's ``POST /reset_prefix_cache``) or
  ``{"event": "restart"}`` (the server restarted): the prefix cache is empty after it.

A line that is not one of these is never guessed at: it becomes a ``Skip`` with its
line number and a reason, so the caller can count and show it. Lines are read one by
one, so memory does not grow with the file.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypedDict, TypeGuard

from cachemon.jsontypes import JsonObject, JsonValue


@dataclass
class Request:
    line: int                          # 1-based line number in the file
    kind: str                          # "chat" | "completion"
    messages: list[JsonObject] | None = None   # each with a string 'role' (checked on reading)
    tools: list[JsonObject] | None = None
    prompt: str | None = None          # completion text
    prompt_ids: list[int] | None = None  # completion given as token ids
    cache_salt: str | None = None
    model: str | None = None
    lora_name: str | None = None       # the LoRA adapter, when the line names it apart from `model`
    user: str | None = None            # the OpenAI `user` field (a tenant key with --tenant-by user)
    full_report: bool = False          # vllm_xargs.kv_cache_report_mode "full": vLLM reports its hits as events
    add_special_tokens: bool | None = None   # None: vLLM's per-endpoint default
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: JsonObject = field(default_factory=dict[str, JsonValue])
    observed_prompt_tokens: int | None = None   # vLLM's usage, when the line carries it
    observed_cached_tokens: int | None = None
    # usage present but prompt_tokens_details null/absent: vLLM sends null when nothing
    # was cached, or always when --enable-prompt-tokens-details is off
    observed_details_null: bool = False
    completion_tokens: int | None = None       # usage.completion_tokens
    completion_ids: list[int] | None = None    # the generated token ids, when recorded
    time: float | None = None                  # epoch seconds, when the line has a time
    session: str | None = None                 # for session-affinity routing (see session_key)
    source: int = 0                    # index of the file in a multi-file stream
    where: str = ""                    # "N", or "FILE:N" when several files form one stream

    def __post_init__(self) -> None:
        if not self.where:
            self.where = str(self.line)


@dataclass
class Skip:
    line: int
    reason: str


@dataclass
class Event:
    """Something that empties the prefix cache between two requests."""
    line: int
    kind: str                          # "reset_prefix_cache" | "restart"
    time: float | None = None
    where: str = ""


EVENT_KINDS = ("reset_prefix_cache", "restart")
Item = Request | Skip | Event


class RequestsFileError(Exception):
    """The file itself cannot be read (missing, a directory, not UTF-8 text ...)."""


def iter_requests(path: str, progress: Callable[[int], None] | None = None) -> Iterator[Item]:
    """Yield a Request or a Skip per request, in file order.

    `progress`, if given, is called with the number of bytes consumed so far
    (for a progress bar)."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise RequestsFileError(f"cannot read {path}: {e.strerror or e}") from e
    consumed = 0
    with f:
        for lineno, raw in enumerate(f, 1):
            consumed += len(raw)
            if progress is not None:
                progress(consumed)
            if not raw.strip():
                continue            # blank lines are not requests (not counted as skips)
            yield from parse_line(raw, lineno)


# vLLM's request logger (--enable-log-requests; vllm/entrypoints/serve/utils/request_logger.py,
# 0.32.0): at INFO only "Received request ID: params: SamplingParams(...), lora_request: ...", no
# prompt, salt or user; at --log-level DEBUG also "Request ID JSON body: {...}", the body as sent.
LOG_BODY = "JSON body: "
LOG_INFO_REQUEST = "Received request "
LOG_INFO_REASON = ("vLLM's INFO request line carries no prompt, cache_salt or user (only sampling params and "
                   "lora_request): run vLLM with --log-level DEBUG for its `JSON body` lines")
LOG_OTHER_REASON = "a vLLM server log line that is not a request"
# "(APIServer pid=1) INFO 12-01 07:35:38 [file.py:65] ...", "INFO 12-01 ...", uvicorn's "INFO:     ..."
_LOG_LINE = re.compile(r"^(\(\w+ pid=\d+\) )?(DEBUG|INFO|WARNING|ERROR|CRITICAL)( \d\d-\d\d \d\d:|:\s)")


def _log_line(raw: bytes | str, lineno: int) -> Skip | bytes | str:
    """A vLLM request-log line: the JSON body it carries, a Skip saying what it is, or the line
    unchanged (not a request-log line: it goes through the JSON path and its errors)."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    at = text.find(LOG_BODY)
    if at >= 0 and "Request " in text[:at]:
        return text[at + len(LOG_BODY):]
    if LOG_INFO_REQUEST in text:
        return Skip(lineno, LOG_INFO_REASON)
    if _LOG_LINE.match(text):
        return Skip(lineno, LOG_OTHER_REASON)
    return raw


def parse_line(raw: bytes | str, lineno: int) -> Iterator[Item]:
    if not (raw.lstrip().startswith(b"{") if isinstance(raw, bytes) else raw.lstrip().startswith("{")):
        body = _log_line(raw, lineno)
        if isinstance(body, Skip):
            yield body
            return
        raw = body
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as e:
        yield Skip(lineno, f"not valid JSON: {e.msg} at char {e.pos}")
        return
    except (ValueError, UnicodeDecodeError) as e:
        yield Skip(lineno, f"not valid JSON ({_short(e)})")
        return
    if not isinstance(obj, dict):
        yield Skip(lineno, f"expected a JSON object, got {type(obj).__name__}")
        return
    if "event" in obj:
        if obj["event"] not in EVENT_KINDS:
            yield Skip(lineno, f"unknown event {str(obj['event'])[:40]!r} (known: {', '.join(EVENT_KINDS)})")
        else:
            yield Event(lineno, obj["event"], parse_time(obj.get("time")), str(lineno))
        return
    usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else None
    body = obj.get("request", obj)
    if not isinstance(body, dict):
        yield Skip(lineno, "'request' is not a JSON object")
        return
    lora = obj.get("lora_name", body.get("lora_name"))
    for item in _parse_body(body, lineno, usage):
        if isinstance(item, Request):
            item.time = parse_time(obj.get("time"))
            item.lora_name = lora if isinstance(lora, str) and lora else None
            ids = obj.get("completion_token_ids")
            if isinstance(ids, list) and _token_ids(ids):
                item.completion_ids = ids
        yield item


def parse_time(v: object) -> float | None:
    """Epoch seconds from a number or an ISO 8601 string; None when absent or unreadable."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, str):
        from datetime import datetime, timezone
        try:
            d = datetime.fromisoformat(v.replace("Z", "+00:00"))
        except ValueError:
            return None
        return (d if d.tzinfo else d.replace(tzinfo=timezone.utc)).timestamp()
    return None


class _Common(TypedDict):
    """The fields every request of a line shares (a completion line may hold several prompts)."""
    cache_salt: str | None
    model: str | None
    user: str | None
    full_report: bool
    add_special_tokens: bool | None
    observed_details_null: bool
    completion_tokens: int | None


def _str_or_none(v: JsonValue) -> str | None:
    return v if isinstance(v, str) else None


def _parse_body(body: JsonObject, lineno: int, usage: JsonObject | None) -> Iterator[Item]:
    xargs = body.get("vllm_xargs")
    special = body.get("add_special_tokens")
    obs_p, obs_c = _observed(usage)
    ct = (usage or {}).get("completion_tokens")
    common = _Common(
        cache_salt=_str_or_none(body.get("cache_salt")),
        model=_str_or_none(body.get("model")),
        user=_str_or_none(body.get("user")),
        full_report=isinstance(xargs, dict) and xargs.get("kv_cache_report_mode") == "full",
        add_special_tokens=special if isinstance(special, bool) else None,
        observed_details_null=obs_p is not None and obs_c is None,
        completion_tokens=ct if isinstance(ct, int) and not isinstance(ct, bool) and ct >= 0 else None,
    )
    if "messages" in body:
        msgs = _messages(body["messages"])
        if isinstance(msgs, str):
            yield Skip(lineno, msgs)
            return
        tools = body.get("tools")
        if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
            yield Skip(lineno, "'tools' is not a list of objects")
            return
        tool_list = [t for t in tools if isinstance(t, dict)] if tools else None
        kwargs = body.get("chat_template_kwargs")
        yield Request(line=lineno, kind="chat", messages=msgs, tools=tool_list,
                      session=session_key(body, msgs),
                      add_generation_prompt=body.get("add_generation_prompt", True) is not False,
                      continue_final_message=body.get("continue_final_message") is True,
                      chat_template_kwargs=kwargs if isinstance(kwargs, dict) else {},
                      observed_prompt_tokens=obs_p, observed_cached_tokens=obs_c, **common)
        return
    if "prompt" in body:
        prompts = _split_prompts(body["prompt"])
        if prompts is None:
            yield Skip(lineno, "'prompt' must be a string, a list of token ids (0 <= id < 2**32), or a list of those")
            return
        for p in prompts:
            r = Request(line=lineno, kind="completion", **common)
            if common["user"] is not None:
                r.session = "user:" + common["user"]
            if isinstance(p, str):
                r.prompt = p
            else:
                r.prompt_ids = p
            if len(prompts) != 1:   # usage sums over the prompts: not comparable per request
                r.observed_details_null, r.completion_tokens = False, None
            else:
                r.observed_prompt_tokens, r.observed_cached_tokens = obs_p, obs_c
            yield r
        return
    yield Skip(lineno, "no 'messages' or 'prompt' field (neither at top level nor under 'request')")


def session_key(body: JsonObject, msgs: list[JsonObject]) -> str:
    """A conversation's identity for sticky routing: the OpenAI ``user`` field when the
    client sets it, else the conversation's opening (the messages up to and including
    the first user message), which every later turn of the same chat repeats."""
    if isinstance(body.get("user"), str):
        return "user:" + str(body["user"])
    head = []
    for m in msgs:
        head.append(m)
        if m.get("role") == "user":
            break
    return json.dumps([body.get("cache_salt"), head], sort_keys=True, ensure_ascii=False, default=str)


def _messages(msgs: JsonValue) -> list[JsonObject] | str:
    """The checked message list, or what is wrong with it."""
    if not isinstance(msgs, list) or not msgs:
        return "'messages' is not a non-empty list"
    out: list[JsonObject] = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            return f"messages[{i}] is not an object"
        if not isinstance(m.get("role"), str):
            return f"messages[{i}] has no string 'role'"
        c = m.get("content")
        if c is not None and not isinstance(c, (str, list)):
            return f"messages[{i}].content is neither a string nor a list of parts"
        out.append(m)
    return out


def _split_prompts(p: JsonValue) -> list[str | list[int]] | None:
    if isinstance(p, str):
        return [p]
    if isinstance(p, list) and p:
        if _token_ids(p):
            return [p]
        strings = [x for x in p if isinstance(x, str)]
        if len(strings) == len(p):
            return list(strings)
        id_lists = [x for x in p if isinstance(x, list) and x and _token_ids(x)]
        if len(id_lists) == len(p):
            return list(id_lists)
    return None


def _token_ids(xs: list[JsonValue]) -> TypeGuard[list[int]]:
    return all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2 ** 32 for x in xs)


def _observed(usage: JsonObject | None) -> tuple[int | None, int | None]:
    if not usage:
        return None, None
    p = usage.get("prompt_tokens")
    details = usage.get("prompt_tokens_details")
    c = details.get("cached_tokens") if isinstance(details, dict) else None
    # A null/missing details object is left unknown here: it means 0 cached only when the
    # server reports details at all (the caller decides, over the whole stream).
    return (p if isinstance(p, int) else None), (c if isinstance(c, int) else None)


def _short(e: Exception) -> str:
    s = str(e)
    return s if len(s) <= 80 else s[:77] + "..."
