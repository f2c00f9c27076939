"""Turn a request into the token ids vLLM would put in its prefix cache.

Two encoders with one interface (``encode_many(requests) -> list[Encoded]``):

* ``ModelTokenizer`` — exact: the model's chat template rendered with jinja2 the way
  Hugging Face's ``apply_chat_template`` does (which is what vLLM's
  ``vllm/entrypoints/chat_utils.py::apply_hf_chat_template`` calls), then encoded with
  the model's ``tokenizer.json`` through the ``tokenizers`` package. No torch, no
  transformers. Both packages are the optional extra ``cachemon[analyze]`` and are
  imported only here, lazily.
* ``ByteTokenizer`` — approximate: one token per UTF-8 byte of a generic rendering.
  It needs nothing installed and finds the same divergences, but its counts are not
  vLLM's; callers must label its output approximate.

vLLM rules implemented here (cited from vLLM's source, not copied):

* chat completions are tokenised with ``add_special_tokens=False`` — the template is
  expected to emit BOS itself (``ChatCompletionRequest.add_special_tokens`` defaults to
  False in ``vllm/entrypoints/openai/protocol.py``); completions default to True, so the
  tokenizer's post-processor may add BOS. A request's own ``add_special_tokens`` wins.
* ``add_generation_prompt`` defaults to True, ``continue_final_message`` to False, and
  ``chat_template_kwargs`` are passed through to the template (same request fields).
* text-only content given as a list of parts is joined with newlines when the
  template expects string content (chat_utils' "string" content format); templates that
  loop over ``message['content']`` get the parts as a list ("openai" format).
* a completion ``prompt`` given as token ids is used as-is.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cachemon import install_hint
from cachemon.diagnostics.requests_io import Request

# Reading a model directory's files is shared with the daemon's tokenizer fingerprints (runtime layer).
from cachemon.runtime.fingerprint import (
    TokenizerDirError,
    read_chat_template,
    read_model_file,
    read_tokenizer_config,
)


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


@dataclass
class Encoded:
    ids: list[int]
    text: str | None           # rendered prompt (None when the prompt came as token ids)
    spans: list[Span]
    _source: Any = None            # the tokenizers Encoding: offsets are fetched only when needed
    _byte_mode: bool = False
    _offsets: list | None = None   # per-token (start, end) char offsets into `text`

    def char_at(self, token_pos: int) -> int | None:
        """Char offset in `text` where token `token_pos` starts."""
        if self.text is None or token_pos < 0:
            return None
        if self._byte_mode:
            return len(self.text.encode("utf-8")[:token_pos].decode("utf-8", "ignore"))
        if self._offsets is None and self._source is not None:
            # building offsets costs as much as the ids, so only for the few requests diagnosed
            src = self._source
            self._offsets = (src() if callable(src) else src).offsets
        if self._offsets is None or token_pos >= len(self._offsets):
            return len(self.text) if token_pos >= len(self.ids) else None
        return self._offsets[token_pos][0]

    def span_at(self, char: int) -> Span | None:
        for s in self.spans:
            if s.start <= char < s.end:
                return s
        return None


# ---------------------------------------------------------------------------
# chat template rendering (jinja2), the way transformers' apply_chat_template does it

def _jinja():
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

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body, lineno=lineno)

    def raise_exception(message):
        raise TemplateError(str(message))

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # transformers overrides jinja's tojson (no HTML escaping, ensure_ascii=False)
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
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


def _special_token(v):
    if isinstance(v, dict):
        return v.get("content")
    return v if isinstance(v, str) else None


class _Renderer:
    """Renders messages with a chat template, recording where each message's content lands."""

    def __init__(self, template_text: str | None, config: dict, tools_template: str | None = None):
        self.template_text = template_text
        self.tools_template_text = tools_template
        self._compiled: dict[str, tuple[Any, bool]] = {}
        self.special = {k: _special_token(config.get(k)) for k in
                        ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")}
        self.special = {k: v for k, v in self.special.items() if v is not None}

    def _template(self, with_tools: bool):
        text = self.tools_template_text if (with_tools and self.tools_template_text) else self.template_text
        if text is None:
            raise TemplateError("the tokenizer directory has no chat template "
                                "(chat_template.jinja, chat_template.json or tokenizer_config.json)")
        if text not in self._compiled:
            self._compiled[text] = (_jinja().from_string(text), bool(_LOOPS_OVER_CONTENT.search(text)))
        return self._compiled[text]

    def render(self, req: Request) -> tuple[str, list[Span]]:
        tmpl, openai_format = self._template(bool(req.tools))
        messages = [_prepare_message(m, openai_format) for m in req.messages or []]
        kwargs = dict(self.special)
        kwargs.update(req.chat_template_kwargs)
        kwargs.update(messages=messages, tools=normalise_tools(req.tools),
                      add_generation_prompt=req.add_generation_prompt and not req.continue_final_message)
        try:
            text = tmpl.render(**kwargs)
        except TemplateError:
            raise
        except Exception as e:   # a template bug or an unexpected message shape: report, don't crash
            raise TemplateError(f"chat template failed: {type(e).__name__}: {e}") from e
        if req.continue_final_message:
            # vLLM/transformers cut the rendering right after the final message's content.
            last = _content_text(messages[-1])
            if last:
                cut = text.rfind(last.strip())
                if cut >= 0:
                    text = text[:cut + len(last.strip())]
        return text, locate_messages(text, messages)


def normalise_tools(tools: list[dict] | None) -> list[dict] | None:
    """The tool list as vLLM hands it to the template: each tool re-serialised by its
    request model (``ChatCompletionToolsParam`` / ``FunctionDefinition`` in vLLM 0.32,
    ``tool.model_dump()`` in ``renderers/online_renderer.py``): fields in model order,
    a missing ``description`` / ``parameters`` becomes None, unknown keys are dropped,
    ``strict`` / ``defer_loading`` only when set."""
    if not tools:
        return None
    out = []
    for t in tools:
        raw = t.get("function")
        f: dict = raw if isinstance(raw, dict) else {}
        fn: dict = {"name": f.get("name"), "description": f.get("description"), "parameters": f.get("parameters")}
        defer = t.get("defer_loading")
        if f.get("strict") is not None:
            fn["strict"] = f["strict"]
        if f.get("defer_loading") is not None or defer is not None:
            # the tool-level flag is copied into the function when the function has none
            fn["defer_loading"] = f["defer_loading"] if f.get("defer_loading") is not None else defer
        tool: dict = {"type": t.get("type", "function"), "function": fn}
        if defer is not None:
            tool["defer_loading"] = defer
        out.append(tool)
    return out


# ConversationMessage keys vLLM keeps (renderers/chat_utils.py::_parse_chat_message_content).
_KEPT = ("tool_calls", "tool_call_id", "name", "task")


def _prepare_message(m: dict, openai_format: bool) -> dict:
    """One message as vLLM's ``_parse_chat_message_content`` + ``_postprocess_messages``
    (``vllm/renderers/chat_utils.py``, 0.32) pass it to the template: only role, content
    and a few known keys survive; ``content: null`` is an empty part list (``""`` in
    the "string" content format); text parts are joined with newlines; an assistant's
    tool-call ``arguments`` given as a JSON string is parsed into an object (``{}`` when
    empty, invalid or not an object), and an empty ``tool_calls`` list is dropped."""
    role = m.get("role")
    c = m.get("content")
    parts = [] if c is None else ([{"type": "text", "text": c}] if isinstance(c, str) else c)
    if role == "system":
        parts = _strip_billing_header(parts)
    content: object
    if openai_format:
        content = [p if isinstance(p, dict) else {"type": "text", "text": p} for p in parts]
    else:
        content = "\n".join(p if isinstance(p, str) else str(p.get("text", "")) for p in parts
                            if isinstance(p, str) or (isinstance(p, dict) and p.get("type") == "text"))
    out: dict = {"role": role, "content": content}
    if role == "assistant" and m.get("reasoning") is not None:
        out["reasoning"] = out["reasoning_content"] = m["reasoning"]
    if role == "tool" and isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                                            for p in content):
        out["content"] = "\n".join(str(p.get("text", "")) for p in content)
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


