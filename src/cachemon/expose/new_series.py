"""New series start at zero: a label set's counters are served at 0 for a while before their values.

Prometheus' ``rate()`` and ``increase()`` only see what a counter gained between two samples. A series
that first appears already counting (a tenant's first store: the ledger makes its row when the tenant is
first seen) has no earlier sample, so its first increments are lost to every rule that reads it: on the
real ``tenants_alert`` capture the healthy tenants' hit ratio read 1.0 where the exact figure is 0.95,
the first cold stores, the very misses that matter, gone (docs/kv-events.md, "Tenants and adapters").

The fix is the usual one for exporters: show the series at 0 before it counts. Here, at the level of a
*group* (one label set's counters, e.g. a tenant's stored tokens by every reason and its hits, or a
replica's; expose/kv_collector.py lists the ledger's groups): the first
render that sees a group starts its hold; until ``hold`` seconds have passed, every render serves all of
the group's counters at 0; from then on, their true values. Time-based, not "the first scrape", so that
every scraper sees the zero: an HA pair of Prometheus servers (or any scrapers) scrapes the same sidecar,
each once per scrape interval, and each one's scrape falls inside a hold longer than its interval.

What is served is always a true count as of some instant: 0 is the group's count before it was first
seen, and after the hold the count now. Nothing is invented, only delayed, by ``hold`` at most and only
for a group's start; per series, values go down only where the source's do. A group whose source counters
go down (a reset at the source; the ledger's never do) is held at 0 again: Prometheus reads that as a
counter reset and counts the new values from 0, which is what they are. A cachemon restart starts every
group over at 0 (a reset, then the new process's counts after the hold). ``hold`` 0: values at once (the
old behaviour). ``cachemon check`` reads the ledger, not this: its figures are exact and immediate.

A group may continue another's counts under a new label set: the ledger keeps a replica's counts (its
own, its tiers', its tenants') when the replica comes back serving another model, so e.g. (replica, new
model, tenant, adapter) appears with the old model's history in it. Holding it at 0 would have rate()
count that history as the new model's traffic; such a group (``lineage``: e.g. the same replica, tenant
and adapter, already released) is served at once, as a new series was before (its first increments under
the new model are lost, none invented).

Groups are remembered for the life of the process (a group that vanished and came back with its counts
is a continuation, not a new series: holding it at 0 again would count its history twice). Their number
is bounded by the ledger's own rows (replicas x models x tenant and adapter pairs, top-K bounded, and
x tiers).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Sequence

Values = tuple[float, ...]


class NewSeriesHold:
    def __init__(self, hold: float, clock: Callable[[], float] = time.monotonic) -> None:
        if hold < 0:
            raise ValueError(f"hold must be >= 0 seconds, got {hold}")
        self.hold = hold
        self.clock = clock
        self._lock = threading.Lock()        # renders may run in more than one thread
        self._since: dict[Hashable, float] = {}     # held groups: when a render first saw them
        self._shown: dict[Hashable, Values] = {}    # released groups: the values last served
        self._lineages: set[Hashable] = set()       # lineages of released groups

    def begin(self) -> float:
        """The instant of one render (every group of a render is judged at the same instant)."""
        return self.clock()

    def values(self, key: Hashable, values: Sequence[float], now: float, lineage: Hashable = None) -> Values:
        """What to serve for group ``key`` whose true counters are ``values`` now. ``lineage``: what
        carries its counts over from an earlier group (None: nothing does)."""
        vals = tuple(values)
        with self._lock:
            last = self._shown.get(key)
            if last is not None:
                if len(last) == len(vals) and all(v >= w for v, w in zip(vals, last, strict=True)):
                    self._shown[key] = vals
                    return vals
                del self._shown[key]         # a reset at the source: start over, from 0
            elif key not in self._since and lineage is not None and lineage in self._lineages:
                self._shown[key] = vals      # the counts of a released group under new labels
                return vals
            since = self._since.setdefault(key, now)
            if now - since < self.hold:
                return (0.0,) * len(vals)
            del self._since[key]
            self._shown[key] = vals
            if lineage is not None:
                self._lineages.add(lineage)
            return vals

    def held(self) -> int:
        """Groups served at 0 right now (tests, debugging)."""
        with self._lock:
            return len(self._since)
