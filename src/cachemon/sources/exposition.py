"""A selective parser for the Prometheus text exposition format (0.0.4).

vLLM's /metrics page is ~50 KB, mostly histogram buckets cachemon never reads.
Instead of building every family (``prometheus_client.parser`` costs 10-40 us per
sample), we look at each line's metric name and only parse the samples whose
*stem* (name without the ``vllm:`` / ``vllm_`` / ``ray_vllm:`` / ``ray_vllm_`` prefix)
is wanted. The wanted stems come from the era table, so the parser stays generic.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

# Ray's stat logger sanitises "vllm:" to "vllm_"; under Ray Serve names may be
# prefixed with "ray_". Every variant maps to the same stem.
VLLM_PREFIXES = ("vllm:", "vllm_", "ray_vllm:", "ray_vllm_")

_LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_ESCAPE_RE = re.compile(r'\\[\\"n]')


class ExpositionError(ValueError):
    """The body is not a (complete) Prometheus text exposition."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass
class Exposition:
    """The wanted part of one /metrics page."""

    # stem -> list of (labels dict, value)
    samples: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)
    # stem -> HELP text (only for stems asked for)
    help: dict[str, str] = field(default_factory=dict)
    # unprefixed process metrics that reveal restarts
    process_start_time: float | None = None
    # which naming prefix the page used (vllm:, vllm_, ray_vllm:, ...), for the info metric
    prefix: str | None = None


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return _ESCAPE_RE.sub(lambda m: _ESCAPES[m.group(0)], value)


_label_cache: dict[str, dict[str, str]] = {}


def parse_labels(text: str) -> dict[str, str]:
    """Label set of one sample. Polls see the same label strings again and again, so
    parsed sets are memoised (bounded); callers must treat the dict as read-only."""
    labels = _label_cache.get(text)
    if labels is None:
        if len(_label_cache) >= 4096:
            _label_cache.clear()
        labels = _label_cache[text] = {k: _unescape(v) for k, v in _LABEL_RE.findall(text)}
    return labels


_SAMPLE_TEMPLATE = r"\n(?:ray_)?vllm[:_](%s)(?:\{([^}\n]*)\})?[ \t]+([^ \t\n]+)"
_HELP_TEMPLATE = r"\n# HELP (?:ray_)?vllm[:_](%s) ([^\n]*)"
_PREFIX_RE = re.compile(r"\n(ray_vllm[:_]|vllm[:_])")
_compiled: dict[tuple[frozenset, frozenset], tuple[re.Pattern, re.Pattern | None]] = {}


def _patterns(wanted: frozenset[str], help_wanted: frozenset[str]):
    """One regex per wanted set: its leading literal newline lets the regex engine
    skip straight from line to line, and the alternation rejects unwanted names
    (histogram buckets, most of the page) after a few characters."""
    key = (wanted, help_wanted)
    pats = _compiled.get(key)
    if pats is None:
        alt = "|".join(re.escape(s) for s in sorted(wanted, key=len, reverse=True))
        sample = re.compile(_SAMPLE_TEMPLATE % alt)
        helps = None
        if help_wanted:
            names = set(help_wanted) | {h[: -len("_total")] for h in help_wanted if h.endswith("_total")}
            halt = "|".join(re.escape(s) for s in sorted(names, key=len, reverse=True))
            helps = re.compile(_HELP_TEMPLATE % halt)
        pats = _compiled[key] = (sample, helps)
    return pats


def parse(body: str, wanted: frozenset[str], help_wanted: frozenset[str] = frozenset()) -> Exposition:
    """Parse the samples of the wanted stems.

    ``wanted`` holds full stems as exposed after the prefix, e.g.
    ``prefix_cache_hits_total`` or ``prefix_cache_hits_created``. ``help_wanted`` holds
    stems whose HELP text is needed (e.g. to tell blocks from tokens).

    Raises ExpositionError for a body that is not an exposition at all, was cut off
    (the format requires a final newline), or has a malformed wanted sample: a page
    that half-parses must never become a wrong number.
    """
    start = body[:256].lstrip()
    if not start:
        if not body.strip():
            raise ExpositionError("not_exposition", "empty body")
        start = body.lstrip()
    if "\x00" in body:
        raise ExpositionError("not_exposition", "body contains NUL bytes")
    head = start[:1]
    if not (head == "#" or head.isalpha() or head in "_:"):
        raise ExpositionError("not_exposition", f"body does not start like an exposition (starts with {start[:20]!r})")
    if not body.endswith("\n"):
        raise ExpositionError("truncated", "body does not end with a newline: the exposition was cut off")

    text = "\n" + body
    sample_re, help_re = _patterns(wanted, help_wanted)
    out = Exposition()
    samples = out.samples
    for stem, labels, value in sample_re.findall(text):
        try:
            v = float(value)
        except ValueError:
            raise ExpositionError("parse", f"bad sample value {value[:40]!r} for {stem}") from None
        samples.setdefault(stem, []).append((parse_labels(labels) if labels else {}, v))
    if samples:
        m = _PREFIX_RE.search(text)
        out.prefix = m.group(1) if m else None
    # HELP lines are only needed to tell eras apart; skip the scan when none is on the page.
    if help_re is not None and any(h in samples for h in help_wanted):
        for name, help_text in help_re.findall(text):
            out.help[name if name.endswith("_total") else name + "_total"] = help_text
    i = text.find("\nprocess_start_time_seconds ")
    if i >= 0:
        end = text.find("\n", i + 1)
        fields = text[i + 28:end].split()
        if fields:
            try:
                out.process_start_time = float(fields[0])
            except ValueError:
                raise ExpositionError("parse", f"bad process_start_time_seconds value {fields[0][:40]!r}") from None
    return out
