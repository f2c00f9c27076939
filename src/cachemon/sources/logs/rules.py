"""User rules: a regex with named groups, mapped onto cachemon's counters and gauges.

::

    rules:
      - name: gateway                       # for messages only
        regex: 'cache_hit=(?P<hit>\\d+) cache_miss=(?P<miss>\\d+)'
        contains: 'cache_hit='              # literal prefilter (default: derived from the regex);
                                            # given, a line with it that fails the regex is malformed
        counters: {hit_tokens: hit, miss_tokens: miss}     # metric: group  (each match ADDS)
        gauges: {kv_cache_usage_ratio: {group: kv, scale: 0.01}}   # each match SETS
        labels: {cache: local, model_name: {group: model}, engine: "0"}

Counters are exact increments (tokens, events); the three prefix-cache counters are
kept consistent: give two of hit/miss/query and cachemon derives the third
(query = hit + miss). A line whose numbers do not parse, are negative or make
miss < 0 is counted as malformed and changes nothing (all or nothing per line).
"""
from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field
from typing import Any

from cachemon import catalog as C
from cachemon.config import ConfigError, check_keys

COUNTERS = {
    "query_tokens": C.QUERY_TOKENS, "hit_tokens": C.HIT_TOKENS, "miss_tokens": C.MISS_TOKENS,
    "prompt_tokens": C.PROMPT_TOKENS, "generation_tokens": C.GENERATION_TOKENS,
    "prompt_cached_tokens": C.PROMPT_CACHED_TOKENS, "preemptions": C.PREEMPTIONS,
}
GAUGES = {
    "kv_cache_usage_ratio": C.KV_CACHE_USAGE, "requests_running": C.REQUESTS_RUNNING,
    "requests_waiting": C.REQUESTS_WAITING, "reported_hit_ratio": C.REPORTED_HIT_RATIO,
}
_CACHE_TRIO = ("hit_tokens", "miss_tokens", "query_tokens")
LABEL_DEFAULTS = {C.MODEL: "", C.ENGINE: "", C.CACHE: "local", "basis": "logged"}
# Distinct label sets a rule may create from regex groups (cardinality guard).
MAX_LABEL_SETS = 100
MAX_LABEL_CHARS = 64


class Malformed(Exception):
    """The line matched the rule but its values cannot be used."""


@dataclass
class Value:
    group: str
    scale: float = 1.0


@dataclass
class Rule:
    name: str
    regex: re.Pattern
    needles: tuple[bytes, ...]          # a line must contain one of these to be tried
    counters: dict[str, Value] = field(default_factory=dict)
    gauges: dict[str, Value] = field(default_factory=dict)
    labels: dict[str, str | Value] = field(default_factory=dict)
    seen_label_sets: set = field(default_factory=set)
    # `contains` given by the user marks the rule's lines: one that then fails the regex
    # is malformed (counted), not just unmatched
    strict: bool = False

    def label(self, name: str, m: re.Match, model_default: str) -> str:
        v = self.labels.get(name)
        if v is None:
            return model_default if name == C.MODEL else LABEL_DEFAULTS[name]
        if isinstance(v, Value):
            return (m.group(v.group) or "")[:MAX_LABEL_CHARS]
        return v

    def apply(self, text: str, model_default: str) -> list[tuple[str, str, tuple[str, ...], float]] | None:
        """None if the rule does not match; else [(kind, spec_name, labels, value)]. Raises Malformed."""
        m = self.regex.search(text)
        if m is None:
            if self.strict:
                raise Malformed(f"rule {self.name}: line has its literal but does not match")
            return None
        model = self.label(C.MODEL, m, model_default)
        engine = self.label(C.ENGINE, m, model_default)
        cache = self.label(C.CACHE, m, model_default)
        basis = self.label("basis", m, model_default)
        if any(isinstance(v, Value) for v in self.labels.values()):
            key = (model, engine, cache, basis)
            if key not in self.seen_label_sets:
                if len(self.seen_label_sets) >= MAX_LABEL_SETS:
                    raise Malformed(f"rule {self.name}: more than {MAX_LABEL_SETS} label sets")
                self.seen_label_sets.add(key)
        nums = {k: _number(m, v) for k, v in self.counters.items()}
        for k, n in nums.items():
            if n < 0:
                raise Malformed(f"rule {self.name}: negative {k}")
        if any(k in nums for k in _CACHE_TRIO):
            h, mi, q = nums.get("hit_tokens"), nums.get("miss_tokens"), nums.get("query_tokens")
            if q is None and h is not None and mi is not None:
                q = h + mi
            elif mi is None and q is not None and h is not None:
                mi = q - h
            elif h is None and q is not None and mi is not None:
                h = q - mi
            if q is None or h is None or mi is None:     # config checks demand two of the three
                raise Malformed(f"rule {self.name}: needs two of hit_tokens, miss_tokens, query_tokens")
            if mi < 0 or h < 0 or abs(q - (h + mi)) > 1e-9 * max(q, 1.0):
                raise Malformed(f"rule {self.name}: hit + miss != query")
            nums.update(hit_tokens=h, miss_tokens=mi, query_tokens=q)
        out: list[tuple[str, str, tuple[str, ...], float]] = []
        for k, n in nums.items():
            spec = COUNTERS[k]
            labels = (model, engine, cache) if spec.labels[-1] == C.CACHE else (model, engine)
            out.append(("counter", spec.name, labels, n))
        for k, v in self.gauges.items():
            spec = GAUGES[k]
            n = _number(m, v)
            gauge_labels = (model, engine, cache, basis) if spec is C.REPORTED_HIT_RATIO else (model, engine)
            out.append(("gauge", spec.name, gauge_labels, n))
        return out


