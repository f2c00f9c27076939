"""Label values read off the wire (a LoRA name, a KV tier's medium): made safe for /metrics.

The exposition formats escape only backslash, double quote and newline, so any other control
character a publisher sends (NUL, ESC, DEL, the C1 controls) would reach every scraper's parser and
an operator's terminal as sent, and a bidi override or zero-width character would make two label
values look alike. Such a value is bounded in length where it is decoded (kv_limits.py), and each of
its non-printable characters (``str.isprintable``: Unicode categories C* and Z* but the space) is
replaced here by U+FFFD; the caller counts every value so rewritten, so the change is visible.
"""
from __future__ import annotations

REPLACEMENT = "\ufffd"


def printable_label(value: str) -> str:
    """``value`` with each non-printable character replaced by U+FFFD (itself when there is none)."""
    if value.isprintable():
        return value
    return "".join(c if c.isprintable() else REPLACEMENT for c in value)
