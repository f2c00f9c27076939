"""What the routers believed, over time: each configured router's readings (normalise/routers.py) kept
with their times, and the view the judge reads per upstream over the attribution window.

Written by the router stage (runtime/router_stage.py), read by the snapshot builder through
``RouterBook.view``, which the attribution stage is handed (as the KV ledger's view). A router's counters
restart at 0 with the router: a reading below the previous one starts a new history (nothing is
subtracted across a router restart).
"""
from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from cachemon.normalise.routers import RouterKind, RouterReading

MAX_READINGS = 4096


@dataclass(frozen=True)
class RouterView:
    """One router's decisions over a window, as they concern one upstream it fronts."""
    router: str
    kind: str
    evidence: str                     # real | constructed (the router table's row)
    policy: str
    blind_fix: str
    seconds: float                    # the window actually covered
    decisions: Mapping[str, float]    # outcome -> decisions in the window (all upstreams: a decision precedes the choice)
    lookups: Mapping[str, float]      # hit | miss lookups of the router's index in the window
    credited_tokens: float | None     # tokens the router credited on its choices (None: it exports none)
    requests_here: float              # requests the router sent to this upstream in the window (an even
    #                                   share of requests_total where the router counts none per worker)
    requests_total: float             # to every worker
    fronted: int                      # upstreams (workers) the router fronts


@dataclass
class _Router:
    name: str
    kind: RouterKind
    workers: dict[str, str]           # the router's worker label -> upstream name
    fronted: tuple[str, ...]          # upstream names
    readings: deque[tuple[float, RouterReading]] = field(default_factory=lambda: deque(maxlen=MAX_READINGS))
    up: bool = False
    refused: dict[str, float] = field(default_factory=dict)    # reason -> samples not read, since start


def _total(r: RouterReading) -> float:
    return (sum(r.decisions.values()) + sum(r.lookups.values()) + sum(r.per_worker.values()) + (r.credited_tokens or 0)
            + (r.requests or 0))


class RouterBook:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._routers: dict[str, _Router] = {}

    def add(self, name: str, kind: RouterKind, workers: Mapping[str, str], fronted: tuple[str, ...]) -> None:
        with self._lock:
            self._routers[name] = _Router(name, kind, dict(workers), fronted)

    def set_workers(self, name: str, workers: Mapping[str, str]) -> None:
        """The router's worker labels on its newest page, as upstream names (the stage resolves them from the
        config). Replaced, not merged: a page's workers are bounded (normalise/routers.MAX_WORKERS), the
        workers of every page ever read are not."""
        with self._lock:
            self._routers[name].workers = dict(workers)

    def record(self, name: str, t: float, reading: RouterReading | None) -> None:
        """One poll: a reading, or None when the page could not be read."""
        with self._lock:
            r = self._routers[name]
            r.up = reading is not None
            if reading is None:
                return
            for reason, n in reading.refused.items():
                r.refused[reason] = r.refused.get(reason, 0.0) + n
            if r.readings:
                # the previous reading's worker strings, not this page's copies: MAX_READINGS readings of
                # a bounded page (normalise/routers.MAX_WORKERS) must not hold MAX_READINGS copies of each
                same = {w: w for w in r.readings[-1][1].per_worker}
                reading.per_worker = {same.get(w, w): v for w, v in reading.per_worker.items()}
            if r.readings and _total(reading) < _total(r.readings[-1][1]):
                r.readings.clear()          # the router restarted: its counters began again at 0
            r.readings.append((t, reading))

    def routers(self) -> list[tuple[str, RouterKind, bool, RouterReading | None, dict[str, str]]]:
        """(name, kind, up, newest reading, worker -> upstream) of every router, for the exporter."""
        with self._lock:
            return [(r.name, r.kind, r.up, r.readings[-1][1] if r.readings else None, dict(r.workers))
                    for r in self._routers.values()]

    def refused(self) -> list[tuple[str, str, float]]:
        """(router, reason, samples) refused since start: the page's lines past a bound or unreadable."""
        with self._lock:
            return [(r.name, reason, n) for r in self._routers.values() for reason, n in sorted(r.refused.items())]

    def view(self, upstream: str, now: float, window: float) -> RouterView | None:
        """The first router fronting ``upstream``, over the trailing ``window`` (None: no router, or fewer
        than two readings in it)."""
        with self._lock:
            r = next((x for x in self._routers.values() if upstream in x.fronted), None)
            if r is None or len(r.readings) < 2:
                return None
            inside = [p for p in r.readings if p[0] > now - window]
            older = [p for p in r.readings if p[0] <= now - window]
            base = older[-1] if older else r.readings[0]
            t0, old = base
            t1, new = r.readings[-1]
            workers = dict(r.workers)
            fronted = len(r.fronted)
        if not inside and t1 < now - window:
            return None

        def d(a: Mapping[str, float], b: Mapping[str, float]) -> dict[str, float]:
            return {k: max(0.0, v - b.get(k, 0.0)) for k, v in a.items()}

        per = d(new.per_worker, old.per_worker)
        if per:
            here, total = sum(v for w, v in per.items() if workers.get(w) == upstream), sum(per.values())
        else:
            total = max(0.0, (new.requests or 0.0) - (old.requests or 0.0))
            here = total / fronted if fronted else 0.0
        credited = None if new.credited_tokens is None else max(0.0, new.credited_tokens - (old.credited_tokens or 0.0))
        return RouterView(
            router=r.name, kind=r.kind.kind, evidence=r.kind.evidence, policy=new.policy, blind_fix=r.kind.blind_fix,
            seconds=t1 - t0, decisions=d(new.decisions, old.decisions), lookups=d(new.lookups, old.lookups),
            credited_tokens=credited,
            requests_here=here, requests_total=total, fronted=fronted)
