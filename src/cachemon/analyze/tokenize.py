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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from cachemon.analyze.chat_template import EXTRA_HINT as EXTRA_HINT
from cachemon.analyze.chat_template import MissingExtraError as MissingExtraError
from cachemon.analyze.chat_template import Renderer, content_text, jinja_environment
from cachemon.analyze.chat_template import Span as Span
from cachemon.analyze.chat_template import TemplateError as TemplateError
from cachemon.analyze.requests_io import Request

# Reading a model directory's files is shared with the daemon's tokenizer fingerprints (runtime layer).
from cachemon.sources.fingerprint import (
    TokenizerDirError as TokenizerDirError,
)
from cachemon.sources.fingerprint import (
    read_chat_template,
    read_model_file,
    read_tokenizer_config,
)

if TYPE_CHECKING:   # tokenizers is the optional extra analyze
    import tokenizers


@dataclass
class Encoded:
    ids: list[int]
    text: str | None           # rendered prompt (None when the prompt came as token ids)
    spans: list[Span]
    # the tokenizers Encoding, or how to make it: offsets are fetched only when needed
    _source: tokenizers.Encoding | Callable[[], tokenizers.Encoding] | None = None
    _byte_mode: bool = False
    _offsets: list[tuple[int, int]] | None = None   # per-token (start, end) char offsets into `text`

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
        start: int = self._offsets[token_pos][0]
        return start

    def span_at(self, char: int) -> Span | None:
        for s in self.spans:
            if s.start <= char < s.end:
                return s
        return None


# ---------------------------------------------------------------------------
# encoders

class Encoder(Protocol):
    """What ``analyze`` needs of a tokenizer: ``ModelTokenizer`` (exact) or ``ByteTokenizer`` (approximate)."""

    @property
    def approximate(self) -> bool: ...

    def encode_many(self, reqs: Sequence[Request]) -> Sequence[Encoded | TemplateError]: ...


class ModelTokenizer:
    """Exact mode: the model's tokenizer.json + chat template."""
    approximate = False

    def __init__(self, tok_dir: str | os.PathLike[str]):
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
        self.renderer = Renderer(read_chat_template(d, config), config,
                                  read_chat_template(d, config, with_tools=True))
        jinja_environment()   # fail early, with the install hint, if jinja2 is missing

    @property
    def has_chat_template(self) -> bool:
        return self.renderer.template_text is not None

    def encode_many(self, reqs: Sequence[Request]) -> list[Encoded | TemplateError]:
        """Encode a batch (the Rust side parallelises a batch). A request whose template
        rendering fails comes back as its TemplateError, in place."""
        out: dict[int, Encoded | TemplateError] = {}   # by request index: filled out of order
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
        return [out[i] for i in range(len(reqs))]


def _lazy_encoding(tok: tokenizers.Tokenizer, text: str) -> Callable[[], tokenizers.Encoding]:
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

    def __init__(self, tok: tokenizers.Tokenizer, data: dict[str, Any]):   # tokenizer.json, checked here
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

    def __init__(self) -> None:
        self._env = None

    def _render(self, r: Request) -> tuple[str, list[Span]]:
        # A dependency-free rendering (no jinja2 needed): role marker + content per message.
        parts, spans, pos = [], [], 0
        for i, m in enumerate(r.messages or []):
            head = f"<|{m.get('role')}|>"
            content = content_text(m)
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


def load_encoder(tok_dir: str | None) -> ModelTokenizer | ByteTokenizer:
    return ModelTokenizer(tok_dir) if tok_dir else ByteTokenizer()
