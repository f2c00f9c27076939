"""What a user rule says, as data: its regex, prefilter literals and the catalog series its groups feed.

``sources.logs.rules`` builds these from the ``logs.rules`` configuration;
``normalise.log_rules`` maps a line a rule matches onto catalog series. This module imports
neither the configuration nor the normaliser, so both sides can share it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from cachemon import catalog as C

COUNTERS = {
    "query_tokens": C.QUERY_TOKENS, "hit_tokens": C.HIT_TOKENS, "miss_tokens": C.MISS_TOKENS,
    "prompt_tokens": C.PROMPT_TOKENS, "generation_tokens": C.GENERATION_TOKENS,
    "prompt_cached_tokens": C.PROMPT_CACHED_TOKENS, "preemptions": C.PREEMPTIONS,
}
GAUGES = {
    "kv_cache_usage_ratio": C.KV_CACHE_USAGE, "requests_running": C.REQUESTS_RUNNING,
    "requests_waiting": C.REQUESTS_WAITING, "reported_hit_ratio": C.REPORTED_HIT_RATIO,
}
# The three prefix-cache counters: a rule gives two, the third is derived (query = hit + miss).
CACHE_TRIO = ("hit_tokens", "miss_tokens", "query_tokens")
LABEL_DEFAULTS = {C.MODEL: "", C.ENGINE: "", C.CACHE: "local", "basis": "logged"}


@dataclass
class Value:
    """A number (or label) taken from a named group of the rule's regex, times ``scale``."""

    group: str
    scale: float = 1.0


@dataclass
class Rule:
    name: str
    regex: re.Pattern[str]
    needles: tuple[bytes, ...]          # a line must contain one of these to be tried
    counters: dict[str, Value] = field(default_factory=dict)
    gauges: dict[str, Value] = field(default_factory=dict)
    labels: dict[str, str | Value] = field(default_factory=dict)
    # The label sets this rule created from regex groups, over every log it reads (the
    # cardinality guard of normalise.log_rules counts them here).
    seen_label_sets: set[tuple[str, str, str, str]] = field(default_factory=set)
    # `contains` given by the user marks the rule's lines: one that then fails the regex
    # is malformed (counted), not just unmatched
    strict: bool = False
