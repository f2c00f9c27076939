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

This module reads the configuration into ``rule_spec.Rule`` data; ``normalise.log_rules``
maps the lines a rule matches onto catalog series.
"""
from __future__ import annotations

import math
import re
import sys
from collections.abc import Mapping
from typing import Any

from cachemon.config import ConfigError, check_keys
from cachemon.sources.logs.rule_spec import CACHE_TRIO, COUNTERS, GAUGES, LABEL_DEFAULTS, Rule, Value

__all__ = ["Rule", "Value", "derive_needle", "parse_rule", "parse_rules"]


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
    except Exception:    # re.compile reports the real error
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


def _value(v: object, key: str, groups: set[str]) -> Value:
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


def parse_rule(d: object, key: str) -> Rule:
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
    rule = Rule(name=name, regex=rx, needles=tuple(n.encode("utf-8") for n in _needles(contains, pattern, key) if n),
                strict=contains is not None)
    _read_values(rule, d, key, groups)
    _read_labels(rule, d.get("labels") or {}, key, groups)
    return rule


def _needles(contains: object, pattern: str, key: str) -> tuple[str, ...]:
    """The plain substrings a line must hold before the regex runs (``contains:``, else derived)."""
    if contains is None:
        return (derive_needle(pattern),)
    if isinstance(contains, str):
        return (contains,)
    if isinstance(contains, list) and contains and all(isinstance(c, str) and c for c in contains):
        return tuple(contains)
    raise ConfigError(f"{key}.contains", "expected a non-empty string or list of strings")


def _read_values(rule: Rule, d: Mapping[object, object], key: str, groups: set[str]) -> None:
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
    trio = [k for k in CACHE_TRIO if k in rule.counters]
    if len(trio) == 1:
        raise ConfigError(f"{key}.counters", "give two of hit_tokens, miss_tokens, query_tokens "
                                             "(the third is derived: query = hit + miss)")


def _read_labels(rule: Rule, labels: object, key: str, groups: set[str]) -> None:
    if not isinstance(labels, dict):
        raise ConfigError(f"{key}.labels", "expected a mapping")
    for lname, lv in labels.items():
        if lname not in LABEL_DEFAULTS:
            raise ConfigError(f"{key}.labels.{lname}", f"unknown label (allowed: {', '.join(LABEL_DEFAULTS)})")
        if isinstance(lv, (str, int)) and not isinstance(lv, bool):
            rule.labels[lname] = str(lv)
        else:
            rule.labels[lname] = _value(lv, f"{key}.labels.{lname}", groups)


def parse_rules(raw: object, key: str) -> list[Rule]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ConfigError(key, "expected a list of rules")
    return [parse_rule(r, f"{key}[{i}]") for i, r in enumerate(raw)]