def _strip_billing_header(parts: list) -> list:
    # vLLM drops this per-request header line from system text (it defeats the prefix
    # cache): ``_strip_claude_code_billing_header`` in renderers/chat_utils.py.
    out = []
    for p in parts:
        text = p if isinstance(p, str) else p.get("text") if isinstance(p, dict) and p.get("type") == "text" else None
        if not (isinstance(text, str) and text.startswith(_BILLING_HEADER)):
            out.append(p)
            continue
        rest = text.partition("\n")[2]
        if rest:
            out.append(rest if isinstance(p, str) else {**p, "text": rest})
    return out


def _parse_arguments(tc: object) -> object:
    if not isinstance(tc, dict) or not isinstance(tc.get("function"), dict):
        return tc
    fn = dict(tc["function"])
    args = fn.get("arguments")
    if not args:
        fn["arguments"] = {}
    elif not isinstance(args, dict):
        parsed = args
        if isinstance(args, str):
            try:
                parsed = json.loads(args)
            except ValueError:
                parsed = None
        fn["arguments"] = parsed if isinstance(parsed, dict) else {}
    return {**tc, "function": fn}


def _content_text(m: dict) -> str:
    c = m.get("content")
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        return "\n".join(p.get("text", "") for p in c if isinstance(p, dict) and p.get("type") == "text")
    return ""


