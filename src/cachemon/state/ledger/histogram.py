"""A cumulative Prometheus histogram kept as plain per-bucket counts (rendered in expose)."""
from __future__ import annotations

from bisect import bisect_left

__all__ = ["Histogram"]


class Histogram:
    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)     # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        self.counts[bisect_left(self.bounds, v)] += 1
        self.sum += v
        self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, cumulative count) per bucket, +Inf last."""
        out, acc = [], 0
        for b, c in zip(self.bounds + (float("inf"),), self.counts, strict=True):
            acc += c
            out.append((b, acc))
        return out

    def copy(self) -> Histogram:
        h = Histogram(self.bounds)
        h.counts, h.sum, h.count = list(self.counts), self.sum, self.count
        return h
