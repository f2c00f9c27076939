"""Whose tokens missed: the configured setup's stored-token split, per tenant and per adapter.

Each request runs through the simulation as before; what the split (``PrefixCacheSim.
track_split``) gained during that request is the request's, so it goes to the request's tenant
(its ``cache_salt``, or its ``user`` with ``by="user"``, named by ``normalise.tenant_label``:
never the raw value) and its adapter (the LoRA name, ``""`` for the base model).

One reason is added to the live ledger's: ``isolation``. A block counted ``first`` (nothing
explains it on the same salt and adapter) whose *token content* -- the chain of token ids from
the prompt's start, without salt or adapter -- is cached at that moment under another salt or
adapter, on this replica or another, is isolation: the workload would have hit it, the
separation of caches did not let it. Departures and routing take precedence (they explain the
miss within the tenant's own cache), exactly as ``first`` is the last resort of the ledger.
The per-request sums are unchanged: ``first + isolation`` here is the global split's ``first``.
"""
from __future__ import annotations

from array import array
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import is_not

from cachemon.analyze.requests_io import Request
from cachemon.analyze.sim.block_hash import BlockHasher, BlockKey, chain_seed, extend_chain
from cachemon.analyze.sim.fleet import Fleet
from cachemon.analyze.sim.prefix import SPLIT_REASONS, PrefixCacheSim
from cachemon.normalise.tenant_label import NO_TENANT, OTHER, TenantNamer, adapter_label, top_k

# The live ledger's reasons (cachemon_kv_tenant_stored_tokens_total{reason}): the simulation's, whose
# isolation stays 0 there and is filled in here.
TENANT_REASONS = SPLIT_REASONS
TENANT_BY = ("salt", "user")
# The isolation index (token-content hash -> (chain position, {extra key: hash})) is compacted to the
# contents still cached somewhere when it passes INDEX_FACTOR x the pool (all replicas), at least
# INDEX_MIN entries: content cached under no key cannot be isolation, so nothing is lost.
INDEX_FACTOR = 4
INDEX_MIN = 1 << 16
# An index entry of content cached under one extra key is one int, (position << 64) + the block's hash
# (signed 64 bits: one addition per stored block); under several, a dict of their hashes and POSITION. Which
# key a hash is under needs no code: the same content under the same key always hashes the same, so a
# request's own copy is the one whose hash is its own at that position.
POSITION = -1              # a several-key entry's key of the chain position (no hash() is ever -1)
# an index entry: one key's block, (chain position << 64) + its hash; several keys': {POSITION: position, hash: 0}
Entry = int | dict[int, int]
_HALF = 1 << 63
_M64 = (1 << 64) - 1


def _hash_of(entry: int) -> int:
    """A one-key entry's block hash."""
    return ((entry + _HALF) & _M64) - _HALF


def _position_of(entry: int) -> int:
    """A one-key entry's chain position."""
    return (entry + _HALF) >> 64


