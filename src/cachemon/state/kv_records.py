"""The ledger's packed records, named: one int per cached block and one per departed content.

A cached block is one dict entry (vLLM hash -> one packed int); 60-bit content ids are 2-digit
Python ints (32 bytes, not 40) and the record fits 4 digits (120 bits: 40 bytes) for 4 years of
milliseconds: 8 bytes saved three times per block (benchmarks/bench_kv_ledger.py).

    block record:     bits 0-59 content id | 60-73 depth | 74-81 copies | 82 open tail | 83-119 store time (ms)
                      | 120-131 tenant code | 132-191 token content id
    departure record: bits 0-2 reason (Reason.CAPACITY, RESET or RESTART) | 3+ time (ms)

The last two only exist in blocks of salted or adapter chains (state/kv_tenants.py): the others pay
nothing for them. The helpers below are the one place the layout is spelled; the ledger's innermost loops bind the
same constants to locals (a call per block would cost more than the loop's whole budget).
"""
from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable

from cachemon.state.kv_reasons import Reason

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
UID_SHIFT = 132
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
    """The token content id (isolation): kept apart for salted / adapter chains, else the content id."""
    uid = rec >> UID_SHIFT
    return uid if uid else rec & CID_MASK


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


IDX_END = (1 << 64) - 1           # each bucket's last word: above every id (so a probe needs no bounds test)
IDX_TARGET = 16                   # mean entries per bucket past which the buckets double


class ContentIndex:
    """The isolation index of a model: the token content id of every block cached in its fleet, once
    per copy (a multiset), exact, with no object per entry. Ids are hashes (uniform), so their top bits
    pick a bucket: a sorted ``array('Q')`` of ~8-16 ids ending with IDX_END, searched with ``bisect``
    (in C). ~8 bytes an id and ~8 of bucket (header, slack), where a dict costs its entry (30-60 bytes
    with its slots) and a 60-bit int key (32): benchmarks/bench_kv_tenants.py. The price is CPU: a
    probe costs ~3x a dict lookup (docs/kv-events.md, "Per-tenant accounting"). The store loop
    (kv_replica._store_blocks) probes and inserts inline."""
    __slots__ = ("buckets", "limit", "n", "shift")

    def __init__(self, bits: int = 4) -> None:
        self.buckets = [array("Q", (IDX_END,)) for _ in range(1 << bits)]
        self.shift = 60 - bits        # a bucket: the id's top ``bits`` of 60
        self.n = 0                    # copies held
        self.limit = IDX_TARGET << bits

    def __len__(self) -> int:
        return self.n

    def copies(self, uid: int) -> int:
        a = self.buckets[uid >> self.shift]
        return bisect_right(a, uid) - bisect_left(a, uid)

    def split(self) -> None:
        """Twice the buckets: each sorted bucket cut at its middle id (amortised: once per doubling)."""
        s = self.shift - 1
        out: list[array[int]] = []
        for k, a in enumerate(self.buckets):
            m = bisect_left(a, (2 * k + 1) << s)
            low = a[:m]
            low.append(IDX_END)
            out += (low, a[m:])
        self.buckets, self.shift, self.limit = out, s, self.limit * 2

    def added(self, n: int) -> None:
        """``n`` ids were inserted in their buckets (by the store loop): twice the buckets if due."""
        self.n += n
        while self.n > self.limit:
            self.split()

    def hold_all(self, uids: Iterable[int]) -> None:
        """One more cached copy of each."""
        for uid in uids:
            a = self.buckets[uid >> self.shift]
            a.insert(bisect_left(a, uid), uid)
            self.n += 1
            if self.n > self.limit:
                self.split()

    def release_all(self, uids: Iterable[int]) -> None:
        """One cached copy of each less (the hot path: a run of removals in one call)."""
        buckets, s = self.buckets, self.shift
        gone = 0
        for uid in uids:
            try:
                buckets[uid >> s].remove(uid)
            except ValueError:        # not held: cannot happen while the index is exact
                continue
            gone += 1
        self.n -= gone
