"""Why is the hit ratio low, and what did each cause cost? One engine for the exporter and `cachemon check`.

The engine is a pure function of a ``ModelSnapshot``: what one upstream reported for one
served model over a recent interval (and a short trailing window, and the step since the
previous evaluation), the events (restart, cache reset, change) known to have happened lately,
and, where vLLM's KV-cache events are followed, the ledger's split of the stored tokens by reason
(docs/kv-events.md). Snapshots are built at one place (runtime/snapshots.py), from the store, for
both callers: the exporter's ``Attributor`` and `cachemon check` (which polls into a store of its
own); the rules live only here, so the metric and the command can never disagree.

Attribution v2 (issue 16):
- a cause is named whenever it cost tokens, not only while the ratio is below the warning
  threshold (alerts still gate on the thresholds); each named cause carries the tokens it cost in
  the step (``Cause.tokens``): exact from the ledger, an estimate from the counters otherwise;
- a vLLM process's first traffic is ``cold_cache``, never a dynamic prefix;
- dynamic prefix and short prompts are judged on the short trailing window, so they are named
  within a few polls;
- with KV events in sync, capacity, routing, reset, restart and the dynamic prefix come from the
  ledger (certainty ``exact``; ``measured`` when the ledger lost events: its split is then a lower
  bound).

How sure each cause is (``certainty``): ``exact`` when vLLM states it (cache config, a log
line, a counter that went down, a KV event), ``measured`` when it follows from vLLM's counters and
histograms by a fixed rule, ``heuristic`` when it is a best guess from counters alone. How sure its
token count is (``tokens_certainty``): ``exact`` (ledger in sync), ``measured`` (ledger out of sync:
a lower bound) or ``estimated`` (counters; each rule says how in ``TOKEN_ESTIMATES``).

Hysteresis: the snapshot carries the causes active before this evaluation (``active``); inputs
that flap (KV usage, the ratio, the short-prompt share, the near-zero ratio) enter at one level and
leave at a lower one. The hold-down (k consecutive evaluations to enter, a hold-down time to leave)
is ``CauseTracker``'s.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

from cachemon import thresholds as T
from cachemon.runtime.events import EventKind

log = logging.getLogger("cachemon.attribution")

Severity = Literal["warning", "critical"]           # an attribution's; None: healthy
Basis = Literal["interval", "since_start", "reported", "none"]   # what the ratio judged is computed over
Certainty = Literal["exact", "measured", "heuristic"]           # how sure a cause is
TokensCertainty = Literal["exact", "measured", "estimated", ""]  # how sure its token count is ("": none)
LedgerCertainty = Literal["exact", "measured"]                   # the ledger's: in sync, or a lower bound

# Causes, in the order they are reported. Each maps to a runbook section of the same name.
PREFIX_CACHING_DISABLED = "prefix_caching_disabled"
COLD_CACHE = "cold_cache"
SHORT_PROMPTS = "prompts_shorter_than_block"
CAPACITY = "capacity_eviction"
PREEMPTION_INFLATED = "hits_inflated_by_preemption"
RESTART = "restart"
CACHE_RESET = "cache_reset"
CACHE_RESET_SUSPECTED = "cache_reset_suspected"
CHANGE = "change"
ROUTING_SKEW = "routing_skew"
DYNAMIC_PREFIX_EXACT = "dynamic_prefix"
DYNAMIC_PREFIX = "dynamic_prefix_suspected"

CAUSES: tuple[str, ...] = (PREFIX_CACHING_DISABLED, COLD_CACHE, SHORT_PROMPTS, CAPACITY, PREEMPTION_INFLATED,
                           RESTART, CACHE_RESET, CACHE_RESET_SUSPECTED, CHANGE, ROUTING_SKEW, DYNAMIC_PREFIX_EXACT,
                           DYNAMIC_PREFIX)


@dataclass(frozen=True)
class CauseBasis:
    """What a cause rests on, without and with KV events, and how its token count is obtained."""
    counters: str       # from vLLM's /metrics (and logs): the rule and its certainty
    events: str         # with KV-cache events followed (docs/kv-events.md)
    tokens: str         # what cachemon_cause_missed_tokens_total counts for it


# Where each cause comes from and how sure it is (docs/metrics.md and the runbook read this table).
CAUSE_SOURCES: dict[str, CauseBasis] = {
    PREFIX_CACHING_DISABLED: CauseBasis(
        "exact: `vllm:cache_config_info{enable_prefix_caching}`, V0's -1 gauge", "the same",
        "estimated: every missed token of the interval (vLLM often counts no queries then: 0)"),
    COLD_CACHE: CauseBasis(
        "measured: the vLLM process's first traffic (its query counter left 0 within the short window, or "
        "no hit yet in its first 8 requests); never named after a restart (that is `restart`)",
        "exact: `first` tokens stored during the process's first traffic",
        "estimated: the interval's missed tokens while cold (an upper bound: includes each prompt's "
        "uncacheable last partial block); with events exact `first` tokens"),
    SHORT_PROMPTS: CauseBasis(
        "measured: `vllm:request_prompt_tokens` histogram against `block_size` over the short window "
        "(bucket bounds make it a lower bound)", "the same",
        "estimated: at most `le` tokens per prompt in a bucket <= block size, capped at the missed tokens"),
    CAPACITY: CauseBasis(
        "measured: KV usage >= 95 % (leaves below 90 %), preemptions, `--kv-cache-metrics` evictions; "
        "'missed tokens exceed the pool' is a heuristic; only while the ratio is below the warning threshold",
        "exact: `capacity` tokens (content evicted here earlier and stored again)",
        "estimated: missed tokens not attributed to another cause, shared with the other counter-judged "
        "causes; with events exact `capacity` tokens"),
    PREEMPTION_INFLATED: CauseBasis(
        "measured: >= 0.1 preemptions per finished request while the ratio looks fine", "the same",
        "none (it inflates hits, it does not miss tokens)"),
    RESTART: CauseBasis(
        "exact: a counter went down, or `process_start_time` / `*_created` changed",
        "exact: `restart` tokens (content cached by an earlier vLLM process)",
        "estimated: missed tokens above the miss ratio before the restart (all missed tokens without a "
        "baseline); with events exact `restart` tokens"),
    CACHE_RESET: CauseBasis(
        "exact: vLLM's log line `Successfully reset prefix cache` (0.32.0: `vllm/v1/core/block_pool.py`), "
        "from a log linked to the upstream with `logs.files[].upstream`",
        "exact: `reset` tokens (content cleared by `AllBlocksCleared`)",
        "estimated: missed tokens above the miss ratio before the reset; with events exact `reset` tokens"),
    CACHE_RESET_SUSPECTED: CauseBasis(
        "heuristic: hits collapsed at steady queries, then recovered; superseded by a logged reset",
        "superseded by the ledger's `reset` tokens",
        "estimated: missed tokens above the miss ratio before the suspected reset"),
    CHANGE: CauseBasis(
        "exact: `/v1/models`, `/version`, `cache_config_info`, tokenizer / chat-template fingerprints changed",
        "the same (the ledger shows the re-rendered prompts as `first`)",
        "estimated: missed tokens above the miss ratio before the change"),
    ROUTING_SKEW: CauseBasis(
        "measured: this replica >= 20 points below the model's other replicas polled by the same cachemon "
        "while they are >= 80 % (across cachemons: the `CachemonReplicaHitRatioSkew` alert)",
        "exact: `routing` tokens (content cached now on another replica of the model)",
        "estimated: query tokens x (fleet ratio - this ratio); with events exact `routing` tokens"),
    DYNAMIC_PREFIX_EXACT: CauseBasis(
        "-", "exact: the ledger's signature (one parent, many distinct children each stored once) at a "
        "depth in blocks",
        "exact: tokens recomputed below the per-request value"),
    DYNAMIC_PREFIX: CauseBasis(
        "heuristic: caching on, prompts longer than a block, not a cold cache, no eviction and no event, "
        "hits <= 5 % over the short window (leaves above 15 %); every other cause ruled out; prints the "
        "exact `cachemon analyze ... --block-size N --redact` line to confirm",
        "superseded by `dynamic_prefix` when the ledger finds the signature",
        "estimated: missed tokens not attributed to another cause"),
}



def cause_table(link: bool = True) -> str:
    """The causes, what each rests on and how sure it is: docs/metrics.md and the runbook render this one table."""
    rows = ["| cause | without KV events | with KV events | tokens counted |", "|---|---|---|---|"]
    for code, b in CAUSE_SOURCES.items():
        name = f"[`{code}`](#cause-{code})" if link else f"`{code}`"
        rows.append(f"| {name} | {b.counters} | {b.events} | {b.tokens} |")
    return "\n".join(rows)

# Defaults of the rules that are not alert thresholds (those live in cachemon.thresholds).
MIN_QUERY_TOKENS = 256.0          # below this in a window there is no traffic to judge
MIN_REQUESTS = 3.0                # finished requests a window needs for the prompt-length rules
COLD_REQUESTS = 8.0               # a process with no hit yet and at most this many requests is cold
SHORT_PROMPT_FRACTION = 0.5       # this share of prompts at most one block long -> cause ...
SHORT_PROMPT_FRACTION_LEAVE = 0.4  # ... and it stays while the share is at least this
PREEMPTIONS_PER_REQUEST = 0.1     # preempted/finished requests above which hits are inflated
NEAR_ZERO_RATIO = 0.05            # "hits near zero" for the dynamic-prefix rule ...
NEAR_ZERO_RATIO_LEAVE = 0.15      # ... and it stays while the ratio is at most this
POOL_OVERRUN = 1.0                # interval query tokens > this x pool tokens -> working set too big
KV_USAGE_LEAVE = 0.90             # capacity entered at T.KV_CACHE_USAGE_HIGH leaves below this
RATIO_HYSTERESIS = 0.05           # an active ratio-gated cause stays until the ratio is this far above
EVENT_EXCESS_MARGIN = 0.05        # an event costs tokens while the miss ratio exceeds its baseline by this
LEDGER_REASONS = {"capacity": CAPACITY, "routing": ROUTING_SKEW, "reset": CACHE_RESET, "restart": RESTART}


@dataclass(frozen=True)
class Event:
    """One event of the stages' event log (runtime/events.py) as the engine reads it."""
    kind: EventKind     # RESTART | CACHE_RESET | CACHE_RESET_SUSPECTED | CHANGE
    at: float           # unix time
    detail: str = ""    # e.g. the change kind ("model", "version", ...) or "vLLM log"

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", EventKind(self.kind))    # a kind's name ("restart") is accepted too


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