def locate_messages(text: str, messages: list[dict]) -> list[Span]:
    """Find each message's content in the rendered text, left to right. A template
    that rewrites content (e.g. strips it) still leaves the stripped text findable."""
    spans, cursor = [], 0
    for i, m in enumerate(messages):
        content = _content_text(m)
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


# ---------------------------------------------------------------------------
# encoders

class ModelTokenizer:
    """Exact mode: the model's tokenizer.json + chat template."""
    approximate = False

    def __init__(self, tok_dir: str | os.PathLike):
        d = Path(tok_dir)
        if not d.is_dir():
            raise TokenizerDirError(f"--tokenizer {tok_dir}: not a directory")
        tj = d / "tokenizer.json"
        if not tj.exists():
            raise TokenizerDirError(
                f"--tokenizer {tok_dir}: no tokenizer.json (only the fast-tokenizer format is supported; "
                "save it with a recent transformers or `tokenizers`)")
        try:
            from tokenizers import Tokenizer
        except ImportError as e:
            raise MissingExtraError(f"the 'tokenizers' package is not installed; {EXTRA_HINT}") from e
        raw = read_model_file(tj)       # bounded, regular files only; read once for both uses below
        try:
            self.tok = Tokenizer.from_str(raw.decode("utf-8"))
        except Exception as e:   # tokenizers raises plain Exception subclasses
            raise TokenizerDirError(f"--tokenizer {tok_dir}: cannot load tokenizer.json: {e}") from e
        config = read_tokenizer_config(d)
        self.path = d
        self.segments: _SegmentEncoder | None
        try:
            self.segments = _SegmentEncoder(self.tok, json.loads(raw))
        except (ValueError, UnicodeDecodeError):
            self.segments = None
        self.renderer = _Renderer(read_chat_template(d, config), config,
                                  read_chat_template(d, config, with_tools=True))
        _jinja()   # fail early, with the install hint, if jinja2 is missing

    @property
    def has_chat_template(self) -> bool:
        return self.renderer.template_text is not None

    def encode_many(self, reqs: Sequence[Request]) -> list[Encoded | TemplateError]:
        """Encode a batch (the Rust side parallelises a batch). A request whose template
        rendering fails comes back as its TemplateError, in place."""
        out: list = [None] * len(reqs)
        groups: dict[bool, list[tuple[int, str]]] = {True: [], False: []}
        spans_of: dict[int, list[Span]] = {}
        for i, r in enumerate(reqs):
            if r.kind == "completion" and r.prompt_ids is not None:
                out[i] = Encoded(list(r.prompt_ids), None, [])
                continue
            try:
                if r.kind == "chat":
                    text, spans = self.renderer.render(r)
                    special = False if r.add_special_tokens is None else r.add_special_tokens
                else:
                    text = r.prompt or ""
                    spans = [Span("prompt", "prompt", -1, 0, len(text))]
                    special = True if r.add_special_tokens is None else r.add_special_tokens
            except TemplateError as e:
                out[i] = e
                continue
            spans_of[i] = spans
            groups[special].append((i, text))
        for special, items in groups.items():
            if not items:
                continue
            texts = [t for _, t in items]
            seg = self.segments
            if not special and seg is not None and seg.enabled:
                ids = seg.encode_batch(texts)
                if seg.verified < seg.VERIFY:
                    full = self.tok.encode_batch(texts, add_special_tokens=False)
                    seg.check(ids, [e.ids for e in full])
                if seg.enabled:
                    for (i, text), x in zip(items, ids, strict=False):
                        out[i] = Encoded(x, text, spans_of[i], _lazy_encoding(self.tok, text))
                    continue
            encs = self.tok.encode_batch(texts, add_special_tokens=special)
            for (i, text), enc in zip(items, encs, strict=False):
                out[i] = Encoded(enc.ids, text, spans_of[i], enc)
        return out


