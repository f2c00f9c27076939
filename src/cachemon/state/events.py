"""The event log the daemon's stages share: restarts, cache resets and changes, with their times.

It is the one route by which what one stage saw reaches another, the snapshot builder included.
Publishers: the pollers (a restart that corrected counters), the log source (a prefix-cache reset
vLLM logged), change detection (a model, version, cache-config, tokenizer or chat-template change; a
suspected prefix-cache reset) and the KV-event stage (a stream's sequence went back: a new vLLM
process; every block cleared: a cache reset). Readers subscribe (change detection re-checks at once
after a restart; warm-up runs after a restart or a model change) or read: ``since`` (every event
after a sequence number, while the ring still holds it) or ``latest`` (the newest event of each
(kind, detail) of an upstream, kept whatever the ring has dropped; what the snapshot builder reads).

Thread-safe: every stage publishes from its own thread. Subscribers are called on the
publisher's thread, after the log's lock is released, so they must return quickly.
"""
from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum

log = logging.getLogger("cachemon.events")

DEFAULT_CAPACITY = 1024       # events held for ``since``; ``latest`` keeps one per (upstream, kind, detail)


class EventKind(str, Enum):
    RESTART = "restart"                            # poller: an upstream restart corrected counters
    CACHE_RESET = "cache_reset"                    # log source: vLLM logged a prefix-cache reset (upstream: the log)
    CHANGE = "change"                              # change detection; detail: model, version, cache_config, ...
    CACHE_RESET_SUSPECTED = "cache_reset_suspected"   # change detection's reset heuristic (ResetDetector)


@dataclass(frozen=True)
class StageEvent:
    seq: int              # 1, 2, ... in publishing order
    kind: EventKind
    upstream: str         # the upstream (or KV-event replica) it happened to
    at: float             # wall-clock seconds
    detail: str = ""      # CHANGE: what changed; RESTART: why the counters were corrected


Subscriber = Callable[[StageEvent], None]


class EventLog:
    """Bounded, typed, thread-safe record of what the stages saw."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self._lock = threading.Lock()
        self._ring: deque[StageEvent] = deque(maxlen=capacity)
        self._latest: dict[tuple[str, EventKind, str], StageEvent] = {}
        self._subscribers: list[tuple[frozenset[EventKind], Subscriber]] = []
        self._seq = 0

    def subscribe(self, kinds: Iterable[EventKind], fn: Subscriber) -> None:
        """Call ``fn`` with every later event of these kinds."""
        with self._lock:
            self._subscribers.append((frozenset(kinds), fn))

    def publish(self, kind: EventKind, upstream: str, at: float, detail: str = "") -> StageEvent:
        with self._lock:
            self._seq += 1
            ev = StageEvent(self._seq, kind, upstream, at, detail)
            self._ring.append(ev)
            self._latest[(upstream, kind, detail)] = ev
            subscribers = [fn for kinds, fn in self._subscribers if kind in kinds]
        for fn in subscribers:
            try:
                fn(ev)
            except Exception:     # one stage's bug must not stop the publishing stage
                log.exception("event subscriber failed on %s of %s", kind.value, upstream)
        return ev

    @property
    def last_seq(self) -> int:
        """The sequence number of the newest event (0: none yet)."""
        with self._lock:
            return self._seq

    def since(self, seq: int = 0) -> list[StageEvent]:
        """Events published after ``seq`` that the ring still holds, oldest first."""
        with self._lock:
            return [e for e in self._ring if e.seq > seq]

    def latest(self, upstream: str, kinds: Iterable[EventKind]) -> list[StageEvent]:
        """The newest event of each (kind, detail) of ``upstream``, in the order each was first seen."""
        want = frozenset(kinds)
        with self._lock:
            return [e for (u, k, _), e in self._latest.items() if u == upstream and k in want]