Buckets = tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class ModelSnapshot:
    """What the engine needs about one (upstream, model); None = not known on this era / source."""
    upstream: str
    model: str
    now: float
    prefix_caching: str = ""                 # "true" | "false" | ""
    block_size: int | None = None
    # cumulative since the upstream (re)started, local cache, in tokens
    since_start_query_tokens: float | None = None
    since_start_hit_tokens: float | None = None
    reported_ratio: float | None = None      # V0: vLLM's own block ratio since start
    # the trailing interval (attribution.window): the ratio and severity are judged on it
    interval_seconds: float | None = None
    interval_query_tokens: float | None = None
    interval_hit_tokens: float | None = None
    interval_preemptions: float | None = None
    interval_evictions: float | None = None  # --kv-cache-metrics (sampled) evicted blocks
    # prompt lengths of requests finished in the interval: ((le, cumulative count), ...), +Inf last
    interval_prompt_buckets: Buckets = ()
    kv_usage: float | None = None            # now, 0..1
    pool_tokens: float | None = None         # num_gpu_blocks x block_size
    events: tuple[Event, ...] = ()
    # the same model on the other upstreams this cachemon polls (interval tokens, summed)
    fleet_query_tokens: float | None = None
    fleet_hit_tokens: float | None = None
    thresholds: Thresholds = field(default_factory=Thresholds)
    analyze_hint: str = ""                   # the exact `cachemon analyze ...` line for this model
    # --- v2 -------------------------------------------------------------------------------------
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
    step_kv_stored_tokens: dict[str, float] | None = None
    kv_in_sync: bool | None = None
    dynamic_prefix: DynamicPrefixLike | None = None
    step_dynamic_prefix_tokens: float | None = None   # recomputed below the dynamic prefix in the step
    interval_dynamic_prefix_tokens: float | None = None   # the same over the trailing window (None: unknown)
    active: frozenset[str] = frozenset()     # causes active before this evaluation (hysteresis)


