"""The KV-event ledger's families, built at scrape time from ``FleetLedger.snapshot()``.

The ledger keeps plain ints and per-bucket counts (state/kv_ledger.py); they become families
only when Prometheus asks, like the store's collector. Names and labels are the catalog's.

The per-tenant families start each group at 0 (expose/new_series.py): a tenant and adapter's counters on
one replica, and a replica's label overflow, are served at 0 for ``hold`` seconds after a render first sees
them, so ``rate()`` counts their first increments.
"""
from __future__ import annotations

from collections.abc import Iterator

from cachemon import catalog as C
from cachemon.expose.new_series import NewSeriesHold
from cachemon.expose.render import Family, format_labels
from cachemon.state.kv_ledger import REASONS, FleetLedger


class KvLedgerCollector:
    def __init__(self, fleet: FleetLedger, hold: NewSeriesHold | None = None) -> None:
        self.fleet = fleet
        self.hold = hold if hold is not None else NewSeriesHold(0.0)

    def collect(self) -> Iterator[Family]:
        snaps = self.fleet.snapshot()
        now = self.hold.begin()
        stored = Family.of(C.KV_STORED_TOKENS)
        reused = Family.of(C.KV_REUSED_TOKENS)
        cached = Family.of(C.KV_CACHED_BLOCKS)
        in_sync = Family.of(C.KV_LEDGER_IN_SYNC)
        lifetime = Family.of(C.KV_BLOCK_LIFETIME)
        depth = Family.of(C.KV_DIVERGENCE_DEPTH)
        evicted = Family.of(C.KV_HISTORY_EVICTED)
        anomalies = Family.of(C.KV_LEDGER_ANOMALIES)
        t_stored = Family.of(C.KV_TENANT_STORED_TOKENS)
        t_hits = Family.of(C.KV_TENANT_HIT_TOKENS)
        t_over = Family.of(C.KV_TENANT_LABEL_OVERFLOW)
        tier_stored = Family.of(C.KV_TIER_STORED_BLOCKS)
        tier_removed = Family.of(C.KV_TIER_REMOVED_BLOCKS)
        tier_hits = Family.of(C.KV_TIER_HIT_TOKENS)
        window = Family.of(C.KV_SLIDING_WINDOW)
        for s in snaps:
            for reason in REASONS:
                stored.put(C.KV_STORED_TOKENS, (s.replica, s.model, reason), s.stored_tokens[reason])
            reused.put(C.KV_REUSED_TOKENS, (s.replica, s.model), s.reused_tokens)
            um = format_labels(C.KV_CACHED_BLOCKS.labels, (s.replica, s.model))
            cached.add(um, float(s.cached_blocks))
            in_sync.put(C.KV_LEDGER_IN_SYNC, (s.replica,), 1.0 if s.in_sync else 0.0)
            lifetime.add_histogram(format_labels(C.KV_BLOCK_LIFETIME.labels, (s.replica, s.model)),
                                   s.lifetime.cumulative(), s.lifetime.sum, s.lifetime.count)
            depth.add_histogram(format_labels(C.KV_DIVERGENCE_DEPTH.labels, (s.replica, s.model)),
                                s.depth.cumulative(), s.depth.sum, s.depth.count)
            evicted.put(C.KV_HISTORY_EVICTED, (s.replica,), float(s.history_evicted))
            if s.sliding_window:
                window.put(C.KV_SLIDING_WINDOW, (s.replica, s.model), float(s.sliding_window))
            for kind, n in s.anomalies:
                anomalies.put(C.KV_LEDGER_ANOMALIES, (s.replica, kind), n)
            for tenant, adapter, split, hits in s.tenants:
                # lineage: the replica's counts of this pair go on if the replica comes back with another model
                *shown, shown_hits = self.hold.values((s.replica, s.model, tenant, adapter),
                                                      [split[r] for r in REASONS] + [hits], now,
                                                      lineage=(s.replica, tenant, adapter))
                for reason, v in zip(REASONS, shown, strict=True):
                    t_stored.put(C.KV_TENANT_STORED_TOKENS, (s.replica, s.model, tenant, adapter, reason), v)
                t_hits.put(C.KV_TENANT_HIT_TOKENS, (s.replica, s.model, tenant, adapter), shown_hits)
            if s.tenants:
                (over,) = self.hold.values((s.replica,), (s.tenant_overflow,), now)
                t_over.put(C.KV_TENANT_LABEL_OVERFLOW, (s.replica,), over)
            for t in s.tiers:
                tier_stored.put(C.KV_TIER_STORED_BLOCKS, (s.replica, s.model, t.medium), t.stored_blocks)
                tier_removed.put(C.KV_TIER_REMOVED_BLOCKS, (s.replica, s.model, t.medium), t.removed_blocks)
                tier_hits.put(C.KV_TIER_HIT_TOKENS, (s.replica, s.model, t.medium), t.hit_tokens)
        yield from (stored, reused, cached, in_sync, lifetime, depth, evicted, anomalies, t_stored, t_hits, t_over,
                    tier_stored, tier_removed, tier_hits, window)
