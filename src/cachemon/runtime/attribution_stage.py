"""The daemon stage that runs the attribution engine on every poll and exports its causes.

``snapshots`` is the one place that turns the store (and the events other stages saw) into
``ModelSnapshot`` values; when the store's types change, only this function follows.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from cachemon import catalog as C
from cachemon.config import DAY, ConfigError, duration, optional, setting
from cachemon.expose.render import Family, format_labels
from cachemon.runtime.attribution import (
    Attribution,
    CauseTracker,
    Event,
    ModelSnapshot,
    Thresholds,
    attribute,
)
from cachemon.state.store import Store, UpstreamState

log = logging.getLogger("cachemon.attribution")

Totals = dict[str, float]      # what one poll said about one model, cumulative (see _totals)


@dataclass
class AttributionConfig:
    """The ``attribution:`` section of `cachemon run`'s file."""
    window: float | None = setting(optional(duration(hi=DAY)), None)   # default: the shortest of `windows`
    lookback: float = setting(duration(hi=DAY), 900.0)      # how long an event explains a low ratio


@dataclass
class AttributionSettings:
    window: float = 60.0          # the interval judged (trailing)
    lookback: float = 900.0       # how long a restart / reset / change explains a low ratio
    thresholds: dict[str, Thresholds] = field(default_factory=dict)   # model -> thresholds
    tokenizers: dict[str, str] = field(default_factory=dict)           # model -> tokenizer dir
    log_links: dict[str, str] = field(default_factory=dict)            # log upstream -> metrics upstream

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


def _gauge(st: UpstreamState, spec: C.MetricSpec, model: str, how: Any = max) -> float | None:
    vals = [v for (m, labels), v in st.gauges.items() if m == spec.name and labels[0] == model]
    return how(vals) if vals else None


class Attributor:
    """History per (upstream, model) plus the tracker; ``evaluate`` is the stage's whole job."""

    def __init__(self, store: Store, settings: AttributionSettings, events: Any = None):
        self.store = store
        self.settings = settings
        self.events = events          # callable(upstream) -> list[Event], from the other stages
        self.history: dict[tuple[str, str], deque[tuple[float, Totals]]] = {}
        self.log_resets: dict[str, float] = {}       # log upstream -> last seen 'done' count
        self.reset_events: dict[str, list[Event]] = {}
        self.tracker = CauseTracker()
        self.results: list[Attribution] = []
        self.lock = threading.Lock()

    def snapshots(self, now: float) -> list[ModelSnapshot]:
        s = self.settings
        with self.store.lock:
            ups = {name: st for name, st in self.store.upstreams.items()}
            metrics_ups = [n for n, st in ups.items() if st.info.kind == "metrics"]
            for name, st in ups.items():
                if st.info.kind != "log":
                    continue
                done = sum(c.value for (m, labels), c in st.counters.items()
                           if m == C.LOG_CACHE_RESETS.name and labels == ("done",))
                seen = self.log_resets.get(name)
                self.log_resets[name] = done
                target = s.log_links.get(name) or (metrics_ups[0] if len(metrics_ups) == 1 else "")
                if seen is not None and done > seen and target:
                    self.reset_events.setdefault(target, []).append(Event("cache_reset", now, "vLLM log"))
            rows: list[tuple[str, str, UpstreamState, Totals, Totals | None, float | None]] = []
            for name in metrics_ups:
                st = ups[name]
                if not st.up:
                    continue
                for model, tot in totals(st).items():
                    hist = self.history.setdefault((name, model), deque())
                    if not hist or hist[-1][1] != tot or now - hist[-1][0] >= s.window / 4:
                        hist.append((now, tot))
                    while len(hist) > 2 and hist[1][0] <= now - s.window:
                        hist.popleft()
                    base = hist[0] if len(hist) > 1 else None
                    rows.append((name, model, st, tot, base[1] if base else None,
                                 now - base[0] if base else None))
            snaps: list[ModelSnapshot] = []
            for name, model, st, tot, old, secs in rows:
                fq = fh = 0.0
                fleet = False
                for oname, omodel, _, otot, oold, _ in rows:
                    if omodel == model and oname != name and oold is not None:
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
                snaps.append(ModelSnapshot(
                    upstream=name, model=model, now=now,
                    prefix_caching="" if caching is None else ("true" if caching > 0 else "false"),
                    block_size=int(bs) if bs else None,
                    since_start_query_tokens=tot.get(C.QUERY_TOKENS.name),
                    since_start_hit_tokens=tot.get(C.HIT_TOKENS.name),
                    reported_ratio=min(reported) if reported else None,
                    interval_seconds=secs,
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
                ))
        for evs in self.reset_events.values():
            evs[:] = [e for e in evs if now - e.at <= s.lookback]
        return snaps

    def evaluate(self, now: float) -> list[Attribution]:
        results = [attribute(snap, self.settings.lookback) for snap in self.snapshots(now)]
        with self.lock:
            before = set(self.tracker.since)
            self.tracker.update(results, now)
            self.results = results
            for key in set(self.tracker.since) - before:
                log.warning("upstream %s model %s: cause %s active", *key)
        return results


class AttributionStage:
    """Runs ``Attributor.evaluate`` every poll interval; ``collector`` exports the active causes."""

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
        active = Family(C.CAUSE_ACTIVE.name, C.CAUSE_ACTIVE.type, C.CAUSE_ACTIVE.help)
        since = Family(C.CAUSE_SINCE.name, C.CAUSE_SINCE.type, C.CAUSE_SINCE.help)
        with self.attributor.lock:
            for key, t in sorted(self.attributor.tracker.since.items()):
                active.add(format_labels(C.CAUSE_ACTIVE.labels, key), 1.0)
                since.add(format_labels(C.CAUSE_SINCE.labels, key), t)
        yield active
        yield since


def _change_events(daemon: Any) -> Any:
    """Events seen by the change-detection stage (found by shape: runtime never imports diagnostics)."""
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
        log_links={f.name: f.upstream for f in cfg.logs.files if f.upstream} if cfg.logs is not None else {})
    return AttributionStage(Attributor(daemon.store, settings, _change_events(daemon)), cfg.poll_interval)