@dataclass(frozen=True)
class Cause:
    code: str
    certainty: Certainty
    message: str
    tokens: float | None = None      # missed tokens the cause cost in the step (None: not a token cost)
    tokens_certainty: TokensCertainty = ""


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


def _ratio(h: float | None, q: float | None) -> float | None:
    return h / q if h is not None and q is not None and q > 0 else None


def short_prompt_fraction(buckets: Buckets, block_size: int) -> float | None:
    """Share of prompts that are certainly at most one block long (cannot hit: a request hits at
    most prompt_tokens - 1 tokens, in full blocks). A lower bound, from the largest bucket <= block_size."""
    if not buckets:
        return None
    total = buckets[-1][1]
    if total <= 0:
        return None
    short = 0.0
    for le, count in buckets:
        if le <= block_size:
            short = count
    return short / total


def short_prompt_tokens(buckets: Buckets, block_size: int) -> float:
    """At most how many prompt tokens the prompts of at most one block carry: each bucket's count x
    its upper bound (cumulative buckets made per-bucket)."""
    total, prev = 0.0, 0.0
    for le, count in buckets:
        if le > block_size:
            break
        total += max(0.0, count - prev) * le
        prev = count
    return total


class _Ctx:
    """The figures every rule reads, computed once per snapshot."""

    def __init__(self, s: ModelSnapshot, lookback: float):
        self.s = s
        self.lookback = lookback
        thr = s.thresholds
        iq, ih = s.interval_query_tokens, s.interval_hit_tokens
        self.traffic = iq is not None and iq >= MIN_QUERY_TOKENS
        self.basis: Basis
        if self.traffic:
            self.basis, self.ratio = "interval", _ratio(ih, iq)
        elif s.since_start_query_tokens:
            self.basis, self.ratio = "since_start", _ratio(s.since_start_hit_tokens, s.since_start_query_tokens)
        elif s.reported_ratio is not None:
            self.basis, self.ratio = "reported", s.reported_ratio
        else:
            self.basis, self.ratio = "none", None
        self.severity = thr.severity(self.ratio) if self.ratio is not None else None
        self.low = self.severity is not None
        if self.low and self.basis != "interval":
            # Without traffic now, an old shortfall is worth a look, not a page: the same on every era.
            self.severity = "warning"
        # the short window (falls back to the interval)
        self.sq: float | None
        self.sh: float | None
        if s.short_query_tokens is not None:
            self.sq, self.sh = s.short_query_tokens, s.short_hit_tokens
            self.s_buckets: Buckets = s.short_prompt_buckets or ()
            self.s_seconds = s.short_seconds
        else:
            self.sq, self.sh, self.s_buckets, self.s_seconds = iq, ih, s.interval_prompt_buckets, s.interval_seconds
        self.s_traffic = self.sq is not None and self.sq >= MIN_QUERY_TOKENS
        self.s_ratio = _ratio(self.sh, self.sq)
        # the step (falls back to the interval)
        tq: float | None
        th: float | None
        if s.step_query_tokens is not None:
            tq, th = s.step_query_tokens, s.step_hit_tokens
            self.t_buckets: Buckets = s.step_prompt_buckets or ()
        else:
            tq, th, self.t_buckets = iq, ih, s.interval_prompt_buckets
        self.tq = max(0.0, tq or 0.0)
        self.t_misses = max(0.0, (tq or 0.0) - (th or 0.0)) if th is not None else 0.0
        # the ledger
        self.split = s.kv_stored_tokens
        self.t_split = s.step_kv_stored_tokens if s.step_kv_stored_tokens is not None else s.kv_stored_tokens
        self.ledger = self.split is not None
        self.ledger_cert: LedgerCertainty = "exact" if s.kv_in_sync else "measured"
        self.recent = [e for e in s.events if s.now - e.at <= lookback]
        self.restarted = any(e.kind == "restart" for e in self.recent)
        # cold: this process's first traffic is in the short window, or it has not hit once in its first
        # COLD_REQUESTS requests (the first request of every prefix misses; cachemon may first see the
        # process after its first requests). After a restart the empty cache is the restart's.
        young = (s.since_start_requests is not None and s.since_start_requests <= COLD_REQUESTS
                 and s.since_start_hit_tokens is not None and s.since_start_hit_tokens <= 0)
        fresh = s.first_traffic_at is not None and s.now - s.first_traffic_at < (self.s_seconds or 0.0)
        self.cold = (young or fresh) and not self.restarted
        self.short = short_prompt_fraction(self.s_buckets, s.block_size) if s.block_size else None
        self.excess = _excess_misses(self)      # the step's misses above the baseline (events' tokens)
        self.event_at: dict[str, float] = {}    # event causes named from the counters -> their event's time

    def low_for(self, code: str) -> bool:
        """Below the warning threshold; an active cause stays until the ratio is RATIO_HYSTERESIS above it."""
        if self.low:
            return True
        return (code in self.s.active and self.basis == "interval" and self.ratio is not None
                and self.ratio < self.s.thresholds.warning + RATIO_HYSTERESIS)

    def ledger_tokens(self, reason: str) -> tuple[float, float]:
        """(interval, step) tokens of one ledger reason."""
        return (self.split or {}).get(reason, 0.0), (self.t_split or {}).get(reason, 0.0)


