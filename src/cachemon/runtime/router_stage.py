"""The router stage (``routers:``): poll each router's /metrics, keep its readings in the router book
(state/routers.py) for the judge, and export its decisions under cachemon's names (catalog/routers.py).

A router names its workers by URL (vllm-router: ``worker="http://host:port"``); a worker is matched
to the upstream whose /metrics URL has the same scheme, host and port, or by ``routers[].workers``.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from urllib.parse import urlsplit

from cachemon import catalog as C
from cachemon.config import Upstream
from cachemon.config.routers import RouterEntry
from cachemon.expose.render import Family
from cachemon.normalise.routers import KINDS, MAX_POLICIES, OUTCOMES, RouterKind, read_page
from cachemon.runtime.component import LoopStage
from cachemon.sources import hints
from cachemon.sources.scrape import FetchError, fetch_text, new_session
from cachemon.state.routers import RouterBook
from cachemon.urls import redact_url

log = logging.getLogger("cachemon.routers")
MAX_PAGE_BYTES = 4 * 1024 * 1024
NOT_A_ROUTER_PAGE = "not_a_router_page"     # a page that names none of the router kind's families


def _families(kind: RouterKind) -> list[str]:
    return [n for n in (kind.decisions, kind.lookups, kind.credited_tokens, kind.best_tokens, kind.per_worker,
                        kind.requests, kind.policy_family) if n]


def not_a_router_page(e: RouterEntry, text: str) -> str:
    """Why the page of router ``e`` is not its router's (one line), or "" when it names one of the families
    its kind reads (even without a sample yet)."""
    kind = KINDS[e.kind]
    wanted = _families(kind)
    if any(n in text for n in wanted):
        return ""
    if hints.cachemon_page(text, e.url):
        what = "it is a cachemon's own /metrics"
    elif "vllm:" in text:
        what = "it is a vLLM engine's /metrics, not the router's"
    else:
        what = "no router family at all"
    return (f"{redact_url(e.url)} names none of the {e.kind} families cachemon reads ({', '.join(wanted)}): {what} "
            f"— routers[{e.name}].url must be the router's Prometheus page and routers[{e.name}].kind its kind "
            "(docs/configuration.md, Routers)")


def _origin(url: str) -> str:
    p = urlsplit(url)
    return f"{p.scheme}://{(p.hostname or '').lower()}:{p.port or (443 if p.scheme == 'https' else 80)}"


def worker_map(entry: RouterEntry, upstreams: Sequence[Upstream]) -> Callable[[str], str]:
    """The router's worker label -> the upstream's name (the label itself when no upstream matches)."""
    by_origin = {_origin(u.url): u.name for u in upstreams}

    def name(worker: str) -> str:
        if worker in entry.workers:
            return entry.workers[worker]
        try:
            return by_origin.get(_origin(worker), worker)
        except ValueError:
            return worker
    return name


class RouterStage(LoopStage):
    thread_name = "routers"

    def __init__(self, routers: Sequence[RouterEntry], upstreams: Sequence[Upstream], book: RouterBook,
                 interval: float, clock: Callable[[], float] = time.time,
                 routing_tokens: Callable[[str], float] | None = None) -> None:
        self.entries = list(routers)
        self.book = book
        self.interval = interval
        self.clock = clock
        self.session = new_session()
        self.names = {e.name: worker_map(e, upstreams) for e in self.entries}
        self.fronted: dict[str, tuple[str, ...]] = {}
        for e in self.entries:
            self.fronted[e.name] = tuple(e.upstreams) or tuple(u.name for u in upstreams)
            book.add(e.name, KINDS[e.kind], {}, self.fronted[e.name])
        # the KV ledger's `routing` tokens of an upstream (None: no KV events), split by the router's policy
        self.routing_tokens = routing_tokens
        self.routing_seen: dict[str, float] = {}
        self.routing_by_policy: dict[tuple[str, str], float] = {}
        self._said: dict[str, str] = {}         # router -> the reason of the failure last logged

    def poll_once(self) -> None:
        for e in self.entries:
            now = self.clock()
            try:
                text = fetch_text(self.session, e.url, e.timeout, MAX_PAGE_BYTES,
                                  expect=hints.router_endpoint(e.name, e.kind))
            except FetchError as err:
                # said when it changes, not at every poll (a router down for a day at 1 s polls is one
                # line, as an upstream is: runtime/poller.py)
                if self._said.get(e.name) != err.reason:
                    log.warning("router %s: %s (%s)", e.name, err, err.reason)
                self._said[e.name] = err.reason
                self.book.record(e.name, now, None)
                continue
            wrong = not_a_router_page(e, text)
            if wrong:                   # read all the same (nothing of it is taken): said once, as a failure is
                if self._said.get(e.name) != NOT_A_ROUTER_PAGE:
                    log.warning("router %s: %s", e.name, wrong)
                self._said[e.name] = NOT_A_ROUTER_PAGE
            elif self._said.pop(e.name, ""):
                log.info("router %s is back up", e.name)
            self.feed(e, now, text)

    def feed(self, e: RouterEntry, now: float, text: str) -> None:
        """One page of router ``e``: its reading, with its workers named as upstreams."""
        reading = read_page(KINDS[e.kind], text)
        name = self.names[e.name]
        self.book.set_workers(e.name, {w: name(w) for w in reading.per_worker})
        self.book.record(e.name, now, reading)
        if self.routing_tokens is not None:
            # what routing cost since the last poll goes to the policy the router names now (the ledger is
            # as old as this stage: its tokens before the first poll are the first policy's)
            total = sum(self.routing_tokens(u) for u in self.fronted[e.name])
            new = max(0.0, total - self.routing_seen.get(e.name, 0.0))
            self.routing_seen[e.name] = total
            key = (e.name, reading.policy or "unknown")     # a page names its policy from its first decision
            if key not in self.routing_by_policy and \
                    sum(k[0] == e.name for k in self.routing_by_policy) >= MAX_POLICIES:
                key = (e.name, "other")     # a router whose policy churns: bounded series, the tokens kept
            if new > 0 or reading.policy:
                self.routing_by_policy[key] = self.routing_by_policy.get(key, 0.0) + new

    def _loop(self, stop: threading.Event) -> None:
        while True:
            try:
                self.poll_once()
            except Exception:          # one bad round must not end the stage
                log.exception("routers: unexpected error")
            if stop.wait(self.interval):
                return


    def collect(self) -> Iterator[Family]:
        up, info = Family.of(C.ROUTER_UP), Family.of(C.ROUTER_INFO)
        decisions, lookups = Family.of(C.ROUTER_PREFIX_DECISIONS), Family.of(C.ROUTER_INDEX_LOOKUPS)
        credited, requests = Family.of(C.ROUTER_CREDITED_TOKENS), Family.of(C.ROUTER_REQUESTS)
        routing, refused = Family.of(C.ROUTER_ROUTING_TOKENS), Family.of(C.ROUTER_REFUSED_SAMPLES)
        for name, reason, n in self.book.refused():
            refused.put(C.ROUTER_REFUSED_SAMPLES, (name, reason), n)
        for key, v in sorted(self.routing_by_policy.items()):
            routing.put(C.ROUTER_ROUTING_TOKENS, key, v)
        for name, kind, is_up, reading, workers in self.book.routers():
            up.put(C.ROUTER_UP, (name,), 1.0 if is_up else 0.0)
            info.put(C.ROUTER_INFO, (name, kind.kind, reading.policy if reading else "", kind.evidence), 1.0)
            if reading is None:
                continue
            if kind.decisions:
                for outcome in OUTCOMES:
                    decisions.put(C.ROUTER_PREFIX_DECISIONS, (name, outcome), reading.decisions.get(outcome, 0.0))
            if kind.lookups:
                for result in ("hit", "miss"):
                    lookups.put(C.ROUTER_INDEX_LOOKUPS, (name, result), reading.lookups.get(result, 0.0))
            if reading.credited_tokens is not None:
                credited.put(C.ROUTER_CREDITED_TOKENS, (name,), reading.credited_tokens)
            per: dict[str, float] = {}
            for w, v in reading.per_worker.items():
                per[workers.get(w, w)] = per.get(workers.get(w, w), 0.0) + v
            for target, v in sorted(per.items()):
                requests.put(C.ROUTER_REQUESTS, (name, target), v)
        yield from (up, info, decisions, lookups, credited, requests, routing, refused)
