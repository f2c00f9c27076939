"""Routers in front of the replicas (``routers:``): what each router decided, read from its own page
(normalise/routers.py) and exported under cachemon's names. Labelled by ``router`` (the configured
name), never added to the engine's series."""
from __future__ import annotations

from cachemon.catalog.spec import _m

ROUTER = "router"
ROUTER_KIND = "kind"
ROUTER_UPSTREAM = "upstream"

ROUTER_UP = _m(
    "router_up", "gauge", "", (ROUTER,),
    "1 when the router's /metrics page was read at the last poll, 0 when it failed.",
    "the router's /metrics page",
)
ROUTER_INFO = _m(
    "router_info", "gauge", "", (ROUTER, ROUTER_KIND, "policy", "evidence"),
    "The router: its configured kind (a row of cachemon's router table), the policy its page names and "
    "whether that row was recorded from a real router (real) or built from its source (constructed). Always 1.",
    "the routers: config section and the router's /metrics page",
)
ROUTER_PREFIX_DECISIONS = _m(
    "router_prefix_decisions", "counter", "", (ROUTER, "outcome"),
    "The router's prefix-routing decisions (requests), by what it believed: hit (it found the prompt's "
    "prefix cached on a worker), miss (on none), blind (it could not look: no prompt tokens), load (it chose "
    "the least loaded worker over the cached one for balance), cost (a choice by a cost of new prefill "
    "tokens and load, as vllm-router kv_aware makes). Counts of decisions, never tokens.",
    "the router's page (vllm-router: vllm_router_prefix_routing_decisions_total{outcome})",
)
ROUTER_INDEX_LOOKUPS = _m(
    "router_index_lookups", "counter", "", (ROUTER, "result"),
    "Lookups of the router's own KV index (hit, miss), where the router keeps one (vllm-router kv_aware: "
    "vllm_router_kv_placement_lookups_total{result}).",
    "the router's page",
)
ROUTER_CREDITED_TOKENS = _m(
    "router_credited_prefix_tokens", "counter", "tokens", (ROUTER,),
    "Prompt tokens the router believed cached on the worker it chose, where it exports tokens (Dynamo: "
    "kv_selected_cached_prefix_tokens_total). Compare with the engines' hits: credited tokens the engine "
    "did not hit are the router's stale view.",
    "the router's page",
)
ROUTER_REQUESTS = _m(
    "router_requests", "counter", "", (ROUTER, ROUTER_UPSTREAM),
    "Requests the router sent to each upstream it fronts (the upstream's configured name; its worker URL "
    "where it fronts one not configured as an upstream).",
    "the router's page (vllm-router: vllm_router_processed_requests_total{worker})",
)
ROUTER_ROUTING_TOKENS = _m(
    "router_routing_tokens", "counter", "tokens", (ROUTER, "policy"),
    "Tokens the upstreams this router fronts stored again while another of them held them (the KV ledger's "
    "`routing` reason, exact with KV events), split by the policy the router's page named when they were "
    "stored: what routing cost under each policy. Needs KV events on the fronted upstreams.",
    "cachemon KV-event ledger beside the router's page",
)
ROUTER_REFUSED_SAMPLES = _m(
    "router_refused_samples", "counter", "", (ROUTER, "reason"),
    "Samples of the router's page that were not read, by reason: unparsed (a line of the router's families "
    "that does not parse), invalid_value (NaN, an infinity or a negative count), worker_cap (a worker past "
    "the 256 read per page), policy_cap (a policy past the 16 read per page). A router's page is the wire: "
    "its label values are bounded, and what is past a bound is counted here, never a new series.",
    "the router's page",
)