def _number(m: re.Match, v: Value) -> float:
    raw = m.group(v.group)
    try:
        n = float(raw) * v.scale
    except (TypeError, ValueError):
        raise Malformed(f"group {v.group}: not a number") from None
    if not math.isfinite(n):
        raise Malformed(f"group {v.group}: not finite")
    return n


def derive_needle(pattern: str) -> str:
    """The longest literal run that every match must contain, or '' if none is obvious.

    Only top-level literals count (not inside alternations, optional parts or
    repeats), so the prefilter never rejects a line the regex would match.
    """
    if sys.version_info >= (3, 11):
        from re import _parser as sre_parse
    else:                                      # pragma: no cover - 3.10
        import sre_parse
    try:
        parsed = sre_parse.parse(pattern)
    except Exception:    # noqa: BLE001 - re.compile reports the real error
        return ""
    if parsed.state.flags & re.IGNORECASE:
        return ""
    best, run = "", []
    ops: list[tuple[Any, Any]] = [*parsed.data, (None, None)]
    for op, arg in ops:
        if op is sre_parse.LITERAL:
            run.append(chr(arg))
            continue
        if len(run) > len(best):
            best = "".join(run)
        run = []
    return best


def _value(v: Any, key: str, groups: set[str]) -> Value:
    if isinstance(v, str):
        v = {"group": v}
    if not isinstance(v, dict):
        raise ConfigError(key, "expected a group name or {group: NAME, scale: NUMBER}")
    check_keys(v, ("group", "scale"), key)
    g = v.get("group")
    if g not in groups:
        raise ConfigError(f"{key}.group",
                          f"{g!r} is not a named group of the regex (groups: {', '.join(sorted(groups)) or 'none'})")
    scale = v.get("scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise ConfigError(f"{key}.scale", f"expected a positive number, got {scale!r}")
    return Value(g, float(scale))


def parse_rule(d: Any, key: str) -> Rule:
    if not isinstance(d, dict):
        raise ConfigError(key, "expected a mapping with regex and counters/gauges")
    allowed = {"name", "regex", "contains", "counters", "gauges", "labels"}
    check_keys(d, allowed, key)
    pattern = d.get("regex")
    if not isinstance(pattern, str) or not pattern:
        raise ConfigError(f"{key}.regex", "required: a regular expression with named groups")
    try:
        rx = re.compile(pattern)
    except re.error as e:
        raise ConfigError(f"{key}.regex", f"invalid regular expression: {e}") from None
    groups = set(rx.groupindex)
    name = str(d.get("name") or f"rule{key.rsplit('[', 1)[-1].rstrip(']')}")
    contains = d.get("contains")
    if contains is None:
        needles = (derive_needle(pattern),)
    elif isinstance(contains, str):
        needles = (contains,)
    elif isinstance(contains, list) and contains and all(isinstance(c, str) and c for c in contains):
        needles = tuple(contains)
    else:
        raise ConfigError(f"{key}.contains", "expected a non-empty string or list of strings")
    rule = Rule(name=name, regex=rx, needles=tuple(n.encode("utf-8") for n in needles if n),
                strict=contains is not None)
    for section, table in (("counters", COUNTERS), ("gauges", GAUGES)):
        sub = d.get(section) or {}
        if not isinstance(sub, dict):
            raise ConfigError(f"{key}.{section}", "expected a mapping metric: group")
        for metric, v in sub.items():
            if metric not in table:
                raise ConfigError(f"{key}.{section}.{metric}", f"unknown metric (allowed: {', '.join(table)})")
            getattr(rule, section)[metric] = _value(v, f"{key}.{section}.{metric}", groups)
    if not rule.counters and not rule.gauges:
        raise ConfigError(key, "a rule needs at least one of counters or gauges")
    trio = [k for k in _CACHE_TRIO if k in rule.counters]
    if len(trio) == 1:
        raise ConfigError(f"{key}.counters", "give two of hit_tokens, miss_tokens, query_tokens "
                                             "(the third is derived: query = hit + miss)")
    labels = d.get("labels") or {}
    if not isinstance(labels, dict):
        raise ConfigError(f"{key}.labels", "expected a mapping")
    for lname, lv in labels.items():
        if lname not in LABEL_DEFAULTS:
            raise ConfigError(f"{key}.labels.{lname}", f"unknown label (allowed: {', '.join(LABEL_DEFAULTS)})")
        if isinstance(lv, (str, int)) and not isinstance(lv, bool):
            rule.labels[lname] = str(lv)
        else:
            rule.labels[lname] = _value(lv, f"{key}.labels.{lname}", groups)
    return rule


def parse_rules(raw: Any, key: str) -> list[Rule]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ConfigError(key, "expected a list of rules")
    return [parse_rule(r, f"{key}[{i}]") for i, r in enumerate(raw)]
