"""Find where prompts that should share a prefix diverge, and name the segment.

For each request we pick, among the last few requests, the one sharing the longest
token prefix (the *reference*). Where the two first differ we look for the point
where they agree again for a long run: the stretch in between is a *varying
segment* — a timestamp, an ID, a reordered list — sitting in front of text that
would otherwise have been reused. Its cost is the whole blocks the request could
have hit had the segment been equal, minus what it did hit.

Divergences are mapped back to the message (role, index) and the char span inside
its content, classified, and grouped by a text pattern such as
``Current time: <timestamp>.``; a group is a *cause*. Each cause knows how to rewrite
a request to hold the segment constant or move it after the stable part, so the
caller can re-simulate and report the hit ratio before and after (``Fix``).

Token comparisons use the chained block hashes (equal hash at block j means the
first j+1 blocks are equal), then a bytes comparison inside one block — no loop
over tokens in Python.
"""
from __future__ import annotations

import copy
import json
import re
from array import array
from collections import deque
from dataclasses import dataclass, field
from typing import TypedDict

from cachemon.analyze.requests_io import Request
from cachemon.analyze.tokenize import Encoded
from cachemon.jsontypes import JsonObject

# --- segment classes --------------------------------------------------------------
TIMESTAMP, ID, NUMBER, REORDERED, OTHER = "timestamp", "uuid/hex id", "number", "reordered list", "other"
PLACEHOLDER = {TIMESTAMP: "<timestamp>", ID: "<id>", NUMBER: "<number>"}

_CLASS_RES = [
    (TIMESTAMP, r"\d{4}-\d{2}-\d{2}(?:[T ]\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?"
                r"|\d{1,2}:\d{2}:\d{2}(?:\.\d+)?"
                r"|\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)[a-z]*,? (?:\d{1,2} )?[A-Z][a-z]+ \d{1,2}(?:st|nd|rd|th)?,? \d{4}"
                r"|\b1[5-9]\d{8}(?:\d{3})?\b"),          # unix epoch seconds / milliseconds
    (ID, r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
         r"|\b(?=[0-9a-fA-F]*[a-fA-F])(?=[0-9a-fA-F]*\d)[0-9a-fA-F]{8,}\b"
         # 12+ hex digits that happen to be all decimal (an ID of zeros and digits) are
         # still an ID; epoch milliseconds were taken by TIMESTAMP above.
         r"|\b[0-9a-fA-F]{12,}\b"),
    (NUMBER, r"\d+(?:\.\d+)?"),
]
_COMPILED = [(k, re.compile(r)) for k, r in _CLASS_RES]
CLASS_REGEX = dict(_CLASS_RES)

MAX_SEGMENT = 512      # tokens: a longer varying stretch is not "a segment" any more
PROBE = 16             # tokens that must match to call it a re-synchronisation
STRIDE = 8
REFERENCES_TRIED = 3


@dataclass
class Divergence:
    line: str               # "N" or "FILE:N"
    pos: int                # first differing token
    seg_end: int            # token where r re-synchronises with the reference
    potential: int          # tokens r would hit had the segment been equal (whole blocks)
    cached: int
    location: str           # "system[0]", "tools", "template", "prompt"
    role: str | None
    msg_index: int | None
    char_span: tuple[int, int] | None     # within the message content
    klass: str
    pattern: str            # shown text pattern, e.g. "Current time: <timestamp>."
    prefix: str             # literal text just before the value (for the fixes)
    suffix: str
    value: str              # r's varying text
    ref_value: str

    @property
    def lost(self) -> int:
        return self.potential - self.cached


@dataclass
class Cause:
    location: str
    role: str | None
    msg_index: int | None
    klass: str
    pattern: str
    prefix: str
    suffix: str
    requests: int = 0
    tokens_lost: int = 0
    lines: list[str] = field(default_factory=list)       # first few affected lines (N or FILE:N)
    samples: list[str] = field(default_factory=list)     # first few values (not exported when redacted)
    char_span: tuple[int, int] | None = None
    first_pos: int = 0
    constant_value: str | None = None                    # first value seen: the one to hold constant

    def fixes(self) -> list[Fix]:
        out = []
        if self.klass in (TIMESTAMP, ID, NUMBER) and self.msg_index is not None:
            where = "the end of the prompt" if self.location == "prompt" else "the end of the last user message"
            out.append(Fix(self, "move", f"moving it after the stable part (to {where})"))
            out.append(Fix(self, "constant", "holding it constant"))
        elif self.klass == REORDERED:
            out.append(Fix(self, "sort", "sorting the list into a fixed order"))
        return out