def _lazy_encoding(tok, text):
    return lambda: tok.encode(text, add_special_tokens=False)


class _SegmentEncoder:
    """Encode rendered chat prompts segment by segment, caching the segments.

    The tokenizers library cuts the input at added tokens (``<|system|>``, ...) *before*
    normalising, pre-tokenising and running the model, so the text between two added
    tokens is encoded independently of the rest. A chat prompt's long static system
    prompt is such a segment: encoding it once and reusing the ids makes analysis of
    real traffic several times faster. Only used when that independence holds by the
    tokenizer's own settings (no lstrip/rstrip/single_word added tokens, no normaliser
    under normalised added tokens), and checked against a full encode on the first
    requests; a single mismatch turns it off for the run."""
    VERIFY = 64
    MAX_CHARS = 16_000_000       # bound on cached segment text (memory stays bounded)

    def __init__(self, tok, data: dict):
        from collections import OrderedDict
        added = data.get("added_tokens") or []
        self.enabled = bool(added) and all(
            isinstance(a, dict) and isinstance(a.get("content"), str) and a.get("content")
            and not a.get("lstrip") and not a.get("rstrip") and not a.get("single_word")
            and (not a.get("normalized") or data.get("normalizer") is None)
            for a in added)
        if not self.enabled:
            return
        self.tok = tok
        self.ids = {a["content"]: a["id"] for a in added}
        # leftmost, then longest match first: the added-vocabulary matcher's rule
        self.split = re.compile("(" + "|".join(re.escape(c) for c in sorted(self.ids, key=len, reverse=True)) + ")")
        self.cache: OrderedDict[str, list[int]] = OrderedDict()
        self.chars = 0
        self.verified = 0

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        parts_list = [self.split.split(t) for t in texts]
        cache = self.cache
        missing = list({p for parts in parts_list for p in parts[::2] if p and p not in cache})
        if missing:
            for p, e in zip(missing, self.tok.encode_batch(missing, add_special_tokens=False), strict=False):
                cache[p] = e.ids
                self.chars += len(p)
        out = []
        for parts in parts_list:
            ids: list[int] = []
            for k, p in enumerate(parts):
                if k % 2:
                    ids.append(self.ids[p])
                elif p:
                    ids.extend(cache[p])
            out.append(ids)
        while self.chars > self.MAX_CHARS and cache:
            p, _ = cache.popitem(last=False)
            self.chars -= len(p)
        return out

    def check(self, got: list[list[int]], full: list[list[int]]) -> None:
        self.verified += len(got)
        if got != full:
            self.enabled = False


_GENERIC_TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}" \
                    "{% if add_generation_prompt %}<|assistant|>{% endif %}"


class ByteTokenizer:
    """Approximate mode: UTF-8 bytes of a generic rendering. Divergence positions are
    right; token counts and block boundaries are not the model's."""
    approximate = True
    path = None
    has_chat_template = True

    def __init__(self):
        self._env = None

    def _render(self, r: Request) -> tuple[str, list[Span]]:
        # A dependency-free rendering (no jinja2 needed): role marker + content per message.
        parts, spans, pos = [], [], 0
        for i, m in enumerate(r.messages or []):
            head = f"<|{m.get('role')}|>"
            content = _content_text(m)
            spans.append(Span(f"{m.get('role')}[{i}]", str(m.get("role")), i, pos + len(head), pos + len(head) + len(content)))
            piece = head + content + "\n"
            parts.append(piece)
            pos += len(piece)
        if r.tools:
            piece = "<|tools|>" + json.dumps(r.tools, ensure_ascii=False) + "\n"
            parts.insert(0, piece)
            for s in spans:
                s.start += len(piece)
                s.end += len(piece)
        if r.add_generation_prompt:
            parts.append("<|assistant|>")
        return "".join(parts), spans

    def encode_many(self, reqs: Sequence[Request]) -> list[Encoded]:
        out = []
        for r in reqs:
            if r.kind == "completion" and r.prompt_ids is not None:
                out.append(Encoded(list(r.prompt_ids), None, []))
                continue
            if r.kind == "chat":
                text, spans = self._render(r)
            else:
                text = r.prompt or ""
                spans = [Span("prompt", "prompt", -1, 0, len(text))]
            # char spans -> stay in chars; char_at() maps byte positions back to chars
            out.append(Encoded(list(text.encode("utf-8")), text, spans, None, True))
        return out


def load_encoder(tok_dir: str | None):
    return ModelTokenizer(tok_dir) if tok_dir else ByteTokenizer()
