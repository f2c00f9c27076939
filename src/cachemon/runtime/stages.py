"""Every optional stage of `cachemon run`, registered in this one place: ``STAGES``.

Each factory is registered by ``@stage(name)`` (node_exporter's registerCollector): it reads its
config section and the read ports of the ``StageContext`` (runtime/context.py) and returns its
stage, or None when the section is absent (or there is nothing to watch). The daemon builds them
in registration order, which is the order of /metrics, nothing more: stages talk through the context
only (the event log, the store's read API, the KV ledger built on first ask). A stage's module is
imported only when its factory runs, so a sidecar without `logs:` or `kv_events` never loads the
tailer or pyzmq. The name is the `stage` label of cachemon_stage_collect_{success,duration_seconds}.

Adding a stage: its module, and one factory here.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from cachemon.runtime.context import StageContext

if TYPE_CHECKING:
    from cachemon.runtime.attribution_stage import AttributionStage
    from cachemon.runtime.change_detector import ChangeDetector
    from cachemon.runtime.component import Component
    from cachemon.runtime.cost import CostCollector
    from cachemon.runtime.kv_stage import KvStage
    from cachemon.runtime.logsource import LogSource
    from cachemon.runtime.router_stage import RouterStage
    from cachemon.runtime.warmup import WarmupTrigger
    from cachemon.state.routers import RouterView

Factory = Callable[[StageContext], "Component | None"]
STAGES: list[tuple[str, Factory]] = []
F = TypeVar("F", bound=Factory)


def stage(name: str) -> Callable[[F], F]:
    """Register a stage factory under ``name`` (unique), after the ones registered before it."""
    def register(factory: F) -> F:
        if any(n == name for n, _ in STAGES):
            raise ValueError(f"stage {name!r} registered twice")
        STAGES.append((name, factory))
        return factory
    return register


@stage("logs")
def log_stage(ctx: StageContext) -> LogSource | None:
    """Log files -> store: present when `logs:` / --log-file is configured."""
    logs = ctx.config.logs
    if logs is None or ctx.writer is None:
        return None
    from cachemon.runtime.logsource import LogSource
    return LogSource(logs, ctx.writer, events=ctx.events)


@stage("changes")
def changes_stage(ctx: StageContext) -> ChangeDetector | None:
    """Models / version / cache-config / tokenizer changes and suspected resets, per polled upstream."""
    if not ctx.upstreams:
        return None
    from cachemon.config.events import EventSettings
    from cachemon.runtime.change_detector import ChangeDetector
    cfg = ctx.config
    return ChangeDetector(list(ctx.upstreams.values()), ctx.store, EventSettings.of(cfg.events, list(cfg.models)),
                          cfg.poll_interval, events=ctx.events)


@stage("warmup")
def warmup_stage(ctx: StageContext) -> WarmupTrigger | None:
    """Re-warm the cache after a restart or a model change (with `warmup:`)."""
    cfg = ctx.config.warmup
    if cfg is None or not ctx.upstreams:
        return None
    from cachemon.runtime.warmup import WarmupTrigger
    return WarmupTrigger(cfg, ctx.upstreams, ctx.events)


@stage("cost")
def cost_stage(ctx: StageContext) -> CostCollector | None:
    """Estimated cost counters (with `cost:`)."""
    model = ctx.config.cost
    if not model:
        return None
    from cachemon.runtime.cost import CostCollector
    return CostCollector(ctx.store, model)


@stage("kv_events")
def kv_stage(ctx: StageContext) -> KvStage | None:
    """KV-cache event streams -> the ledger; None (and no import of zmq or msgspec) when no upstream
    has ``kv_events``."""
    sink = ctx.kv_sink()
    if sink is None:
        return None
    from cachemon.runtime.kv_stage import KvStage, ledger_collectors
    upstreams = [u for u in ctx.config.upstreams if u.kv_events is not None]
    settings = ctx.config.kv_events
    return KvStage(upstreams, settings, sink, ctx.store,
                   collectors=ledger_collectors(sink, settings.new_series_hold), feeds=ctx.kv_feeds())


@stage("routers")
def router_stage(ctx: StageContext) -> RouterStage | None:
    """Each router's /metrics (with `routers:`): its decisions, beside the engines'."""
    book = ctx.router_book()
    if book is None:
        return None
    from cachemon.runtime.router_stage import RouterStage
    ledger = ctx.kv_ledger()
    routing = None
    if ledger is not None:
        def routing(upstream: str) -> float:
            view = ledger.view(upstream)
            return view.stored_tokens.get("routing", 0.0) if view is not None else 0.0
    return RouterStage(ctx.config.routers, ctx.config.upstreams, book, ctx.config.poll_interval,
                       routing_tokens=routing)


@stage("attribution")
def attribution_stage(ctx: StageContext) -> AttributionStage | None:
    """Why the hit ratio is low: reads the store, the event log and the KV ledger."""
    if not ctx.upstreams:
        return None
    from cachemon.runtime.attribution_stage import (
        AttributionSettings,
        AttributionStage,
        Attributor,
        model_thresholds,
    )
    cfg = ctx.config
    att = cfg.attribution
    settings = AttributionSettings(
        window=att.window or min(cfg.windows.values(), default=60.0),
        lookback=att.lookback,
        thresholds=model_thresholds(cfg.models),
        tokenizers={m.name: m.tokenizer for m in cfg.models if m.tokenizer},
        log_links={f.name: f.upstream for f in cfg.logs.files if f.upstream} if cfg.logs is not None else {},
        short_window=att.short_window or 4 * cfg.poll_interval,
        hold=att.hold, hold_down=att.hold_down)
    ledger = ctx.kv_ledger()
    book = ctx.router_book()
    router_view = None
    if book is not None:
        def router_view(upstream: str, now: float) -> RouterView | None:
            return book.view(upstream, now, settings.window)
    return AttributionStage(Attributor(ctx.store, settings, ctx.events, ledger.view if ledger is not None else None,
                                       router_view, ctx.kv_profile()), cfg.poll_interval)
