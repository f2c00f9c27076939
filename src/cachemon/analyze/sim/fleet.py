"""N replicas, each with its own simulated prefix cache, behind a router (``cachemon analyze
--replicas N --routing POLICY``)."""
from __future__ import annotations

import zlib
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from cachemon.analyze.sim.block_hash import raw_bytes
from cachemon.analyze.sim.prefix import HISTORY_BLOCKS, SPLIT_REASONS, PrefixCacheSim

ROUTING_POLICIES = ("round-robin", "random", "session", "prefix")


class Fleet:
    """N replicas, each with its own prefix cache, behind a router. Same interface as
    ``PrefixCacheSim`` (``run`` / ``reset`` / counters); ``run`` also needs the request's
    session key (for session affinity).

    Policies: ``round-robin``; ``random`` (seeded, reproducible); ``session`` (sticky by
    session key; by prefix when a request has none); ``prefix`` (by the chained hash of the first ``prefix_blocks`` blocks,
    i.e. requests sharing their head go to the same replica)."""

    def __init__(self, replicas: int, policy: str, block_size: int, cache_blocks: int | None,
                 seed: int = 0, prefix_blocks: int = 2, make: Callable[[], PrefixCacheSim] | None = None):
        """``make``: each replica's simulation (default: ``PrefixCacheSim(block_size, cache_blocks)``; a
        sliding-window model's is ``window_sim.WindowedPrefixCacheSim``)."""
        import random
        if replicas < 1:
            raise ValueError("replicas must be at least 1")
        if policy not in ROUTING_POLICIES:
            raise ValueError(f"unknown routing policy {policy!r} (known: {', '.join(ROUTING_POLICIES)})")
        self.sims = [make() if make is not None else PrefixCacheSim(block_size, cache_blocks) for _ in range(replicas)]
        self.policy = policy
        self.block_size = block_size
        self.cache_blocks = cache_blocks
        self.prefix_blocks = prefix_blocks
        self._rng = random.Random(seed)
        self._next = 0
        self.requests = self.prompt_tokens = self.cached_tokens = 0
        self.last_replica = 0
        self.hasher = self.sims[0].hasher

    @property
    def oversized(self) -> int:
        return sum(s.oversized for s in self.sims)

    @property
    def hit_ratio(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def reset(self, kind: str = "reset_prefix_cache") -> None:
        for s in self.sims:
            s.reset(kind)

    def rename(self, mapping: dict[Any, Any]) -> None:
        for s in self.sims:
            s.rename(mapping)

    def track_split(self, history_blocks: int = HISTORY_BLOCKS) -> None:
        """Each replica classifies what it stores; "routing" means cached now on another one."""
        for s in self.sims:
            s.track_split(history_blocks)
            s._peers = [p for p in self.sims if p is not s]

    @property
    def split(self) -> dict[str, int] | None:
        splits = [s.split for s in self.sims if s.split is not None]
        if not splits:
            return None
        return {k: sum(sp[k] for sp in splits) for k in SPLIT_REASONS}

    @property
    def history_dropped(self) -> int:
        return sum(s.history_dropped for s in self.sims)

    def route(self, ids: Sequence[int], session: Hashable) -> int:
        n = len(self.sims)
        if n == 1:
            return 0
        if self.policy == "round-robin":
            self._next += 1
            return (self._next - 1) % n
        if self.policy == "random":
            return self._rng.randrange(n)
        # crc32, not hash(): the built-in is salted per process and routing must be reproducible
        if self.policy == "session" and session is not None:
            return zlib.crc32(repr(session).encode()) % n
        # prefix-aware (and session affinity for a request with no session: a completion
        # without a `user`)
        head = raw_bytes(ids)[:4 * self.block_size * self.prefix_blocks]
        return zlib.crc32(head) % n

    def run(self, ids: Sequence[int], extra: Hashable = None, hashes: list[Any] | None = None,
            completion_tokens: int | None = None, completion_ids: Sequence[int] | None = None,
            session: Hashable = None, generated: list[Any] | None = None) -> int:
        if hashes is None:
            hashes = self.hasher(ids, extra)
        self.last_replica = self.route(ids, session)
        sim = self.sims[self.last_replica]
        cached = sim.run(ids, extra, hashes, completion_tokens, completion_ids, generated)
        self.requests += 1
        self.prompt_tokens += len(ids)
        self.cached_tokens += cached
        return cached
