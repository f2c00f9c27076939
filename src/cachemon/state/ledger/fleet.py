"""The miss ledger of a fleet: every followed replica's ``ReplicaLedger``, grouped by model.

The KvSink of runtime/kv_stage.py (docs/kv-events.md): ``on_batch`` comes from the source threads,
``view`` / ``snapshot`` from the scrape and attribution threads; one lock, held per batch.

Two reasons need the model's whole fleet, so its replicas share two fleet indexes (state/ledger/index.py):
the routing index (the content each replica caches) from the model's second replica on, and, with
per-tenant accounting and ``kv_events.isolation``, the isolation index (the token content of every cached
copy) from the second key (salt, adapter) a model's chain heads carry: a model that only ever serves one
key, or runs on one replica, pays for neither.
The parts: replica.py (one replica), records.py (the packed records), reasons.py (the reasons),
dynamic.py (the dynamic-prefix signature), tenants.py (tenants and adapters), tiers.py (other media),
groups.py (a hybrid model's other groups), index.py (the fleet indexes).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from cachemon.normalise.kv_batch import POOL_MEDIA, KvBatch, Stored
from cachemon.state.ledger.dynamic import DynamicPrefix
from cachemon.state.ledger.histogram import Histogram
from cachemon.state.ledger.index import FleetIndex, new_index
from cachemon.state.ledger.reasons import DEFAULT_HISTORY_BLOCKS, REASONS, Reason
from cachemon.state.ledger.replica import DEFAULT_MAX_BLOCKS, DEPTH_BUCKETS, LIFETIME_BUCKETS, ReplicaLedger
from cachemon.state.ledger.tenants import TenantBook, TenantLabels

__all__ = [
    "DEFAULT_HISTORY_BLOCKS",
    "DEFAULT_MAX_BLOCKS",
    "DEPTH_BUCKETS",
    "LIFETIME_BUCKETS",
    "REASONS",
    "DynamicPrefix",
    "FleetLedger",
    "Histogram",
    "LedgerView",
    "Reason",
    "ReplicaLedger",
    "ReplicaSnapshot",
    "TenantLabels",
]


@dataclass(frozen=True)
class LedgerView:
    model: str
    in_sync: bool
    stored_tokens: dict[str, float]          # reason -> cumulative tokens (the counter's values)
    cached_blocks: int
    dynamic_prefix: DynamicPrefix | None     # the signature, while it holds
    sliding_window: int | None = None        # a sliding-window group's window (tokens) named by the events
    tier_hit_tokens: float = 0.0             # GPU stores of blocks another tier held (loads seen, cumulative)


@dataclass(frozen=True)
class TierSnapshot:
    medium: str
    stored_blocks: float
    removed_blocks: float
    hit_tokens: float                        # GPU stores of blocks this tier held (loaded, not computed)


@dataclass(frozen=True)
class ReplicaSnapshot:
    """Everything the collector exports for one replica, copied under the lock."""
    replica: str
    model: str
    in_sync: bool
    stored_tokens: dict[str, float]
    cached_blocks: int
    history_evicted: int
    lifetime: Histogram
    depth: Histogram
    reused_tokens: float = 0.0               # hit tokens of full-report requests (reuse reports)
    anomalies: tuple[tuple[str, float], ...] = ()
    tenants: tuple[tuple[str, str, dict[str, float], float], ...] = ()   # (tenant, adapter, stored, reused)
    tenant_overflow: float = 0.0
    tiers: tuple[TierSnapshot, ...] = ()
    sliding_window: int | None = None        # a sliding-window group's window (tokens) named by the events


class FleetLedger:
    def __init__(self, *, max_blocks: int = DEFAULT_MAX_BLOCKS, history_blocks: int = DEFAULT_HISTORY_BLOCKS,
                 keep_text: bool = False, tenants: TenantLabels | None = None, isolation: bool = True,
                 index: Callable[[], FleetIndex] = new_index, full_reports: bool | None = None) -> None:
        self.lock = threading.Lock()
        self._new_index = index                             # the fleet indexes' maker (index.py: compiled or not)
        self._max_blocks, self._history_blocks, self._keep_text = max_blocks, history_blocks, keep_text
        self._full_reports = full_reports                   # kv_events.full_reports (None: auto)
        self._book = TenantBook(tenants) if tenants is not None else None
        self._isolation = isolation and tenants is not None    # the isolation reason (kv_events.isolation)
        self._replicas: dict[str, ReplicaLedger] = {}
        self._models: dict[str, list[ReplicaLedger]] = {}
        self._routing: dict[str, FleetIndex] = {}           # per model with 2+ replicas
        self._isolation_index: dict[str, FleetIndex] = {}   # per model with 2+ keys (isolation on)
        self._first_key: dict[str, object] = {}             # the first chain head's key per model

    def _ledger(self, replica: str, model: str) -> ReplicaLedger:
        led = self._replicas.get(replica)
        if led is None:
            led = self._replicas[replica] = ReplicaLedger(
                replica, model, max_blocks=self._max_blocks, history_blocks=self._history_blocks,
                keep_text=self._keep_text, tenants=self._book, full_reports=self._full_reports,
                isolation=self._isolation)
            self._join(led)
        elif led.model != model and model:
            self._leave(led)
            led.model = model
            self._join(led)
        return led

    def _join(self, led: ReplicaLedger) -> None:
        group = self._models.setdefault(led.model, [])
        group.append(led)
        routing = self._routing.get(led.model)
        if routing is None and len(group) == 2:
            # A second replica: from now on the model needs the index of what each one caches.
            routing = self._routing[led.model] = self._new_index()
            group[0].join_indexes(routing, group[0].isolation_index)
        led.join_indexes(routing, self._isolation_index.get(led.model))

    def _leave(self, led: ReplicaLedger) -> None:
        group = self._models[led.model]
        group.remove(led)
        led.leave_indexes()
        led.routing = led.isolation_index = None
        if len(group) < 2:
            for other in group:
                other.routing = None
            self._routing.pop(led.model, None)
        if not group:
            del self._models[led.model]
            self._isolation_index.pop(led.model, None)

    def _watch_keys(self, led: ReplicaLedger, batch: KvBatch) -> None:
        """Isolation on, the model's index not made yet: at a chain head of the model's second key (its first
        block's extra keys, its adapter), make the index, holding every replica's cached token content (salted
        and adapter blocks carry theirs from their store on, so it starts complete). A head whose first block
        is cached here is a reuse report or a recompute of cached blocks, whose key is a cached one's: skipped."""
        cached = led.cached_hashes()
        for ev in batch.events:
            if type(ev) is not Stored or ev.parent is not None or not ev.hashes or ev.medium not in POOL_MEDIA \
                    or ev.hashes[0] in cached:
                continue
            key = (ev.extra[0] if ev.extra else None, ev.lora)
            if self._first_key.setdefault(led.model, key) != key:
                index = self._isolation_index[led.model] = self._new_index()
                for member in self._models[led.model]:
                    member.join_indexes(member.routing, index)
                return

    # --- KvSink ----------------------------------------------------------------------------
    def on_batch(self, replica: str, model: str, batch: KvBatch, at: float) -> None:
        with self.lock:
            led = self._ledger(replica, model)
            if self._isolation and led.isolation_index is None:
                self._watch_keys(led, batch)
            led.apply(batch, at)

    def on_restart(self, replica: str, at: float) -> None:
        with self.lock:
            led = self._replicas.get(replica)
            if led is not None:
                led.restart(at)

    def on_lost(self, replica: str, _batches: int, _at: float, /) -> None:
        """How many batches and when do not matter here: the replica's ledger is out of sync until
        its next restart (kv_stage.KvSink)."""
        with self.lock:
            led = self._replicas.get(replica)
            if led is not None:
                led.lost()

    # --- reading ---------------------------------------------------------------------------
    def view(self, replica: str, now: float | None = None) -> LedgerView | None:
        with self.lock:
            led = self._replicas.get(replica)
            if led is None:
                return None
            led.dyn.expire(led.last_at if now is None else now)
            return LedgerView(led.model, led.in_sync, led.stored_tokens(), len(led._cached), led.dyn.current(),
                              led.side.window, float(led.tiers.seen_tokens()))

    def snapshot(self) -> list[ReplicaSnapshot]:
        with self.lock:
            return [_snapshot(led) for led in self._replicas.values()]

    def text_samples(self, replica: str) -> list[tuple[int, ...]]:
        """keep_text only: token ids of example blocks where requests diverge (for ``check --show-text``)."""
        with self.lock:
            led = self._replicas.get(replica)
            return [] if led is None else list(led.dyn.samples)

    def replica(self, replica: str) -> ReplicaLedger | None:
        """The replica's ledger itself (tests, benchmarks; callers hold ``lock``)."""
        return self._replicas.get(replica)


def _snapshot(led: ReplicaLedger) -> ReplicaSnapshot:
    t, tr = led.tenants, led.tiers
    if tr.pending:
        tr.settle(time.time())       # loads no tier store disproved within SETTLE_S: the tier's hits
    tiers = tuple(TierSnapshot(m, float(tr.stored.get(m, 0)), float(tr.removed.get(m, 0)), float(tr.hit_tokens.get(m, 0)))
                  for m in sorted(tr.stored.keys() | tr.removed.keys()))
    return ReplicaSnapshot(
        led.replica, led.model, led.in_sync, led.stored_tokens(), len(led._cached), led.history_evicted,
        led.lifetime.copy(), led.depth.copy(), float(led.reused_tokens),
        tuple((k, float(v + (tr.overflow if k == "overflow_blocks" else 0))) for k, v in led.anomalies.items())
        + (("tier_unannounced_clears", float(tr.unannounced_clears)), ("tier_overflow", float(tr.refused))),
        tuple(t.rows()) if t is not None else (), float(t.overflow) if t is not None else 0.0, tiers,
        led.side.window)
