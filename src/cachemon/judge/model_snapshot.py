"""What attribution judges, and its verdict: one (upstream, model)'s figures over a recent interval and
the events known to have happened lately (built in one place, judge/snapshots.py, for the daemon and
`cachemon check`), and the ``Attribution`` the engine returns for it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

from cachemon import thresholds as T
from cachemon.judge.causes import Cause
from cachemon.state.events import EventKind
from cachemon.state.routers import RouterView

Basis = Literal["interval", "since_start", "reported", "none"]   # what the ratio judged is computed over
Severity = Literal["warning", "critical"]           # an attribution's; None: healthy
Buckets = tuple[tuple[float, float], ...]           # prompt-length histogram: ((le, cumulative count), ...), +Inf last


@dataclass(frozen=True)
class Event:
    """One event of the stages' event log (state/events.py) as the engine reads it."""
    kind: EventKind     # RESTART | CACHE_RESET | CACHE_RESET_SUSPECTED | CHANGE
    at: float           # unix time
    detail: str = ""    # e.g. the change kind ("model", "version", ...) or "vLLM log"

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", EventKind(self.kind))    # a kind's name ("restart") is accepted too


@dataclass(frozen=True)
class FloorMove:
    """The match floor (the shortest prefix that can hit: the block size, or the page's match unit) moved
    between two evaluations of one (upstream, model): a restart with another ``--block-size``, an upgrade
    that changed the default (vLLM 0.34 on GPUs: 16 -> 64), another attention backend."""
    before: int                          # tokens
    after: int
    at: float                            # the evaluation that first saw the new floor
    baseline_miss_ratio: float | None    # the miss ratio before the move (a cold start left out)
    settled: bool = False                # the cache refilled since: the short window's miss ratio stopped falling


@dataclass(frozen=True)
class Thresholds:
    warning: float = T.HIT_RATIO_WARNING
    critical: float = T.HIT_RATIO_CRITICAL

    def severity(self, ratio: float) -> Severity | None:
        if ratio < self.critical:
            return "critical"
        if ratio < self.warning:
            return "warning"
        return None


class DynamicPrefixLike(Protocol):
    """docs/kv-events.md's ``DynamicPrefix`` (state/kv_ledger), read by shape."""
    @property
    def depth_blocks(self) -> int: ...
    @property
    def since(self) -> float: ...
    @property
    def recomputed_tokens(self) -> float: ...


@dataclass(frozen=True)
class ModelSnapshot:
    """What the engine needs about one (upstream, model); None = not known on this era / source."""
    upstream: str
    model: str
    now: float
    prefix_caching: str = ""                 # "true" | "false" | ""
    block_size: int | None = None
    match_floor: int | None = None           # the shortest prefix that can hit (None: the block size)
    floor_move: FloorMove | None = None      # the last move of that floor, while it has not moved back
    # cumulative since the upstream (re)started, local cache, in tokens
    since_start_query_tokens: float | None = None
    since_start_hit_tokens: float | None = None
    since_start_tier_query_tokens: float | None = None   # asked of a KV connector's tiers (> 0: one is set up)
    reported_ratio: float | None = None      # V0: vLLM's own block ratio since start
    # the trailing interval (attribution.window): the ratio and severity are judged on it
    interval_seconds: float | None = None
    interval_query_tokens: float | None = None
    interval_hit_tokens: float | None = None
    interval_preemptions: float | None = None
    interval_evictions: float | None = None  # --kv-cache-metrics (sampled) evicted blocks
    # hits of the KV connector's tiers (CPU offload, disk, peers: external_prefix_cache_hits), in tokens:
    # missed by the device pool, not computed
    interval_tier_hit_tokens: float | None = None
    kv_tier_hit_tokens: float | None = None  # the ledger's part of them: loads it saw in other tiers' events
    # parallel sampling: finished requests, and their sequences (the sum of their n)
    interval_sampling_requests: float | None = None
    interval_sampling_sequences: float | None = None
    # prompt lengths of requests finished in the interval: ((le, cumulative count), ...), +Inf last
    interval_prompt_buckets: Buckets = ()
    kv_usage: float | None = None            # now, 0..1
    pool_tokens: float | None = None         # the KV pool in tokens
    events: tuple[Event, ...] = ()
    # the same model on the other upstreams this cachemon polls (interval tokens, summed)
    fleet_query_tokens: float | None = None
    fleet_hit_tokens: float | None = None
    thresholds: Thresholds = field(default_factory=Thresholds)
    analyze_hint: str = ""                   # the exact `cachemon analyze ...` line for this model
    # the short trailing window (attribution.short_window): dynamic prefix, short prompts, cold cache.
    # None: the interval is used.
    short_seconds: float | None = None
    short_query_tokens: float | None = None
    short_hit_tokens: float | None = None
    short_prompt_buckets: Buckets | None = None
    # the step since the previous evaluation: the tokens each cause cost (the counter's increment).
    # None: the interval is the step (`check`).
    step_query_tokens: float | None = None
    step_hit_tokens: float | None = None
    step_prompt_buckets: Buckets | None = None
    first_traffic_at: float | None = None    # when this vLLM process's query counter left 0 (None: unknown)
    since_start_requests: float | None = None  # finished requests since the process started (histogram count)
    baseline_miss_ratio: float | None = None  # miss ratio before the most recent event (None: unknown)
    # KV-cache events (docs/kv-events.md): the ledger's split of the interval's / step's stored tokens
    kv_stored_tokens: dict[str, float] | None = None
    kv_stored_tokens_lagged: dict[str, float] | None = None   # the same up to the previous evaluation
    step_kv_stored_tokens_lagged: dict[str, float] | None = None   # the previous evaluation's step
    step_kv_stored_tokens: dict[str, float] | None = None
    kv_in_sync: bool | None = None
    dynamic_prefix: DynamicPrefixLike | None = None
    step_dynamic_prefix_tokens: float | None = None   # recomputed below the dynamic prefix in the step
    interval_dynamic_prefix_tokens: float | None = None   # the same over the trailing window (None: unknown)
    active: frozenset[str] = frozenset()     # causes active before this evaluation (hysteresis)
    router: RouterView | None = None         # what the router fronting this upstream decided over the window


@dataclass(frozen=True)
class Attribution:
    upstream: str
    model: str
    basis: Basis
    traffic: bool               # queries in the interval
    ratio: float | None
    severity: Severity | None
    causes: tuple[Cause, ...]
    summary: str

    @property
    def codes(self) -> tuple[str, ...]:
        return tuple(c.code for c in self.causes)
