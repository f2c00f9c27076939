"""Why is the hit ratio low? One attribution engine for the exporter and `cachemon check`.

The engine is a pure function of a ``ModelSnapshot``: what one upstream reported for one
served model over a recent interval, plus the events (restart, cache reset, change) known
to have happened lately. Callers build snapshots at one place each (the exporter's
``AttributionComponent`` from the store, ``check`` from its two reads); the rules live only
here, so the metric and the command can never disagree.

How sure each cause is (``certainty``): ``exact`` when vLLM states it (cache config, a log
line, a counter that went down), ``measured`` when it follows from vLLM's counters and
histograms by a fixed rule, ``heuristic`` when it is a best guess from counters alone.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from cachemon import thresholds as T

# Causes, in the order they are reported. Each maps to a runbook section of the same name.
PREFIX_CACHING_DISABLED = "prefix_caching_disabled"
SHORT_PROMPTS = "prompts_shorter_than_block"
CAPACITY = "capacity_eviction"
PREEMPTION_INFLATED = "hits_inflated_by_preemption"
RESTART = "restart"
CACHE_RESET = "cache_reset"
CACHE_RESET_SUSPECTED = "cache_reset_suspected"
CHANGE = "change"
ROUTING_SKEW = "routing_skew"
DYNAMIC_PREFIX = "dynamic_prefix_suspected"

CAUSES: tuple[str, ...] = (PREFIX_CACHING_DISABLED, SHORT_PROMPTS, CAPACITY, PREEMPTION_INFLATED, RESTART,
                           CACHE_RESET, CACHE_RESET_SUSPECTED, CHANGE, ROUTING_SKEW, DYNAMIC_PREFIX)

# Where each cause comes from and how sure it is (README and runbook read this table).
CAUSE_SOURCES: dict[str, tuple[str, str]] = {
    PREFIX_CACHING_DISABLED: ("metrics", "exact: vllm:cache_config_info{enable_prefix_caching}, V0's -1 gauge"),
    SHORT_PROMPTS: ("metrics", ("measured: vllm:request_prompt_tokens histogram against block_size "
                                "(bucket bounds make it a lower bound)")),
    CAPACITY: ("metrics", ("measured: KV usage, preemptions, --kv-cache-metrics evictions; "
                           "'pool smaller than the traffic' is a heuristic")),
    PREEMPTION_INFLATED: ("metrics", "measured: preemptions per finished request"),
    RESTART: ("metrics", "exact: a counter went down, or process_start_time / *_created changed"),
    CACHE_RESET: ("logs", "exact: vLLM's log line 'Successfully reset prefix cache'"),
    CACHE_RESET_SUSPECTED: ("metrics", "heuristic: hits collapsed at steady queries, then recovered"),
    CHANGE: ("metrics", "exact: /v1/models, /version, cache_config_info, tokenizer fingerprints changed"),
    ROUTING_SKEW: ("metrics", "measured: this replica's ratio against the other replicas of the model"),
    DYNAMIC_PREFIX: ("metrics", "heuristic: every other cause ruled out; confirm with `cachemon analyze`"),
}

# Defaults of the rules that are not alert thresholds (those live in cachemon.thresholds).
MIN_QUERY_TOKENS = 256.0          # below this in the interval there is no traffic to judge
SHORT_PROMPT_FRACTION = 0.5       # this share of prompts at most one block long -> cause
PREEMPTIONS_PER_REQUEST = 0.1     # preempted/finished requests above which hits are inflated
NEAR_ZERO_RATIO = 0.05            # "hits near zero" for the dynamic-prefix rule
POOL_OVERRUN = 1.0                # interval query tokens > this x pool tokens -> working set too big


@dataclass(frozen=True)
class Event:
    kind: str           # restart | cache_reset | cache_reset_suspected | change
    at: float           # unix time
    detail: str = ""    # e.g. the change kind ("model", "version", ...) or the log line


@dataclass(frozen=True)
class Thresholds:
    warning: float = T.HIT_RATIO_WARNING
    critical: float = T.HIT_RATIO_CRITICAL

    def severity(self, ratio: float) -> str | None:
        if ratio < self.critical:
            return "critical"
        if ratio < self.warning:
            return "warning"
        return None


@dataclass(frozen=True)
class ModelSnapshot:
    """What the engine needs about one (upstream, model); None = not known on this era."""
    upstream: str
    model: str
    now: float
    prefix_caching: str = ""                 # "true" | "false" | ""
    block_size: int | None = None
    # cumulative since the upstream (re)started, local cache, in tokens
    since_start_query_tokens: float | None = None
    since_start_hit_tokens: float | None = None
    reported_ratio: float | None = None      # V0: vLLM's own block ratio since start
    # the trailing interval
    interval_seconds: float | None = None
    interval_query_tokens: float | None = None
    interval_hit_tokens: float | None = None
    interval_preemptions: float | None = None
    interval_evictions: float | None = None  # --kv-cache-metrics (sampled) evicted blocks
    # prompt lengths of requests finished in the interval: ((le, cumulative count), ...), +Inf last
    interval_prompt_buckets: tuple[tuple[float, float], ...] = ()
    kv_usage: float | None = None            # now, 0..1
    pool_tokens: float | None = None         # num_gpu_blocks x block_size
    events: tuple[Event, ...] = ()
    # the same model on the other upstreams this cachemon polls (interval tokens, summed)
    fleet_query_tokens: float | None = None
    fleet_hit_tokens: float | None = None
    thresholds: Thresholds = field(default_factory=Thresholds)
    analyze_hint: str = ""                   # the exact `cachemon analyze ...` line for this model


@dataclass(frozen=True)
class Cause:
    code: str
    certainty: str      # exact | measured | heuristic
    message: str


@dataclass(frozen=True)
class Attribution:
    upstream: str
    model: str
    basis: str                  # interval | since_start | reported | none
    traffic: bool               # queries in the interval
    ratio: float | None
    severity: str | None        # warning | critical | None
    causes: tuple[Cause, ...]
    summary: str

    @property
    def codes(self) -> tuple[str, ...]:
        return tuple(c.code for c in self.causes)


def _ratio(h: float | None, q: float | None) -> float | None:
    return h / q if h is not None and q is not None and q > 0 else None


def short_prompt_fraction(buckets: tuple[tuple[float, float], ...], block_size: int) -> float | None:
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


def attribute(s: ModelSnapshot, lookback: float = 900.0) -> Attribution:
    """Judge one snapshot and name every cause that holds. ``lookback`` (seconds): how long an
    event (restart, reset, change) still explains a low ratio (the cache refills after it)."""
    causes: list[Cause] = []
    thr = s.thresholds
    iq, ih = s.interval_query_tokens, s.interval_hit_tokens
    traffic = iq is not None and iq >= MIN_QUERY_TOKENS
    if traffic:
        basis, ratio = "interval", _ratio(ih, iq)
    elif s.since_start_query_tokens:
        basis, ratio = "since_start", _ratio(s.since_start_hit_tokens, s.since_start_query_tokens)
    elif s.reported_ratio is not None:
        basis, ratio = "reported", s.reported_ratio
    else:
        basis, ratio = "none", None
    severity = thr.severity(ratio) if ratio is not None else None
    low = severity is not None
    if low and basis != "interval":
        # Without traffic now, an old shortfall is worth a look, not a page: the same on every era.
        severity = "warning"

    if s.prefix_caching == "false":
        causes.append(Cause(PREFIX_CACHING_DISABLED, "exact",
                            "prefix caching is disabled (enable_prefix_caching=False): start vLLM with "
                            "--enable-prefix-caching"))
        severity = "critical"

    recent = [e for e in s.events if s.now - e.at <= lookback]
    short = short_prompt_fraction(s.interval_prompt_buckets, s.block_size) if s.block_size else None
    if low and short is not None and short >= SHORT_PROMPT_FRACTION:
        causes.append(Cause(SHORT_PROMPTS, "measured",
                            f"{short:.0%} of prompts are at most one block ({s.block_size} tokens) long; only "
                            f"full blocks are cached, so they cannot hit"))

    rate_ok = s.interval_seconds is not None and s.interval_seconds > 0
    preempt = s.interval_preemptions or 0.0
    finished = s.interval_prompt_buckets[-1][1] if s.interval_prompt_buckets else 0.0
    pressure: list[str] = []
    if s.kv_usage is not None and s.kv_usage >= T.KV_CACHE_USAGE_HIGH:
        pressure.append(f"KV cache {s.kv_usage:.0%} full")
    if rate_ok and preempt / s.interval_seconds >= T.PREEMPTIONS_PER_SECOND_HIGH:  # type: ignore[operator]
        pressure.append(f"{preempt:.0f} preemptions in {s.interval_seconds:g}s")
    if s.interval_evictions:
        pressure.append(f"{s.interval_evictions:.0f} sampled block evictions (--kv-cache-metrics)")
    overrun = (traffic and s.pool_tokens and iq is not None and ih is not None
               and iq - ih > POOL_OVERRUN * s.pool_tokens)
    if low and overrun:
        pressure.append(f"{iq - ih:.0f} missed tokens in the interval against a pool of "  # type: ignore[operator]
                        f"{s.pool_tokens:.0f}: the working set does not fit")
    if low and pressure:
        certainty = "measured" if (s.interval_evictions or preempt or
                                   (s.kv_usage or 0) >= T.KV_CACHE_USAGE_HIGH) else "heuristic"
        causes.append(Cause(CAPACITY, certainty, "; ".join(pressure) +
                            ": cached prefixes are evicted before reuse (more KV memory, fewer concurrent requests)"))
    if not low and ratio is not None and finished > 0 and preempt / finished >= PREEMPTIONS_PER_REQUEST:
        causes.append(Cause(PREEMPTION_INFLATED, "measured",
                            f"{preempt:.0f} preemptions for {finished:.0f} finished requests: recomputed prefills "
                            f"of preempted requests count as hits, so this ratio overstates real reuse"))

    if low:
        logged_reset = any(e.kind == "cache_reset" for e in recent)
        for kind, code, certainty, text in (
                ("restart", RESTART, "exact", "the upstream restarted {ago}: the cache starts empty"),
                ("cache_reset", CACHE_RESET, "exact", "the prefix cache was reset {ago} (vLLM logged it)"),
                ("cache_reset_suspected", CACHE_RESET_SUSPECTED, "heuristic",
                 "a prefix-cache reset is suspected {ago} (hits collapsed while queries continued)"),
                ("change", CHANGE, "exact", "{detail} changed {ago}: cached prefixes no longer match")):
            hits = [e for e in recent if e.kind == kind]
            if kind == "cache_reset_suspected" and logged_reset:
                continue      # vLLM's log says exactly what the heuristic guesses
            if hits:
                last = max(hits, key=lambda e: e.at)
                details = ", ".join(sorted({e.detail for e in hits if e.detail})) or kind
                causes.append(Cause(code, certainty, text.format(ago=f"{s.now - last.at:.0f}s ago", detail=details)))

    fleet = _ratio(s.fleet_hit_tokens, s.fleet_query_tokens)
    if (traffic and ratio is not None and fleet is not None and fleet >= thr.warning
            and ratio < fleet - T.SKEW_DROP):
        causes.append(Cause(ROUTING_SKEW, "measured",
                            f"this replica {ratio:.0%} against {fleet:.0%} on the model's other replicas: the "
                            f"router sends this replica traffic whose prefixes live elsewhere"))
        if severity is None:
            severity = "warning"

    if (traffic and ratio is not None and ratio <= NEAR_ZERO_RATIO and s.prefix_caching != "false"
            and not causes and short is not None and short < SHORT_PROMPT_FRACTION):
        hint = s.analyze_hint or "cachemon analyze REQUESTS.jsonl --tokenizer DIR --redact"
        causes.append(Cause(DYNAMIC_PREFIX, "heuristic",
                            f"caching is on, prompts are longer than a block, no eviction and no event, yet hits "
                            f"are near zero: something at the head of the prompt changes per request. "
                            f"Run: {hint}"))

    causes.sort(key=lambda c: CAUSES.index(c.code))
    summary = _summary(s, basis, traffic, ratio, severity, causes)
    return Attribution(s.upstream, s.model, basis, traffic, ratio, severity, tuple(causes), summary)


def _summary(s: ModelSnapshot, basis: str, traffic: bool, ratio: float | None, severity: str | None,
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


class CauseTracker:
    """When each (upstream, model, cause) became active: the exporter's only state besides history."""

    def __init__(self) -> None:
        self.since: dict[tuple[str, str, str], float] = {}

    def update(self, results: list[Attribution], now: float) -> None:
        active = {(a.upstream, a.model, c) for a in results for c in a.codes}
        self.since = {k: self.since.get(k, now) for k in active}
