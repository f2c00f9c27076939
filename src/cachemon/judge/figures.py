"""The figures every attribution rule reads, computed once per snapshot, and the rules' defaults."""
from __future__ import annotations

from typing import Literal

from cachemon.judge.causes import CauseCode
from cachemon.judge.model_snapshot import Basis, Buckets, ModelSnapshot, Severity

LedgerCertainty = Literal["exact", "measured"]                   # the ledger's: in sync, or a lower bound

# Defaults of the rules that are not alert thresholds (those live in cachemon.thresholds).
# the ledger's reasons for content that had been cached before: where an event-less tier's loads land
DEPARTED = ("capacity", "reset", "restart", "routing")
MIN_QUERY_TOKENS = 256.0          # below this in a window there is no traffic to judge
MIN_REQUESTS = 3.0                # finished requests a window needs for the prompt-length rules
COLD_REQUESTS = 8.0               # a process with no hit yet and at most this many requests is cold
SHORT_PROMPT_FRACTION = 0.5       # this share of prompts at most the match floor long -> cause ...
SHORT_PROMPT_FRACTION_LEAVE = 0.4  # ... and it stays while the share is at least this
LONG_PROMPT_FRACTION = 0.5        # a dynamic prefix needs this share of prompts certainly longer than the floor
PREEMPTIONS_PER_REQUEST = 0.1     # preempted/finished requests above which hits are inflated
PARALLEL_COPIES_SHARE = 0.1       # extra prompt copies (n > 1) per sequence above which hits are inflated
NEAR_ZERO_RATIO = 0.05            # "hits near zero" for the dynamic-prefix rule ...
NEAR_ZERO_RATIO_LEAVE = 0.15      # ... and it stays while the ratio is at most this
POOL_OVERRUN = 1.0                # interval query tokens > this x pool tokens -> working set too big
KV_USAGE_LEAVE = 0.90             # capacity entered at T.KV_CACHE_USAGE_HIGH leaves below this
RATIO_HYSTERESIS = 0.05           # an active ratio-gated cause stays until the ratio is this far above
LOAD_SKEW_SHARE = 0.95            # one replica with this share of its model's prompt tokens: the others idle
EVENT_EXCESS_MARGIN = 0.05        # an event costs tokens while the miss ratio exceeds its baseline by this
# Events this close to the latest one came with it (a template changed across a restart: the change
# detector looks every 30 s): they share the step's excess misses.
JOINED_EVENT_SECONDS = 60.0


def ratio(hits: float | None, queries: float | None) -> float | None:
    return hits / queries if hits is not None and queries is not None and queries > 0 else None


def short_prompt_fraction(buckets: Buckets, floor: int) -> float | None:
    """Share of prompts that are certainly at most ``floor`` tokens long (cannot hit: a request hits at
    most prompt_tokens - 1 tokens, in whole match units). A lower bound, from the largest bucket <= floor."""
    if not buckets:
        return None
    total = buckets[-1][1]
    if total <= 0:
        return None
    short = 0.0
    for le, count in buckets:
        if le <= floor:
            short = count
    return short / total


def long_prompt_fraction(buckets: Buckets, floor: int) -> float | None:
    """Share of prompts that are certainly longer than ``floor``: those above the smallest bucket
    bound >= floor (a prompt in the bucket that holds the floor may be shorter). A lower bound."""
    if not buckets:
        return None
    total = buckets[-1][1]
    if total <= 0:
        return None
    at_most = next((count for le, count in buckets if le >= floor), total)
    return (total - at_most) / total


def short_prompt_tokens(buckets: Buckets, floor: int) -> float:
    """At most how many prompt tokens the prompts of at most ``floor`` tokens carry: each bucket's count x
    its upper bound (cumulative buckets made per-bucket)."""
    total, prev = 0.0, 0.0
    for le, count in buckets:
        if le > floor:
            break
        total += max(0.0, count - prev) * le
        prev = count
    return total


