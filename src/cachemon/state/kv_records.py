"""The ledger's packed records, named: one int per cached block and one per departed content.

A cached block is one dict entry (vLLM hash -> one packed int); 60-bit content ids are 2-digit
Python ints (32 bytes, not 40) and the record fits 4 digits (120 bits: 40 bytes) for 4 years of
milliseconds: 8 bytes saved three times per block (benchmarks/bench_kv_ledger.py).

    block record:     bits 0-59 content id | 60-73 depth | 74-81 copies | 82 open tail | 83-119 store time (ms)
                      | 120-131 tenant code | 132-179 key (the chain's salt and adapter)
    departure record: bits 0-2 reason (Reason.CAPACITY, RESET or RESTART) | 3+ time (ms)

The last two only exist in blocks of salted or adapter chains (state/kv_tenants.py; the key only with
isolation on): the others pay nothing for them. The key is the content id xor the token content id
(isolation compares the latter): constant along a chain, it costs the store loop nothing per block
(``rec_base`` carries it). The helpers below are the one place the layout is spelled; the ledger's
innermost loops bind the same constants to locals (a call per block would cost more than the loop's
whole budget).
"""
from __future__ import annotations

from array import array
from collections.abc import Iterable

from cachemon.state.kv_reasons import Reason

# The index's ids as C unsigned longs where those hold 64 bits: CPython converts them digit by digit,
# where 'Q' (unsigned long long) goes through a byte array (~250 instructions a conversion, 3.11).
ID_TYPE = "L" if array("L").itemsize == 8 else "Q"

CID_MASK = (1 << 60) - 1          # the content id
DEPTH_SHIFT = 60
DEPTH_ONE = 1 << DEPTH_SHIFT
DEPTH_MAX = 0x3FFF                # 16 383 blocks (262 144 tokens at block_size 16); deeper is clamped
COPY_SHIFT = 74
COPY_ONE = 1 << COPY_SHIFT
COPY_MAX = 0xFF                   # copies of one hash (saturating; vLLM keeps a handful at most)
COPY_BITS = COPY_MAX << COPY_SHIFT
OPEN = 1 << 82                    # the last block of a store with no child yet
TIME_SHIFT = 83
TIME_MAX = (1 << 37) - 1          # 4.3 years of milliseconds from the ledger's first event (clamped)
TENANT_SHIFT = 120
TENANT_MAX = 0xFFF
KEY_SHIFT = 132
KEY_MASK = (1 << 48) - 1          # keys are 48-bit: a keyed record is 6 digits of 30 bits (180), not 7
DEPART_SHIFT = 3
DEPART_REASON = (1 << DEPART_SHIFT) - 1


def pack_block(cid: int, depth: int, ms: int) -> int:
    """A block stored once, at ``ms`` after the ledger's epoch."""
    ms = 0 if ms < 0 else TIME_MAX if ms > TIME_MAX else ms
    return (ms << TIME_SHIFT) | COPY_ONE | (depth << DEPTH_SHIFT) | cid


def content_of(rec: int) -> int:
    return rec & CID_MASK


def depth_of(rec: int) -> int:
    return (rec >> DEPTH_SHIFT) & DEPTH_MAX


def copies_of(rec: int) -> int:
    return (rec >> COPY_SHIFT) & COPY_MAX


def stored_ms(rec: int) -> int:
    return (rec >> TIME_SHIFT) & TIME_MAX


def tenant_of(rec: int) -> int:
    return (rec >> TENANT_SHIFT) & TENANT_MAX


def token_content_of(rec: int) -> int:
    """The token content id (isolation): the content id without the chain's key (none: the content id)."""
    return (rec >> KEY_SHIFT) ^ (rec & CID_MASK)


def pack_departure(reason: Reason, ms: int) -> int:
    return int(reason) | ((ms if ms > 0 else 0) << DEPART_SHIFT)


def departure_reason(rec: int) -> Reason:
    return Reason(rec & DEPART_REASON)


def fleet_release(fleet: dict[int, int], cid: int) -> None:
    """One replica no longer caches ``cid``: the fleet index's count of replicas caching it, less one."""
    fleet_release_all(fleet, (cid,))


def fleet_release_all(fleet: dict[int, int], cids: Iterable[int]) -> None:
    """``fleet_release`` of each (one call for a batch of removals: the hot path)."""
    pop = fleet.pop
    for cid in cids:
        c = pop(cid, 1) - 1          # one dict operation for the usual count of 1
        if c > 0:
            fleet[cid] = c


def fleet_hold(fleet: dict[int, int], cid: int) -> None:
    fleet[cid] = fleet.get(cid, 0) + 1


IDX_TARGET = 16                   # mean ids per bucket past which the buckets double


class ContentIndex:
    """The isolation index of a model: the token content id of every block cached in its fleet, once
    per copy (a multiset), exact, with no object per entry. Ids are hashes (uniform), so their low bits
    pick a bucket: an unordered 64-bit ``array`` (ID_TYPE) of ~8-16 ids. An insert appends (one C call);
    a removal or a probe scans its bucket in C (evictions find theirs near the front: store order).
    ~8 bytes an id and ~6 of bucket (header, slack), where a dict costs its entry (30-60 bytes with its
    slots) and a 60-bit int key (32): benchmarks/bench_kv_tenants.py. A probe costs more than an insert,
    so the store loop (kv_replica._store_blocks, inline) probes a store's blocks only up to the first
    one not held (see there)."""
    __slots__ = ("buckets", "limit", "mask", "n")

    def __init__(self, bits: int = 4) -> None:
        self.buckets = [array(ID_TYPE) for _ in range(1 << bits)]
        self.mask = (1 << bits) - 1   # a bucket: the id's low ``bits``
        self.n = 0                    # copies held
        self.limit = IDX_TARGET << bits

    def __len__(self) -> int:
        return self.n

    def ids(self) -> Iterable[int]:
        """Every id held, once per copy (in no order)."""
        for a in self.buckets:
            yield from a

    def copies(self, uid: int) -> int:
        return self.buckets[uid & self.mask].count(uid)

    def split(self) -> None:
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

    def added(self, n: int) -> None:
        """``n`` ids were appended to their buckets (by the store loop): twice the buckets if due."""
        self.n += n
        while self.n > self.limit:
            self.split()

    def hold_all(self, uids: Iterable[int]) -> None:
        """One more cached copy of each."""
        for uid in uids:
            self.buckets[uid & self.mask].append(uid)
            self.n += 1
            if self.n > self.limit:
                self.split()

    def release_all(self, uids: Iterable[int]) -> None:
        """One cached copy of each less (a reset, a restart, a replica leaving; an eviction removes its id
        inline, in kv_replica._removed)."""
        buckets, m = self.buckets, self.mask
        gone = 0
        for uid in uids:
            try:
                buckets[uid & m].remove(uid)
            except ValueError:        # not held: cannot happen while the index is exact
                continue
            gone += 1
        self.n -= gone
