"""The daemon's warm-up stage (``warmup:`` in the config): after a restart or a model change of an
upstream, re-send the stable prefixes once with ``run_warmup`` (runtime/warmup_run.py), counted
in cachemon_warmups_total{trigger, result}."""
from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from typing import Protocol

from cachemon import catalog as C
from cachemon.config import (
    Upstream,
)
from cachemon.config.warmup import WarmupConfig, WarmupError, load_prompts
from cachemon.expose.render import Family, format_labels
from cachemon.runtime.warmup_run import RESULTS, WarmupResult, pct_text, run_warmup
from cachemon.state.events import EventKind, EventLog, StageEvent

log = logging.getLogger("cachemon.warmup")

# --- daemon: warmup_on --------------------------------------------------------------------------


class _HasUpstream(Protocol):
    @property
    def upstream(self) -> Upstream: ...


class WarmupTrigger:
    """The warm-up stage: runs one warm-up per event, one at a time; events arriving while one is
    pending for the same upstream join it (a restart that is also a model change warms up once).

    Hears restarts (from the pollers) and model changes (from change detection) on ``events``;
    ``trigger`` is also callable directly."""

    def __init__(self, cfg: WarmupConfig, pollers: Mapping[str, _HasUpstream], events: EventLog | None = None) -> None:
        self.cfg = cfg
        self.pollers = pollers
        self.lock = threading.Lock()
        self.counts: dict[tuple[str, str, str], int] = {
            (u, t, r): 0 for u in pollers for t in cfg.warmup_on for r in RESULTS}
        self.pending: dict[str, str] = {}          # upstream -> trigger
        self.wake = threading.Event()
        self.stop: threading.Event | None = None
        self.thread: threading.Thread | None = None
        self.last: dict[str, WarmupResult] = {}
        if events is not None:
            events.subscribe((EventKind.RESTART, EventKind.CHANGE), self._on_event)

    def _on_event(self, event: StageEvent) -> None:
        if event.kind is EventKind.RESTART:
            self.trigger(event.upstream, "restart")
        elif event.detail == "model":
            self.trigger(event.upstream, "model_change")

    def trigger(self, upstream: str, trigger: str) -> bool:
        if trigger not in self.cfg.warmup_on or upstream not in self.pollers:
            return False
        with self.lock:
            if upstream in self.pending:
                log.info("warm-up of %s already pending (%s); %s joins it", upstream, self.pending[upstream], trigger)
                return False
            self.pending[upstream] = trigger
        self.wake.set()
        return True

    def family(self) -> Family:
        f = Family.of(C.WARMUPS)
        with self.lock:
            for labels, n in sorted(self.counts.items()):
                f.add(format_labels(C.WARMUPS.labels, labels), n)
        return f

    def run_pending(self) -> None:
        while True:
            with self.lock:
                if not self.pending:
                    return
                upstream, trigger = next(iter(self.pending.items()))
            if self.stop is not None and self.stop.wait(self.cfg.delay):
                return
            result = self._run(upstream, trigger)
            with self.lock:
                self.pending.pop(upstream, None)
                self.counts[(upstream, trigger, result)] = self.counts.get((upstream, trigger, result), 0) + 1

    def _run(self, upstream: str, trigger: str) -> str:
        p = self.pollers[upstream]
        api = self.cfg.api or p.upstream.base_url
        try:
            prompts = load_prompts(self.cfg.prompts)
            if not prompts.items:
                raise WarmupError(f"no usable prompt in {self.cfg.prompts}")
            res = run_warmup(api, prompts, concurrency=self.cfg.concurrency, rate=self.cfg.rate,
                             max_tokens=self.cfg.max_tokens, max_load=self.cfg.max_load, force=False,
                             timeout=self.cfg.timeout, metrics_url=p.upstream.url, stop=self.stop)
        except Exception as e:     # a broken warm-up must never take the exporter down
            log.error("warm-up of %s after %s failed: %s", upstream, trigger, e)
            return "failed"
        self.last[upstream] = res
        if res.refused:
            log.warning("warm-up of %s after %s refused: %s", upstream, trigger, res.refused)
            return "refused_load"
        if prompts.skipped:
            log.warning("warm-up of %s: %d line(s) of %s skipped", upstream, len(prompts.skipped), self.cfg.prompts)
        if res.failed or res.stopped:
            log.warning("warm-up of %s after %s: %d ok, %d failed%s; first failure: %s", upstream, trigger, res.ok,
                        len(res.failed), " (stopped)" if res.stopped else "",
                        res.failed[0].error if res.failed else "-")
            return "failed"
        log.info("warm-up of %s after %s: %d prompt(s) ok in %.1f s, hit ratio during warm-up %s", upstream, trigger,
                 res.ok, res.seconds, pct_text(res.delta_ratio))
        return "done"

    def _loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.wake.wait(1.0)
            self.wake.clear()
            try:
                self.run_pending()
            except Exception:
                log.exception("warm-up worker: unexpected error")

    def start(self, stop_event: threading.Event) -> None:
        self.stop = stop_event
        self.thread = threading.Thread(target=self._loop, args=(stop_event,), name="warmup", daemon=True)
        self.thread.start()

    def close(self) -> None:
        if self.thread is not None:
            self.thread.join(timeout=5)

    def collect(self) -> Iterator[Family]:
        yield self.family()
