"""The dynamic-prefix signature: a per-request value (a timestamp, a request id) early in the prompt.

docs/kv-events.md, "The dynamic-prefix signature". A **vote** is a new prompt's store whose first
block is new content and whose later blocks repeat token content already seen under a *different*
parent (found by a token-only hash per block in a bounded window of recent prompt stores). The
replica's ledger (state/ledger/fleet.py) feeds the window from its store loop and calls ``vote`` and
``reused``; this module decides when a finding holds.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from cachemon.normalise.kv_batch import Hash
from cachemon.normalise.kv_tokens import decode_ids

# Votes needed within DP_WINDOW_S at one (parent, depth); the finding holds until no vote came for
# DP_HOLD_S (no flapping).
DP_MIN_VOTES = 3
DP_CONFIRM = 3                # later votes at the same point before a vote counts (see _DivergencePoint)
DP_MAX_CHILDREN = 32          # children followed per point
DP_VOTE_BLOCKS = 8192         # blocks of voting stores remembered, to see their reuse (two generations)
DP_WINDOW_S = 600.0
DP_HOLD_S = 300.0
DP_TOKEN_WINDOW = 16384       # token-content hashes remembered per replica (two generations)
DP_MAX_PARENTS = 512          # divergence parents followed per replica
TEXT_SAMPLES = 4              # keep_text: example blocks kept at the divergence depth
TEXT_MAX_TOKENS = 1024        # ... and at most this many token ids of each


@dataclass(frozen=True)
class DynamicPrefix:
    depth_blocks: int                        # where the per-request value sits (blocks from the prompt's start)
    since: float                             # first seen (unix time)
    recomputed_tokens: float                 # cumulative tokens recomputed below a per-request value (a part of `first`)


class _DivergencePoint:
    """Candidate per-request values at one (parent content, depth).

    Each vote is a new child of the parent with recomputed shared content below it. A
    per-request value makes a new child per request and none is ever used again; a per-tenant
    value (a handful of tenants, each with its own head) looks the same on the tenants' first
    requests, but their subtrees are reused by the next request of the tenant. So a vote counts
    only once ``DP_CONFIRM`` later votes came at the same point and its child was not reused
    meanwhile, and the finding needs ``DP_MIN_VOTES`` such votes with few reuses."""
    __slots__ = ("children", "depth", "last_vote", "reused")

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.children: dict[int, list[float]] = {}   # child content id -> [vote time, later votes, reused 0/1]
        self.reused = 0                              # children (kept) whose subtree a later request reused
        self.last_vote = 0.0

    def confirmed(self, since: float) -> int:
        return sum(1 for t, later, reused in self.children.values()
                   if later >= DP_CONFIRM and not reused and t >= since)

    def plausible(self) -> bool:
        """Few of its children were ever reused: per-request, not per-tenant."""
        return self.reused * 4 <= len(self.children)


class DynamicPrefixDetector:
    """One replica's detector. ``tok_new`` / ``tok_old``: token-content hash -> content id of the
    first store that had it (the window the ledger's store loop fills, two generations)."""

    def __init__(self, keep_text: bool = False) -> None:
        self.keep_text = keep_text
        self.tok_new: dict[int, int] = {}
        self.tok_old: dict[int, int] = {}
        self.points: dict[tuple[int, int], _DivergencePoint] = {}
        self.vote_new: dict[Hash, tuple[tuple[int, int], int]] = {}   # vLLM hash -> (point, child) of voting stores
        self.vote_old: dict[Hash, tuple[tuple[int, int], int]] = {}
        self.recomputed_tokens = 0                 # cumulative tokens recomputed below a per-request value
        self.finding: DynamicPrefix | None = None
        self._finding_key: tuple[int, int] | None = None
        self.samples: deque[tuple[int, ...]] = deque(maxlen=TEXT_SAMPLES)

    def rotate_window(self) -> None:
        if len(self.tok_new) >= DP_TOKEN_WINDOW // 2:
            self.tok_old = self.tok_new
            self.tok_new = {}

    def vote(self, parent: int, depth: int, rep_tokens: int, hashes: tuple[Hash, ...],
             sample: bytes, bs: int, at: float) -> None:
        """A vote for a per-request value below ``parent`` at ``depth``: a divergence whose first
        block is new content (a new child of the parent) and whose later blocks of the same store
        repeat token content already seen under another parent (shared content, recomputed because
        of what precedes it). Unique questions below a shared system prompt repeat nothing below
        their first block: they never vote."""
        key = (parent, depth)
        pt = self.points.get(key)
        if pt is None:
            if len(self.points) >= DP_MAX_PARENTS:
                self.points.pop(next(iter(self.points)))
            pt = self.points[key] = _DivergencePoint(depth)
        for c in pt.children.values():
            c[1] += 1
        child = hash((key, hashes[0]))
        if len(pt.children) >= DP_MAX_CHILDREN:
            old = pt.children.pop(next(iter(pt.children)))
            pt.reused -= int(old[2])
        pt.children[child] = [at, 0, 0]
        pt.last_vote = at
        vb = self.vote_new
        for h in hashes[:-1]:          # the last block is the open tail: continuations hang there
            vb[h] = (key, child)
        if len(vb) >= DP_VOTE_BLOCKS // 2:
            self.vote_old = vb
            self.vote_new = {}
        self.recomputed_tokens += rep_tokens
        if self.keep_text:
            # decoded here, bounded (only with keep_text, only at a vote): the key may be a huge block
            self.samples.append(decode_ids(sample, bs, TEXT_MAX_TOKENS))
        if self.finding is None and pt.plausible() and pt.confirmed(at - DP_WINDOW_S) >= DP_MIN_VOTES:
            self.finding = DynamicPrefix(depth, at, float(self.recomputed_tokens))
            self._finding_key = key

    def reused(self, parent: Hash) -> None:
        """A new prompt diverged below a block of a voting store: that child was not per-request."""
        if not self.vote_new and not self.vote_old:
            return
        hit = self.vote_new.get(parent) or self.vote_old.get(parent)
        if hit is None:
            return
        key, child = hit
        pt = self.points.get(key)
        if pt is None:
            return
        c = pt.children.get(child)
        if c is not None and not c[2]:
            c[2] = 1
            pt.reused += 1
            if self._finding_key == key and not pt.plausible():
                self.finding = None
                self._finding_key = None

    def expire(self, now: float) -> None:
        if self.finding is None or self._finding_key is None:
            return
        pt = self.points.get(self._finding_key)
        if pt is None or now - pt.last_vote > DP_HOLD_S:
            self.finding = None
            self._finding_key = None

    def current(self) -> DynamicPrefix | None:
        """The finding with the cumulative recomputed tokens of now, while it holds."""
        fp = self.finding
        if fp is None:
            return None
        return DynamicPrefix(fp.depth_blocks, fp.since, float(self.recomputed_tokens))
