"""The attribution engine's series (judge/attribute.py): which cause explains a low hit ratio."""
from __future__ import annotations

from cachemon.catalog.spec import MODEL, UPSTREAM, _m

CAUSE = "cause"
CERTAINTY = "certainty"
CAUSE_ACTIVE = _m(
    "cause_active", "gauge", "", (UPSTREAM, MODEL, CAUSE, CERTAINTY),
    "1 while the cause explains missed prompt tokens of the model on the upstream, whatever the ratio "
    "(prefix_caching_disabled, cold_cache, prompts_shorter_than_block, sliding_window, capacity_eviction, "
    "hits_inflated_by_preemption, hits_inflated_by_parallel_sampling, restart, cache_reset, "
    "cache_reset_suspected, change, routing_skew, dynamic_prefix, dynamic_prefix_suspected); certainty: exact, "
    "measured or heuristic. Held down: active "
    "after attribution.hold evaluations (at once when it cost tokens), inactive attribution.hold_down after "
    "it last held. Absent while inactive.",
    "cachemon attribution engine",
)
CAUSE_SINCE = _m(
    "cause_since_timestamp_seconds", "gauge", "seconds", (UPSTREAM, MODEL, CAUSE),
    "Unix time at which the active cause became active (for the Why timeline).",
    "cachemon attribution engine",
)
LOG_CACHE_RESETS = _m(
    "log_prefix_cache_resets", "counter", "", (UPSTREAM, "result"),
    "Prefix-cache resets read from vLLM's log: result=requested ('Resetting prefix cache'), done "
    "('Successfully reset prefix cache'), failed ('Failed to reset prefix cache').",
    "vLLM log lines",
)
