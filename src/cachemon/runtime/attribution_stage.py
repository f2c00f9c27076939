"""The daemon stage that runs the attribution engine on every poll and exports its causes.

``snapshots`` is the one place that turns the store (and the events other stages saw, and the
KV-event ledger's view where one is followed) into ``ModelSnapshot`` values; when the store's types
change, only this function follows. Per (upstream, model) it keeps one point per evaluation (the
counters' and the ledger's cumulative values), from which it cuts the trailing window, the short
window and the step; ``CauseTracker`` holds the causes down; ``missed`` is the tokens counter.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from cachemon import catalog as C
from cachemon.config import DAY, ConfigError, duration, integer, optional, setting
from cachemon.expose.render import Family
from cachemon.runtime.attribution import (
    COLD_CACHE,
    COLD_REQUESTS,
    MIN_QUERY_TOKENS,
    Attribution,
    CauseTracker,
    DynamicPrefixLike,
    Event,
    ModelSnapshot,
    Thresholds,
    attribute,
)
from cachemon.state.store import Store, UpstreamState

log = logging.getLogger("cachemon.attribution")

Totals = dict[str, float]      # what one poll said about one model, cumulative (see model_totals)


@dataclass
class AttributionConfig:
    """The ``attribution:`` section of `cachemon run`'s file."""
    window: float | None = setting(optional(duration(hi=DAY)), None)   # default: the shortest of `windows`
    lookback: float = setting(duration(hi=DAY), 900.0)      # how long an event explains missed tokens
    # dynamic prefix, short prompts and cold cache are judged over this (default: 4 polls)
    short_window: float | None = setting(optional(duration(hi=DAY)), None)
    hold: int = setting(integer(1, 100), 2)                 # evaluations a cause must hold to become active
    hold_down: float = setting(duration(hi=DAY), 30.0)      # how long a cause stays active after it last held


@dataclass
class AttributionSettings:
    window: float = 60.0          # the interval judged (trailing)
    lookback: float = 900.0       # how long a restart / reset / change explains missed tokens
    thresholds: dict[str, Thresholds] = field(default_factory=dict)   # model -> thresholds
    tokenizers: dict[str, str] = field(default_factory=dict)           # model -> tokenizer dir
    log_links: dict[str, str] = field(default_factory=dict)            # log upstream -> metrics upstream
    short_window: float = 8.0     # dynamic prefix / short prompts / cold cache (4 polls of 2 s)
    hold: int = 2
    hold_down: float = 30.0

    def thresholds_for(self, model: str) -> Thresholds:
        return self.thresholds.get(model, Thresholds())


def model_thresholds(models: Iterable[Any]) -> dict[str, Thresholds]:
    """Per served model, ``models[].hit_ratio_warning`` / ``hit_ratio_critical`` (the defaults where unset)."""
    out: dict[str, Thresholds] = {}
    base = Thresholds()
    for m in models:
        w, c = getattr(m, "hit_ratio_warning", None), getattr(m, "hit_ratio_critical", None)
        if w is None and c is None:
            continue
        t = Thresholds(base.warning if w is None else w, base.critical if c is None else c)
        if t.critical > t.warning:
            raise ConfigError(f"models[{m.name}].hit_ratio_critical", "must not be above hit_ratio_warning")
        out[m.name] = t
    return out


def analyze_hint(model: str, block_size: int | None, tokenizer: str = "") -> str:
    """The exact `cachemon analyze` line for a model; REQUESTS.jsonl is a sample of its request bodies."""
    return (f"cachemon analyze REQUESTS.jsonl --tokenizer {tokenizer or 'TOKENIZER_DIR'} "
            f"--block-size {block_size or 16} --redact   # REQUESTS.jsonl: recent request bodies of model {model}")