@dataclass
class Fix:
    """A what-if rewrite of requests, for re-simulation."""
    cause: Cause
    kind: str             # move | constant | sort
    description: str

    def apply(self, req: Request) -> Request:
        c = self.cause
        if c.location == "tools" and self.kind == "sort":
            if not req.tools:
                return req
            r = copy.copy(req)
            r.tools = sorted(req.tools, key=_tool_name)
            return r
        if c.location == "prompt" and req.kind == "completion":
            return self._apply_prompt(req)
        messages = req.messages or []
        if req.kind != "chat" or c.msg_index is None or c.msg_index < 0 or c.msg_index >= len(messages):
            return req
        msg = messages[c.msg_index]
        content = msg.get("content")
        if not isinstance(content, str) or msg.get("role") != c.role:
            return req
        r = copy.copy(req)
        r.messages = [dict(m) for m in messages]
        if self.kind == "sort":
            r.messages[c.msg_index]["content"] = "\n".join(sorted(content.split("\n")))
            return r
        rx = re.compile("(" + re.escape(c.prefix) + ")(" + CLASS_REGEX[c.klass] + ")(" + re.escape(c.suffix) + ")")
        if self.kind == "constant":
            const = c.constant_value or ""
            r.messages[c.msg_index]["content"] = rx.sub(lambda m: m.group(1) + const + m.group(3), content)
            return r
        m = rx.search(content)
        if not m:
            return req
        clause = (c.prefix + m.group(2) + c.suffix).strip()
        end = m.end()
        while end < len(content) and content[end] in " \t":
            end += 1                       # take the separator with it
        r.messages[c.msg_index]["content"] = content[:m.start()] + content[end:]
        target = _last_user(r.messages)
        if target is None:
            return req
        tc = r.messages[target].get("content")
        if isinstance(tc, str):
            r.messages[target]["content"] = tc + "\n\n" + clause
        return r

    def _apply_prompt(self, req: Request) -> Request:
        # A completion prompt has no "user message": moving means to the prompt's end.
        c = self.cause
        if not isinstance(req.prompt, str) or c.klass not in CLASS_REGEX and self.kind != "sort":
            return req
        r = copy.copy(req)
        if self.kind == "sort":
            r.prompt = "\n".join(sorted(req.prompt.split("\n")))
            return r
        rx = re.compile("(" + re.escape(c.prefix) + ")(" + CLASS_REGEX[c.klass] + ")(" + re.escape(c.suffix) + ")")
        if self.kind == "constant":
            const = c.constant_value or ""
            r.prompt = rx.sub(lambda m: m.group(1) + const + m.group(3), req.prompt)
            return r
        m = rx.search(req.prompt)
        if not m:
            return req
        end = m.end()
        while end < len(req.prompt) and req.prompt[end] in " \t":
            end += 1
        r.prompt = req.prompt[:m.start()] + req.prompt[end:] + "\n\n" + (c.prefix + m.group(2) + c.suffix).strip()
        return r


@dataclass
class CombinedFix:
    """Several causes' fixes applied one after the other (what fixing them all gains)."""
    fixes: list[Fix]
    kind: str = "all"

    @property
    def description(self) -> str:
        return f"applying the first fix of each of these {len(self.fixes)} causes together"

    def apply(self, req: Request) -> Request:
        out = req
        for f in self.fixes:
            out = f.apply(out)
        return out


def _tool_name(t: JsonObject) -> str:
    f = t.get("function")
    return str((f if isinstance(f, dict) else t).get("name", ""))


def _canonical(t: JsonObject) -> str:
    return json.dumps(t, sort_keys=True, ensure_ascii=False, default=str)


def _last_user(messages: list[JsonObject]) -> int | None:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user":
            return i
    return None


# --- finding divergences ------------------------------------------------------------

@dataclass
class _Seen:
    req: Request
    enc: Encoded
    raw: bytes
    hashes: list[int]
    extra: object


