"""The one snapshot builder: the store -> the attribution engine's ``ModelSnapshot`` values.

Both judges of cachemon ask the engine (judge/attribute.py) through this module: the daemon's
``Attributor`` on every evaluation, and `cachemon check` after its two polls through the daemon's own
``Store``, ``UpstreamPoller`` and ``LogSource``. So a page (or a log) reaches the engine by one route,
and the exporter and the command can never disagree on what a snapshot holds.

``SnapshotBuilder`` keeps one point per evaluation and (upstream, model) (the counters' and the
KV-event ledger's cumulative values), from which it cuts the trailing window, the short window and
the step. What it reads of the store goes through ``read_store`` alone (one copy under the lock, then
no lock); what other stages saw (restarts, logged and suspected resets, changes) through the event
log alone (state/events.py); and the KV-event ledger through the ``ledger_view`` callable it is
given (docs/kv-events.md).
"""
from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol, TypedDict

from cachemon import catalog as C
from cachemon.judge.attribute import (
    COLD_REQUESTS,
    MIN_QUERY_TOKENS,
    DynamicPrefixLike,
    Event,
    ModelSnapshot,
    Thresholds,
)
from cachemon.judge.floor_moves import FloorTracker
from cachemon.judge.model_totals import Key, ModelTotals, delta, model_totals, prompt_buckets
from cachemon.normalise.server_profile import ServerProfile, combine, merge
from cachemon.state.events import EventKind, StageEvent
from cachemon.state.routers import RouterView
from cachemon.state.views import SourceKind, StoreReader

log = logging.getLogger("cachemon.attribution")

MAX_POINTS = 4096      # per (upstream, model): bounds memory whatever the poll interval


# --- the store, read once per evaluation ----------------------------------------------------------

@dataclass(frozen=True)
class UpstreamCopy:
    """What the builder (and `check`'s report) reads of one upstream's state: a copy, valid without the lock."""
    name: str
    kind: SourceKind
    up: bool
    counters: dict[Key, float]                  # reset-corrected, cumulative
    gauges: dict[Key, float]
    models: tuple[str, ...]                     # the read view's models(): with counters, or a reported ratio only
    restarts: int
    process_start_time: float | None
    last_error: tuple[str, str] | None          # (reason, message) of the last failed read
    # (model_name, engine) -> what it said of its cache (the page's cache_config_info, a log's start-up lines)
    profiles: dict[tuple[str, ...], ServerProfile] = field(default_factory=dict)


def read_store(store: StoreReader) -> dict[str, UpstreamCopy]:
    """The builder's one access to the store (and `check`'s), through ``Store.read()``: one
    consistent copy of every upstream, valid after the lock is released."""
    with store.read() as state:
        return {name: UpstreamCopy(
            name=name, kind=st.info.kind, up=st.up,
            counters={(k[0], k[1]): c.value for k, c in st.counters.items()},
            gauges={(k[0], k[1]): v for k, v in st.gauges.items()}, models=tuple(st.models()),
            restarts=st.restarts, process_start_time=st.process_start_time,
            last_error=st.last_error, profiles=dict(st.profiles)) for name, st in state.upstreams.items()}


def engines_profile(profiles: Mapping[tuple[str, ...], ServerProfile],
                    models: tuple[str, ...] | None = None) -> ServerProfile | None:
    """One profile of an upstream's engines (of ``models``; None: all of them), None when none said anything."""
    return combine(p for ident, p in profiles.items() if models is None or ident[0] in models)


def analyze_hint(model: str, block_size: int | None, tokenizer: str = "") -> str:
    """The exact `cachemon analyze` line for a model; REQUESTS.jsonl is a sample of its request bodies."""
    # the server's block size where it said one; else analyze reads the release's default (never a silent 16)
    size = f"--block-size {block_size}" if block_size else "--vllm-version VERSION --platform gpu|cpu|npu"
    return (f"cachemon analyze REQUESTS.jsonl --tokenizer {tokenizer or 'TOKENIZER_DIR'} "
            f"{size} --redact   # REQUESTS.jsonl: recent request bodies of model {model}")