Rule = Callable[[_Ctx, list[Cause]], None]


def _caching_disabled(c: _Ctx, out: list[Cause]) -> None:
    if c.s.prefix_caching == "false":
        out.append(Cause(PREFIX_CACHING_DISABLED, "exact",
                         "prefix caching is disabled (enable_prefix_caching=False): start vLLM with "
                         "--enable-prefix-caching", c.t_misses or None, "estimated"))


def _cold_cache(c: _Ctx, out: list[Cause]) -> None:
    if not c.cold or c.s.prefix_caching == "false":      # with caching off nothing is ever cached
        return
    if c.ledger:
        first = (c.t_split or {}).get("first", 0.0) - (c.s.step_dynamic_prefix_tokens or 0.0)
        if (c.split or {}).get("first", 0.0) > 0:
            out.append(Cause(COLD_CACHE, c.ledger_cert,
                             "the vLLM process's first traffic: nothing was cached yet (the KV events show "
                             "never-seen content stored)", max(0.0, first), c.ledger_cert))
        return
    if c.sq and c.sq > 0 and c.sh is not None and c.sq - c.sh > 0:
        out.append(Cause(COLD_CACHE, "measured",
                         "the vLLM process's first traffic: nothing was cached yet, so the first request of "
                         "every prefix misses", c.t_misses, "estimated"))