def _common_blocks(a: list[int], b: list[int]) -> int:
    # Chained hashes: equal at j implies equal at all i < j, so binary search applies.
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) >> 1
        if a[mid - 1] == b[mid - 1]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _lcp_from(a: bytes, b: bytes, lo: int, hi: int) -> int:
    """Common prefix length in tokens (4 bytes each), knowing tokens < lo are equal and
    nothing beyond hi can be. Binary search with memcmp-speed slice compares."""
    while lo < hi:
        mid = (lo + hi + 1) >> 1
        if a[4 * lo:4 * mid] == b[4 * lo:4 * mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _find_aligned(hay: bytes, needle: bytes, start: int, end: int) -> int:
    at = hay.find(needle, start, end)
    while at >= 0 and at % 4:
        at = hay.find(needle, at + 1, end)
    return at


class _Found(TypedDict):
    """What every Divergence of a request says whatever its class."""
    line: str
    pos: int
    seg_end: int
    potential: int
    cached: int


class DivergenceFinder:
    def __init__(self, block_size: int, window: int = 8):
        self.bs = block_size
        self.recent: deque[_Seen] = deque(maxlen=window)
        self.causes: dict[tuple[str, str, str], Cause] = {}   # (location, class, pattern)
        self.divergences = 0

    def observe(self, req: Request, enc: Encoded, hashes: list[int], cached: int,
                extra: object = None) -> Divergence | None:
        """`hashes` are the request's chained block hashes (with `extra`, its cache_salt /
        LoRA key). Only requests with the same extra key are compared: a different salt
        or adapter separates caches on purpose, it is not a varying segment."""
        raw = array("I", enc.ids).tobytes()
        bs = self.bs
        scored = []
        for age, s in enumerate(reversed(self.recent)):
            if s.extra != extra:
                continue
            c = _common_blocks(hashes, s.hashes)
            lcp = _lcp_from(raw, s.raw, c * bs, min(len(enc.ids), len(s.enc.ids), (c + 1) * bs))
            scored.append((-lcp, age, s))
        scored.sort(key=lambda x: (x[0], x[1]))
        d = None
        # Longest common prefix first, most recent on ties. When the head itself varies,
        # every candidate shares ~0 tokens and the most recent may be unrelated traffic,
        # so a few candidates get a chance to re-synchronise.
        for neg_lcp, _, s in scored[:REFERENCES_TRIED]:
            d = self._diverge(req, enc, raw, s, -neg_lcp, cached)
            if d is not None:
                break
        self.recent.append(_Seen(req, enc, raw, hashes, extra))
        if d is not None:
            self.divergences += 1
            self._add(d)
        return d

    def _diverge(self, req: Request, enc: Encoded, raw: bytes, ref: _Seen, d: int, cached: int) -> Divergence | None:
        n, m, bs = len(enc.ids), len(ref.enc.ids), self.bs
        if d >= n - 1 or d >= m:
            return None
        # Re-synchronise: the first probe of r after d that also appears in ref after d.
        hay_end = 4 * min(m, d + MAX_SEGMENT + PROBE)
        k = None
        for kr in range(d + 1, min(n - PROBE, d + MAX_SEGMENT) + 1, STRIDE):
            at = _find_aligned(ref.raw, raw[4 * kr:4 * (kr + PROBE)], 4 * d, hay_end)
            if at >= 0:
                k = (kr, at // 4)
                break
        if k is None:
            return None
        kr, kref = k
        # walk back to the exact start of the common run (at most STRIDE tokens)
        while kr - 1 > d and kref - 1 > d - 1 and enc.ids[kr - 1] == ref.enc.ids[kref - 1]:
            kr, kref = kr - 1, kref - 1
        run = _lcp_from(raw[4 * kr:], ref.raw[4 * kref:], 0, min(n - kr, m - kref))
        potential = (min(n - 1, kr + run) // bs) * bs
        if potential - cached < bs:
            return None          # not even one block to gain
        return self._classify(req, enc, ref, d, kr, kref, potential, cached)

    def _classify(self, req: Request, enc: Encoded, ref: _Seen, d: int, kr: int, kref: int, potential: int,
                  cached: int) -> Divergence:
        c0 = enc.char_at(d)
        c1 = enc.char_at(kr)
        r0 = ref.enc.char_at(d)
        r1 = ref.enc.char_at(kref)
        base = _Found(line=req.where, pos=d, seg_end=kr, potential=potential, cached=cached)
        span = enc.span_at(c0) if c0 is not None else None
        ref_span = None
        if span is not None:
            ref_span = next((s for s in ref.enc.spans if s.index == span.index and s.role == span.role), None)
        if span is None or ref_span is None:
            loc = "template"
            klass, pattern = OTHER, "<differs outside message content>"
            if req.tools and ref.req.tools and req.tools != ref.req.tools:
                loc = "tools"
                names, ref_names = [_tool_name(t) for t in req.tools], [_tool_name(t) for t in ref.req.tools]
                # reordered only if the same tools really come in another order; the same
                # order with different definitions is a changed list (sorting fixes nothing)
                reordered = names != ref_names and sorted(names) == sorted(ref_names) and \
                    sorted(map(_canonical, req.tools)) == sorted(map(_canonical, ref.req.tools))
                klass = REORDERED if reordered else OTHER
                pattern = "tool list order" if klass == REORDERED else "tool list differs"
                return Divergence(**base, location=loc, role=None, msg_index=None, char_span=None, klass=klass,
                                  pattern=pattern, prefix="", suffix="", value=",".join(names),
                                  ref_value=",".join(ref_names))
            if req.kind == "completion" and enc.text is None:
                loc = "prompt"
                pattern = "<token ids differ>"
            value = _slice(enc.text, c0, c1)
            return Divergence(**base, location=loc, role=None, msg_index=None, char_span=None, klass=klass,
                              pattern=pattern, prefix="", suffix="", value=value, ref_value=_slice(ref.enc.text, r0, r1))
        # a span is found only in a rendered text, at the char where the divergence starts
        assert enc.text is not None and ref.enc.text is not None and c0 is not None
        content = enc.text[span.start:span.end]
        ref_content = ref.enc.text[ref_span.start:ref_span.end]
        a = c0 - span.start
        b = max(a + 1, min(c1 if c1 is not None else span.end, span.end) - span.start)
        # the same lines in another order (numbered rules, a list of documents) come first:
        # the numbers inside them are not what varies
        lines, ref_lines = content.split("\n"), ref_content.split("\n")
        if len(lines) > 1 and lines != ref_lines and sorted(lines) == sorted(ref_lines):
            return Divergence(**base, location=span.label, role=span.role, msg_index=span.index,
                              char_span=(0, len(content)), klass=REORDERED, pattern="lines in a different order",
                              prefix="", suffix="", value="", ref_value="")
        # widen to the classifiable value overlapping [a, b)
        for klass, rx in _COMPILED:
            for mt in rx.finditer(content):
                if mt.start() < b and mt.end() > a:
                    prefix = _clause_prefix(content, mt.start())
                    suffix = content[mt.end():mt.end() + 1] if content[mt.end():mt.end() + 1] in ".])}>,;\"'" else ""
                    ref_mt = rx.search(ref_content, max(0, mt.start() - 8))
                    return Divergence(**base, location=span.label, role=span.role, msg_index=span.index,
                                      char_span=(mt.start(), mt.end()), klass=klass,
                                      pattern=f"{prefix}{PLACEHOLDER[klass]}{suffix}", prefix=prefix, suffix=suffix,
                                      value=mt.group(0), ref_value=ref_mt.group(0) if ref_mt else "")
        prefix = _clause_prefix(content, a)
        value = content[a:b]
        return Divergence(**base, location=span.label, role=span.role, msg_index=span.index, char_span=(a, b),
                          klass=OTHER, pattern=f"{prefix}<varies>", prefix=prefix, suffix="",
                          value=value, ref_value=ref_content[a:a + len(value)])

    def _add(self, d: Divergence) -> None:
        key = (d.location, d.klass, d.pattern)
        c = self.causes.get(key)
        if c is None:
            c = self.causes[key] = Cause(d.location, d.role, d.msg_index, d.klass, d.pattern, d.prefix, d.suffix,
                                         char_span=d.char_span, first_pos=d.pos,
                                         constant_value=d.ref_value or d.value)
        c.requests += 1
        c.tokens_lost += d.lost
        if len(c.lines) < 5:
            c.lines.append(d.line)
        if len(c.samples) < 3 and d.value and d.value not in c.samples:
            c.samples.append(d.value)

    def ranked(self) -> list[Cause]:
        return sorted(self.causes.values(), key=lambda c: (-c.tokens_lost, -c.requests, c.location))


def _clause_prefix(content: str, at: int, limit: int = 40) -> str:
    """The literal text in front of a value, back to the start of its line or sentence
    (``"Current time: "``, ``"[Request ID: "``): the stable label that names the value."""
    start = max(content.rfind("\n", 0, at) + 1, content.rfind(". ", 0, at) + 2 if content.rfind(". ", 0, at) >= 0 else 0)
    start = max(start, at - limit)
    return content[start:at]


def _slice(text: str | None, a: int | None, b: int | None) -> str:
    if text is None or a is None:
        return ""
    return text[a:b if b is not None else len(text)]