def _gauge(up: UpstreamCopy, spec: C.MetricSpec, model: str,
           how: Callable[[list[float]], float] = max) -> float | None:
    vals = [v for (m, labels), v in up.gauges.items() if m == spec.name and labels[0] == model]
    return how(vals) if vals else None


def _reported(up: UpstreamCopy, model: str) -> float | None:
    """vLLM's own hit ratio of the local cache (V0 pages, logs); the lowest where several are reported."""
    vals = [v for (m, labels), v in up.gauges.items()
            if m == C.REPORTED_HIT_RATIO.name and labels[0] == model and labels[2] == "local"]
    return min(vals) if vals else None


def models_of(up: UpstreamCopy) -> dict[str, ModelTotals]:
    """Every model the upstream reports, with its totals: those with counters, and those with only
    vLLM's own hit ratio (V0 pages without counters, a log's stats lines)."""
    per_model = model_totals(up.counters.items())
    for m in up.models:
        per_model.setdefault(m, ModelTotals())
    return per_model


# --- the KV-event ledger, read by shape -------------------------------------------------------------

class LedgerViewLike(Protocol):
    """docs/kv-events.md's ``LedgerView`` (state/ledger/fleet.FleetLedger.view), read by shape: runtime
    takes the callable injected at wiring, so the builder never imports the ledger."""
    @property
    def model(self) -> str: ...
    @property
    def in_sync(self) -> bool: ...
    @property
    def stored_tokens(self) -> dict[str, float]: ...
    @property
    def cached_blocks(self) -> int: ...
    @property
    def dynamic_prefix(self) -> DynamicPrefixLike | None: ...
    @property
    def tier_hit_tokens(self) -> float: ...


LedgerViewFn = Callable[[str], "LedgerViewLike | None"]
KvProfileFn = Callable[[str], "ServerProfile | None"]     # upstream -> what its KV events said (kv_stage.StreamFeed)
RouterViewFn = Callable[[str, float], "RouterView | None"]   # (upstream, now) -> the router fronting it


class EventSource(Protocol):
    """What the builder reads of the event log (state/events.EventLog)."""
    @property
    def last_seq(self) -> int: ...
    def latest(self, upstream: str, kinds: Iterable[EventKind]) -> list[StageEvent]: ...


# The kinds a metrics upstream's snapshot carries, newest of each (kind, detail), besides its newest
# restart and its logs' resets. The KV stream's own events reach the engine through the ledger's view.
NAMED_EVENTS = (EventKind.CACHE_RESET, EventKind.CHANGE, EventKind.CACHE_RESET_SUSPECTED)
ActiveFn = Callable[[str, str], frozenset[str]]


def match_ledger(view: LedgerViewLike | None, models: list[str]) -> tuple[str, LedgerViewLike] | None:
    """The model (of an upstream's ``models``, as its metrics name them) a ledger view belongs to: its own
    model when the metrics know it, else the only model."""
    if view is None:
        return None
    if view.model in models:
        return view.model, view
    return (models[0], view) if len(models) == 1 else None


def _router(router_view: RouterViewFn, upstream: str, now: float) -> RouterView | None:
    """The router's view of one upstream; a failing router book is logged, and judged without."""
    try:
        return router_view(upstream, now)
    except Exception:      # another stage's state: its failure must not end attribution
        log.exception("attribution: router view of %s failed", upstream)
        return None


# --- history ------------------------------------------------------------------------------------------

@dataclass
class _Point:
    """One evaluation's cumulative values of one (upstream, model)."""
    t: float
    totals: ModelTotals
    ledger: dict[str, float] | None = None    # the ledger's stored_tokens (cumulative), None without events
    dyn: float | None = None                  # recomputed tokens below the dynamic prefix (cumulative)
    tier: float | None = None                 # the ledger's loads from other tiers (cumulative)
    cold: bool = False                        # the engine named cold_cache at this point


def _split(new: dict[str, float] | None, old: dict[str, float] | None) -> dict[str, float] | None:
    """The ledger's tokens between two points (None without a ledger now). An older point without one
    is zeros: the ledger has a replica's view only from its first batch on, and vLLM publishes nothing
    before its first request, so without this a fresh server's whole first window (its cold cache, and a
    replica whose first traffic is routed there) was judged by the counters (seen live on vLLM 0.32.0:
    scripts/e2e/kv_attribution.py)."""
    if new is None:
        return None
    old = old or {}
    return {k: max(0.0, v - old.get(k, 0.0)) for k, v in new.items()}


