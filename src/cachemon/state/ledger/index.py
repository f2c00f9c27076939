"""The fleet indexes of a model: multisets of ids over every replica of the model one cachemon follows.
The ledger keeps two, behind one interface (``FleetIndex``) and the same implementations:

- the **routing** index: the content id of every block cached on the model's replicas, once per replica
  caching it (made at the model's second replica). A store asks: is this content cached on another
  replica? (``Reason.ROUTING``.)
- the **isolation** index: the token content id (the content without its salt and adapter) of every block
  cached, once per copy (made at the model's second key, with per-tenant accounting and
  ``kv_events.isolation`` on). A store asks: is this token content cached under another key?
  (``Reason.ISOLATION``.)

Copies are the normal case: N tenants (a ``cache_salt`` each) sharing one system prompt hold N copies of
its blocks' token content ids, and replicas caching the same prompt one each. Both implementations count an
id's copies (the compiled one always, the pure one past a few in a bucket), so no call's cost grows with
them, and neither has a step that holds the GIL for long while it grows (issue 38: the first compiled
index kept a slot per copy, probed past each, and rebuilt its table in one call).

Two implementations answer alike (tests/test_kv_content_index.py runs both against a plain multiset and
against each other, and the ledger's routing and isolation counts with each):

- ``cachemon_native.IdMultiset``, compiled (native/, a distribution of its own so cachemon's wheel stays
  pure Python): one open-addressing table of distinct ids with a count byte each, grown incrementally
  (a bounded number of slots moved per call). Used whenever it is installed.
- ``BucketIndex``, pure Python: unordered 64-bit ``array`` buckets picked by the id's low bits, no object
  per id; a bucket that fills up with copies keeps one and counts the rest in a dict. With it, per-tenant
  accounting costs the ledger about twice the CPU per event the compiled one does
  (benchmarks/bench_kv_tenants.py measures both).

The interface (``FleetIndex``; its domain there).
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
DEDUPE_AT = 4 * BUCKET_TARGET     # entries past which a bucket keeps one per id (the other copies: counted)
# Set to 1 to use the pure-Python index even where the compiled one is installed (benchmarks, tests).
PURE_ENV = "CACHEMON_PURE_INDEX"


class FleetIndex(Protocol):
    """A multiset of ids. The domain: ``int`` (``bool`` included) with 0 <= id < 2**62 (ID_BITS; the
    ledger's content ids and token content ids are 60-bit). Outside it ``add``, ``discard`` and ``count``
    raise TypeError (not an int) or ValueError (an int out of range) and change nothing; ``x in index`` is
    False. Inside it both implementations give the same answers to every sequence of calls, ``ids()`` up
    to order.

    ``add(id)``: one more copy. ``discard(id) -> bool``: one copy less (False: none held). ``count(id)``:
    the copies held. ``len(index)``: every copy of every id. ``ids()``: every id, once per copy."""

    def add(self, uid: int, /) -> None: ...
    def discard(self, uid: int, /) -> bool: ...
    def count(self, uid: int, /) -> int: ...
    def ids(self) -> list[int]: ...
    def __contains__(self, uid: object, /) -> bool: ...
    def __len__(self) -> int: ...


class BucketIndex:
    """The pure-Python index: ids in unordered 64-bit ``array`` buckets picked by the id's low bits (~8-16 a
    bucket), no object per id. An add appends; a discard scans its bucket from the front, where an evicted
    id mostly is (buckets keep store order, vLLM evicts least recently used first).

    Copies: a bucket past DEDUPE_AT entries keeps one entry per id and moves the other copies to ``more``
    (id -> copies beyond the bucket's one), so no bucket holds many copies of one id, and a discard takes
    from ``more`` first (an id in ``more`` is always in its bucket too: ``in`` reads the bucket only).

    Growth in small steps: past BUCKET_TARGET entries a bucket, the bucket list doubles with each bucket
    named twice (by its low bits with the next bit clear and set: a list copy, no id moved), and each later
    add splits one shared bucket in two, until none is left (``shared``: the next bucket to split)."""
    __slots__ = ("buckets", "extra", "held", "limit", "mask", "more", "shared")

    def __init__(self, bits: int = 4) -> None:
        self.buckets = [array(ID_TYPE) for _ in range(1 << bits)]
        self.more: dict[int, int] = {}
        self.mask = (1 << bits) - 1   # a bucket: the id's low ``bits``
        self.held = 0                 # entries in the buckets
        self.extra = 0                # copies in ``more``
        self.limit = BUCKET_TARGET << bits    # grow past this many entries
        self.shared = 1 << bits       # buckets k of the lower half, shared <= k, are also named k + half (none)

    def add(self, uid: int, /) -> None:
        if uid >> ID_BITS:
            raise _outside(uid)
        b = self.buckets[uid & self.mask]
        b.append(uid)
        self.held += 1
        if len(b) > DEDUPE_AT:
            self._dedupe(b)
        if self.held > self.limit:
            self._grow()

    def discard(self, uid: int, /) -> bool:
        if uid >> ID_BITS:
            raise _outside(uid)
        more = self.more
        if more:
            c = more.get(uid)
            if c is not None:
                if c > 1:
                    more[uid] = c - 1
                else:
                    del more[uid]
                self.extra -= 1
                return True
        try:
            self.buckets[uid & self.mask].remove(uid)
        except ValueError:
            return False
        self.held -= 1
        return True

    def count(self, uid: int, /) -> int:
        if uid >> ID_BITS:
            raise _outside(uid)
        return self.buckets[uid & self.mask].count(uid) + self.more.get(uid, 0)

    def ids(self) -> list[int]:
        half = (self.mask + 1) // 2
        out = [u for k, b in enumerate(self.buckets) if k < half or k - half < self.shared for u in b]
        return out + [u for u, c in self.more.items() for _ in range(c)]   # (a shared bucket once, above)

    def __contains__(self, uid: object, /) -> bool:
        return isinstance(uid, int) and uid in self.buckets[uid & self.mask]

    def __len__(self) -> int:
        return self.held + self.extra

    def _dedupe(self, b: array[int]) -> None:
        """One entry per id in bucket ``b``, in place (a shared bucket keeps both names), first-store order
        kept; the other copies counted in ``more``."""
        copies: dict[int, int] = {}
        for u in b:
            copies[u] = copies.get(u, 0) + 1
        if len(copies) == len(b):
            return
        more = self.more
        for u, c in copies.items():
            if c > 1:
                more[u] = more.get(u, 0) + c - 1
        moved = len(b) - len(copies)
        b[:] = array(ID_TYPE, copies)
        self.held -= moved
        self.extra += moved

    def _grow(self) -> None:
        """One step: split the next shared bucket by its id's top bit, or (none left) double the list."""
        half = (self.mask + 1) // 2
        if self.shared >= half:
            self.buckets += self.buckets           # each bucket named by bit clear and set: shared
            self.mask = 2 * self.mask + 1
            self.shared, half = 0, self.mask // 2 + 1
        k, bit = self.shared, half
        lo, hi = array(ID_TYPE), array(ID_TYPE)
        for u in self.buckets[k]:
            (hi if u & bit else lo).append(u)
        self.buckets[k], self.buckets[k + half] = lo, hi
        self.shared += 1
        # while buckets are shared, each add past the limit splits one (half of them in 1/BUCKET_TARGET of
        # the entries the list may take before it doubles again); then the next doubling waits for twice
        self.limit = self.held if self.shared < half else BUCKET_TARGET * (self.mask + 1)


def _outside(uid: int) -> ValueError:
    return ValueError(f"a fleet index holds ids 0 <= id < 2**{ID_BITS}, not {uid}")


def _compiled() -> Any:
    """The compiled index's type, or None where it is not installed (or PURE_ENV asks for the pure one)."""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return None
    try:
        return importlib.import_module("cachemon_native").IdMultiset
    except ImportError:
        return None


def new_index() -> FleetIndex:
    kind = _compiled()
    return BucketIndex() if kind is None else kind()


def implementation() -> str:
    """Which index ``new_index`` makes: ``compiled`` or ``pure-python``."""
    return "pure-python" if _compiled() is None else "compiled"


def hold_all(index: FleetIndex, uids: Iterable[int]) -> None:
    """One more cached copy of each."""
    add = index.add
    for uid in uids:
        add(uid)


def release_all(index: FleetIndex, uids: Iterable[int]) -> int:
    """One cached copy of each less (evictions, a reset, a restart, a replica leaving). Returns how many were
    not held (none while the index is exact; the ledger counts them as ``index_misses``)."""
    discard = index.discard
    missing = 0
    for uid in uids:
        if not discard(uid):
            missing += 1
    return missing
