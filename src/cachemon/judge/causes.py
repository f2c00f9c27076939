"""The cause vocabulary: every cause attribution can name, in report order, and what each rests on.

Each code maps to a runbook section of the same name; docs/metrics.md and the runbook render
``cause_table()``. Adding a cause: a member here (its place is its report order), its row in
``CAUSE_SOURCES``, and its rule in ``attribution_rules.RULES``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Literal

Certainty = Literal["exact", "measured", "heuristic"]           # how sure a cause is
TokensCertainty = Literal["exact", "measured", "estimated", ""]  # how sure its token count is ("": none)


class CauseCode(str, Enum):
    """A cause's exported name (the ``cause`` label); members in the order causes are reported. A str,
    so it equals, hashes and formats as its name (Python 3.10 has no StrEnum)."""
    PREFIX_CACHING_DISABLED = "prefix_caching_disabled"
    COLD_CACHE = "cold_cache"
    SHORT_PROMPTS = "prompts_shorter_than_block"
    SLIDING_WINDOW = "sliding_window"
    CAPACITY = "capacity_eviction"
    PREEMPTION_INFLATED = "hits_inflated_by_preemption"
    PARALLEL_SAMPLING_INFLATED = "hits_inflated_by_parallel_sampling"
    RESTART = "restart"
    CACHE_RESET = "cache_reset"
    CACHE_RESET_SUSPECTED = "cache_reset_suspected"
    CHANGE = "change"
    MATCH_FLOOR_CHANGED = "match_floor_changed"
    ROUTING_SKEW = "routing_skew"
    DYNAMIC_PREFIX_EXACT = "dynamic_prefix"
    DYNAMIC_PREFIX = "dynamic_prefix_suspected"
    ROUTER_BLIND = "router_blind"
    ROUTER_STALE = "router_stale"
    LOAD_OVER_LOCALITY = "load_over_locality"
    REPLICA_LOAD_SKEW = "replica_load_skew"

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


CAUSES: tuple[CauseCode, ...] = tuple(CauseCode)
INFLATING = frozenset((CauseCode.PREEMPTION_INFLATED, CauseCode.PARALLEL_SAMPLING_INFLATED))   # explain no miss


@dataclass(frozen=True)
class Cause:
    code: CauseCode
    certainty: Certainty
    message: str
    tokens: float | None = None      # missed tokens the cause cost in the step (None: not a token cost)
    tokens_certainty: TokensCertainty = ""
    # an event named from the counters: the event's time (the step's excess misses go to the latest)
    event_at: float | None = field(default=None, compare=False)


@dataclass(frozen=True)
class CauseBasis:
    """What a cause rests on, without and with KV events, and how its token count is obtained."""
    counters: str       # from vLLM's /metrics (and logs): the rule and its certainty
    events: str         # with KV-cache events followed (docs/kv-events.md)
    tokens: str         # what cachemon_cause_missed_tokens_total counts for it


CAUSE_SOURCES: dict[CauseCode, CauseBasis] = {
    CauseCode.PREFIX_CACHING_DISABLED: CauseBasis(
        "exact: `vllm:cache_config_info{enable_prefix_caching}`, V0's -1 gauge", "the same",
        "estimated: every missed token of the interval (vLLM often counts no queries then: 0)"),
    CauseCode.COLD_CACHE: CauseBasis(
        "measured: the vLLM process's first traffic (its query counter left 0 within the short window, or "
        "no hit yet in its first 8 requests); never named after a restart (that is `restart`)",
        "exact: `first` tokens stored during the process's first traffic",
        "estimated: the interval's missed tokens while cold (an upper bound: includes each prompt's "
        "uncacheable last partial block); with events exact `first` tokens"),
    CauseCode.SHORT_PROMPTS: CauseBasis(
        "measured: `vllm:request_prompt_tokens` histogram against the match floor (the shortest prefix that can "
        "hit: `cachemon_prefix_cache_match_floor_tokens`, the block size on plain models, 784-4096 tokens on "
        "hybrid ones) over the short window (bucket bounds make it a lower bound)", "the same",
        "estimated: at most `le` tokens per prompt in a bucket <= the floor, capped at the missed tokens"),
    CauseCode.SLIDING_WINDOW: CauseBasis(
        "-", "exact: `sliding_window` tokens: blocks the full-attention group still held, stored again because the "
        "model's sliding-window group did not hold the window before the hit point (vLLM keeps only each "
        "prompt's last window there); a legitimate miss, not a broken cache",
        "exact: the ledger's `sliding_window` tokens"),
    CauseCode.CAPACITY: CauseBasis(
        "measured: KV usage >= 95 % (leaves below 90 %), preemptions, `--kv-cache-metrics` evictions; "
        "'missed tokens exceed the pool' is a heuristic; only while the ratio is below the warning threshold",
        "exact: `capacity` tokens (content evicted here earlier and stored again)",
        "estimated: missed tokens not attributed to another cause, shared with the other counter-judged "
        "causes; with events exact `capacity` tokens"),
    CauseCode.PREEMPTION_INFLATED: CauseBasis(
        "measured: >= 0.1 preemptions per finished request while the ratio looks fine", "the same",
        "none (it inflates hits, it does not miss tokens)"),
    CauseCode.PARALLEL_SAMPLING_INFLATED: CauseBasis(
        "measured: `vllm:request_params_n` (_sum sequences against _count requests): >= 10 % of the interval's "
        "sequences are extra copies of a prompt (n > 1), each queried again and hitting the first copy "
        "(vllm#56923)", "the same",
        "none (it inflates hits, it does not miss tokens)"),
    CauseCode.RESTART: CauseBasis(
        "exact: a counter went down, or `process_start_time` / `*_created` changed",
        "exact: `restart` tokens (content cached by an earlier vLLM process)",
        "estimated: missed tokens above the miss ratio before the restart (all missed tokens without a "
        "baseline), shared with a change seen with it; with events exact `restart` tokens"),
    CauseCode.CACHE_RESET: CauseBasis(
        "exact: vLLM's log line `Successfully reset prefix cache` (0.32.0: `vllm/v1/core/block_pool.py`), "
        "from a log linked to the upstream with `logs.files[].upstream`",
        "exact: `reset` tokens (content cleared by `AllBlocksCleared`)",
        "estimated: missed tokens above the miss ratio before the reset; with events exact `reset` tokens"),
    CauseCode.CACHE_RESET_SUSPECTED: CauseBasis(
        "heuristic: hits collapsed at steady queries, then recovered; superseded by a logged reset",
        "superseded by the ledger's `reset` tokens",
        "estimated: missed tokens above the miss ratio before the suspected reset"),
    CauseCode.CHANGE: CauseBasis(
        "exact: `/v1/models`, `/version`, `cache_config_info`, tokenizer / chat-template fingerprints changed; "
        "named beside `restart` when it came with one (a template changed across a restart)",
        "the same (the ledger shows the re-rendered prompts as `first`)",
        "estimated: missed tokens above the miss ratio before the change, shared with a restart seen with it"),
    CauseCode.MATCH_FLOOR_CHANGED: CauseBasis(
        "exact: the match floor (`cachemon_prefix_cache_match_floor_tokens`: the page's match unit, else "
        "`vllm:cache_config_info{block_size}`) rose between two polls (a restart with another `--block-size`, an "
        "upgrade that moved the default: vLLM 0.34 on GPUs 16 -> 64); named beside `restart` and the "
        "cache-config `change`, and after them while the loss lasts; a floor that did not move, or fell, never",
        "the same (the ledger cannot see it: the tokens lost are in blocks that are no longer full, which vLLM "
        "never stores; a moved floor also makes every content new, so `restart` is named from the counters)",
        "estimated: missed tokens above the miss ratio before the move, shared with the restart and change it "
        "came with until the cache refilled (the short window's miss ratio stopped falling), then all its own: a "
        "lasting loss, where the restart's is one flush"),
    CauseCode.ROUTING_SKEW: CauseBasis(
        "measured: this replica >= 20 points below the model's other replicas polled by the same cachemon "
        "while they are >= 80 % (across cachemons: the `CachemonReplicaHitRatioSkew` alert)",
        "exact: `routing` tokens (content cached now on another replica of the model)",
        "estimated: query tokens x (fleet ratio - this ratio); with events exact `routing` tokens"),
    CauseCode.DYNAMIC_PREFIX_EXACT: CauseBasis(
        "-", "exact: the ledger's signature (one parent, many distinct children each stored once) at a "
        "depth in blocks",
        "exact: tokens recomputed below the per-request value"),
    CauseCode.DYNAMIC_PREFIX: CauseBasis(
        "heuristic: caching on, most prompts certainly longer than the match floor, not a cold cache, no eviction "
        "and no event, hits <= 5 % over the short window (leaves above 15 %); every other cause ruled out; prints "
        "the exact `cachemon analyze ... --block-size N --redact` line to confirm",
        "superseded by `dynamic_prefix` when the ledger finds the signature",
        "estimated: missed tokens not attributed to another cause"),
    CauseCode.ROUTER_BLIND: CauseBasis(
        "measured: with `routers:`, the router fronting this replica made no prefix decision in the window "
        "(every decision `blind`: vllm-router's `missing_tokens`; every lookup of its KV index a miss; or it "
        "credited 0 tokens) while this replica hit; names the router kind's likely fix (vllm-router on vLLM 0.32: "
        "`--enable-scale-out`)", "the same; the ledger's `routing` tokens say what the blindness cost",
        "none (its cost is the `routing_skew` tokens, or the load on one replica: `replica_load_skew`)"),
    CauseCode.ROUTER_STALE: CauseBasis(
        "measured: a router that exports credited tokens (Dynamo's `kv_selected_cached_prefix_tokens_total`) "
        "credited more prompt tokens on its choices than the replicas it fronts hit in the window: it believed "
        "blocks cached that were gone", "the same",
        "measured: credited tokens minus the fronted replicas' hit tokens in the step (a lower bound)"),
    CauseCode.LOAD_OVER_LOCALITY: CauseBasis(
        "measured: the router's decisions say it chose a colder replica for balance (vllm-router "
        "`prefix_cost`) in the window", "the same, with the ledger's `routing` tokens as what it cost",
        "none (what it cost is the `routing_skew` tokens, named beside it)"),
    CauseCode.REPLICA_LOAD_SKEW: CauseBasis(
        "measured: this replica took >= 95 % of the model's prompt tokens over the window (at least 8 requests, "
        "finished or routed here) while the model's other replicas polled by the same cachemon were up and idle; the router's "
        "policy beside it (`routers:`)",
        "the same", "none (a load finding, not a miss)"),
}
assert tuple(CAUSE_SOURCES) == CAUSES, "one row per cause, in report order"


def cause_table(link: bool = True) -> str:
    """The causes, what each rests on and how sure it is: docs/metrics.md and the runbook render this one table."""
    rows = ["| cause | without KV events | with KV events | tokens counted |", "|---|---|---|---|"]
    for code, b in CAUSE_SOURCES.items():
        name = f"[`{code}`](#cause-{code})" if link else f"`{code}`"
        rows.append(f"| {name} | {b.counters} | {b.events} | {b.tokens} |")
    return "\n".join(rows)
