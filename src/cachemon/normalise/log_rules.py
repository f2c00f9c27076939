"""A log line a user rule matches -> catalog series (the rules half of log normalisation).

The rule itself is data (``sources.logs.rule_spec.Rule``, read from ``logs.rules``); this
module applies it: the regex's groups become counter increments and gauge values on
catalog series, with the three prefix-cache counters kept consistent (give two of
hit/miss/query, the third is derived). A line is all or nothing: numbers that do not parse,
are negative or make miss < 0 raise ``Malformed`` and change nothing.
"""
from __future__ import annotations

import math
import re
from typing import Literal, NamedTuple

from cachemon import catalog as C
from cachemon.sources.logs.rule_spec import CACHE_TRIO, COUNTERS, GAUGES, LABEL_DEFAULTS, Rule, Value

# Distinct label sets a rule may create from regex groups (cardinality guard).
MAX_LABEL_SETS = 100
MAX_LABEL_CHARS = 64


class Malformed(Exception):
    """The line matched the rule but its values cannot be used."""


class RuleUpdate(NamedTuple):
    """One series a matched line feeds: a counter increment or a gauge's new value."""

    kind: Literal["counter", "gauge"]
    metric: str                 # the catalog series' name
    labels: tuple[str, ...]
    value: float


def _label(rule: Rule, name: str, m: re.Match[str], model_default: str) -> str:
    v = rule.labels.get(name)
    if v is None:
        return model_default if name == C.MODEL else LABEL_DEFAULTS[name]
    if isinstance(v, Value):
        return (m.group(v.group) or "")[:MAX_LABEL_CHARS]
    return v


def _admit_label_set(rule: Rule, key: tuple[str, str, str, str]) -> None:
    """Label sets taken from regex groups are counted per rule; past MAX_LABEL_SETS, a new one is malformed."""
    if not any(isinstance(v, Value) for v in rule.labels.values()) or key in rule.seen_label_sets:
        return
    if len(rule.seen_label_sets) >= MAX_LABEL_SETS:
        raise Malformed(f"rule {rule.name}: more than {MAX_LABEL_SETS} label sets")
    rule.seen_label_sets.add(key)


def _cache_trio(rule: Rule, nums: dict[str, float]) -> None:
    """Derive the third of hit/miss/query from the other two, and check they agree."""
    h, mi, q = nums.get("hit_tokens"), nums.get("miss_tokens"), nums.get("query_tokens")
    if q is None and h is not None and mi is not None:
        q = h + mi
    elif mi is None and q is not None and h is not None:
        mi = q - h
    elif h is None and q is not None and mi is not None:
        h = q - mi
    if q is None or h is None or mi is None:     # config checks demand two of the three
        raise Malformed(f"rule {rule.name}: needs two of hit_tokens, miss_tokens, query_tokens")
    if mi < 0 or h < 0 or abs(q - (h + mi)) > 1e-9 * max(q, 1.0):
        raise Malformed(f"rule {rule.name}: hit + miss != query")
    nums.update(hit_tokens=h, miss_tokens=mi, query_tokens=q)


def rule_updates(rule: Rule, text: str, model_default: str) -> list[RuleUpdate] | None:
    """None if the rule does not match ``text``; else the series the line feeds. Raises Malformed."""
    m = rule.regex.search(text)
    if m is None:
        if rule.strict:
            raise Malformed(f"rule {rule.name}: line has its literal but does not match")
        return None
    model = _label(rule, C.MODEL, m, model_default)
    engine = _label(rule, C.ENGINE, m, model_default)
    cache = _label(rule, C.CACHE, m, model_default)
    basis = _label(rule, "basis", m, model_default)
    _admit_label_set(rule, (model, engine, cache, basis))
    nums = {k: _number(m, v) for k, v in rule.counters.items()}
    for k, n in nums.items():
        if n < 0:
            raise Malformed(f"rule {rule.name}: negative {k}")
    if any(k in nums for k in CACHE_TRIO):
        _cache_trio(rule, nums)
    out: list[RuleUpdate] = []
    for k, n in nums.items():
        spec = COUNTERS[k]
        labels = (model, engine, cache) if spec.labels[-1] == C.CACHE else (model, engine)
        out.append(RuleUpdate("counter", spec.name, labels, n))
    for k, v in rule.gauges.items():
        spec = GAUGES[k]
        gauge_labels = (model, engine, cache, basis) if spec is C.REPORTED_HIT_RATIO else (model, engine)
        out.append(RuleUpdate("gauge", spec.name, gauge_labels, _number(m, v)))
    return out


def _number(m: re.Match[str], v: Value) -> float:
    raw = m.group(v.group)
    try:
        n = float(raw) * v.scale
    except (TypeError, ValueError):
        raise Malformed(f"group {v.group}: not a number") from None
    if not math.isfinite(n):
        raise Malformed(f"group {v.group}: not finite")
    return n
