"""The cardinality guard of one upstream: at most ``max_series`` (model_name, engine) label sets are
kept; a label set unseen for ``evict_after`` seconds is evicted with all its series, which frees its
slot, and under pressure one seen on fewer than ESTABLISHED polls and absent from the page (churn)
gives its slot up at once. A label set refused on one poll and on the page again on the next
persists: it takes the slot of an admitted one absent from the page, however established, so a
model that stays gets a slot within two polls of churn. The guard decides; the upstream's state
drops the series of what it let go (``evict``'s result and ``take_victims``)."""
from __future__ import annotations

import logging

from cachemon import catalog as C
from cachemon.normalise.updates import REJECT_BUDGET, Update
from cachemon.state.views import Ident

# Label sets seen on at least this many polls are established: never evicted early for a new one.
ESTABLISHED = 3
# Refused label sets remembered (times max_series), so each is counted once: the parser's
# label-set budget reads at most 2 x max_series label sets a page, so a page refused again and
# again stays in memory.
REFUSED_MEMORY = 8
REFUSAL_LOG_EVERY = 600.0
log = logging.getLogger("cachemon.state")


class CardinalityGuard:
    def __init__(self, name: str, max_series: int, evict_after: float):
        self.name = name
        self.max_series = max_series
        self.evict_after = evict_after
        self.idents: dict[Ident, list[float]] = {}     # admitted label set -> [last seen, polls seen]
        self._refused: dict[Ident, float] = {}         # refused ones, oldest first: counted once each
        self._waiting: dict[Ident, int] = {}           # refused ones: polls they were refused on
        self.overflow_total = 0
        self.overflow_new = 0                           # refused on the current apply
        self.evicted_total = 0
        self._cands: list[tuple[float, float, Ident]] = []
        self._cands_at: float | None = None
        self._victims: set[Ident] = set()
        self._refusal_logged: float | None = None

    @property
    def any_refused(self) -> bool:
        return bool(self._refused)

    def take_victims(self) -> set[Ident]:
        """Label sets that gave their slot up since the last call (their series are to be dropped)."""
        victims, self._victims = self._victims, set()
        return victims

    def admit(self, ident: Ident, now: float) -> bool:
        seen = self.idents.get(ident)
        if seen is not None:
            if seen[0] != now:
                seen[0] = now
                seen[1] += 1
            return True
        if len(self.idents) >= self.max_series and not self._make_room(now):
            refused = self._refused
            if ident not in refused:
                self.overflow_total += 1
                self.overflow_new += 1
                if len(refused) >= REFUSED_MEMORY * self.max_series:   # bounded memory: forget the oldest
                    del refused[next(iter(refused))]
            if refused.pop(ident, None) != now:      # refreshed: the oldest-refused is forgotten first
                self._waiting[ident] = self._waiting.get(ident, 0) + 1
            refused[ident] = now
            return False
        self.idents[ident] = [now, 1]
        return True


    def _make_room(self, now: float) -> bool:
        """Under pressure a label set seen on fewer than ESTABLISHED polls and absent from this
        one (churn: a name that came once and went) gives its slot to a new one at once, rather
        than after evict_after: churn must not keep a real model out. Label sets seen on more
        polls keep theirs until evict_after."""
        if self._cands_at != now:
            self._cands_at = now
            self._cands = sorted(((v[1], v[0], i) for i, v in self.idents.items()
                                  if v[0] < now and v[1] < ESTABLISHED), reverse=True)
        while self._cands:
            _, _, victim = self._cands.pop()
            v = self.idents.get(victim)
            if v is not None and v[0] < now:
                del self.idents[victim]
                self._victims.add(victim)
                self.evicted_total += 1
                return True
        return False


    def admit_waiting(self, on_page: set[Ident], now: float) -> None:
        """Label sets refused on an earlier poll and on this page again (they persist) get the slots
        of admitted ones absent from this page, however many polls those were seen on: churn that
        lived a few polls must not hold its slots for evict_after while a model that stays waits.
        The longest-waiting first; the victims least recently seen first; an admitted label set on
        the page is never displaced. Runs before new label sets ask for room."""
        refused = self._refused
        waiting = sorted(((self._waiting.get(i, 0), i) for i in on_page if refused.get(i, now) < now), reverse=True)
        if not waiting:
            return
        idents = self.idents
        victims = sorted((v[0], i) for i, v in idents.items() if v[0] < now)
        victims.reverse()
        for _, ident in waiting:
            if len(idents) >= self.max_series:
                if not victims:
                    return
                _, victim = victims.pop()
                del idents[victim]
                self._victims.add(victim)
                self.evicted_total += 1
            idents[ident] = [now, 1]
            del refused[ident]
            self._waiting.pop(ident, None)


    def evict(self, now: float) -> set[Ident]:
        """Forget label sets unseen for evict_after; returns them (their series are to be dropped)."""
        cutoff = now - self.evict_after
        gone = {i for i, t in self.idents.items() if t[0] < cutoff}
        self._refused = {i: t for i, t in self._refused.items() if t >= cutoff}
        if len(self._waiting) > len(self._refused):
            self._waiting = {i: n for i, n in self._waiting.items() if i in self._refused}
        if not gone:
            return gone
        self.evicted_total += len(gone)
        for i in gone:
            del self.idents[i]
        return gone

    def log_refusals(self, upd: Update, now: float) -> None:
        """Say once (then at most every REFUSAL_LOG_EVERY seconds) per upstream that label sets
        are refused: the counters say how many."""
        skipped = upd.rejected.get(REJECT_BUDGET, 0)
        if not (self.overflow_new or skipped):
            return
        if self._refusal_logged is not None and now - self._refusal_logged < REFUSAL_LOG_EVERY:
            return
        self._refusal_logged = now
        log.warning("upstream %s: %d new (model_name, engine) label set(s) refused: max_series_per_upstream=%d "
                    "reached%s; counted in %s%s", self.name, self.overflow_new, self.max_series,
                    f", and {skipped} sample(s) of further label sets not read (label-set budget)" if skipped else "",
                    C.SERIES_OVERFLOW.sample_name,
                    f" and {C.REJECTED_SAMPLES.sample_name}{{reason=\"{REJECT_BUDGET}\"}}" if skipped else "")