def _short_prompts(c: _Ctx, out: list[Cause]) -> None:
    s, short = c.s, c.short
    if short is None or not s.block_size or not c.s_buckets or c.s_buckets[-1][1] < MIN_REQUESTS:
        return
    enter = SHORT_PROMPT_FRACTION_LEAVE if SHORT_PROMPTS in s.active else SHORT_PROMPT_FRACTION
    if short < enter or not c.sq or c.sh is None or c.sq - c.sh <= 0:
        return
    tokens = min(c.t_misses, short_prompt_tokens(c.t_buckets, s.block_size))
    out.append(Cause(SHORT_PROMPTS, "measured",
                     f"{short:.0%} of prompts are at most one block ({s.block_size} tokens) long; only "
                     f"full blocks are cached, so they cannot hit", tokens, "estimated"))


def _capacity(c: _Ctx, out: list[Cause]) -> None:
    s = c.s
    if c.ledger:
        interval, step = c.ledger_tokens("capacity")
        if interval > 0:
            total = sum(v for k, v in (c.split or {}).items() if k != "recompute_last_block") or interval
            out.append(Cause(CAPACITY, c.ledger_cert,
                             f"{interval:.0f} tokens ({interval / total:.0%} of the stored tokens) in the last "
                             f"{s.interval_seconds or 0:g}s were cached here before and evicted (KV events"
                             f"{'' if s.kv_in_sync else '; events lost: a lower bound'}): give vLLM more KV memory "
                             f"or offload", step, c.ledger_cert))
        if s.kv_in_sync:
            return
    low = c.low_for(CAPACITY)
    iq, ih = s.interval_query_tokens, s.interval_hit_tokens
    rate_ok = s.interval_seconds is not None and s.interval_seconds > 0
    preempt = s.interval_preemptions or 0.0
    pressure: list[str] = []
    kv_high = T.KV_CACHE_USAGE_HIGH if CAPACITY not in s.active else KV_USAGE_LEAVE
    if s.kv_usage is not None and s.kv_usage >= kv_high:
        pressure.append(f"KV cache {s.kv_usage:.0%} full")
    if rate_ok and preempt / s.interval_seconds >= T.PREEMPTIONS_PER_SECOND_HIGH:  # type: ignore[operator]
        pressure.append(f"{preempt:.0f} preemptions in {s.interval_seconds:g}s")
    if s.interval_evictions:
        pressure.append(f"{s.interval_evictions:.0f} sampled block evictions (--kv-cache-metrics)")
    overrun = (c.traffic and s.pool_tokens and iq is not None and ih is not None
               and iq - ih > POOL_OVERRUN * s.pool_tokens)
    if low and overrun:
        pressure.append(f"{iq - ih:.0f} missed tokens in the interval against a pool of "  # type: ignore[operator]
                        f"{s.pool_tokens:.0f}: the working set does not fit")
    if low and pressure and not any(x.code == CAPACITY for x in out):
        certainty: Certainty = "measured" if (s.interval_evictions or preempt or
                                   (s.kv_usage or 0) >= kv_high) else "heuristic"
        out.append(Cause(CAPACITY, certainty, "; ".join(pressure) +
                         ": cached prefixes are evicted before reuse (more KV memory, fewer concurrent requests)",
                         None, "estimated"))


