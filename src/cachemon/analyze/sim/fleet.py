"""N replicas, each with its own simulated prefix cache, behind a router (``cachemon analyze
--replicas N --routing POLICY``, and every policy side by side with ``--compare-routing N``).

The policies a user can choose between, two of them after vLLM's own router (vllm-project/router, read,
not copied):

* ``consistent-hash``: a hash ring with 160 virtual nodes per replica, as ``vllm-router --policy
  consistent_hash`` (``src/policies/consistent_hash.rs``: ``VIRTUAL_NODES_PER_WORKER = 160``, the first
  ring point at or after the key's hash, wrapping), keyed here by the head of the prompt (``prefix_blocks``
  blocks) where the router keys by a session header or body field. The hash function is CRC-32, not the
  router's FurcHash: which replica gets which prefix differs from the router, how they spread does not.
* ``cache-aware``: ``vllm-router --policy cache_aware`` (``src/policies/cache_aware.rs``): the router
  keeps, per replica, a tree of the requests it sent there (its guess of that replica's cache, never the
  cache itself); a request whose longest match there covers more than ``--cache-threshold`` of it (0.3,
  the CLI default in ``src/main.rs``) goes to that replica, any other to the least-loaded replica, ties to
  the first in its list. Load is requests in flight: ``analyze`` replays requests one at a time, so every
  load is 0, a low match always goes to replica 0, and (balanced loads) the load check never overrides
  a match, exactly what the real router did on sequential traffic (issue 36: all 40 requests on the first
  worker). Matched here in whole blocks of token ids, where the router matches characters or tokens.
* ``cache-aware-balanced``: the same, with load = requests routed so far: a stand-in for concurrent
  traffic, where low-match requests spread over the replicas. It cannot see load in flight, so a router
  that balances on it against a match (``--balance-abs-threshold``) stores prefixes again that this does
  not (docs/analyze.md, "Against vLLM's own router").
"""
from __future__ import annotations

import bisect
import zlib
from collections.abc import Callable, Hashable, Sequence

from cachemon.analyze.sim.block_hash import BlockKey, Placeholder, raw_bytes
from cachemon.analyze.sim.prefix import HISTORY_BLOCKS, SPLIT_REASONS, PrefixCacheSim

ROUTING_POLICIES = ("round-robin", "random", "session", "prefix", "consistent-hash", "cache-aware",
                    "cache-aware-balanced")
CACHE_THRESHOLD = 0.3           # vllm-router's --cache-threshold default (src/main.rs)
VIRTUAL_NODES = 160             # vllm-router's consistent_hash ring points per worker


class Fleet:
    """N replicas, each with its own prefix cache, behind a router. Same interface as
    ``PrefixCacheSim`` (``run`` / ``reset`` / counters); ``run`` also needs the request's
    session key (for session affinity).

    Policies: ``round-robin``; ``random`` (seeded, reproducible); ``session`` (sticky by
    session key; by prefix when a request has none); ``prefix`` (by the chained hash of the first ``prefix_blocks`` blocks,
    i.e. requests sharing their head go to the same replica); ``consistent-hash``, ``cache-aware`` and
    ``cache-aware-balanced``: the module's docstring."""

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
        self.routed = [0] * replicas                  # requests sent to each replica
        # cache-aware: per replica, the block hashes of the requests the router sent there (its tree)
        self._seen: list[set[BlockKey]] = [set() for _ in range(replicas)]
        self._ring = _ring(replicas) if policy == "consistent-hash" else None

    @property
    def oversized(self) -> int:
        return sum(s.oversized for s in self.sims)

    @property
    def hit_ratio(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def cached_by_replica(self) -> list[int]:
        """Each replica's cached tokens: what its ``vllm:prefix_cache_hits_total`` would count."""
        return [s.cached_tokens for s in self.sims]

    def reset(self, kind: str = "reset_prefix_cache") -> None:
        for s in self.sims:
            s.reset(kind)

    def rename(self, mapping: dict[Placeholder, int]) -> None:
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

    def route(self, ids: Sequence[int], session: Hashable, hashes: Sequence[BlockKey] = ()) -> int:
        n = len(self.sims)
        if n == 1:
            return 0
        if self.policy.startswith("cache-aware"):
            return self._cache_aware(len(ids), hashes)
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
        if self._ring is not None:
            points, owners = self._ring
            i = bisect.bisect_left(points, zlib.crc32(head))
            return owners[i % len(points)]
        return zlib.crc32(head) % n

    def _cache_aware(self, n_tokens: int, hashes: Sequence[BlockKey]) -> int:
        best, best_blocks = 0, 0
        for r, seen in enumerate(self._seen):
            k = 0
            while k < len(hashes) and hashes[k] in seen:
                k += 1
            if k > best_blocks:
                best, best_blocks = r, k
        if n_tokens and best_blocks * self.block_size / n_tokens > CACHE_THRESHOLD:
            return best
        if self.policy == "cache-aware-balanced":
            return min(range(len(self.sims)), key=self.routed.__getitem__)
        return 0        # loads in flight are all 0 when requests run one at a time: the first replica

    def run(self, ids: Sequence[int], extra: Hashable = None, hashes: list[int] | None = None,
            completion_tokens: int | None = None, completion_ids: Sequence[int] | None = None,
            session: Hashable = None, generated: list[BlockKey] | None = None) -> int:
        if hashes is None:
            hashes = self.hasher(ids, extra)
        r = self.last_replica = self.route(ids, session, hashes)
        self.routed[r] += 1
        if self.policy.startswith("cache-aware"):
            self._seen[r].update(hashes)
        sim = self.sims[r]
        cached = sim.run(ids, extra, hashes, completion_tokens, completion_ids, generated)
        self.requests += 1
        self.prompt_tokens += len(ids)
        self.cached_tokens += cached
        return cached


def _ring(replicas: int) -> tuple[list[int], list[int]]:
    """The consistent-hash ring: sorted points and the replica owning each."""
    pts = sorted((zlib.crc32(f"replica-{r}:{v}".encode()), r) for r in range(replicas) for v in range(VIRTUAL_NODES))
    return [p for p, _ in pts], [r for _, r in pts]
