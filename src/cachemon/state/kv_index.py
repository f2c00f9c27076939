"""The isolation index of a model: the token content id of every block cached on its replicas, once per
copy (a multiset), exact. The ledger asks it one question, at a store: is this block's token content
cached under another key (salt, adapter)? (state/kv_replica.py, Reason.ISOLATION.)

Copies are the normal case: N tenants (a ``cache_salt`` each) sharing one system prompt hold N copies of
its blocks' ids, and replicas caching the same prompt one each. Both implementations hold a count per
distinct id, so no call's cost grows with an id's copies, and neither has a step that holds the GIL for
long while it grows (issue 38: the first compiled index kept a slot per copy, probed past each, and
rebuilt its table in one call).

Two implementations answer alike (tests/test_kv_content_index.py runs both against a plain multiset and
against each other):

- ``cachemon_native.IdMultiset``, compiled (native/, a distribution of its own so cachemon's wheel stays
  pure Python): one open-addressing table of distinct ids with a count byte each, grown incrementally
  (a bounded number of slots moved per call). Used whenever it is installed.
- ``BucketIndex``, pure Python: unordered 64-bit ``array`` buckets of distinct ids picked by the id's low
  bits, their counts in parallel arrays, no object per id. With it, per-tenant accounting costs the
  ledger about twice the CPU per event of the compiled one (benchmarks/bench_kv_tenants.py measures both).

The interface the ledger uses (``ContentIndex``; its domain there).
"""
from __future__ import annotations

import importlib
import os
from array import array
from collections.abc import Iterable
from typing import Any, Protocol

# The pure index's ids as C unsigned longs where those hold 64 bits: CPython converts them digit by digit,
# where 'Q' (unsigned long long) goes through a byte array (~250 instructions a conversion, 3.11).
ID_TYPE = "L" if array("L").itemsize == 8 else "Q"
BUCKET_TARGET = 16                # mean distinct ids per bucket past which the buckets double
ID_BITS = 62                      # ids are 0 <= id < 2**ID_BITS (the compiled index's bound)
# Set to 1 to use the pure-Python index even where the compiled one is installed (benchmarks, tests).
PURE_ENV = "CACHEMON_PURE_INDEX"


class ContentIndex(Protocol):
    """A multiset of ids. The domain: ``int`` (``bool`` included) with 0 <= id < 2**62 (ID_BITS; the ledger's
    ids are 60-bit). Outside it ``add``, ``discard`` and ``count`` raise TypeError (not an int) or ValueError
    (an int out of range) and change nothing; ``x in index`` is False. Inside it both implementations give
    the same answers to every sequence of calls, ``ids()`` up to order.

    ``add(id)``: one more copy. ``discard(id) -> bool``: one copy less (False: none held). ``count(id)``:
    the copies held. ``len(index)``: every copy of every id. ``ids()``: every id, once per copy."""

    def add(self, uid: int, /) -> None: ...
    def discard(self, uid: int, /) -> bool: ...
    def count(self, uid: int, /) -> int: ...
    def ids(self) -> list[int]: ...
    def __contains__(self, uid: object, /) -> bool: ...
    def __len__(self) -> int: ...