def _steady_miss_ratio(hist: Iterable[_Point]) -> float | None:
    """The miss ratio over a history, from its last cold point on (a cold start's misses are no steady state)."""
    pts = list(hist)
    cold = [i for i, p in enumerate(pts) if p.cold]
    pts = pts[cold[-1]:] if cold else pts
    return _miss_ratio(pts[0], pts[-1]) if len(pts) >= 2 else None


def _miss_ratio(a: _Point, b: _Point) -> float | None:
    q = (b.totals.query or 0.0) - (a.totals.query or 0.0)
    h = (b.totals.hit or 0.0) - (a.totals.hit or 0.0)
    return max(0.0, q - h) / q if q >= MIN_QUERY_TOKENS else None


def _interval_tokens(hist: deque[_Point], tot: ModelTotals) -> tuple[float, float] | None:
    """(query, hit) tokens of one (upstream, model) over its trailing window; None without one."""
    if len(hist) < 2:
        return None
    old = hist[0].totals
    return ((tot.query or 0.0) - (old.query or 0.0), (tot.hit or 0.0) - (old.hit or 0.0))


class SnapshotSettings(Protocol):
    """What the builder reads of ``attribution_stage.AttributionSettings`` (by shape: no import cycle)."""
    window: float
    lookback: float
    short_window: float
    tokenizers: dict[str, str]
    log_links: dict[str, str]

    def thresholds_for(self, model: str) -> Thresholds: ...


@dataclass
class _Row:
    """One (upstream, model) of one evaluation: the view, its totals, its history and its ledger view."""
    up: UpstreamCopy
    model: str
    tot: ModelTotals
    hist: deque[_Point]
    view: LedgerViewLike | None

    @property
    def key(self) -> tuple[str, str]:
        return self.up.name, self.model


def _no_active(_upstream: str, _model: str) -> frozenset[str]:
    return frozenset()