def _preemption_inflated(c: _Ctx, out: list[Cause]) -> None:
    s = c.s
    preempt = s.interval_preemptions or 0.0
    finished = s.interval_prompt_buckets[-1][1] if s.interval_prompt_buckets else 0.0
    if not c.low and c.ratio is not None and finished > 0 and preempt / finished >= PREEMPTIONS_PER_REQUEST:
        out.append(Cause(PREEMPTION_INFLATED, "measured",
                         f"{preempt:.0f} preemptions for {finished:.0f} finished requests: recomputed prefills "
                         f"of preempted requests count as hits, so this ratio overstates real reuse"))


def _excess_misses(c: _Ctx) -> float:
    """Missed tokens of the step above the miss ratio before the last event (all of them without one)."""
    base = c.s.baseline_miss_ratio
    if c.tq <= 0:
        return 0.0
    if base is None:
        return c.t_misses
    if c.t_misses / c.tq <= base + EVENT_EXCESS_MARGIN:
        return 0.0
    return max(0.0, c.t_misses - c.tq * base)


def _ledger_event(c: _Ctx, out: list[Cause], reason: str, code: str, what: str) -> bool:
    """With the ledger, a restart or a reset is its `restart` / `reset` tokens (exact in sync). True when
    the ledger names the cause, or is in sync (then the counters' event rule stays silent)."""
    if not c.ledger:
        return False
    interval, step = c.ledger_tokens(reason)
    if interval > 0:
        out.append(Cause(code, c.ledger_cert, f"{interval:.0f} tokens in the last {c.s.interval_seconds or 0:g}s "
                         f"were {what} and recomputed (KV events)", step, c.ledger_cert))
        return True
    return bool(c.s.kv_in_sync)


def _event(c: _Ctx, out: list[Cause], kind: str, code: str, certainty: Certainty, text: str) -> None:
    """An event of ``kind`` within the lookback names ``code`` while it costs tokens (or the ratio is
    low). Its token count is set once every event is named (``_share_event_excess``): the step's excess
    misses go to the most recent event."""
    hits = [e for e in c.recent if e.kind == kind]
    if not hits or (c.excess <= 0 and not c.low_for(code)):
        return
    last = max(hits, key=lambda e: e.at)
    details = ", ".join(sorted({e.detail for e in hits if e.detail})) or kind
    c.event_at[code] = last.at
    out.append(Cause(code, certainty, text.format(ago=f"{c.s.now - last.at:.0f}s ago", detail=details),
                     0.0, "estimated"))


def _restart(c: _Ctx, out: list[Cause]) -> None:
    if not _ledger_event(c, out, "restart", RESTART, "cached by an earlier vLLM process"):
        _event(c, out, "restart", RESTART, "exact", "the upstream restarted {ago}: the cache starts empty")


def _cache_reset(c: _Ctx, out: list[Cause]) -> None:
    if not _ledger_event(c, out, "reset", CACHE_RESET, "cleared by a prefix-cache reset"):
        _event(c, out, "cache_reset", CACHE_RESET, "exact", "the prefix cache was reset {ago} (vLLM logged it)")


def _cache_reset_suspected(c: _Ctx, out: list[Cause]) -> None:
    if c.ledger and c.s.kv_in_sync:
        return        # the ledger's `reset` tokens say it exactly
    if any(e.kind == "cache_reset" for e in c.recent) or any(x.code == CACHE_RESET for x in out):
        return        # vLLM's log (or the ledger) says exactly what the heuristic guesses
    _event(c, out, "cache_reset_suspected", CACHE_RESET_SUSPECTED, "heuristic",
           "a prefix-cache reset is suspected {ago} (hits collapsed while queries continued)")


def _change(c: _Ctx, out: list[Cause]) -> None:
    _event(c, out, "change", CHANGE, "exact", "{detail} changed {ago}: cached prefixes no longer match")


def _share_event_excess(c: _Ctx, causes: list[Cause]) -> list[Cause]:
    """The step's excess misses go to the most recent event named from the counters: one event, one count."""
    if not c.event_at:
        return causes
    latest = max(c.event_at.values())
    mine = next(i for i, x in enumerate(causes) if c.event_at.get(x.code) == latest)
    return [replace(x, tokens=c.excess) if i == mine else x for i, x in enumerate(causes)]


