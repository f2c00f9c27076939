"""Label values read off the wire (a page's model_name, a LoRA name, a KV tier's medium): made safe for /metrics.

The exposition formats escape only backslash, double quote and newline, so any other control
character a publisher sends (NUL, ESC, DEL, the C1 controls) would reach every scraper's parser and
an operator's terminal as sent, and a bidi override or zero-width character would make two label
values look alike. Such a value is bounded in length where it is decoded (kv_limits.py), and each of
its non-printable characters (``str.isprintable``: Unicode categories C* and Z* but the space) is
replaced here by U+FFFD; the caller counts every value so rewritten, so the change is visible. A page's
label values have no decoder to bound them: one over MAX_LABEL_CHARS is cut, and ends with a digest of
the whole value so that two long values stay two series (``wire_label``).
"""
from __future__ import annotations

import hashlib

MAX_LABEL_CHARS = 256
_DIGEST_CHARS = 12

REPLACEMENT = "\ufffd"


def printable_label(value: str) -> str:
    """``value`` with each non-printable character but the newline (which both formats escape) replaced by
    U+FFFD (itself when there is none)."""
    if value.isprintable():
        return value
    return "".join(c if c.isprintable() or c == "\n" else REPLACEMENT for c in value)


def wire_label(value: str) -> str:
    """``value`` printable and at most MAX_LABEL_CHARS long (itself when it is both)."""
    if len(value) <= MAX_LABEL_CHARS and value.isprintable():
        return value
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:_DIGEST_CHARS]
    if len(value) > MAX_LABEL_CHARS:
        value = value[:MAX_LABEL_CHARS - _DIGEST_CHARS - 1] + "~" + digest
    return printable_label(value)
