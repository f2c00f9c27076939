"""The fleet dashboard's "Router vs engine" row (`routers:`): what a prefix-aware router believed beside what
the engines hit, in the same colours as the rest (monitoring/palette.py)."""
from __future__ import annotations

from cachemon import catalog as c
from cachemon.jsontypes import JsonObject
from cachemon.monitoring import palette
from cachemon.monitoring.grafana import (
    panel,
    row,
    series_colours,
    stacked,
    target,
    tokens_per_second,
)
from cachemon.monitoring.queries import (
    CAUSES,
    CM,
    LOCAL,
    rate,
)

ROUTING_STORED = CAUSES + ', reason="routing"'


def router_row() -> list[JsonObject]:
    """The fleet's "Router vs engine" row (`routers:`): what the router believed beside what the engines hit."""
    causes = f'{CAUSES}, {c.CAUSE}=~"router_blind|router_stale|load_over_locality|replica_load_skew|routing_skew"'
    return [
        row("Router vs engine"),
        panel("timeseries", "Router prefix decisions",
              "The router's prefix-routing decisions per second by what it believed "
              "(cachemon_router_prefix_decisions_total): hit, miss, blind (no prompt tokens or no index: it routes "
              "without looking), load (a colder replica chosen for balance). Requests, not tokens. Needs `routers:`.",
              "reqps", [target(f"sum by (router, outcome) ({rate(c.ROUTER_PREFIX_DECISIONS, CM)})",
                               "{{router}}: {{outcome}}")], w=6),
        series_colours(stacked(tokens_per_second(panel(
            "timeseries", "Engine hits and routing misses",
            "What the engines hit (cachemon_prefix_cache_hits_tokens) beside the tokens stored again on a replica "
            "while another replica held them (cachemon_kv_stored_tokens_total{reason=\"routing\"}: what one shared "
            "cache would also have hit). Hits with `blind` decisions: the router is not the reason they hit.",
            "short", [target(f"sum by ({c.UPSTREAM}) ({rate(c.HIT_TOKENS, LOCAL)})", "hit {{upstream}}"),
                      target(f"sum by ({c.UPSTREAM}) ({rate(c.KV_STORED_TOKENS, ROUTING_STORED)})",
                             "routing {{upstream}}")], w=6))),
            {"hit": palette.HIT, "routing": palette.reasons()["routing"]}, "^{} "),
        panel("timeseries", "Requests per upstream by router",
              "Requests each router sent to each upstream it fronts (cachemon_router_requests_total). One upstream "
              "taking all while the others idle is `replica_load_skew`. Needs `routers:`.",
              "reqps", [target(f"sum by (router, {c.UPSTREAM}) ({rate(c.ROUTER_REQUESTS, CM)})",
                               "{{router}} -> {{upstream}}")], w=6),
        stacked(tokens_per_second(panel(
            "timeseries", "Routing misses by router policy",
            "Tokens stored again on a fronted replica while another held them (the ledger's routing reason), by "
            "the policy the router named at the time (cachemon_router_routing_tokens_total): what each policy "
            "cost. Needs KV events on the fronted upstreams.", "short",
            [target(f"sum by (router, policy) ({rate(c.ROUTER_ROUTING_TOKENS, CM)})", "{{router}}: {{policy}}")],
            w=6))),
        series_colours(panel("state-timeline", "Router causes",
              "The router causes active per upstream and model (cachemon_cause_active): router_blind, router_stale, "
              "load_over_locality, replica_load_skew, and routing_skew (the tokens routing cost). Needs `routers:` "
              "(routing_skew: KV events).", "none",
              [target(f"max by ({c.UPSTREAM}, {c.MODEL}, {c.CAUSE}) "
                      f"({c.CAUSE_ACTIVE.sample_name}{{{causes}}})",
                      "{{upstream}} / {{model_name}}: {{cause}}")], w=24, h=6,
              options_extra={"showValue": "never", "mergeValues": True, "rowHeight": 0.8}), palette.causes(), ": {}$"),
    ]