def _routing(c: _Ctx, out: list[Cause]) -> None:
    s, thr = c.s, c.s.thresholds
    if c.ledger:
        interval, step = c.ledger_tokens("routing")
        if interval > 0:
            out.append(Cause(ROUTING_SKEW, c.ledger_cert,
                             f"{interval:.0f} tokens in the last {s.interval_seconds or 0:g}s were cached on "
                             f"another replica of the model at that moment (KV events): route by prefix",
                             step, c.ledger_cert))
        if s.kv_in_sync:
            return
    fleet = _ratio(s.fleet_hit_tokens, s.fleet_query_tokens)
    drop = T.SKEW_DROP * (0.75 if ROUTING_SKEW in s.active else 1.0)
    if (c.traffic and c.ratio is not None and fleet is not None and fleet >= thr.warning
            and c.ratio < fleet - drop and not any(x.code == ROUTING_SKEW for x in out)):
        out.append(Cause(ROUTING_SKEW, "measured",
                         f"this replica {c.ratio:.0%} against {fleet:.0%} on the model's other replicas: the "
                         f"router sends this replica traffic whose prefixes live elsewhere",
                         min(c.t_misses, c.tq * (fleet - c.ratio)), "estimated"))


def _dynamic_prefix_exact(c: _Ctx, out: list[Cause]) -> None:
    s, d = c.s, c.s.dynamic_prefix
    if d is None:
        return
    if s.interval_dynamic_prefix_tokens is not None and s.interval_dynamic_prefix_tokens <= 0:
        return         # found earlier (the ledger holds a finding 5 min), but it cost nothing in the window:
        #                as for the ledger's other reasons, no cost, no cause (the user may have moved the value)
    out.append(Cause(DYNAMIC_PREFIX_EXACT, c.ledger_cert,
                     f"a per-request value at block depth {d.depth_blocks} (token {d.depth_blocks * (s.block_size or 0)}"
                     f" on): one cached parent with many distinct children each stored once, the shared content "
                     f"after it recomputed under each (KV events, since {s.now - d.since:.0f}s). Move the "
                     f"per-request value after the shared part", s.step_dynamic_prefix_tokens or 0.0,
                     c.ledger_cert))


def _dynamic_prefix_suspected(c: _Ctx, out: list[Cause]) -> None:
    s = c.s
    if s.dynamic_prefix is not None or (c.ledger and s.kv_in_sync):
        return         # the ledger named it exactly, or sees every stored chain: no signature, no dynamic prefix
    limit = NEAR_ZERO_RATIO_LEAVE if DYNAMIC_PREFIX in s.active else NEAR_ZERO_RATIO
    explaining = [x for x in out if x.code != PREEMPTION_INFLATED]
    if (c.s_traffic and c.s_ratio is not None and c.s_ratio <= limit and s.prefix_caching != "false"
            and not c.cold and not explaining and c.short is not None and c.short < SHORT_PROMPT_FRACTION):
        hint = s.analyze_hint or "cachemon analyze REQUESTS.jsonl --tokenizer DIR --redact"
        out.append(Cause(DYNAMIC_PREFIX, "heuristic",
                         f"caching is on, prompts are longer than a block, not a cold cache, no eviction and no "
                         f"event, yet hits are near zero: something at the head of the prompt changes per "
                         f"request. Run: {hint}", None, "estimated"))


# One rule per cause, in the order the causes are reported; each reads the causes named before it.
RULES: dict[str, Rule] = {
    PREFIX_CACHING_DISABLED: _caching_disabled,
    COLD_CACHE: _cold_cache,
    SHORT_PROMPTS: _short_prompts,
    CAPACITY: _capacity,
    PREEMPTION_INFLATED: _preemption_inflated,
    RESTART: _restart,
    CACHE_RESET: _cache_reset,
    CACHE_RESET_SUSPECTED: _cache_reset_suspected,
    CHANGE: _change,
    ROUTING_SKEW: _routing,
    DYNAMIC_PREFIX_EXACT: _dynamic_prefix_exact,
    DYNAMIC_PREFIX: _dynamic_prefix_suspected,
}
assert tuple(RULES) == CAUSES, "one rule per cause, in CAUSES order"
RESIDUAL = {CAPACITY, DYNAMIC_PREFIX}     # counter-judged causes that share the misses nobody else explains


def _share_residual(c: _Ctx, causes: list[Cause]) -> list[Cause]:
    """Estimated tokens of the counter-judged causes without an estimate of their own: the step's
    missed tokens not attributed to another cause, shared evenly between them."""
    open_ = [i for i, x in enumerate(causes) if x.code in RESIDUAL and x.tokens is None]
    if not open_:
        return causes
    taken = sum(x.tokens or 0.0 for x in causes if x.tokens is not None)
    share = max(0.0, c.t_misses - taken) / len(open_)
    return [Cause(x.code, x.certainty, x.message, share, x.tokens_certainty) if i in open_ else x
            for i, x in enumerate(causes)]