def model_totals(counters: Iterable[tuple[tuple[str, tuple[str, ...]], float]]) -> dict[str, Totals]:
    """Per model, the cumulative values the engine reads (summed over engines): local query / hit
    tokens, preemptions, evictions, and prompt-length buckets as "<metric>|<le>". Both users feed it:
    the stage the store's corrected counters, `check` a page's raw ones."""
    out: dict[str, Totals] = {}
    q, h, pre, ev, plen = (C.QUERY_TOKENS.name, C.HIT_TOKENS.name, C.PREEMPTIONS.name, C.KV_EVICTED_BLOCKS.name,
                           C.PROMPT_LENGTH_REQUESTS.name)
    for (metric, labels), value in counters:
        t = out.setdefault(labels[0], {})
        if metric in (q, h):
            if labels[2] != "local":
                continue
            name = metric
        elif metric in (pre, ev):
            name = metric
        elif metric == plen:
            name = f"{plen}|{labels[2]}"
        else:
            continue
        t[name] = t.get(name, 0.0) + value
    return out


def totals(st: UpstreamState) -> dict[str, Totals]:
    return model_totals((key, c.value) for key, c in st.counters.items())


def delta(new: Totals, old: Totals | None, name: str) -> float | None:
    """new - old of one total; None without a base or where the page has no such series."""
    if old is None or name not in new:
        return None
    return new[name] - old.get(name, 0.0)


def prompt_buckets(new: Totals, old: Totals | None) -> tuple[tuple[float, float], ...]:
    """Prompt-length buckets (le, count) of the interval (since start without a base), +Inf last."""
    prefix = C.PROMPT_LENGTH_REQUESTS.name + "|"
    rows = []
    for k, v in new.items():
        if k.startswith(prefix):
            try:
                le = float(k[len(prefix):])
            except ValueError:
                continue
            rows.append((le, v - (old or {}).get(k, 0.0)))
    return tuple(sorted(rows))


def requests_total(tot: Totals) -> float | None:
    """Finished requests counted by the prompt-length histogram (its +Inf bucket); None without it."""
    inf = [v for k, v in tot.items() if k.startswith(C.PROMPT_LENGTH_REQUESTS.name + "|") and
           k.rsplit("|", 1)[1].lower() in ("+inf", "inf")]
    return max(inf) if inf else None


def _gauge(st: UpstreamState, spec: C.MetricSpec, model: str, how: Any = max) -> float | None:
    vals = [v for (m, labels), v in st.gauges.items() if m == spec.name and labels[0] == model]
    return how(vals) if vals else None


class LedgerViewLike(Protocol):
    """docs/kv-events.md's ``LedgerView`` (state/kv_ledger.FleetLedger.view), read by shape: runtime
    takes the callable injected at wiring, so this stage never imports the ledger."""
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


LedgerViewFn = Callable[[str], "LedgerViewLike | None"]


def match_ledger(view: LedgerViewLike | None, models: list[str]) -> tuple[str, LedgerViewLike] | None:
    """The model (of an upstream's ``models``, as its metrics name them) a ledger view belongs to: its own
    model when the metrics know it, else the only model. Shared by the daemon and `cachemon check`."""
    if view is None:
        return None
    if view.model in models:
        return view.model, view
    return (models[0], view) if len(models) == 1 else None


@dataclass
class _Point:
    """One evaluation's cumulative values of one (upstream, model)."""
    t: float
    totals: Totals
    ledger: dict[str, float] | None = None    # the ledger's stored_tokens (cumulative), None without events
    dyn: float | None = None                  # recomputed tokens below the dynamic prefix (cumulative)
    cold: bool = False                        # the engine named cold_cache at this point


MAX_POINTS = 4096      # per (upstream, model): bounds memory whatever the poll interval


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


def _miss_ratio(a: _Point, b: _Point) -> float | None:
    q = b.totals.get(C.QUERY_TOKENS.name, 0.0) - a.totals.get(C.QUERY_TOKENS.name, 0.0)
    h = b.totals.get(C.HIT_TOKENS.name, 0.0) - a.totals.get(C.HIT_TOKENS.name, 0.0)
    return max(0.0, q - h) / q if q >= MIN_QUERY_TOKENS else None


