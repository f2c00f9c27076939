"""Stable, separate fingerprints of a model directory's tokenizer and chat template.

Public API: ``fingerprint_dir(path) -> {"tokenizer": hex, "chat_template": hex or "", "parts": {...}}``,
and ``Fingerprinter`` (the daemon's change detection, for labels: re-hashes only when files change).

Why two hashes: either one changing silently changes every prompt's token ids, and
with them every block hash — the prefix cache starts cold after an upgrade even when
the prompts did not change. Keeping them apart tells *which* one moved.

The tokenizer hash covers what decides token ids: the model (type, vocabulary,
merges and flags), normaliser, pre-tokeniser, post-processor, decoder, added tokens, and
the special tokens / add_bos / add_eos settings of ``tokenizer_config.json``. It is
computed over canonical JSON (sorted keys), so re-saving the same tokenizer with
another key order or indentation keeps the hash. Padding and truncation settings are
left out: they are runtime options, and vLLM does not encode prompts with them.

The chat-template hash is over the exact template text (whitespace is significant to
jinja's output). No third-party import here: reading JSON is enough, so the daemon can
call it without the ``analyze`` extra.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import TypedDict

from cachemon.config import MAX_TOKENIZER_FILE_BYTES, ConfigError, read_small_file
from cachemon.jsontypes import JsonObject, JsonValue

log = logging.getLogger("cachemon.changes")

HEX_LEN = 12     # 48 bits: ample to tell versions of one model apart, short enough for a label

TOKENIZER_PARTS = ("model", "normalizer", "pre_tokenizer", "post_processor", "decoder", "added_tokens")
CONFIG_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token",
               "add_bos_token", "add_eos_token", "additional_special_tokens", "added_tokens_decoder")
RAW_TOKENIZER_FILES = ("tokenizer.model", "spiece.model", "vocab.json", "merges.txt", "vocab.txt")


class Fingerprint(TypedDict):
    tokenizer: str          # hex of the parts below
    chat_template: str      # hex, "" when the directory has none
    parts: dict[str, str]   # per component (vocab, merges, normalizer, ...), to say what changed


class TokenizerDirError(Exception):
    """The --tokenizer directory is missing, unreadable or has no usable tokenizer."""


def read_model_file(p: Path) -> bytes:
    """One file of a model directory, through the one bounded reader (a FIFO, device or file over
    MAX_TOKENIZER_FILE_BYTES is an error naming it, not a hang or gigabytes of memory)."""
    try:
        return read_small_file(p, "", MAX_TOKENIZER_FILE_BYTES, what="model file")
    except ConfigError as e:
        raise TokenizerDirError(str(e)) from None


def _text(p: Path) -> str:
    try:
        return read_model_file(p).decode("utf-8")
    except UnicodeDecodeError as e:
        raise TokenizerDirError(f"{p} is not valid UTF-8 (byte {e.start})") from None


def _present(p: Path) -> bool:
    """There, whatever its type (a FIFO or device is then refused by name, not silently skipped)."""
    return p.exists() and not p.is_dir()


def read_chat_template(tok_dir: Path, config: JsonObject | None = None, *, with_tools: bool = False) -> str | None:
    """The chat template text a model directory carries, in transformers' order of
    precedence: chat_template.jinja, chat_template.json, then tokenizer_config.json."""
    p = tok_dir / "chat_template.jinja"
    if _present(p):
        return _text(p)
    p = tok_dir / "chat_template.json"
    if _present(p):
        try:
            t = json.loads(_text(p)).get("chat_template")
        except (ValueError, AttributeError) as e:
            raise TokenizerDirError(f"{p} is not valid JSON with a 'chat_template' key: {e}") from e
        if isinstance(t, str):
            return t
    if config is None:
        config = read_tokenizer_config(tok_dir)
    t = config.get("chat_template")
    if isinstance(t, str):
        return t
    if isinstance(t, list):     # named templates: "default", and "tool_use" when tools are given
        named = {d.get("name"): d.get("template") for d in t if isinstance(d, dict)}
        if with_tools and isinstance(named.get("tool_use"), str):
            return named["tool_use"]
        if isinstance(named.get("default"), str):
            return named["default"]
    return None


def read_tokenizer_config(tok_dir: Path) -> JsonObject:
    p = tok_dir / "tokenizer_config.json"
    if not _present(p):
        return {}
    try:
        d = json.loads(_text(p))
    except ValueError as e:
        raise TokenizerDirError(f"{p} is not valid JSON: {e}") from e
    return d if isinstance(d, dict) else {}


def _h(obj: object) -> str:
    if isinstance(obj, bytes):
        data = obj
    elif isinstance(obj, str):
        data = obj.encode("utf-8")
    else:
        data = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return hashlib.sha256(data).hexdigest()[:HEX_LEN]


def tokenizer_parts(path: str | Path) -> dict[str, str]:
    """Per-component hashes (vocab, merges, normalizer, ...), to say what changed."""
    d = Path(path)
    if not d.is_dir():
        raise TokenizerDirError(f"{path}: not a directory")
    config = read_tokenizer_config(d)
    parts: dict[str, str] = {}
    tj = d / "tokenizer.json"
    if _present(tj):
        try:
            data = json.loads(_text(tj))
        except (ValueError, UnicodeDecodeError) as e:
            raise TokenizerDirError(f"{tj}: not valid JSON: {e}") from e
        if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
            raise TokenizerDirError(f"{tj}: no 'model' object; not a tokenizers file")
        model = dict(data["model"])
        vocab, merges = model.pop("vocab", None), model.pop("merges", None)
        parts["vocab"] = _h(vocab)
        parts["merges"] = _h(merges)
        parts["model"] = _h(model)               # type and flags (unk_token, byte_fallback, ...)
        for k in TOKENIZER_PARTS[1:]:
            parts[k] = _h(data.get(k))
    else:
        found = [f for f in RAW_TOKENIZER_FILES if _present(d / f)]
        if not found:
            raise TokenizerDirError(f"{path}: no tokenizer.json (nor {', '.join(RAW_TOKENIZER_FILES)})")
        for f in found:
            parts[f] = _h(read_model_file(d / f))
    parts["special_tokens"] = _h({k: config.get(k) for k in CONFIG_KEYS if k in config})
    return parts


def chat_template_text(path: str | Path) -> str | list[JsonValue] | None:
    """The directory's chat template(s) as transformers would find them."""
    d = Path(path)
    config = read_tokenizer_config(d)
    t = config.get("chat_template")
    if not _present(d / "chat_template.jinja") and not _present(d / "chat_template.json") and isinstance(t, list):
        return t                                   # several named templates: hash them all
    return read_chat_template(d, config)