@dataclass
class Share:
    """One tenant's (or adapter's) part of the stream."""
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0                     # predicted by the simulation
    observed_requests: int = 0                 # requests whose line carried vLLM's cached_tokens
    observed_cached_tokens: int = 0
    full_report_cached_tokens: int = 0         # of requests in full report mode: the ledger's hit tokens
    stored: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TENANT_REASONS, 0))

    @property
    def hit_ratio(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def missed(self) -> int:
        """Stored tokens that were a miss (all but recompute_last_block)."""
        return sum(t for r, t in self.stored.items() if r != "recompute_last_block")

    def add(self, other: Share) -> None:
        self.requests += other.requests
        self.prompt_tokens += other.prompt_tokens
        self.cached_tokens += other.cached_tokens
        self.observed_requests += other.observed_requests
        self.observed_cached_tokens += other.observed_cached_tokens
        self.full_report_cached_tokens += other.full_report_cached_tokens
        for r, t in other.stored.items():
            self.stored[r] += t


@dataclass
class TenantReport:
    by: str                                    # "salt" | "user"
    naming: str                                # how labels were made (configured names / keyed hash)
    tenants: dict[str, Share]                  # top-K (+ configured names, "") and "other"
    adapters: dict[str, Share]
    pairs: dict[tuple[str, str], Share]        # (tenant, adapter), tenants as above
    tenants_folded: int = 0                    # distinct tenants summed into "other"
    index_compactions: int = 0                 # times the isolation index dropped uncached content


def adapter_of(req: Request, lora_models: frozenset[str]) -> str | None:
    """The request's LoRA adapter: its ``model`` when that names a known adapter, else its ``lora_name``."""
    if req.model is not None and req.model in lora_models:
        return req.model
    return req.lora_name


class TenantSplit:
    """Feeds the per-request split of one configured simulation (server or fleet) to tenants."""

    def __init__(self, sim: PrefixCacheSim | Fleet, namer: TenantNamer, by: str = "salt"):
        if by not in TENANT_BY:
            raise ValueError(f"tenant by {by!r}: one of {', '.join(TENANT_BY)}")
        self.sim, self.namer, self.by = sim, namer, by
        self.sims = list(sim.sims) if isinstance(sim, Fleet) else [sim]
        self.bs = sim.block_size
        for s in self.sims:
            s.on_first = self._on_first
        # a sliding window frees a chain's head while its tail stays cached: isolation is then looked
        # up block by block (_isolated_run)
        self._monotone = all(type(s) is PrefixCacheSim for s in self.sims)
        self.pairs: dict[tuple[str, str], Share] = {}
        # token-content hash -> the block under one extra key: one int (above), under several:
        # {POSITION: the block's chain position, each key's hash of the block: 0}. Ints only
        # (no tuple, no GC tracking), and most contents are cached under one key: 48 bytes, not a dict's 232
        self._index: dict[int, Entry] = {}
        self._shifted: list[int] = []               # position -> position << 64 (one-key entries)
        pool = sum(s.cache_blocks or 0 for s in self.sims) if sim.cache_blocks is not None else 0
        self._limit = max(INDEX_FACTOR * pool, INDEX_MIN)
        self.index_compactions = 0
        self._hasher = BlockHasher(self.bs)    # token-content hashes (no extra key), memoised like analyze's
        self._salted: list[int] = []                # this request: its hashes by chain position ...
        self._plain: list[int] | None = []          # ... and its token-content hashes (None: not computed yet)
        self._raw = b""                        # ... and its token ids as bytes (salted requests)
        self._isolated = 0

    def _plain_now(self) -> list[int]:
        """The request's token-content hashes, computed on first use: a request that stores nothing
        (a full hit) never pays for them."""
        if self._plain is None:
            self._plain = self._hasher(self._raw, None)
        return self._plain

    def _on_first(self, hashes: list[BlockKey], positions: Sequence[int]) -> None:
        salted, plain, index = self._salted, self._plain_now(), self._index
        n = min(len(salted), len(plain))
        if isinstance(positions, range) and positions.step == 1 and positions.stop <= n:
            start, stop = positions.start, positions.stop
            if self._monotone and hashes == salted[start:stop]:
                self._isolated += self._isolated_run(plain, start, stop)
                return
            # a run of the request's blocks: the index looked up in C
            entries = list(map(index.get, plain[start:stop]))
        else:
            entries = [index.get(plain[j]) if j < n else None for j in positions]
        found = len(entries) - entries.count(None)
        if not found:               # most of a request's first blocks (its new tail) are in no one's cache
            return
        candidates: Iterable[tuple[BlockKey, int, Entry | None]] = zip(hashes, positions, entries, strict=True)
        if found < len(entries):    # only the indexed blocks reach the Python loop (filtered in C)
            candidates = compress(candidates, map(is_not, entries, repeat(None)))
        for h, j, entry in candidates:
            if entry is not None and salted[j] == h and self._held_elsewhere(entry, j):
                self._isolated += 1

    def _isolated_run(self, plain: list[int], start: int, stop: int) -> int:
        """How many of the request's first blocks ``start``..``stop - 1`` are isolation, in O(log) lookups.
        On a pool without a sliding window, content cached under a key is cached with its whole chain
        before it (a hit starts at block 0, eviction takes chain tails first: what the simulation's own
        binary search relies on), so "cached under another key" holds for a head of the run and fails for
        the rest. The per-block loop in ``_on_first`` gives the same count (tested)."""
        index, held = self._index, self._held_elsewhere
        entry = index.get(plain[start])
        if entry is None or not held(entry, start):
            return 0                # the usual tail: new content, no one's cache
        lo, hi = start + 1, stop    # block lo - 1 is isolation; find the first that is not
        while lo < hi:
            mid = (lo + hi) >> 1
            entry = index.get(plain[mid])
            if entry is not None and held(entry, mid):
                lo = mid + 1
            else:
                hi = mid
        return lo - start

    def _held_elsewhere(self, entry: Entry, j: int) -> bool:
        """Whether the content indexed as ``entry`` (chain position ``j``) is cached now under another
        extra key than this request's, on any replica."""
        mine = self._salted[j]      # this request's own copy of the block (not cached: it is a first block)
        others: Iterable[int]
        if isinstance(entry, dict):
            keys = entry.copy()         # the other keys' hashes, without a per-key Python step
            del keys[POSITION]
            keys.pop(mine, None)
            others = keys
        else:
            other = _hash_of(entry)
            if other == mine:
                return False
            others = (other,)
        sims = self.sims
        return sims[0].holds_any(others, j) if len(sims) == 1 else any(s.holds_any(others, j) for s in sims)

    def request(self, req: Request, adapter: str | None, extra: Hashable, ids: Sequence[int], hashes: list[int],
                generated: Iterable[int], cached_run: Callable[[], int], raw_ids: bytes | None = None) -> int:
        """Run one request (``cached_run``) and book what it stored. ``generated``: the token ids
        its decode fed back, when known (their blocks' content is known too). ``raw_ids``: ``ids`` as
        ``array('I')`` bytes, when the caller has them (the hasher's input)."""
        bs = self.bs
        gen = array("I", generated)
        full = (len(ids) + len(gen)) // bs
        grows = full > len(hashes)
        if grows or extra is not None:         # one conversion to bytes for both hashers
            raw = array("I", ids).tobytes() if raw_ids is None else raw_ids
            if grows:
                raw += gen.tobytes()
        # the generated blocks' hashes: the prompt's chain, continued
        salted = hashes + extend_chain(hashes[-1] if hashes else chain_seed(extra), raw, len(hashes), full, bs) \
            if grows else hashes
        self._salted, self._isolated = salted, 0
        self._plain, self._raw = (None, raw) if extra is not None else (salted, b"")
        before = self._split()
        cached = cached_run()
        after = self._split()
        index = self._index
        # only what this request stored is new to the index: its hit blocks were stored before
        start = min(cached // bs, len(salted))
        plain = self._plain_now() if start < len(salted) else []
        stop = min(len(salted), len(plain))
        if len(self._shifted) < stop:
            self._shifted = [j << 64 for j in range(max(stop, 2 * len(self._shifted)))]
        get = index.get
        for shifted, p, h in zip(self._shifted[start:stop], plain[start:stop], salted[start:stop], strict=True):
            entry = get(p)
            if entry is None:
                index[p] = shifted + h
            elif isinstance(entry, dict):
                entry[h] = 0
            elif entry != shifted + h:      # another key's copy (this key's is the same int)
                index[p] = {POSITION: _position_of(entry), _hash_of(entry): 0, h: 0}
        self._salted, self._plain, self._raw = [], [], b""
        if len(index) > self._limit:
            self._compact()
        tenant = self.namer(req.cache_salt if self.by == "salt" else req.user)
        share = self.pairs.get((tenant, adapter_label(adapter)))
        if share is None:
            share = self.pairs[(tenant, adapter_label(adapter))] = Share()
        share.requests += 1
        share.prompt_tokens += len(ids)
        share.cached_tokens += cached
        if req.full_report:
            share.full_report_cached_tokens += cached
        if req.observed_cached_tokens is not None:
            share.observed_requests += 1
            share.observed_cached_tokens += req.observed_cached_tokens
        for r in SPLIT_REASONS:
            share.stored[r] += after[r] - before[r]
        iso = self._isolated * bs
        share.stored["first"] -= iso
        share.stored["isolation"] += iso
        return cached

    def _compact(self) -> None:
        sims = self.sims
        index: dict[int, Entry] = {}
        for p, keys in self._index.items():
            if isinstance(keys, int):
                j = _position_of(keys)
                if any(s.holds(_hash_of(keys), j) for s in sims):
                    index[p] = keys
                continue
            j = keys[POSITION]
            held = {h: 0 for h in keys if h != POSITION and any(s.holds(h, j) for s in sims)}
            if held:
                held[POSITION] = j
                index[p] = held
        self._index = index
        self.index_compactions += 1
        if len(self._index) > self._limit // 2:     # an unlimited pool keeps everything: grow with it
            self._limit *= 2

    def _split(self) -> dict[str, int]:
        if len(self.sims) == 1 and self.sims[0].split is not None:
            return dict(self.sims[0].split)     # one server: a copy (twice a request)
        out = dict.fromkeys(SPLIT_REASONS, 0)
        for s in self.sims:
            for r, t in (s.split or {}).items():
                out[r] += t
        return out

    def report(self, k: int, naming: str) -> TenantReport:
        """Top ``k`` tenants by missed tokens (configured names and ``""`` always shown), the rest in ``other``."""
        per_tenant: dict[str, Share] = {}
        adapters: dict[str, Share] = {}
        for (t, a), s in self.pairs.items():
            per_tenant.setdefault(t, Share()).add(s)
            adapters.setdefault(a, Share()).add(s)
        keep = frozenset(x for x in per_tenant if x == NO_TENANT or x in self.namer.names.values())
        shown, folded = top_k({t: s.missed for t, s in per_tenant.items()}, k, keep)
        tenants = {t: per_tenant[t] for t in shown}
        pairs: dict[tuple[str, str], Share] = {}
        if folded:
            tenants[OTHER] = Share()
            for t in folded:
                tenants[OTHER].add(per_tenant[t])
        for (t, a), s in self.pairs.items():
            pairs.setdefault((t if t in tenants else OTHER, a), Share()).add(s)
        return TenantReport(self.by, naming, tenants, adapters, pairs, len(folded), self.index_compactions)


@dataclass(frozen=True)
class TenantOptions:
    """How `analyze` splits by tenant: the naming, the tenant key and the label budget."""
    namer: TenantNamer
    by: str = "salt"
    top: int = 10

    @property
    def naming(self) -> str:
        if self.namer.key_is_random:
            how = "keyed hash h-<12 hex> with a random key: names hold for this run only"
        else:
            how = "keyed hash h-<12 hex> (HMAC-SHA256, the configured key)"
        if self.namer.names:
            how = f"configured names ({len(self.namer.names)}), else {how}"
        return how