class Attributor:
    """History per (upstream, model) plus the tracker; ``evaluate`` is the stage's whole job.

    ``events``: callable(upstream) -> list[Event], from the other stages. ``ledger_view``:
    callable(upstream) -> LedgerView | None, the KV-event ledger (None: no events followed)."""

    def __init__(self, store: Store, settings: AttributionSettings, events: Any = None,
                 ledger_view: LedgerViewFn | None = None):
        self.store = store
        self.settings = settings
        self.events = events
        self.ledger_view = ledger_view
        self.ledger_failed: set[str] = set()
        self.history: dict[tuple[str, str], deque[_Point]] = {}
        self.first_traffic: dict[tuple[str, str], float] = {}
        self.baselines: dict[tuple[str, str], tuple[float, float | None]] = {}   # (event time, miss ratio)
        self.log_resets: dict[str, float] = {}       # log upstream -> last seen 'done' count
        self.reset_events: dict[str, list[Event]] = {}
        self.tracker = CauseTracker(settings.hold, settings.hold_down)
        self.missed: dict[tuple[str, str, str, str], float] = {}   # (upstream, model, cause, certainty) -> tokens
        self.results: list[Attribution] = []
        self.lock = threading.Lock()

    def _log_resets(self, ups: dict[str, UpstreamState], metrics_ups: list[str], now: float) -> None:
        for name, st in ups.items():
            if st.info.kind != "log":
                continue
            done = sum(c.value for (m, labels), c in st.counters.items()
                       if m == C.LOG_CACHE_RESETS.name and labels == ("done",))
            seen = self.log_resets.get(name)
            self.log_resets[name] = done
            target = self.settings.log_links.get(name) or (metrics_ups[0] if len(metrics_ups) == 1 else "")
            if seen is not None and done > seen and target:
                self.reset_events.setdefault(target, []).append(Event("cache_reset", now, "vLLM log"))

    def _ledger(self, name: str, models: list[str]) -> tuple[str, LedgerViewLike] | None:
        """The upstream's ledger view and the model it belongs to (the only model when it names none known)."""
        if self.ledger_view is None:
            return None
        try:
            view = self.ledger_view(name)
        except Exception:      # the ledger is another stage's: its failure must not end attribution
            if name not in self.ledger_failed:
                log.exception("attribution: ledger view of %s failed (logged once until it works again)", name)
            self.ledger_failed.add(name)
            return None
        self.ledger_failed.discard(name)
        return match_ledger(view, models)

    def _point(self, key: tuple[str, str], tot: Totals, view: LedgerViewLike | None, now: float,
               st: UpstreamState) -> deque[_Point]:
        hist = self.history.setdefault(key, deque(maxlen=MAX_POINTS))
        q = tot.get(C.QUERY_TOKENS.name, 0.0)
        start = st.process_start_time
        if (not hist and q > 0 and st.restarts == 0 and start is not None
                and 0 < now - start <= self.settings.lookback and (requests_total(tot) or 0.0) <= COLD_REQUESTS):
            # First seen after its first requests, a young process: its counters were 0 at its start, so
            # that traffic (its cold cache) belongs to the first interval instead of to no interval at all.
            hist.append(_Point(start, {}, None, None))
        if hist and hist[-1].totals.get(C.QUERY_TOKENS.name, 0.0) <= 0 < q:
            self.first_traffic[key] = now      # seen idle, now with traffic: this process's first traffic
        dyn = view.dynamic_prefix.recomputed_tokens if view is not None and view.dynamic_prefix else None
        hist.append(_Point(now, tot, dict(view.stored_tokens) if view is not None else None, dyn))
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

    def snapshots(self, now: float) -> list[ModelSnapshot]:
        s = self.settings
        with self.store.lock:
            ups = {name: st for name, st in self.store.upstreams.items()}
            metrics_ups = [n for n, st in ups.items() if st.info.kind == "metrics"]
            self._log_resets(ups, metrics_ups, now)
            rows: list[tuple[str, str, UpstreamState, Totals, deque[_Point], LedgerViewLike | None]] = []
            for name in metrics_ups:
                st = ups[name]
                if not st.up:
                    continue
                per_model = totals(st)
                ledger = self._ledger(name, sorted(per_model))
                for model, tot in per_model.items():
                    view = ledger[1] if ledger is not None and ledger[0] == model else None
                    rows.append((name, model, st, tot, self._point((name, model), tot, view, now, st), view))
            snaps: list[ModelSnapshot] = []
            for name, model, st, tot, hist, view in rows:
                base = hist[0] if len(hist) > 1 else None
                short = next((p for p in reversed(hist) if p.t <= now - s.short_window), base)
                step = hist[-2] if len(hist) > 1 else None
                fq = fh = 0.0
                fleet = False
                for oname, omodel, _, otot, ohist, _ in rows:
                    if omodel == model and oname != name and len(ohist) > 1:
                        oold = ohist[0].totals
                        fq += otot.get(C.QUERY_TOKENS.name, 0.0) - oold.get(C.QUERY_TOKENS.name, 0.0)
                        fh += otot.get(C.HIT_TOKENS.name, 0.0) - oold.get(C.HIT_TOKENS.name, 0.0)
                        fleet = True
                events = list(self.reset_events.get(name, ()))
                if st.last_restart is not None:
                    events.append(Event("restart", st.last_restart))
                if self.events is not None:
                    events.extend(self.events(name))
                caching = _gauge(st, C.PREFIX_CACHING_ENABLED, model, min)
                bs = _gauge(st, C.BLOCK_SIZE, model)
                reported = [v for (m, labels), v in st.gauges.items()
                            if m == C.REPORTED_HIT_RATIO.name and labels[0] == model and labels[2] == "local"]
                old = base.totals if base else None
                cur = hist[-1]
                dyn_step = None
                if cur.dyn is not None:
                    dyn_step = max(0.0, cur.dyn - (step.dyn or 0.0)) if step is not None else 0.0
                snaps.append(ModelSnapshot(
                    upstream=name, model=model, now=now,
                    prefix_caching="" if caching is None else ("true" if caching > 0 else "false"),
                    block_size=int(bs) if bs else None,
                    since_start_query_tokens=tot.get(C.QUERY_TOKENS.name),
                    since_start_hit_tokens=tot.get(C.HIT_TOKENS.name),
                    reported_ratio=min(reported) if reported else None,
                    interval_seconds=now - base.t if base else None,
                    interval_query_tokens=delta(tot, old, C.QUERY_TOKENS.name),
                    interval_hit_tokens=delta(tot, old, C.HIT_TOKENS.name),
                    interval_preemptions=delta(tot, old, C.PREEMPTIONS.name),
                    interval_evictions=delta(tot, old, C.KV_EVICTED_BLOCKS.name),
                    interval_prompt_buckets=prompt_buckets(tot, old) if old is not None else (),
                    kv_usage=_gauge(st, C.KV_CACHE_USAGE, model),
                    pool_tokens=_gauge(st, C.KV_CACHE_CAPACITY, model, sum),
                    events=tuple(events),
                    fleet_query_tokens=fq if fleet else None, fleet_hit_tokens=fh if fleet else None,
                    thresholds=s.thresholds_for(model),
                    analyze_hint=analyze_hint(model, int(bs) if bs else None, s.tokenizers.get(model, "")),
                    short_seconds=now - short.t if short else None,
                    short_query_tokens=delta(tot, short.totals, C.QUERY_TOKENS.name) if short else None,
                    short_hit_tokens=delta(tot, short.totals, C.HIT_TOKENS.name) if short else None,
                    short_prompt_buckets=prompt_buckets(tot, short.totals) if short else None,
                    step_query_tokens=delta(tot, step.totals, C.QUERY_TOKENS.name) if step else 0.0,
                    step_hit_tokens=delta(tot, step.totals, C.HIT_TOKENS.name) if step else 0.0,
                    step_prompt_buckets=prompt_buckets(tot, step.totals) if step else (),
                    first_traffic_at=self.first_traffic.get((name, model)),
                    since_start_requests=requests_total(tot),
                    baseline_miss_ratio=self._baseline((name, model), hist, events, now),
                    kv_stored_tokens=_split(cur.ledger, base.ledger) if base else None,
                    step_kv_stored_tokens=_split(cur.ledger, step.ledger) if step else None,
                    kv_in_sync=view.in_sync if view is not None else None,
                    dynamic_prefix=view.dynamic_prefix if view is not None else None,
                    step_dynamic_prefix_tokens=dyn_step,
                    interval_dynamic_prefix_tokens=(max(0.0, cur.dyn - (base.dyn or 0.0))
                                                    if cur.dyn is not None and base is not None else None),
                    active=self.tracker.active_for(name, model),
                ))
        for evs in self.reset_events.values():
            evs[:] = [e for e in evs if now - e.at <= s.lookback]
        return snaps

    def evaluate(self, now: float) -> list[Attribution]:
        results = [attribute(snap, self.settings.lookback) for snap in self.snapshots(now)]
        for a in results:
            hist = self.history.get((a.upstream, a.model))
            if hist and hist[-1].t == now:
                hist[-1].cold = COLD_CACHE in a.codes
        with self.lock:
            self.tracker.update(results, now)
            self.results = results
            for a in results:
                for c in a.causes:
                    if c.tokens:
                        key = (a.upstream, a.model, c.code, c.tokens_certainty)
                        self.missed[key] = self.missed.get(key, 0.0) + c.tokens
        return results


