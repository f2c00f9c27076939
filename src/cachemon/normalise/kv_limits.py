"""Bounds on a KV-event payload, read from msgpack headers before anything is decoded.

msgpack lets a few bytes stand for a Python object of ~50: a 5 MB frame of 5 million one-byte events
decoded to a list of ``msgspec.Raw`` took 230 MB, and a 15 MB frame of 5 million unknown events 4 s of
CPU (benchmarks/bench_kv_hostile.py). The decoder (normalise/kv_decode.py) therefore reads the declared
lengths first and refuses a batch with more events, or an event with more fields, than any vLLM sends:
one batch is one engine step, whose events are one BlockStored per request that filled blocks and one
BlockRemoved per evicted block (thousands at most), and an event has at most 16 fields (0.33.0).
What the ledger keeps is bounded in count (kv_events.max_blocks); the decoder bounds the size of each
kept value: a block hash sent as bytes (the ledger held 8 hashes of 64 KB a batch, 166 MB after 200
batches), a LoRA name and a medium (label values: 300 media of 64 KiB held 150 MB and made a 56 MiB
page); and the batch's timestamp, from which block lifetimes are
measured (a ts of 1e300 put 2e300 in the lifetime histogram's sum; NaN or inf made the ledger raise).
"""
from __future__ import annotations

MAX_EVENTS = 1 << 17     # events in one batch
MAX_FIELDS = 64          # fields of one event (array items or map keys)
MAX_HASH_BYTES = 64      # a block hash sent as bytes: vLLM's are 32-byte digests (sha256, sha256_cbor)
MAX_NAME_CHARS = 256     # a LoRA name (an exported label value)
MAX_MEDIUM_CHARS = 32    # a tier's medium (an exported label value): GPU, CPU, CPU_PINNED, EXTERNAL, ...
MAX_TIERS = 8            # media followed per replica (vLLM's offloading specs use one or two; SGLang's three)
MAX_SALT_CHARS = 4096    # an explicit cache_salt (SGLang): only its digest or keyed hash is ever kept
MAX_TS = 1e10            # a batch's ts (unix seconds, year 2286): beyond, or NaN, the lifetimes' sums break

# msgpack scalars a batch's ts may be (float, int, nil): first byte -> encoded size
_SCALAR = {0xCA: 5, 0xCB: 9, 0xCC: 2, 0xCD: 3, 0xCE: 5, 0xCF: 9, 0xD0: 2, 0xD1: 3, 0xD2: 5, 0xD3: 9, 0xC0: 1}


def declared_length(raw: bytes, at: int = 0) -> int | None:
    """The element count an array or map header at ``at`` declares (None: not an array or map, or cut)."""
    if at >= len(raw):
        return None
    b = raw[at]
    if 0x90 <= b <= 0x9F or 0x80 <= b <= 0x8F:
        return b & 0x0F
    width = {0xDC: 2, 0xDE: 2, 0xDD: 4, 0xDF: 4}.get(b)
    if width is None or at + 1 + width > len(raw):
        return None
    return int.from_bytes(raw[at + 1:at + 1 + width], "big")


def declared_events(payload: bytes) -> int | None:
    """How many events ``[ts, [event, ...], ...]`` declares (None: not that shape; the decoder says why)."""
    if not payload or not 0x92 <= payload[0] <= 0x93:
        return None
    b = payload[1] if len(payload) > 1 else -1
    size = 1 if (0 <= b <= 0x7F or b >= 0xE0) else _SCALAR.get(b)
    if size is None:
        return None
    at = 1 + size
    if at >= len(payload) or not (0x90 <= payload[at] <= 0x9F or payload[at] in (0xDC, 0xDD)):
        return None
    return declared_length(payload, at)
