"""The factories of `cachemon run`'s optional stages: ``factory(ctx) -> Component | None``.

Each reads its config section from the ``StageContext`` and returns its stage, or None when
the section is absent (or there is nothing to watch). They are listed, in order, in
daemon.STAGES; a stage's module is imported only when its factory runs, so a sidecar without
`logs:` or `kv_events` never loads the tailer or pyzmq. What one stage hands another goes
through the context: the event log (restarts, changes, resets) and the KV ledger slot.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from cachemon.runtime.context import StageContext

if TYPE_CHECKING:
    from cachemon.runtime.attribution_stage import AttributionStage
    from cachemon.runtime.changes import ChangeDetector
    from cachemon.runtime.cost import CostCollector
    from cachemon.runtime.kv_stage import KvStage
    from cachemon.runtime.logsource import LogSource
    from cachemon.runtime.warmup import WarmupTrigger


def log_stage(ctx: StageContext) -> LogSource | None:
    """Log files -> store: present when `logs:` / --log-file is configured."""
    from cachemon.runtime.logsource import LogSource
    logs = ctx.config.logs
    return LogSource(logs, ctx.store, events=ctx.events) if logs is not None else None


def changes_stage(ctx: StageContext) -> ChangeDetector | None:
    """Models / version / cache-config / tokenizer changes and suspected resets, per polled upstream."""
    from cachemon.runtime.changes import ChangeDetector, EventSettings
    if not ctx.pollers:
        return None
    cfg = ctx.config
    return ChangeDetector(ctx.pollers, ctx.store, EventSettings.of(cfg.events, list(cfg.models)),
                          cfg.poll_interval, events=ctx.events)


def warmup_stage(ctx: StageContext) -> WarmupTrigger | None:
    """Re-warm the cache after a restart or a model change (with `warmup:`)."""
    from cachemon.runtime.warmup import WarmupTrigger
    cfg = ctx.config.warmup
    if cfg is None or not ctx.pollers:
        return None
    return WarmupTrigger(cfg, {p.upstream.name: p for p in ctx.pollers}, ctx.events)


def cost_stage(ctx: StageContext) -> CostCollector | None:
    """Estimated cost counters (with `cost:`)."""
    from cachemon.runtime.cost import CostCollector
    model = ctx.config.cost
    return CostCollector(ctx.store, model) if model else None


def kv_stage(ctx: StageContext) -> KvStage | None:
    """KV-cache event streams -> the ledger; None (and no import of zmq or msgspec) when no upstream
    has ``kv_events``. Fills ``ctx.kv`` with the fleet ledger, which attribution reads."""
    from cachemon.runtime.kv_stage import KvStage, fleet_ledger, ledger_collectors, ledger_factory
    upstreams = [u for u in ctx.config.upstreams if u.kv_events is not None]
    if not upstreams:
        return None
    settings = ctx.config.kv_events
    sink = (ctx.kv_sink_factory or ledger_factory)(settings)
    ctx.kv.ledger = fleet_ledger(sink)
    return KvStage(upstreams, settings, sink, ctx.store, collectors=ledger_collectors(sink), events=ctx.events)


def attribution_stage(ctx: StageContext) -> AttributionStage | None:
    """Why the hit ratio is low: reads the store, the event log and the KV ledger slot."""
    from cachemon.runtime.attribution_stage import (
        AttributionSettings,
        AttributionStage,
        Attributor,
        model_thresholds,
    )
    if not ctx.pollers:
        return None
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
    return AttributionStage(Attributor(ctx.store, settings, ctx.events, ctx.kv.view), cfg.poll_interval)