class AttributionStage:
    """Runs ``Attributor.evaluate`` every poll interval; ``collector`` exports the active causes
    and the tokens each cause cost."""

    def __init__(self, attributor: Attributor, interval: float, clock: Any = time.time):
        self.attributor = attributor
        self.interval = interval
        self.clock = clock
        self.collector = self
        self._threads: list[threading.Thread] = []

    def _loop(self, stop: threading.Event) -> None:
        while not stop.wait(self.interval):
            try:
                self.attributor.evaluate(self.clock())
            except Exception:      # one bad round must not end attribution
                log.exception("attribution: unexpected error")

    def start(self, stop_event: threading.Event) -> None:
        t = threading.Thread(target=self._loop, args=(stop_event,), name="attribution", daemon=True)
        t.start()
        self._threads.append(t)

    def close(self) -> None:
        for t in self._threads:
            t.join(timeout=5)

    def collect(self) -> Iterator[Family]:
        active = Family.of(C.CAUSE_ACTIVE)
        since = Family.of(C.CAUSE_SINCE)
        missed = Family.of(C.CAUSE_MISSED_TOKENS)
        att = self.attributor
        with att.lock:
            for key, t in sorted(att.tracker.since.items()):
                active.put(C.CAUSE_ACTIVE, (*key, att.tracker.certainty.get(key, "")), 1.0)
                since.put(C.CAUSE_SINCE, key, t)
            for mkey, v in sorted(att.missed.items()):
                missed.put(C.CAUSE_MISSED_TOKENS, mkey, v)
        yield active
        yield since
        yield missed