class Figures:
    """What the rules read of one snapshot: the ratio judged and its basis, the short window, the step,
    the ledger, the recent events, the match floor."""

    def __init__(self, s: ModelSnapshot, lookback: float):
        self.snapshot = s
        self.lookback = lookback
        iq, ih = s.interval_query_tokens, s.interval_hit_tokens
        self.traffic = iq is not None and iq >= MIN_QUERY_TOKENS
        self.basis: Basis
        self.ratio: float | None
        if self.traffic:
            self.basis, self.ratio = "interval", ratio(ih, iq)
        elif s.since_start_query_tokens:
            self.basis, self.ratio = "since_start", ratio(s.since_start_hit_tokens, s.since_start_query_tokens)
        elif s.reported_ratio is not None:
            self.basis, self.ratio = "reported", s.reported_ratio
        else:
            self.basis, self.ratio = "none", None
        self.severity: Severity | None = s.thresholds.severity(self.ratio) if self.ratio is not None else None
        self.low = self.severity is not None
        if self.low and self.basis != "interval":
            # Without traffic now, an old shortfall is worth a look, not a page: the same on every era.
            self.severity = "warning"
        self._short_window(s)
        self._step(s)
        # the ledger
        self.ledger_split = s.kv_stored_tokens
        self.step_ledger_split = s.step_kv_stored_tokens if s.step_kv_stored_tokens is not None else s.kv_stored_tokens
        self.ledger = self.ledger_split is not None
        self.ledger_certainty: LedgerCertainty = "exact" if s.kv_in_sync else "measured"
        self.recent = [e for e in s.events if s.now - e.at <= lookback]
        self.restarted = any(e.kind == "restart" for e in self.recent)
        # cold: this process's first traffic is in the short window, or it has not hit once in its first
        # COLD_REQUESTS requests (the first request of every prefix misses; cachemon may first see the
        # process after its first requests). After a restart the empty cache is the restart's.
        young = (s.since_start_requests is not None and s.since_start_requests <= COLD_REQUESTS
                 and s.since_start_hit_tokens is not None and s.since_start_hit_tokens <= 0)
        fresh = s.first_traffic_at is not None and s.now - s.first_traffic_at < (self.short_seconds or 0.0)
        self.cold = (young or fresh) and not self.restarted
        # the shortest prefix that can hit: the match floor where the page says it, else the block
        self.floor = s.match_floor or s.block_size
        self.short_prompt_share = short_prompt_fraction(self.short_buckets, self.floor) if self.floor else None
        self.long_prompt_share = long_prompt_fraction(self.short_buckets, self.floor) if self.floor else None
        self.excess = self._excess_misses()     # the step's misses above the baseline (events' tokens)
        # a raised match floor (judge/model_snapshot.FloorMove): the step's misses above the ratio before it
        move = s.floor_move
        self.floor_raised = move is not None and move.after > move.before
        self.floor_excess = self._above(move.baseline_miss_ratio) if move is not None and self.floor_raised else 0.0

    def _short_window(self, s: ModelSnapshot) -> None:
        """The short window's figures; the interval's where the snapshot has no short window."""
        self.short_query_tokens: float | None
        self.short_hit_tokens: float | None
        self.short_buckets: Buckets
        self.short_seconds: float | None
        if s.short_query_tokens is not None:
            self.short_query_tokens, self.short_hit_tokens = s.short_query_tokens, s.short_hit_tokens
            self.short_buckets, self.short_seconds = s.short_prompt_buckets or (), s.short_seconds
        else:
            self.short_query_tokens, self.short_hit_tokens = s.interval_query_tokens, s.interval_hit_tokens
            self.short_buckets, self.short_seconds = s.interval_prompt_buckets, s.interval_seconds
        self.short_traffic = self.short_query_tokens is not None and self.short_query_tokens >= MIN_QUERY_TOKENS
        self.short_ratio = ratio(self.short_hit_tokens, self.short_query_tokens)

    def _step(self, s: ModelSnapshot) -> None:
        """The step's figures; the interval's where the snapshot has no step (`check`)."""
        queries: float | None
        hits: float | None
        self.step_buckets: Buckets
        if s.step_query_tokens is not None:
            queries, hits, self.step_buckets = s.step_query_tokens, s.step_hit_tokens, s.step_prompt_buckets or ()
        else:
            queries, hits, self.step_buckets = s.interval_query_tokens, s.interval_hit_tokens, s.interval_prompt_buckets
        self.step_query_tokens = max(0.0, queries or 0.0)
        self.step_missed_tokens = max(0.0, (queries or 0.0) - (hits or 0.0)) if hits is not None else 0.0

    def _excess_misses(self) -> float:
        """Missed tokens of the step above the miss ratio before the last event (all of them without one)."""
        return self._above(self.snapshot.baseline_miss_ratio)

    def _above(self, base: float | None) -> float:
        """Missed tokens of the step above the miss ratio ``base`` (all of them without one)."""
        if self.step_query_tokens <= 0:
            return 0.0
        if base is None:
            return self.step_missed_tokens
        if self.step_missed_tokens / self.step_query_tokens <= base + EVENT_EXCESS_MARGIN:
            return 0.0
        return max(0.0, self.step_missed_tokens - self.step_query_tokens * base)

    def low_for(self, code: CauseCode) -> bool:
        """Below the warning threshold; an active cause stays until the ratio is RATIO_HYSTERESIS above it."""
        if self.low:
            return True
        s = self.snapshot
        return (code in s.active and self.basis == "interval" and self.ratio is not None
                and self.ratio < s.thresholds.warning + RATIO_HYSTERESIS)

    def ledger_tokens(self, reason: str) -> tuple[float, float]:
        """(interval, step) tokens of one ledger reason. A KV connector's tier that publishes no events
        (ExampleConnector, ...) loads blocks into the pool, where the ledger sees them stored like computed
        ones under the reason they had left by: vLLM's counter of the tier's hits, less the loads the ledger
        saw in other tiers' events, says how many; they are taken out of the departure reasons pro rata.
        The events run ahead of the page (a request's stores arrive at once, its hits with the next poll), so
        with a KV connector set up (tokens were asked of it) departures are judged up to the previous
        evaluation."""
        split, step_split = self.ledger_split or {}, self.step_ledger_split or {}
        interval, step = split.get(reason, 0.0), step_split.get(reason, 0.0)
        s = self.snapshot
        unseen = max(0.0, (s.interval_tier_hit_tokens or 0.0) - (s.kv_tier_hit_tokens or 0.0))
        if reason in DEPARTED and (s.since_start_tier_query_tokens or 0.0) > 0:
            lagged = s.kv_stored_tokens_lagged if s.kv_stored_tokens_lagged is not None else split
            departed = sum(lagged.get(r, 0.0) for r in DEPARTED)
            keep = max(0.0, 1.0 - unseen / departed) if departed else 1.0
            interval = lagged.get(reason, 0.0) * keep
            step = min((s.step_kv_stored_tokens_lagged or {}).get(reason, 0.0) * keep, interval)
        return interval, step