class BucketIndex:
    """The pure-Python index: the distinct ids in unordered 64-bit ``array`` buckets picked by the id's low
    bits (~8-16 a bucket), each bucket's copy counts in a parallel array: 16 bytes a distinct id plus its
    bucket's share, however many copies it has. A discard scans its bucket from the front, where an evicted
    id mostly is (buckets keep first-store order, vLLM evicts least recently used first).

    Growth in small steps: past BUCKET_TARGET ids a bucket, the bucket list doubles with each bucket named
    twice (by its low bits with the next bit clear and set: a list copy, no id moved), and each later new id
    splits one shared bucket in two, until none is left (``shared``: the next bucket to split)."""
    __slots__ = ("buckets", "counts", "distinct", "limit", "mask", "n", "shared")

    def __init__(self, bits: int = 4) -> None:
        self.buckets = [array(ID_TYPE) for _ in range(1 << bits)]
        self.counts = [array(ID_TYPE) for _ in range(1 << bits)]    # copies of buckets[k][i]
        self.mask = (1 << bits) - 1   # a bucket: the id's low ``bits``
        self.n = 0                    # copies held
        self.distinct = 0             # distinct ids held
        self.limit = BUCKET_TARGET << bits    # grow past this many distinct ids
        self.shared = 1 << bits       # buckets k of the lower half, shared <= k, are also named k + half (none)

    def add(self, uid: int, /) -> None:
        if uid >> ID_BITS:
            raise _outside(uid)
        k = uid & self.mask
        b = self.buckets[k]
        if uid in b:
            self.counts[k][b.index(uid)] += 1
        else:
            b.append(uid)
            self.counts[k].append(1)
            self.distinct += 1
            if self.distinct > self.limit:
                self._grow()
        self.n += 1

    def discard(self, uid: int, /) -> bool:
        if uid >> ID_BITS:
            raise _outside(uid)
        k = uid & self.mask
        b = self.buckets[k]
        try:
            i = b.index(uid)
        except ValueError:
            return False
        c = self.counts[k]
        if c[i] > 1:
            c[i] -= 1
        else:
            del b[i]
            del c[i]
            self.distinct -= 1
        self.n -= 1
        return True

    def count(self, uid: int, /) -> int:
        if uid >> ID_BITS:
            raise _outside(uid)
        k = uid & self.mask
        b = self.buckets[k]
        return self.counts[k][b.index(uid)] if uid in b else 0

    def ids(self) -> list[int]:
        half = (self.mask + 1) // 2
        return [u for k, (b, c) in enumerate(zip(self.buckets, self.counts, strict=True))
                if k < half or k - half < self.shared      # a shared bucket once
                for u, n in zip(b, c, strict=True) for _ in range(n)]

    def __contains__(self, uid: object, /) -> bool:
        return isinstance(uid, int) and uid in self.buckets[uid & self.mask]

    def __len__(self) -> int:
        return self.n

    def _grow(self) -> None:
        """One step: split the next shared bucket by its id's top bit, or (none left) double the list."""
        half = (self.mask + 1) // 2
        if self.shared >= half:
            self.buckets += self.buckets           # each bucket named by bit clear and set: shared
            self.counts += self.counts
            self.mask = 2 * self.mask + 1
            self.shared, half = 0, self.mask // 2 + 1
        k, bit = self.shared, half
        lo, hi, lo_n, hi_n = array(ID_TYPE), array(ID_TYPE), array(ID_TYPE), array(ID_TYPE)
        for u, n in zip(self.buckets[k], self.counts[k], strict=True):
            if u & bit:
                hi.append(u)
                hi_n.append(n)
            else:
                lo.append(u)
                lo_n.append(n)
        self.buckets[k], self.buckets[k + half], self.counts[k], self.counts[k + half] = lo, hi, lo_n, hi_n
        self.shared += 1
        # while buckets are shared, each new id splits one (half of them in 1/BUCKET_TARGET of the ids the
        # list may take before it doubles again); then the next doubling waits for twice the ids
        self.limit = self.distinct if self.shared < half else BUCKET_TARGET * (self.mask + 1)


def _outside(uid: int) -> ValueError:
    return ValueError(f"the isolation index holds ids 0 <= id < 2**{ID_BITS}, not {uid}")


def _compiled() -> Any:
    """The compiled index's type, or None where it is not installed (or PURE_ENV asks for the pure one)."""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return None
    try:
        return importlib.import_module("cachemon_native").IdMultiset
    except ImportError:
        return None


def new_index() -> ContentIndex:
    kind = _compiled()
    return BucketIndex() if kind is None else kind()


def implementation() -> str:
    """Which index ``new_index`` makes: ``compiled`` or ``pure-python``."""
    return "pure-python" if _compiled() is None else "compiled"


def hold_all(index: ContentIndex, uids: Iterable[int]) -> None:
    """One more cached copy of each."""
    add = index.add
    for uid in uids:
        add(uid)


def release_all(index: ContentIndex, uids: Iterable[int]) -> int:
    """One cached copy of each less (a reset, a restart, a replica leaving; an eviction discards its id in
    kv_replica._removed). Returns how many were not held (none while the index is exact)."""
    discard = index.discard
    missing = 0
    for uid in uids:
        if not discard(uid):
            missing += 1
    return missing