def _change_events(daemon: Any) -> Any:
    """Events seen by the change-detection stage (found by shape, its `watches`: this stage never imports runtime.changes)."""
    watchers = [c for c in daemon.components if hasattr(c, "watches")]

    def events(upstream: str) -> list[Event]:
        out: list[Event] = []
        for det in watchers:
            with det.lock:
                w = det.watches.get(upstream)
                if w is None:
                    continue
                out.extend(Event("change", t, kind) for kind, t in w.last_change.items())
                if w.last_cache_reset is not None:
                    out.append(Event("cache_reset_suspected", w.last_cache_reset))
        return out
    return events


def attribution_component(daemon: Any) -> AttributionStage | None:
    if not daemon.pollers:
        return None
    cfg = daemon.cfg
    settings = AttributionSettings(
        window=cfg.attribution.window or min(cfg.windows.values(), default=60.0),
        lookback=cfg.attribution.lookback,
        thresholds=model_thresholds(cfg.models),
        tokenizers={m.name: m.tokenizer for m in cfg.models if m.tokenizer},
        log_links={f.name: f.upstream for f in cfg.logs.files if f.upstream} if cfg.logs is not None else {},
        short_window=cfg.attribution.short_window or 4 * cfg.poll_interval,
        hold=cfg.attribution.hold, hold_down=cfg.attribution.hold_down)
    # the KV-event ledger, where one is followed (docs/kv-events.md: FleetLedger.view); wired by shape
    ledger = getattr(daemon, "kv_ledger", None)
    return AttributionStage(Attributor(daemon.store, settings, _change_events(daemon),
                                       ledger.view if ledger is not None else None), cfg.poll_interval)
