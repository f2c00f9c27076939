"""The isolation index of a model: the token content id of every block cached on its replicas, once per
copy (a multiset), exact. The ledger asks it one question, at a store: is this block's token content
cached under another key (salt, adapter)? (state/ledger/replica.py, Reason.ISOLATION.)

Two implementations answer alike (tests/test_kv_content_index.py runs both against a plain multiset):

- ``cachemon_native.IdMultiset``, compiled (native/, a distribution of its own so cachemon's wheel stays
  pure Python): one open-addressing table of 64-bit slots. Used whenever it is installed.
- ``BucketIndex``, pure Python: unordered 64-bit ``array`` buckets picked by the id's low bits, no object
  per id. With it, per-tenant accounting costs the ledger about +32 % CPU per event here, with the
  compiled one about +15 %; the budget is +20 % (benchmarks/bench_kv_tenants.py measures both).

The interface the ledger uses: ``add(id)``, ``discard(id) -> bool`` (False: not held), ``id in index``,
``len(index)``, ``count(id)``, ``ids()``.
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
BUCKET_TARGET = 16                # mean ids per bucket past which the buckets double
# Set to 1 to use the pure-Python index even where the compiled one is installed (benchmarks, tests).
PURE_ENV = "CACHEMON_PURE_INDEX"


class ContentIndex(Protocol):
    def add(self, uid: int, /) -> None: ...
    def discard(self, uid: int, /) -> bool: ...
    def count(self, uid: int, /) -> int: ...
    def ids(self) -> list[int]: ...
    def __contains__(self, uid: object, /) -> bool: ...
    def __len__(self) -> int: ...


class BucketIndex:
    """The pure-Python index: ~8-16 ids a bucket, 8 bytes an id plus its bucket's share. An add appends;
    a discard scans its bucket from the front, where an evicted id mostly is (buckets keep store order,
    vLLM evicts least recently used first)."""
    __slots__ = ("buckets", "limit", "mask", "n")

    def __init__(self, bits: int = 4) -> None:
        self.buckets = [array(ID_TYPE) for _ in range(1 << bits)]
        self.mask = (1 << bits) - 1   # a bucket: the id's low ``bits``
        self.n = 0                    # copies held
        self.limit = BUCKET_TARGET << bits

    def add(self, uid: int, /) -> None:
        self.buckets[uid & self.mask].append(uid)
        self.n += 1
        if self.n > self.limit:
            self._split()

    def discard(self, uid: int, /) -> bool:
        try:
            self.buckets[uid & self.mask].remove(uid)
        except ValueError:
            return False
        self.n -= 1
        return True

    def count(self, uid: int, /) -> int:
        return self.buckets[uid & self.mask].count(uid)

    def ids(self) -> list[int]:
        return [u for a in self.buckets for u in a]

    def __contains__(self, uid: object, /) -> bool:
        return isinstance(uid, int) and uid in self.buckets[uid & self.mask]

    def __len__(self) -> int:
        return self.n

    def _split(self) -> None:
        """Twice the buckets: each bucket's ids parted by the next bit (amortised: once per doubling)."""
        bit = self.mask + 1
        low: list[array[int]] = []
        high: list[array[int]] = []
        for a in self.buckets:
            lo, hi = array(ID_TYPE), array(ID_TYPE)
            for u in a:
                (hi if u & bit else lo).append(u)
            low.append(lo)
            high.append(hi)
        self.buckets, self.mask, self.limit = low + high, 2 * bit - 1, self.limit * 2


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