def attribute(s: ModelSnapshot, lookback: float = 900.0) -> Attribution:
    """Judge one snapshot and name every cause that holds. ``lookback`` (seconds): how long an
    event (restart, reset, change) still explains missed tokens (the cache refills after it)."""
    c = _Ctx(s, lookback)
    causes: list[Cause] = []
    for rule in RULES.values():
        rule(c, causes)
    causes = _share_residual(c, _share_event_excess(c, causes))
    severity = _severity(c, causes)
    causes.sort(key=lambda x: CAUSES.index(x.code))
    summary = _summary(s, c.basis, c.ratio, severity, causes)
    return Attribution(s.upstream, s.model, c.basis, c.traffic, c.ratio, severity, tuple(causes), summary)


def _severity(c: _Ctx, causes: list[Cause]) -> Severity | None:
    """The ratio's severity; disabled caching is critical whatever the ratio, and a measured routing skew
    a warning at least."""
    if any(x.code == PREFIX_CACHING_DISABLED for x in causes):
        return "critical"
    if c.severity is None and any(x.code == ROUTING_SKEW and x.certainty == "measured" and not c.ledger
                                  for x in causes):
        return "warning"
    return c.severity


def _summary(s: ModelSnapshot, basis: Basis, ratio: float | None, severity: Severity | None,
             causes: list[Cause]) -> str:
    where = f"model {s.model or '?'}"
    if ratio is None:
        head = f"{where}: no prefix-cache traffic yet"
    elif basis == "interval":
        head = f"{where}: hit ratio {ratio:.1%} over the last {s.interval_seconds or 0:g}s"
    elif basis == "since_start":
        head = (f"{where}: no traffic in the interval; hit ratio since the upstream started {ratio:.1%}")
    else:
        head = f"{where}: no token counters on this era; vLLM reports a hit ratio of {ratio:.1%} since start"
    if severity:
        head += (f", below the {s.thresholds.warning:.0%} warning / {s.thresholds.critical:.0%} critical "
                 f"thresholds" if ratio is not None and s.thresholds.severity(ratio) else "")
    if causes:
        head += ". Causes: " + "; ".join(f"{c.code} ({c.certainty}): {c.message}" for c in causes)
    elif severity:
        head += ". No cause identified from the metrics"
    return head


Key = tuple[str, str, str]      # (upstream, model, cause)
TOKEN_FLOOR = MIN_QUERY_TOKENS  # a cause that cost at least this many tokens in one step is active at once


@dataclass
class _Track:
    streak: int = 0             # consecutive evaluations it held
    last_held: float = 0.0
    certainty: str = ""
    active: bool = False


class CauseTracker:
    """Which causes are active, with hold-down: a cause becomes active when the engine names it for
    ``hold`` consecutive evaluations, or at once when it cost at least ``floor`` tokens in the step;
    it becomes inactive only when it has not been named for ``hold_down`` seconds. One log line per
    change. ``since`` (key -> when it became active) and ``certainty`` are what the stage exports."""

    def __init__(self, hold: int = 2, hold_down: float = 30.0, floor: float = TOKEN_FLOOR):
        self.hold, self.hold_down, self.floor = hold, hold_down, floor
        self.since: dict[Key, float] = {}
        self.certainty: dict[Key, str] = {}
        self.tracks: dict[Key, _Track] = {}

    def active_for(self, upstream: str, model: str) -> frozenset[str]:
        return frozenset(k[2] for k in self.since if k[0] == upstream and k[1] == model)

    def update(self, results: list[Attribution], now: float) -> list[tuple[Key, bool]]:
        """Apply one evaluation; returns the changes (key, became_active)."""
        held: dict[Key, Cause] = {(a.upstream, a.model, c.code): c for a in results for c in a.causes}
        changes: list[tuple[Key, bool]] = []
        for key, cause in held.items():
            t = self.tracks.setdefault(key, _Track())
            t.streak += 1
            t.last_held = now
            t.certainty = cause.certainty
            if not t.active and (t.streak >= self.hold or (cause.tokens or 0.0) >= self.floor):
                t.active = True
                self.since[key] = now
                changes.append((key, True))
                log.warning("upstream %s model %s: cause %s active (%s): %s", *key, cause.certainty, cause.message)
            if t.active:
                self.certainty[key] = cause.certainty
        for key in list(self.tracks):
            if key in held:
                continue
            t = self.tracks[key]
            t.streak = 0
            if t.active and now - t.last_held >= self.hold_down:
                t.active = False
                self.since.pop(key, None)
                self.certainty.pop(key, None)
                changes.append((key, False))
                log.info("upstream %s model %s: cause %s no longer active (not seen for %.0fs)", *key,
                         now - t.last_held)
            if not t.active:
                del self.tracks[key]
        return changes
