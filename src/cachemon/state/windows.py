"""Trailing-window hit ratio from (time, hits, queries) points of corrected counters."""
from __future__ import annotations

from collections import deque


class RatioWindow:
    """Keeps the points needed to answer every configured window."""

    __slots__ = ("points", "horizon")

    def __init__(self, horizon: float):
        self.points: deque[tuple[float, float, float]] = deque()
        self.horizon = horizon

    def add(self, t: float, hits: float, queries: float) -> None:
        pts = self.points
        pts.append((t, hits, queries))
        # Keep one point at or before the horizon so the longest window stays whole.
        while len(pts) > 2 and pts[1][0] <= t - self.horizon:
            pts.popleft()

    def ratio(self, window: float) -> tuple[float, float] | None:
        """(hits delta, queries delta) over the trailing window, or None without traffic.

        The base is the newest point at or before ``latest - window``; while cachemon
        has run for less than the window, the oldest point (a partial window).
        """
        pts = self.points
        if len(pts) < 2:
            return None
        t1, h1, q1 = pts[-1]
        base = pts[0]
        cutoff = t1 - window
        for p in reversed(pts):
            if p[0] <= cutoff:
                base = p
                break
        dq = q1 - base[2]
        if dq <= 0:
            return None
        # A window's hits cannot exceed its queries: an end point read with the query counter low
        # (or a base read with the hits behind) shows them ahead; the counters stay as read.
        dh = h1 - base[1]
        if dh > dq:             # comparisons, not min/max: this runs for every ratio series on every scrape
            dh = dq
        elif dh < 0.0:
            dh = 0.0
        return dh, dq