class SnapshotBuilder:
    """History per (upstream, model), and the snapshots cut from it at each ``build``.

    ``kinds``: the kinds of upstream judged (the daemon: metrics; `check`: metrics and log). ``events``:
    the event log every other stage publishes on (None: no events, e.g. a test of the counters alone)."""

    def __init__(self, settings: SnapshotSettings, kinds: tuple[SourceKind, ...] = ("metrics",),
                 events: EventSource | None = None):
        self.settings = settings
        self.kinds = kinds
        self.events = events
        self.ledger_failed: set[str] = set()
        self.history: dict[tuple[str, str], deque[_Point]] = {}
        self.first_traffic: dict[tuple[str, str], float] = {}
        self.baselines: dict[tuple[str, str], tuple[float, float | None]] = {}   # (event time, miss ratio)
        self.floors = FloorTracker()      # the match floor's moves (judge/floor_moves.py)
        # A log's resets published before the first build are the log's backlog (read from its start),
        # not news: only later ones name a cause.
        self.first_seq: int | None = None
        self.linked_logs: dict[str, UpstreamCopy] = {}  # metrics upstream -> the log linked to it, this build

    def build(self, ups: Mapping[str, UpstreamCopy], now: float, *,
              ledger_view: LedgerViewFn | None = None, active: ActiveFn = _no_active,
              router_view: RouterViewFn | None = None, kv_profile: KvProfileFn | None = None) -> list[ModelSnapshot]:
        """Record this evaluation's point of every judged (upstream, model) and return their snapshots.

        ``ledger_view``: callable(upstream) -> LedgerView | None, the KV-event ledger (None: no events
        followed). ``kv_profile``: callable(upstream) -> what its KV events said of its cache (``profile``).
        ``active``: callable(upstream, model) -> the causes active before this evaluation
        (hysteresis). ``router_view``: callable(upstream, now) -> what the router fronting it decided over the
        window (None: no ``routers:``)."""
        if self.first_seq is None:
            self.first_seq = self.events.last_seq if self.events is not None else 0
        logs = self._log_links(ups)
        self.linked_logs = {target: ups[names[0]] for target, names in logs.items() if names}
        rows = [row for up in ups.values() if up.kind in self.kinds and up.up
                for row in self._rows(up, now, ledger_view)]
        snaps = [self._snapshot(row, rows, now, self._events(row.up, logs.get(row.up.name, ())), active(*row.key),
                                self.profile(row.up, row.model, kv_profile))
                 for row in rows]
        if router_view is None:
            return snaps
        return [replace(s, router=_router(router_view, s.upstream, now)) for s in snaps]

    def mark_cold(self, upstream: str, model: str, now: float, cold: bool) -> None:
        """The engine's verdict on this evaluation's point: a cold cache's misses are no baseline."""
        hist = self.history.get((upstream, model))
        if hist and hist[-1].t == now:
            hist[-1].cold = cold

    # -- inputs ----------------------------------------------------------------------------------------
    def _log_links(self, ups: Mapping[str, UpstreamCopy]) -> dict[str, list[str]]:
        """metrics upstream -> the logs whose resets are its own: the log's ``upstream:``, else the only one."""
        metrics_ups = [n for n, up in ups.items() if up.kind == "metrics"]
        out: dict[str, list[str]] = {}
        for name, up in ups.items():
            target = self._log_target(name, metrics_ups)
            if up.kind == "log" and target:
                out.setdefault(target, []).append(name)
        return out

    def _log_target(self, name: str, metrics_ups: list[str]) -> str:
        """The metrics upstream a log belongs to: its link, else the only metrics upstream."""
        return self.settings.log_links.get(name) or (metrics_ups[0] if len(metrics_ups) == 1 else "")

    def linked_log(self, ups: Mapping[str, UpstreamCopy], name: str) -> UpstreamCopy | None:
        """The log linked to metrics upstream ``name`` (its ``upstream:``, else the only metrics upstream's)."""
        names = self._log_links(ups).get(name)
        return ups[names[0]] if names else None

    def profile(self, up: UpstreamCopy, model: str, kv_profile: KvProfileFn | None = None) -> ServerProfile:
        """What (upstream, model) says of its cache, one ``merge`` of its sources, field by field: the
        upstream's own (its page's engines of the model), the log linked to it (a page without
        vllm:cache_config_info, as the Rust frontend's of 0.32, leaves the start-up lines to say it), then
        its KV events (the block size every BlockStored carries)."""
        log_up = self.linked_logs.get(up.name)
        return merge(engines_profile(up.profiles, (model,)),
                     engines_profile(log_up.profiles, (model, "")) if log_up is not None else None,
                     kv_profile(up.name) if kv_profile is not None else None)

    def _ledger(self, name: str, models: list[str], ledger_view: LedgerViewFn | None) -> tuple[str, LedgerViewLike] | None:
        """The upstream's ledger view and the model it belongs to (the only model when it names none known)."""
        if ledger_view is None:
            return None
        try:
            view = ledger_view(name)
        except Exception:      # the ledger is another stage's: its failure must not end attribution
            if name not in self.ledger_failed:
                log.exception("attribution: ledger view of %s failed (logged once until it works again)", name)
            self.ledger_failed.add(name)
            return None
        self.ledger_failed.discard(name)
        return match_ledger(view, models)

    def _events(self, up: UpstreamCopy, logs: Iterable[str]) -> list[Event]:
        """What the event log holds of one metrics upstream: its logs' resets since the first build, its
        newest restart, and the newest event of each (kind, detail) of the kinds it names. A log's own
        resets are its metrics upstream's, not its own (`check` judges logs too)."""
        log_, name = self.events, up.name
        if log_ is None or up.kind != "metrics":
            return []
        first = self.first_seq or 0
        out = [Event(e.kind, e.at, e.detail) for lg in logs
               for e in log_.latest(lg, (EventKind.CACHE_RESET,)) if e.seq > first]
        restarts = log_.latest(name, (EventKind.RESTART,))
        if restarts:     # one restart, by its time: which series it corrected is the poller's log line
            out.append(Event(EventKind.RESTART, max(restarts, key=lambda e: e.seq).at))
        out.extend(Event(e.kind, e.at, e.detail) for e in log_.latest(name, NAMED_EVENTS))
        return out

    # -- history -----------------------------------------------------------------------------------------
    def _rows(self, up: UpstreamCopy, now: float, ledger_view: LedgerViewFn | None) -> list[_Row]:
        per_model = models_of(up)
        ledger = self._ledger(up.name, sorted(per_model), ledger_view)
        rows = []
        for model, tot in per_model.items():
            view = ledger[1] if ledger is not None and ledger[0] == model else None
            rows.append(_Row(up, model, tot, self._point((up.name, model), tot, view, now, up), view))
        return rows

    def _point(self, key: tuple[str, str], tot: ModelTotals, view: LedgerViewLike | None, now: float,
               up: UpstreamCopy) -> deque[_Point]:
        hist = self.history.setdefault(key, deque(maxlen=MAX_POINTS))
        q = tot.query or 0.0
        start = up.process_start_time
        if (not hist and q > 0 and up.restarts == 0 and start is not None
                and 0 < now - start <= self.settings.lookback and (tot.requests() or 0.0) <= COLD_REQUESTS):
            # First seen after its first requests, a young process: its counters were 0 at its start, so
            # that traffic (its cold cache) belongs to the first interval instead of to no interval at all.
            hist.append(_Point(start, ModelTotals(), None, None))
        if hist and (hist[-1].totals.query or 0.0) <= 0 < q:
            self.first_traffic[key] = now      # seen idle, now with traffic: this process's first traffic
        dyn = view.dynamic_prefix.recomputed_tokens if view is not None and view.dynamic_prefix else None
        hist.append(_Point(now, tot, dict(view.stored_tokens) if view is not None else None, dyn,
                           tier=view.tier_hit_tokens if view is not None else None))
        while len(hist) > 2 and hist[1].t <= now - self.settings.window:
            hist.popleft()
        return hist

    def _baseline(self, key: tuple[str, str], hist: deque[_Point], events: list[Event], now: float) -> float | None:
        """Miss ratio over the history before the most recent event (recorded when the event is first seen)."""
        recent = [e.at for e in events if now - e.at <= self.settings.lookback]
        if not recent:
            return None
        at = max(recent)
        known = self.baselines.get(key)
        if known is None or known[0] != at:
            before = [p for p in hist if p.t < at]
            # a cold start's misses are not the steady state: the baseline starts at its last cold point
            cold = [i for i, p in enumerate(before) if p.cold]
            before = before[cold[-1]:] if cold else before
            known = (at, _miss_ratio(before[0], before[-1]) if len(before) >= 2 else None)
            self.baselines[key] = known
        return known[1]

    # -- one snapshot ----------------------------------------------------------------------------------
    def _snapshot(self, row: _Row, rows: list[_Row], now: float, events: list[Event],
                  active: frozenset[str], profile: ServerProfile) -> ModelSnapshot:
        s, up, model, tot, hist = self.settings, row.up, row.model, row.tot, row.hist
        block_size, floor = profile.block_size, profile.match_floor
        fleet = [t for o in rows if o.model == model and o.up.name != up.name
                 for t in (_interval_tokens(o.hist, o.tot),) if t is not None]
        windows = _windows(hist, tot, now, s.short_window)
        kept = self.history.get(row.key)
        floor_move = self.floors.observe(
            row.key, floor or block_size, now, lambda: _steady_miss_ratio(kept or ()),
            kept is not None, (windows["short_query_tokens"], windows["short_hit_tokens"], windows["short_seconds"]))
        return ModelSnapshot(
            upstream=up.name, model=model, now=now,
            # an engine of the model without caching: the model's cache is judged off
            prefix_caching="false" if profile.prefix_caching == "mixed" else profile.prefix_caching,
            block_size=block_size,
            match_floor=floor,
            floor_move=floor_move,
            since_start_query_tokens=tot.query,
            since_start_hit_tokens=tot.hit,
            since_start_tier_query_tokens=tot.tier_query,
            reported_ratio=_reported(up, model),
            kv_usage=_gauge(up, C.KV_CACHE_USAGE, model),
            pool_tokens=float(profile.pool) if profile.pool else None,
            events=tuple(events),
            fleet_query_tokens=sum(q for q, _ in fleet) if fleet else None,
            fleet_hit_tokens=sum(h for _, h in fleet) if fleet else None,
            thresholds=s.thresholds_for(model),
            analyze_hint=analyze_hint(model, block_size, s.tokenizers.get(model, "")),
            first_traffic_at=self.first_traffic.get(row.key),
            since_start_requests=tot.requests(),
            baseline_miss_ratio=self._baseline(row.key, hist, events, now),
            kv_in_sync=row.view.in_sync if row.view is not None else None,
            dynamic_prefix=row.view.dynamic_prefix if row.view is not None else None,
            active=active,
            **windows,
        )