def fingerprint_dir(path: str | Path) -> Fingerprint:
    """{"tokenizer": hex, "chat_template": hex ("" when there is none), "parts": {...}}."""
    parts = tokenizer_parts(path)
    tmpl = chat_template_text(path)
    return {
        "tokenizer": _h(parts),
        "chat_template": "" if tmpl is None else _h(tmpl),
        "parts": parts,
    }


class Fingerprinter:
    """(tokenizer, chat_template) hashes of a model directory; re-hashes it only when a file in it
    changed (name, mtime or size)."""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[tuple[tuple[str, int, int], ...], Fingerprint]] = {}

    def __call__(self, path: str) -> tuple[str, str] | None:
        try:
            stamp = tuple(sorted((e.name, e.stat().st_mtime_ns, e.stat().st_size)
                                 for e in os.scandir(path) if e.is_file()))
        except OSError as e:
            log.warning("tokenizer directory %s: %s", path, e)
            return None
        hit = self._cache.get(path)
        if hit is None or hit[0] != stamp:
            try:
                fp = fingerprint_dir(path)
            except Exception as e:   # a broken tokenizer dir must not stop the daemon
                log.warning("cannot fingerprint %s: %s", path, e)
                return None
            self._cache[path] = hit = (stamp, fp)
        fp = hit[1]
        return str(fp.get("tokenizer", "") or ""), str(fp.get("chat_template", "") or "")
