"""The match floor's moves per (upstream, model): what the snapshot builder hands the judge as
``ModelSnapshot.floor_move`` (judge/cause_rules.match_floor_changed reads it)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from cachemon.judge.figures import MIN_QUERY_TOKENS
from cachemon.judge.model_snapshot import FloorMove

Key = tuple[str, str]         # (upstream, model)
# a short window's miss ratio this close to the previous one's (or above it): the refill after a floor move is over
FLOOR_SETTLED_MARGIN = 0.02


class FloorTracker:
    """Per (upstream, model): the match floor, its last move (until it moves back), the steady miss ratio
    of the previous evaluation (a move's baseline: the history is cut to the window by then) and the
    previous short-window miss ratio since the move (the cache has refilled once it stops falling)."""

    def __init__(self) -> None:
        self.floors: dict[Key, int] = {}
        self.moves: dict[Key, FloorMove] = {}
        self.steady: dict[Key, float | None] = {}
        self.short: dict[Key, float] = {}

    def observe(self, key: Key, floor: int | None, now: float, steady_now: Callable[[], float | None],
                has_history: bool, short: tuple[float | None, float | None, float | None]) -> FloorMove | None:
        """The last floor move, recorded when a new floor is first seen (with the steady miss ratio before
        it), forgotten when the floor moves back; ``settled`` from the first evaluation whose short window
        (``short``: its query tokens, hit tokens and start) lies wholly after the move and whose miss ratio
        did not fall below the previous one's: the refill after the restart that came with it is over, what
        is left of the excess is the floor's."""
        prev, move = self.floors.get(key), self.moves.get(key)
        if floor:
            self.floors[key] = floor
            if prev is not None and floor != prev:
                self.short.pop(key, None)
                if move is not None and floor == move.before:
                    del self.moves[key]
                    move = None
                else:
                    move = self.moves[key] = FloorMove(prev, floor, now, self.steady.get(key))
        if move is None or not has_history:
            self.steady[key] = steady_now()
            return None
        q, h, seconds = short
        if move.settled or not q or h is None or q < MIN_QUERY_TOKENS or seconds is None or now - seconds < move.at:
            return move
        ratio, before = max(0.0, q - h) / q, self.short.get(key)
        self.short[key] = ratio
        if before is not None and ratio >= before - FLOOR_SETTLED_MARGIN:
            move = self.moves[key] = replace(move, settled=True)
        return move
