"""Per-model totals of one poll (summed over engines) and the figures cut from two of them.

The snapshot builder (judge/snapshots.py) keeps one ``ModelTotals`` per evaluation and model, and
cuts deltas and prompt-length buckets from them; warm-up and the demo read the same totals."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from cachemon import catalog as C

Key = tuple[str, tuple[str, ...]]
# Series whose first label (after `upstream`) is model_name; the others name no model (a log's reset counter).
PER_MODEL = frozenset(spec.name for spec in C.ALL if spec.labels[1:2] == (C.MODEL,))


@dataclass(frozen=True)
class ModelTotals:
    """What one poll said about one model, cumulative and summed over its engines (``model_totals``).
    A field is None where the upstream has no such series (a V0 page has no preemption counter, a
    log no evictions): a delta of it is then None too, not 0."""
    query: float | None = None          # local prefix-cache query tokens
    hit: float | None = None            # local prefix-cache hit tokens
    preemptions: float | None = None
    evicted: float | None = None        # KV blocks evicted
    tier_hit: float | None = None       # hit tokens of the KV connector's tiers (cache="external")
    tier_query: float | None = None     # tokens asked of them (> 0: the engine has a KV connector)
    sampling_requests: float | None = None    # finished requests, whatever their n
    sampling_sequences: float | None = None   # the sum of their n
    prompt_buckets: Mapping[float, float] = field(default_factory=dict)   # prompt-length bucket le -> requests

    def requests(self) -> float | None:
        """Finished requests counted by the prompt-length histogram (its +Inf bucket); None without it."""
        return self.prompt_buckets.get(float("inf"))


TotalName = Literal["query", "hit", "preemptions", "evicted", "sampling_requests", "sampling_sequences", "tier_hit"]
_FIELDS: dict[str, TotalName] = {C.QUERY_TOKENS.name: "query", C.HIT_TOKENS.name: "hit",
                                 C.PREEMPTIONS.name: "preemptions", C.KV_EVICTED_BLOCKS.name: "evicted",
                                 C.SAMPLING_REQUESTS.name: "sampling_requests",
                                 C.SAMPLING_SEQUENCES.name: "sampling_sequences"}
_LOCAL_ONLY = frozenset((C.QUERY_TOKENS.name, C.HIT_TOKENS.name))
_TIER = {C.HIT_TOKENS.name: "tier_hit", C.QUERY_TOKENS.name: "tier_query"}


def _le(label: str) -> float | None:
    try:
        return float(label)
    except ValueError:
        return None


def model_totals(counters: Iterable[tuple[Key, float]]) -> dict[str, ModelTotals]:
    """Per model, the cumulative values the engine reads (summed over engines): local query / hit
    tokens, preemptions, evictions, and the prompt-length buckets by ``le``. A model with any
    per-model counter is present, with empty totals where it has none of these."""
    sums: dict[str, dict[str, float]] = {}
    buckets: dict[str, dict[float, float]] = {}
    for (metric, labels), value in counters:
        if metric not in PER_MODEL:
            continue
        model = labels[0]
        t = sums.setdefault(model, {})
        name = _FIELDS.get(metric)
        if name is not None and (metric not in _LOCAL_ONLY or labels[2] == "local"):
            t[name] = t.get(name, 0.0) + value
        elif metric in _TIER and labels[2] == "external":
            t[_TIER[metric]] = t.get(_TIER[metric], 0.0) + value
        elif metric == C.PROMPT_LENGTH_REQUESTS.name and (le := _le(labels[2])) is not None:
            b = buckets.setdefault(model, {})
            b[le] = b.get(le, 0.0) + value
    return {model: ModelTotals(query=t.get("query"), hit=t.get("hit"), preemptions=t.get("preemptions"),
                               evicted=t.get("evicted"), tier_hit=t.get("tier_hit"),
                               tier_query=t.get("tier_query"), sampling_requests=t.get("sampling_requests"),
                               sampling_sequences=t.get("sampling_sequences"), prompt_buckets=buckets.get(model, {}))
            for model, t in sums.items()}


def delta(new: ModelTotals, old: ModelTotals | None, name: TotalName) -> float | None:
    """new - old of one total; None without a base or where the page has no such series."""
    now: float | None = getattr(new, name)
    if old is None or now is None:
        return None
    before: float | None = getattr(old, name)
    return now - (before or 0.0)


def prompt_buckets(new: ModelTotals, old: ModelTotals | None) -> tuple[tuple[float, float], ...]:
    """Prompt-length buckets (le, count) of the interval (since start without a base), +Inf last."""
    base = old.prompt_buckets if old is not None else {}
    return tuple(sorted((le, v - base.get(le, 0.0)) for le, v in new.prompt_buckets.items()))
