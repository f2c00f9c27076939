"""Series colours: one fixed Grafana colour per thing a series stands for, the same in every panel.

A reader learns them once: hit green, miss red, each miss reason (state/ledger/reasons.py) and each cause
(judge/causes.py) its own colour, a cause the same hue as the reason it rests on (capacity_eviction
red like capacity, restart orange, cache_reset purple, sliding_window light blue, routing_skew yellow).
Panels apply them as field overrides (``grafana.series_colours``); Grafana resolves the names (its
named-colour palette), and so does scripts/render_dashboards.py.
"""
from __future__ import annotations

from cachemon.judge.causes import CauseCode
from cachemon.state.ledger.reasons import Reason

HIT = "green"
MISS = "red"

REASON_COLOURS: dict[Reason, str] = {
    Reason.FIRST: "blue",
    Reason.CAPACITY: "red",
    Reason.RESET: "purple",
    Reason.RESTART: "orange",
    Reason.ROUTING: "yellow",
    Reason.RECOMPUTE_LAST_BLOCK: "super-light-green",   # not a miss: the quietest colour
    Reason.ISOLATION: "light-orange",
    Reason.SLIDING_WINDOW: "light-blue",
    Reason.CACHE_OPT_OUT: "super-light-blue",            # not a miss either: computed by the request's choice
}

CAUSE_COLOURS: dict[CauseCode, str] = {
    CauseCode.PREFIX_CACHING_DISABLED: "dark-orange",
    CauseCode.COLD_CACHE: "blue",                       # first tokens of a new process
    CauseCode.SHORT_PROMPTS: "dark-blue",
    CauseCode.SLIDING_WINDOW: "light-blue",
    CauseCode.CAPACITY: "red",
    CauseCode.PREEMPTION_INFLATED: "dark-green",
    CauseCode.PARALLEL_SAMPLING_INFLATED: "semi-dark-green",
    CauseCode.RESTART: "orange",
    CauseCode.CACHE_RESET: "purple",
    CauseCode.CACHE_RESET_SUSPECTED: "light-purple",
    CauseCode.CHANGE: "dark-yellow",
    CauseCode.MATCH_FLOOR_CHANGED: "semi-dark-orange",  # an upgrade or restart that raised the floor
    CauseCode.ROUTING_SKEW: "yellow",
    CauseCode.DYNAMIC_PREFIX_EXACT: "dark-red",
    CauseCode.DYNAMIC_PREFIX: "light-red",
    # the router's causes, in routing's yellow family: the router's side of the same loss
    CauseCode.ROUTER_BLIND: "semi-dark-yellow",
    CauseCode.ROUTER_STALE: "light-yellow",
    CauseCode.LOAD_OVER_LOCALITY: "super-light-yellow",
    CauseCode.REPLICA_LOAD_SKEW: "super-light-orange",
}

# The cost counters' scenarios and vLLM's prompt-token sources: served from cache (green) or computed (red).
SCENARIO_COLOURS = {"with_cache": HIT, "without_cache": MISS}
SOURCE_COLOURS = {"local_cache_hit": HIT, "local_compute": MISS, "external_kv_transfer": "blue"}
# The KV-event stream's troubles, by how bad each is for the ledger: a disconnect (ZMQ reconnects, the
# replay socket fills the gap), a protocol error (a new socket), a handler error (a batch lost: a bug).
STREAM_COLOURS = {"disconnects": "orange", "protocol errors": "red", "handler errors": "dark-red"}


def reasons() -> dict[str, str]:
    """Label value of ``reason`` -> colour."""
    return {r.label: c for r, c in REASON_COLOURS.items()}


def causes() -> dict[str, str]:
    """Label value of ``cause`` -> colour."""
    return {str(code): c for code, c in CAUSE_COLOURS.items()}
