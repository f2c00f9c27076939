"""The KV-event ledger's families, built at scrape time from ``FleetLedger.snapshot()``.

The ledger keeps plain ints and per-bucket counts (state/ledger/fleet.py); they become families
only when Prometheus asks, like the store's collector. Names and labels are the catalog's.

Every counter family of the ledger starts each group at 0 (expose/new_series.py), so ``rate()`` counts a
group's first increments: its counters are served at 0 for ``hold`` seconds after a render first sees it.
The groups, one hold for all (their keys tagged apart): a replica and model's counters (stored tokens by
reason, reused tokens, and the block-lifetime and divergence-depth histograms: their buckets, _sum and _count
are counters, born counting as the rest are, and ``rate()`` of them, an eviction or store rate, a quantile
of the last minutes, would lose the same first observations); a replica's anomalies by kind and history
evictions; a replica, model and tier's counters; a tenant and adapter's counters on one replica; a
replica's label overflow. Gauges (cached blocks, in sync, the sliding window) are served as they are.
A replica back with another model keeps its counts (state/ledger/fleet.py): its (replica, model) and tier
groups name the replica as their lineage, so they continue at once (new_series.py).
"""
from __future__ import annotations

from collections.abc import Iterator

from cachemon import catalog as C
from cachemon.expose.new_series import NewSeriesHold
from cachemon.expose.render import Family, format_labels
from cachemon.state.ledger.fleet import REASONS, FleetLedger


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
        hold = self.hold
        for s in snaps:
            um = format_labels(C.KV_CACHED_BLOCKS.labels, (s.replica, s.model))
            life, dep = s.lifetime.cumulative(), s.depth.cumulative()
            vals = hold.values(("ledger", s.replica, s.model),
                                [s.stored_tokens[r] for r in REASONS] + [s.reused_tokens]
                                + [c for _, c in life] + [s.lifetime.sum] + [c for _, c in dep] + [s.depth.sum],
                                now, lineage=("ledger", s.replica))
            k = len(REASONS)
            for reason, v in zip(REASONS, vals[:k], strict=True):
                stored.put(C.KV_STORED_TOKENS, (s.replica, s.model, reason), v)
            reused.put(C.KV_REUSED_TOKENS, (s.replica, s.model), vals[k])
            k += 1
            for fam, h in ((lifetime, life), (depth, dep)):
                buckets = list(zip((b for b, _ in h), vals[k:k + len(h)], strict=True))
                fam.add_histogram(um, buckets, vals[k + len(h)], buckets[-1][1])    # _count: the +Inf bucket
                k += len(h) + 1
            cached.add(um, float(s.cached_blocks))
            in_sync.put(C.KV_LEDGER_IN_SYNC, (s.replica,), 1.0 if s.in_sync else 0.0)
            if s.sliding_window:
                window.put(C.KV_SLIDING_WINDOW, (s.replica, s.model), float(s.sliding_window))
            *kinds, shown_evicted = hold.values(("replica", s.replica), [n for _, n in s.anomalies]
                                                + [float(s.history_evicted)], now)
            for (kind, _), n in zip(s.anomalies, kinds, strict=True):
                anomalies.put(C.KV_LEDGER_ANOMALIES, (s.replica, kind), n)
            evicted.put(C.KV_HISTORY_EVICTED, (s.replica,), shown_evicted)
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
                labels = (s.replica, s.model, t.medium)
                t_s, t_r, t_h = hold.values(("tier",) + labels, (t.stored_blocks, t.removed_blocks, t.hit_tokens),
                                            now, lineage=("tier", s.replica, t.medium))
                tier_stored.put(C.KV_TIER_STORED_BLOCKS, labels, t_s)
                tier_removed.put(C.KV_TIER_REMOVED_BLOCKS, labels, t_r)
                tier_hits.put(C.KV_TIER_HIT_TOKENS, labels, t_h)
        yield from (stored, reused, cached, in_sync, lifetime, depth, evicted, anomalies, t_stored, t_hits, t_over,
                    tier_stored, tier_removed, tier_hits, window)