class _WindowFields(TypedDict):
    interval_seconds: float | None
    interval_query_tokens: float | None
    interval_hit_tokens: float | None
    interval_preemptions: float | None
    interval_evictions: float | None
    interval_tier_hit_tokens: float | None
    kv_tier_hit_tokens: float | None
    interval_sampling_requests: float | None
    interval_sampling_sequences: float | None
    interval_prompt_buckets: tuple[tuple[float, float], ...]
    short_seconds: float | None
    short_query_tokens: float | None
    short_hit_tokens: float | None
    short_prompt_buckets: tuple[tuple[float, float], ...] | None
    step_query_tokens: float | None
    step_hit_tokens: float | None
    step_prompt_buckets: tuple[tuple[float, float], ...] | None
    kv_stored_tokens: dict[str, float] | None
    kv_stored_tokens_lagged: dict[str, float] | None
    step_kv_stored_tokens: dict[str, float] | None
    step_kv_stored_tokens_lagged: dict[str, float] | None
    step_dynamic_prefix_tokens: float | None
    interval_dynamic_prefix_tokens: float | None


def _windows(hist: deque[_Point], tot: ModelTotals, now: float, short_window: float) -> _WindowFields:
    """The snapshot's trailing-window, short-window and step fields, cut from one history."""
    base = hist[0] if len(hist) > 1 else None
    short = next((p for p in reversed(hist) if p.t <= now - short_window), base)
    step = hist[-2] if len(hist) > 1 else None
    old = base.totals if base else None
    cur = hist[-1]
    dyn_step = None
    if cur.dyn is not None:
        dyn_step = max(0.0, cur.dyn - (step.dyn or 0.0)) if step is not None else 0.0
    return _WindowFields(
        interval_seconds=now - base.t if base else None,
        interval_query_tokens=delta(tot, old, "query"),
        interval_hit_tokens=delta(tot, old, "hit"),
        interval_preemptions=delta(tot, old, "preemptions"),
        interval_evictions=delta(tot, old, "evicted"),
        interval_tier_hit_tokens=delta(tot, old, "tier_hit"),
        kv_tier_hit_tokens=max(0.0, cur.tier - (base.tier or 0.0)) if base and cur.tier is not None else None,
        interval_sampling_requests=delta(tot, old, "sampling_requests"),
        interval_sampling_sequences=delta(tot, old, "sampling_sequences"),
        interval_prompt_buckets=prompt_buckets(tot, old) if old is not None else (),
        short_seconds=now - short.t if short else None,
        short_query_tokens=delta(tot, short.totals, "query") if short else None,
        short_hit_tokens=delta(tot, short.totals, "hit") if short else None,
        short_prompt_buckets=prompt_buckets(tot, short.totals) if short else None,
        step_query_tokens=delta(tot, step.totals, "query") if step else 0.0,
        step_hit_tokens=delta(tot, step.totals, "hit") if step else 0.0,
        step_prompt_buckets=prompt_buckets(tot, step.totals) if step else (),
        kv_stored_tokens=_split(cur.ledger, base.ledger) if base else None,
        kv_stored_tokens_lagged=_split(step.ledger, base.ledger) if base and step else None,
        step_kv_stored_tokens_lagged=_split(step.ledger, hist[-3].ledger) if len(hist) > 2 and step else None,
        step_kv_stored_tokens=_split(cur.ledger, step.ledger) if step else None,
        step_dynamic_prefix_tokens=dyn_step,
        interval_dynamic_prefix_tokens=(max(0.0, cur.dyn - (base.dyn or 0.0))
                                        if cur.dyn is not None and base is not None else None),
    )
