"""Routers as a source: one row per router kind, naming where its page says what it decided.

A prefix-aware router exports counts of its *decisions* (and, for some, the prompt tokens it credited
as cached), never what the engine then hit. Each row maps one router's families onto the same few
readings (``RouterReading``): decisions by what the router believed (hit, miss, blind, load), lookups of
its own KV index, credited tokens, requests per worker and the policy. Rows marked ``real`` were read
from a live router here (tests/fixtures/vllm-0.32.0-cpu-router/); ``constructed`` rows from the
router's source, cited file:line, and never seen live.

Adding a router: a ``RouterKind`` row in ``ROUTER_KINDS``; nothing else changes.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from cachemon.sources.exposition import is_float, parse_labels

Outcome = str        # hit | miss | blind | load | cost
OUTCOMES: tuple[Outcome, ...] = ("hit", "miss", "blind", "load", "cost")

# A router's page is the wire: its worker and policy label values are bounded in number here (their
# length and characters by parse_labels, sources/wire_label.py); what is past a bound is refused and
# counted (RouterReading.refused), never a new series.
MAX_WORKERS = 256
MAX_POLICIES = 16
REFUSED_UNPARSED = "unparsed"           # a line of the row's families that does not parse
REFUSED_INVALID = "invalid_value"       # NaN, an infinity or a negative count
REFUSED_WORKERS = "worker_cap"          # a worker past MAX_WORKERS on one page
REFUSED_POLICIES = "policy_cap"         # a policy past MAX_POLICIES on one page


@dataclass(frozen=True)
class RouterKind:
    kind: str                                   # the config's `kind:`
    product: str
    evidence: str                               # "real" | "constructed"
    cite: str                                   # where the names below were read (file:line, or the capture)
    # prefix decisions: family, its outcome label, and the label values meaning each Outcome
    decisions: str = ""
    outcome_label: str = "outcome"
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    # the router's own KV index: family, label, the values meaning hit / miss
    lookups: str = ""
    lookup_label: str = "result"
    lookup_values: dict[str, str] = field(default_factory=dict)   # label value -> "hit" | "miss"
    credited_tokens: str = ""                   # tokens credited as cached on the chosen worker
    best_tokens: str = ""                       # tokens cached on the best eligible worker
    per_worker: str = ""                        # requests per worker
    requests: str = ""                          # requests in all, where no family splits them per worker
    worker_label: str = "worker"
    policy_family: str = ""                     # a family whose `policy` label names the policy
    blind_fix: str = ""                         # the likely fix when the router is blind


ROUTER_KINDS: tuple[RouterKind, ...] = (
    RouterKind(
        "vllm-router", "vLLM's router (vllm-router 0.1.17, PyPI)", "real",
        "tests/fixtures/vllm-0.32.0-cpu-router/ (pages recorded from vllm-router 0.1.17 before two vLLM 0.32.0 "
        "replicas)",
        decisions="vllm_router_prefix_routing_decisions_total",
        # prefix_cost: kv_aware's choice by cost (new prefill tokens and load; what it credited is in its debug
        # log only); load_imbalance: cache_aware fell back to the shortest queue (the outcome names are the
        # strings of vllm_router_rs.abi3.so 0.1.17; missing_tokens, prefix_hit/miss and prefix_cost seen live)
        outcomes={"prefix_hit": "hit", "prefix_miss": "miss", "missing_tokens": "blind", "load_imbalance": "load",
                  "prefix_cost": "cost"},
        lookups="vllm_router_kv_placement_lookups_total", lookup_values={"hit": "hit", "miss": "miss"},
        per_worker="vllm_router_processed_requests_total", worker_label="worker",
        policy_family="vllm_router_policy_decisions_total",
        blind_fix="start the vLLM workers with --enable-scale-out (vLLM 0.32 answers the router's "
                  "POST /v1/chat/completions/render with 403 without it, so the router gets no prompt tokens)"),
    RouterKind(
        "dynamo", "NVIDIA Dynamo KV router", "constructed",
        "ai-dynamo/dynamo lib/llm/src/kv_router/metrics.rs, RouterRequestMetrics::build (read through the search "
        "index, 2026-12-06): IntCounterVecs kv_best_eligible_cached_prefix_tokens_total (the cache-reuse funnel's "
        "F2) and kv_selected_cached_prefix_tokens_total (F3), labels phase and model, named by router_metric() "
        "and prefixed dynamo_component_ by its MetricsHierarchy (its tests list dynamo_component_router_"
        "requests_started_total, dynamo_component_router_overlap_blocks_lost_*); router_shared_cache_hit_rate "
        "and router_overlap_blocks_lost are histograms, not read",
        credited_tokens="dynamo_component_router_kv_selected_cached_prefix_tokens_total",
        requests="dynamo_component_router_requests_total",
        best_tokens="dynamo_component_router_kv_best_eligible_cached_prefix_tokens_total",
        blind_fix="check the workers publish KV events to the router (with --no-kv-events it guesses by a TTL)"),
    RouterKind(
        "llm-d", "llm-d inference scheduler (endpoint picker, prefix-cache scorer)", "constructed",
        "llm-d/llm-d-inference-scheduler@520af478 pkg/epp/metrics/metrics.go:329-336 "
        "(inference_extension_scheduler_attempts_total{status, target_model_name, pod_name, namespace, port}, "
        "endpoint labels only on success, :805) and :358-367 (inference_extension_prefix_indexer_hit_ratio, a "
        "histogram of the matched share of the prefix per lookup, in bytes: not read as tokens)",
        per_worker="inference_extension_scheduler_attempts_total", worker_label="pod_name",
        blind_fix="check the prefix-cache scorer is in the scheduling profile of the EndpointPickerConfig"),
    RouterKind(
        "production-stack", "vLLM production-stack router", "constructed",
        "vllm-project/production-stack@a6c01db0 src/vllm_router/services/metrics_service/__init__.py:55-57 "
        "(vllm:input_tokens_total{server, model}: prompt tokens per server, so its per-worker figures are "
        "tokens, not requests); routing_logic.py:431 (PrefixAwareRouter) exports no decision counter",
        per_worker="vllm:input_tokens_total", worker_label="server",
        blind_fix="use --routing-logic prefixaware or kvaware"),
    RouterKind(
        "sglang-router", "SGLang model gateway (sgl-router)", "constructed",
        "sgl-project/sglang sgl-router/src/metrics.rs (describe_counter! sgl_router_processed_requests_total "
        "'Total requests processed by each worker', sgl_router_policy_decisions_total{policy, worker}); the "
        "cache_aware policy counts per worker (counter! ... \"worker\" => selected_url) and exports no hit/miss",
        per_worker="sgl_router_processed_requests_total", worker_label="worker",
        policy_family="sgl_router_policy_decisions_total",
        blind_fix="use --policy cache_aware"),
)
KINDS: dict[str, RouterKind] = {k.kind: k for k in ROUTER_KINDS}


@dataclass
class RouterReading:
    """One read of a router's page, cumulative (the router's counters since it started)."""
    decisions: dict[Outcome, float] = field(default_factory=dict)
    lookups: dict[str, float] = field(default_factory=dict)      # hit | miss
    credited_tokens: float | None = None
    best_tokens: float | None = None
    per_worker: dict[str, float] = field(default_factory=dict)   # worker URL (as the router names it) -> requests
    requests: float | None = None                                # all requests (a row without per_worker)
    policy: str = ""
    refused: dict[str, int] = field(default_factory=dict)    # reason (REFUSED_*) -> samples not read

    @property
    def skipped(self) -> int:
        """Sample lines of its families that were not read (counted, not guessed)."""
        return sum(self.refused.values())

    def refuse(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1


def _samples(text: str, names: frozenset[str]) -> Iterable[tuple[str, dict[str, str], float] | None]:
    """(name, labels, value) of the lines of the wanted families; None for a wanted line that does not parse."""
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        brace = line.find("{")
        name = line[:brace] if brace >= 0 else line.split(" ", 1)[0]
        if name not in names:
            continue
        end = line.rfind("}") if brace >= 0 else -1
        if brace >= 0 and end < brace:
            yield None
            continue
        labels_text, rest = (line[brace + 1:end], line[end + 1:]) if brace >= 0 else ("", line[len(name):])
        parts = rest.split()
        if not parts or not is_float(parts[0]):
            yield None
            continue
        try:
            labels = parse_labels(labels_text) if labels_text else {}
        except ValueError:              # ExpositionError: a malformed label set
            yield None
            continue
        yield name, labels, float(parts[0])


def _add(kind: RouterKind, out: RouterReading, name: str, labels: dict[str, str], v: float, worker: str) -> None:
    """One admitted sample into the reading, by the family the row names it."""
    if name == kind.decisions:
        outcome = kind.outcomes.get(labels.get(kind.outcome_label, ""))
        if outcome is not None:
            out.decisions[outcome] = out.decisions.get(outcome, 0.0) + v
    if name == kind.lookups:
        result = kind.lookup_values.get(labels.get(kind.lookup_label, ""))
        if result is not None:
            out.lookups[result] = out.lookups.get(result, 0.0) + v
    if name == kind.credited_tokens:
        out.credited_tokens = (out.credited_tokens or 0.0) + v
    if name == kind.best_tokens:
        out.best_tokens = (out.best_tokens or 0.0) + v
    if name == kind.requests:
        out.requests = (out.requests or 0.0) + v
    if name == kind.per_worker:
        out.per_worker[worker] = out.per_worker.get(worker, 0.0) + v

def read_page(kind: RouterKind, text: str) -> RouterReading:
    """The row's families of one router page; a line of them that does not parse, or is past a bound, is
    counted in ``refused``."""
    names = frozenset(n for n in (kind.decisions, kind.lookups, kind.credited_tokens, kind.best_tokens,
                                  kind.per_worker, kind.policy_family, kind.requests) if n)
    out = RouterReading()
    policies: dict[str, float] = {}
    for s in _samples(text, names):
        if s is None:
            out.refuse(REFUSED_UNPARSED)
            continue
        name, labels, v = s
        if not math.isfinite(v) or v < 0:
            out.refuse(REFUSED_INVALID)
            continue
        policy = labels.get("policy", "") if name in (kind.decisions, kind.policy_family) else ""
        if policy and policy not in policies and len(policies) >= MAX_POLICIES:
            out.refuse(REFUSED_POLICIES)
            continue
        worker = labels.get(kind.worker_label, "") if name == kind.per_worker else ""
        if name == kind.per_worker and worker not in out.per_worker and len(out.per_worker) >= MAX_WORKERS:
            out.refuse(REFUSED_WORKERS)
            continue
        _add(kind, out, name, labels, v, worker)
        if policy and name in (kind.decisions, kind.policy_family):
            policies[policy] = policies.get(policy, 0.0) + v
    out.policy = max(policies, key=lambda p: policies[p]) if policies else ""
    return out
