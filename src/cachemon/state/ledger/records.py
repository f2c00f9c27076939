"""The ledger's packed records, named: one int per cached block and one per departed content.

A cached block is one dict entry (vLLM hash -> one packed int); 60-bit content ids are 2-digit
Python ints (32 bytes, not 40) and the record fits 4 digits (120 bits: 40 bytes) for 4 years of
milliseconds: 8 bytes saved three times per block (benchmarks/bench_kv_ledger.py).

    block record:     bits 0-59 content id | 60-73 depth | 74-81 copies | 82 open tail | 83-119 store time (ms)
                      | 120-131 tenant code | 132-179 key (the chain's salt and adapter)
    departure record: bits 0-2 reason (Reason.CAPACITY, RESET or RESTART) | 3+ time (ms)

The last two only exist in blocks of salted or adapter chains (state/ledger/tenants.py; the key only with
isolation on): the others pay nothing for them. The key is the content id xor the token content id
(isolation compares the latter): constant along a chain, it costs the store loop nothing per block
(``rec_base`` carries it). The helpers below are the one place the layout is spelled; the ledger's
innermost loops bind the same constants to locals (a call per block would cost more than the loop's
whole budget).
"""
from __future__ import annotations

from cachemon.state.ledger.reasons import Reason

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

