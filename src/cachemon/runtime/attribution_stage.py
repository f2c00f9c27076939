"""The daemon stage that runs the attribution engine on every poll and exports its causes.

``Attributor.snapshots`` asks the one snapshot builder (judge/snapshots.py, shared with `cachemon
check`) to turn the store (and the events other stages saw, and the KV-event ledger's view where one
is followed) into ``ModelSnapshot`` values; ``CauseTracker`` holds the causes down; ``missed`` is the
tokens counter.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from cachemon import catalog as C
from cachemon.config import ConfigError
from cachemon.config.events import ModelEntry
from cachemon.expose.render import Family
from cachemon.judge.attribute import (
    Attribution,
    CauseCode,
    CauseTracker,
    ModelSnapshot,
    Thresholds,
    attribute,
)
from cachemon.judge.snapshots import (
    EventSource,
    KvProfileFn,
    LedgerViewFn,
    RouterViewFn,
    SnapshotBuilder,
    read_store,
)
from cachemon.runtime.component import LoopStage
from cachemon.state.views import StoreReader

log = logging.getLogger("cachemon.attribution")


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


def model_thresholds(models: Iterable[ModelEntry]) -> dict[str, Thresholds]:
    """Per served model, ``models[].hit_ratio_warning`` / ``hit_ratio_critical`` (the defaults where unset)."""
    out: dict[str, Thresholds] = {}
    base = Thresholds()
    for m in models:
        w, c = m.hit_ratio_warning, m.hit_ratio_critical
        if w is None and c is None:
            continue
        t = Thresholds(base.warning if w is None else w, base.critical if c is None else c)
        if t.critical > t.warning:
            raise ConfigError(f"models[{m.name}].hit_ratio_critical", "must not be above hit_ratio_warning")
        out[m.name] = t
    return out


class Attributor:
    """The snapshot builder (its history per (upstream, model)) plus the tracker; ``evaluate`` is the stage's whole job.

    ``events``: the event log the other stages publish on (state/events.EventLog). ``ledger_view``:
    callable(upstream) -> LedgerView | None, the KV-event ledger (None: no events followed)."""

    def __init__(self, store: StoreReader, settings: AttributionSettings, events: EventSource | None = None,
                 ledger_view: LedgerViewFn | None = None, router_view: RouterViewFn | None = None,
                 kv_profile: KvProfileFn | None = None) -> None:
        self.store = store
        self.settings = settings
        self.ledger_view = ledger_view
        self.kv_profile = kv_profile       # callable(upstream) -> what its KV events said (None: no events)
        self.router_view = router_view     # callable(upstream, now) -> the router's view (None: no routers:)
        # the one snapshot builder (judge/snapshots.py), shared with `cachemon check`
        self.builder = SnapshotBuilder(settings, events=events)
        self.tracker = CauseTracker(settings.hold, settings.hold_down)
        self.missed: dict[tuple[str, str, str, str], float] = {}   # (upstream, model, cause, certainty) -> tokens
        self.results: list[Attribution] = []
        self.lock = threading.Lock()

    def snapshots(self, now: float) -> list[ModelSnapshot]:
        # STORE READ (read_store); the builder reads the event log, and the ledger view it is handed
        return self.builder.build(read_store(self.store), now, ledger_view=self.ledger_view,
                                  active=self.tracker.active_for, router_view=self.router_view,
                                  kv_profile=self.kv_profile)

    def evaluate(self, now: float) -> list[Attribution]:
        results = [attribute(snap, self.settings.lookback) for snap in self.snapshots(now)]
        for a in results:
            self.builder.mark_cold(a.upstream, a.model, now, CauseCode.COLD_CACHE in a.codes)
        with self.lock:
            self.tracker.update(results, now)
            self.results = results
            for a in results:
                for c in a.causes:
                    if c.tokens:
                        key = (a.upstream, a.model, c.code, c.tokens_certainty)
                        self.missed[key] = self.missed.get(key, 0.0) + c.tokens
        return results


class AttributionStage(LoopStage):
    """Runs ``Attributor.evaluate`` every poll interval; ``collector`` exports the active causes
    and the tokens each cause cost."""
    thread_name = "attribution"

    def __init__(self, attributor: Attributor, interval: float, clock: Callable[[], float] = time.time) -> None:
        self.attributor = attributor
        self.interval = interval
        self.clock = clock

    def _loop(self, stop: threading.Event) -> None:
        while not stop.wait(self.interval):
            try:
                self.attributor.evaluate(self.clock())
            except Exception:      # one bad round must not end attribution
                log.exception("attribution: unexpected error")


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
