"""Which causes are active, with hold-down: what the attribution stage exports between evaluations."""
from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from cachemon.judge.causes import Cause
from cachemon.judge.figures import MIN_QUERY_TOKENS
from cachemon.judge.model_snapshot import Attribution

log = logging.getLogger("cachemon.attribution")

Key = tuple[str, str, str]      # (upstream, model, cause)
TOKEN_FLOOR = MIN_QUERY_TOKENS  # a cause that cost at least this many tokens in one step is active at once


@dataclass
class _Track:
    streak: int = 0             # consecutive evaluations it held
    last_held: float = 0.0
    certainty: str = ""
    active: bool = False


class CauseTracker:
    """Which causes are active, with hold-down: a cause becomes active when the engine names it for
    ``hold`` consecutive evaluations, or at once when it cost at least ``floor`` tokens in the step;
    it becomes inactive only when it has not been named for ``hold_down`` seconds. One log line per
    change. ``since`` (key -> when it became active) and ``certainty`` are what the stage exports."""

    def __init__(self, hold: int = 2, hold_down: float = 30.0, floor: float = TOKEN_FLOOR):
        self.hold, self.hold_down, self.floor = hold, hold_down, floor
        self.since: dict[Key, float] = {}
        self.certainty: dict[Key, str] = {}
        self.tracks: dict[Key, _Track] = {}

    def active_for(self, upstream: str, model: str) -> frozenset[str]:
        return frozenset(k[2] for k in self.since if k[0] == upstream and k[1] == model)

    def update(self, results: Sequence[Attribution], now: float) -> list[tuple[Key, bool]]:
        """Apply one evaluation; returns the changes (key, became_active)."""
        held: dict[Key, Cause] = {(a.upstream, a.model, c.code): c for a in results for c in a.causes}
        changes: list[tuple[Key, bool]] = []
        for key, cause in held.items():
            t = self.tracks.setdefault(key, _Track())
            t.streak += 1
            t.last_held = now
            t.certainty = cause.certainty
            if not t.active and (t.streak >= self.hold or (cause.tokens or 0.0) >= self.floor):
                t.active = True
                self.since[key] = now
                changes.append((key, True))
                log.warning("upstream %s model %s: cause %s active (%s): %s", *key, cause.certainty, cause.message)
            if t.active:
                self.certainty[key] = cause.certainty
        for key in list(self.tracks):
            if key in held:
                continue
            t = self.tracks[key]
            t.streak = 0
            if t.active and now - t.last_held >= self.hold_down:
                t.active = False
                self.since.pop(key, None)
                self.certainty.pop(key, None)
                changes.append((key, False))
                log.info("upstream %s model %s: cause %s no longer active (not seen for %.0fs)", *key,
                         now - t.last_held)
            if not t.active:
                del self.tracks[key]
        return changes
