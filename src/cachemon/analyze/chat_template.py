"""Render a chat request the way vLLM hands it to the model's chat template (jinja2, as Hugging
Face's ``apply_chat_template``), and find where each message's content landed in the text.

vLLM rules implemented here (cited from vLLM's source, not copied): ``add_generation_prompt``
defaults to True, ``continue_final_message`` to False, ``chat_template_kwargs`` are passed
through; text-only content given as a list of parts is joined with newlines when the template
expects string content ("string" content format), templates that loop over
``message['content']`` get the parts as a list ("openai" format).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

from cachemon import install_hint
from cachemon.analyze.requests_io import Request
from cachemon.jsontypes import JsonObject, JsonValue, as_str

if TYPE_CHECKING:   # jinja2 is the optional extra analyze
    import jinja2
    import jinja2.nodes
    import jinja2.parser


class MissingExtraError(Exception):
    """tokenizers / jinja2 are not installed."""


class TemplateError(Exception):
    """Rendering one request failed (the template raised, or there is no template)."""


EXTRA_HINT = f"the optional extra analyze (tokenizers + jinja2): {install_hint('analyze')}"


@dataclass
class Span:
    """Where one piece of the request landed in the rendered prompt text."""
    label: str          # "system[0]", "user[1]", "prompt"
    role: str
    index: int          # message index (-1 for a completion prompt)
    start: int          # char offsets in the rendered text
    end: int


def jinja_environment() -> jinja2.Environment:
    try:
        import jinja2
        from jinja2.ext import Extension
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as e:   # pragma: no cover - exercised only without the extra
        raise MissingExtraError(f"jinja2 is not installed; {EXTRA_HINT}") from e

    class GenerationTag(Extension):
        # HF templates may wrap assistant text in {% generation %}...{% endgeneration %}
        # (used for assistant masks); for rendering it is a no-op wrapper.
        tags = {"generation"}

        def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body, lineno=lineno)

    def raise_exception(message: object) -> NoReturn:
        raise TemplateError(str(message))

    def tojson(x: object, ensure_ascii: bool = False, indent: int | str | None = None,
               separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
        # transformers overrides jinja's tojson (no HTML escaping, ensure_ascii=False)
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:
        import datetime
        return datetime.datetime.now().strftime(fmt)

    # trim_blocks / lstrip_blocks / loopcontrols: the environment transformers builds in
    # `_compile_jinja_template`; whitespace handling changes the rendered text, so it matters.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, "jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


_LOOPS_OVER_CONTENT = re.compile(r"for\s+\w+\s+in\s+\w+\s*(\[\s*['\"]content['\"]\s*\]|\.content)\b")


def _special_token(v: JsonValue) -> JsonValue:
    if isinstance(v, dict):
        return v.get("content")
    return v if isinstance(v, str) else None


class Renderer:
    """Renders messages with a chat template, recording where each message's content lands."""

    def __init__(self, template_text: str | None, config: JsonObject, tools_template: str | None = None):
        self.template_text = template_text
        self.tools_template_text = tools_template
        self._compiled: dict[str, tuple[jinja2.Template, bool]] = {}
        self.special = {k: _special_token(config.get(k)) for k in
                        ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")}
        self.special = {k: v for k, v in self.special.items() if v is not None}

    def _template(self, with_tools: bool) -> tuple[jinja2.Template, bool]:
        text = self.tools_template_text if (with_tools and self.tools_template_text) else self.template_text
        if text is None:
            raise TemplateError("the tokenizer directory has no chat template "
                                "(chat_template.jinja, chat_template.json or tokenizer_config.json)")
        if text not in self._compiled:
            self._compiled[text] = (jinja_environment().from_string(text), bool(_LOOPS_OVER_CONTENT.search(text)))
        return self._compiled[text]

    def render(self, req: Request) -> tuple[str, list[Span]]:
        tmpl, openai_format = self._template(bool(req.tools))
        messages = [_prepare_message(m, openai_format) for m in req.messages or []]
        kwargs: JsonObject = dict(self.special)
        kwargs.update(req.chat_template_kwargs)
        kwargs.update(messages=[*messages], tools=normalise_tools(req.tools),
                      add_generation_prompt=req.add_generation_prompt and not req.continue_final_message)
        try:
            text = tmpl.render(**kwargs)
        except TemplateError:
            raise
        except Exception as e:   # a template bug or an unexpected message shape: report, don't crash
            raise TemplateError(f"chat template failed: {type(e).__name__}: {e}") from e
        if req.continue_final_message:
            # vLLM/transformers cut the rendering right after the final message's content.
            last = content_text(messages[-1])
            if last:
                cut = text.rfind(last.strip())
                if cut >= 0:
                    text = text[:cut + len(last.strip())]
        return text, locate_messages(text, messages)


def normalise_tools(tools: list[JsonObject] | None) -> list[JsonValue] | None:
    """The tool list as vLLM hands it to the template: each tool re-serialised by its
    request model (``ChatCompletionToolsParam`` / ``FunctionDefinition`` in vLLM 0.32,
    ``tool.model_dump()`` in ``renderers/online_renderer.py``): fields in model order,
    a missing ``description`` / ``parameters`` becomes None, unknown keys are dropped,
    ``strict`` / ``defer_loading`` only when set."""
    if not tools:
        return None
    out: list[JsonValue] = []
    for t in tools:
        raw = t.get("function")
        f: JsonObject = raw if isinstance(raw, dict) else {}
        fn: JsonObject = {"name": f.get("name"), "description": f.get("description"), "parameters": f.get("parameters")}
        defer = t.get("defer_loading")
        if f.get("strict") is not None:
            fn["strict"] = f["strict"]
        if f.get("defer_loading") is not None or defer is not None:
            # the tool-level flag is copied into the function when the function has none
            fn["defer_loading"] = f["defer_loading"] if f.get("defer_loading") is not None else defer
        tool: JsonObject = {"type": t.get("type", "function"), "function": fn}
        if defer is not None:
            tool["defer_loading"] = defer
        out.append(tool)
    return out


# ConversationMessage keys vLLM keeps (renderers/chat_utils.py::_parse_chat_message_content).
_KEPT = ("tool_calls", "tool_call_id", "name", "task")


def _content_parts(c: JsonValue) -> list[JsonValue]:
    """A message's content as a part list (``null``: none; a string: one text part)."""
    if c is None:
        return []
    if isinstance(c, str):
        return [{"type": "text", "text": c}]
    if isinstance(c, list):
        return c
    # requests_io checks content on reading: a constructed Request can still hold anything
    raise TemplateError(f"message content is neither a string nor a list of parts: {type(c).__name__}")


def _prepare_message(m: JsonObject, openai_format: bool) -> JsonObject:
    """One message as vLLM's ``_parse_chat_message_content`` + ``_postprocess_messages``
    (``vllm/renderers/chat_utils.py``, 0.32) pass it to the template: only role, content
    and a few known keys survive; ``content: null`` is an empty part list (``""`` in
    the "string" content format); text parts are joined with newlines; an assistant's
    tool-call ``arguments`` given as a JSON string is parsed into an object (``{}`` when
    empty, invalid or not an object), and an empty ``tool_calls`` list is dropped."""
    role = m.get("role")
    parts = _content_parts(m.get("content"))
    if role == "system":
        parts = _strip_billing_header(parts)
    content: JsonValue
    if openai_format:
        content = [p if isinstance(p, dict) else {"type": "text", "text": p} for p in parts]
    else:
        content = "\n".join(p if isinstance(p, str) else str(p.get("text", "")) for p in parts
                            if isinstance(p, str) or (isinstance(p, dict) and p.get("type") == "text"))
    out: JsonObject = {"role": role, "content": content}
    if role == "assistant" and m.get("reasoning") is not None:
        out["reasoning"] = out["reasoning_content"] = m["reasoning"]
    if role == "tool" and isinstance(content, list):
        text_parts = [p for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if len(text_parts) == len(content):
            out["content"] = "\n".join(str(p.get("text", "")) for p in text_parts)
    for k in _KEPT:
        if k not in m or (k == "name" and not isinstance(m[k], str)) or (k == "task" and not isinstance(m[k], str)):
            continue
        if k == "tool_calls" and (role != "assistant" or m[k] is None):
            continue
        if k == "tool_call_id" and role != "tool":
            continue
        out[k] = m[k]
    if role == "developer":
        out["tools"] = m.get("tools")
    calls = out.get("tool_calls")
    if isinstance(calls, list):
        if not calls:
            del out["tool_calls"]
        else:
            out["tool_calls"] = [_parse_arguments(tc) for tc in calls]
    return out


_BILLING_HEADER = "x-anthropic-billing-header"


def _strip_billing_header(parts: list[JsonValue]) -> list[JsonValue]:
    # vLLM drops this per-request header line from system text (it defeats the prefix
    # cache): ``_strip_claude_code_billing_header`` in renderers/chat_utils.py.
    out: list[JsonValue] = []
    for p in parts:
        text = p if isinstance(p, str) else p.get("text") if isinstance(p, dict) and p.get("type") == "text" else None
        if not (isinstance(text, str) and text.startswith(_BILLING_HEADER)):
            out.append(p)
            continue
        rest = text.partition("\n")[2]
        if rest:
            out.append({**p, "text": rest} if isinstance(p, dict) else rest)
    return out


def _parse_arguments(tc: JsonValue) -> JsonValue:
    function = tc.get("function") if isinstance(tc, dict) else None
    if not isinstance(tc, dict) or not isinstance(function, dict):
        return tc
    fn = dict(function)
    args = fn.get("arguments")
    if not args:
        fn["arguments"] = {}
    elif not isinstance(args, dict):
        parsed: JsonValue = args
        if isinstance(args, str):
            try:
                parsed = json.loads(args)
            except ValueError:
                parsed = None
        fn["arguments"] = parsed if isinstance(parsed, dict) else {}
    return {**tc, "function": fn}


def content_text(m: JsonObject) -> str:
    c = m.get("content")
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        return "\n".join(as_str(p.get("text", "")) for p in c if isinstance(p, dict) and p.get("type") == "text")
    return ""


def locate_messages(text: str, messages: list[JsonObject]) -> list[Span]:
    """Find each message's content in the rendered text, left to right. A template
    that rewrites content (e.g. strips it) still leaves the stripped text findable."""
    spans, cursor = [], 0
    for i, m in enumerate(messages):
        content = content_text(m)
        role = str(m.get("role"))
        for candidate in (content, content.strip()):
            if not candidate:
                continue
            at = text.find(candidate, cursor)
            if at >= 0:
                spans.append(Span(f"{role}[{i}]", role, i, at, at + len(candidate)))
                cursor = at + len(candidate)
                break
    return spans
