"""Token ids kept msgpack-encoded (normalise/kv_tokens.py) and the ledger's block keys from them.

* On every real vLLM 0.32.0 capture (tests/fixtures/vllm-0.32.0-cpu-kv-events/*): the regex fast path
  splits every BlockStored, its block keys equal the keys of the same token ids given as ints, and the
  ledger fed the encoded form and the int form ends with the same content ids and the same split.
* Hostile encodings (constructed below, labelled): they fall back to the int path or are counted
  (``malformed``, ledger out of sync), never a crash.
* A property (hypothesis): for random token lists (0 .. 2^32-1) and block sizes, the block slices of
  the encoded bytes are exactly the slices of the int list.
"""
from __future__ import annotations

import dataclasses

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from assert_support import nonempty
from cachemon.normalise import kv_tokens as KT
from cachemon.normalise.kv_batch import KvBatch, Stored
from cachemon.normalise.kv_decode import KvDecodeError, decode_payload
from cachemon.normalise.kv_tokens import EncodedTokens, block_keys, decode_ids
from cachemon.state.ledger.fleet import FleetLedger
from kv_support import KV_FIXTURES, messages

CAPTURES = sorted(p.name for p in KV_FIXTURES.iterdir() if (p / "events.jsonl").is_file()
                  and (p / "events.jsonl").stat().st_size) if KV_FIXTURES.is_dir() else []
ENC = msgspec.msgpack.encode


def _as_ints(b: KvBatch) -> KvBatch:
    return KvBatch(b.seq, b.ts, [dataclasses.replace(e, tokens=tuple(e.tokens)) if isinstance(e, Stored) else e
                                 for e in b.events], b.dp_rank, b.unknown, b.release)


def _feed(msgs: list[dict], ints: bool) -> FleetLedger:
    fleet = FleetLedger(keep_text=True)
    last: dict[str, int] = {}
    for m in msgs:
        rep, seq = m["replica"], int(m["seq"])
        if rep in last and seq == 0:
            fleet.on_restart(rep, m["t"])
        last[rep] = seq
        fleet.on_batch(rep, "tiny", _as_ints(m["batch"]) if ints else m["batch"], m["t"])
    return fleet


def test_every_real_capture_is_present():
    assert len(CAPTURES) >= 11, CAPTURES


@pytest.mark.parametrize("name", CAPTURES)
def test_fast_path_and_int_path_agree_on_real_captures(name):
    msgs = messages(KV_FIXTURES / name)
    stores = [e for m in msgs for e in m["batch"].events if isinstance(e, Stored)]
    assert stores
    for e in stores:
        assert type(e.tokens) is EncodedTokens            # the decoder keeps them encoded
        n, bs = len(e.hashes), e.block_size
        fast = KT._fast(e.tokens, n, bs)
        assert fast is not None                           # vLLM's own bytes take the fast path
        assert fast == block_keys(tuple(e.tokens), n, bs)  # ... and equal the ints' canonical bytes
        assert [decode_ids(k, bs, bs) for k in fast] == [tuple(e.tokens)[i:i + bs] for i in range(0, n * bs, bs)]
    enc, ints = _feed(msgs, ints=False), _feed(msgs, ints=True)
    reps = sorted({m["replica"] for m in msgs})
    for rep in reps:
        a, b = enc.replica(rep), ints.replica(rep)
        assert a is not None and b is not None
        assert sorted(a.cached_contents()) == sorted(b.cached_contents())          # same content ids
        assert sorted(a._hist) == sorted(b._hist) and sorted(a._hist_old) == sorted(b._hist_old)
        assert a.anomalies["malformed_stores"] == b.anomalies["malformed_stores"] == 0
        assert enc.view(rep) == ints.view(rep)                                     # same split, same finding
        assert enc.text_samples(rep) == ints.text_samples(rep)
    assert [s.depth.counts for s in enc.snapshot()] == [s.depth.counts for s in ints.snapshot()]


# --- hostile encodings (CONSTRUCTED) --------------------------------------------------------------

def _enc(items: bytes, count: int) -> EncodedTokens:
    tok = EncodedTokens.of((bytes([0x90 + count]) if count < 16 else b"\xdc" + count.to_bytes(2, "big")) + items)
    assert tok is not None
    return tok


def test_negative_and_64_bit_ids_fall_back_to_the_int_path_with_the_same_keys():
    ids = (5, -1, 2**63, -(2**63), 2**64 - 1, 70_000, 300, 200)
    tok = EncodedTokens.of(ENC(ids))
    assert tok is not None and KT._fast(tok, 2, 4) is None          # negatives are not on the fast path
    assert block_keys(tok, 2, 4) == block_keys(ids, 2, 4)
    assert [decode_ids(k, 4, 4) for k in block_keys(tok, 2, 4) or []] == [ids[:4], ids[4:]]
    assert block_keys((2**64,) + ids[1:], 2, 4) is None              # msgpack cannot hold it: counted by the ledger


@pytest.mark.parametrize("items, count", [
    (b"\xa1x" + b"\x01" * 3, 4),             # a string among the ids
    (b"\xcb" + b"\x00" * 8 + b"\x01" * 3, 4),  # a float
    (b"\xc0\x01\x02\x03", 4),                # nil
    (b"\x91\x01" + b"\x01" * 3, 4),          # a nested array
    (b"\x01\x02\x03", 4),                    # the header claims more items than there are
    (b"\x01" * 4 + b"\xcd", 4),              # trailing garbage after the items
    (b"\xcd\x01", 4),                        # truncated inside an item
])
def test_items_that_are_not_ids_are_counted_not_a_crash(items, count):
    tok = _enc(items, count)
    assert block_keys(tok, 1, 4) is None
    fleet = FleetLedger()
    fleet.on_batch("a", "m", KvBatch(0, 1.0, [Stored((1,), None, tok, 4)]), 1.0)
    led = fleet.replica("a")
    v = fleet.view("a")
    assert led is not None and led.anomalies["malformed_stores"] == 1 and v is not None
    assert v.in_sync is False and v.cached_blocks == 0 and sum(v.stored_tokens.values()) == 0
    # the ledger goes on: a good store after it is ledgered
    fleet.on_batch("a", "m", KvBatch(1, 2.0, [Stored((2,), None, (1, 2, 3, 4), 4)]), 2.0)
    assert fleet.view("a").cached_blocks == 1                        # type: ignore[union-attr]


def test_a_bad_item_deep_in_a_store_fails_the_fast_path_in_either_matcher():
    # CONSTRUCTED: 10 blocks of 4 (matched 8 blocks at a time, then one by one), a negative id in
    # block 2 or in block 9: the fast path says no, the fallback keys it like the ints
    for where in nonempty((9, 37)):
        ids = list(range(100, 140))
        ids[where] = -7
        tok = EncodedTokens.of(ENC(ids))
        assert tok is not None and KT._fast(tok, 10, 4) is None
        assert block_keys(tok, 10, 4) == block_keys(tuple(ids), 10, 4) is not None


def test_non_int_token_ids_through_the_decoder_are_counted_by_the_ledger():
    # CONSTRUCTED 0.32.0-shaped payload whose token ids hold a float: the decoder no longer reads the
    # items (kept encoded); the ledger does, counts it and marks itself out of sync
    ev = {"type": "BlockStored", "block_hashes": [7], "parent_block_hash": None, "token_ids": [1, 2, 3.5, 4],
          "block_size": 4, "lora_id": None, "medium": "GPU", "lora_name": None, "group_idx": 0,
          "kv_cache_spec_kind": "full_attention"}
    batch = decode_payload(ENC([1.0, [ev], 0]))
    fleet = FleetLedger()
    fleet.on_batch("a", "m", batch, 1.0)
    assert fleet.replica("a").anomalies["malformed_stores"] == 1 and fleet.view("a").in_sync is False  # type: ignore[union-attr]
    with pytest.raises(KvDecodeError) as e:                            # not an array at all: the decoder says so
        decode_payload(ENC([1.0, [dict(ev, token_ids="abcd")], 0]))
    assert e.value.reason == "bad_event"
    with pytest.raises(KvDecodeError) as e:                            # a count that does not add up
        decode_payload(ENC([1.0, [dict(ev, token_ids=[1, 2, 3])], 0]))
    assert e.value.reason == "token_count"


def test_non_canonical_unsigned_encodings_stay_consistent_within_a_stream():
    # CONSTRUCTED: 5 as uint16 (cd 00 05): no vLLM release sends it (msgspec writes the smallest form).
    # The fast path takes it as it is (docs: a limit), consistently: equal bytes give equal keys.
    odd = _enc(b"\xcd\x00\x05" * 4, 4)
    assert block_keys(odd, 1, 4) == [b"\xcd\x00\x05" * 4] == block_keys(_enc(b"\xcd\x00\x05" * 4, 4), 1, 4)
    assert odd.ids() == (5, 5, 5, 5) and odd == (5, 5, 5, 5)


def test_large_block_sizes_and_many_block_sizes_stay_bounded():
    ids = tuple(range(60_000, 60_000 + 2 * 1000))
    tok = EncodedTokens.of(ENC(ids))
    assert tok is not None and KT._fast(tok, 2, 1000) == block_keys(ids, 2, 1000)   # a counted repeat, not unrolled
    for bs in range(1, KT._MAX_PATTERNS + 5):
        block_keys(EncodedTokens.of(ENC(tuple(range(bs)))), 1, bs)                 # type: ignore[arg-type]
    assert len(KT._PATTERNS) <= KT._MAX_PATTERNS


def test_the_encoded_form_never_shows_its_ids():
    tok = EncodedTokens.of(ENC((123456, 654321)))
    assert repr(tok) == "EncodedTokens(2 token ids, 11 bytes)" and "123456" not in repr(Stored((1,), None, tok, 2))
    assert len(tok) == 2 and list(tok) == [123456, 654321] and tok[1] == 654321 and tok[:1] == (123456,)  # type: ignore[index]
    assert hash(tok) == hash((123456, 654321))


# --- the property -----------------------------------------------------------------------------------

# block sizes: around the msgpack header forms (fixarray < 16) and the unrolled pattern's limit (256);
# sampled, not every size, because each size compiles its own pattern (~50 ms for 256)
@pytest.mark.slow
@settings(max_examples=100, deadline=None)
@given(st.sampled_from([1, 2, 3, 7, 15, 16, 17, 32, 64, 128, 256, 257, 300]), st.integers(1, 20), st.data())
def test_block_slicing_of_the_bytes_equals_slicing_the_ints(bs, n, data):
    if bs > KT._GROUP_MAX_BS:
        n = min(n, 3)          # small blocks go 8 at a time (n up to 20 covers it); large ones one by one
    ids = data.draw(st.lists(st.integers(0, 2**32 - 1), min_size=n * bs, max_size=n * bs))
    tok = EncodedTokens.of(ENC(ids))
    assert tok is not None and len(tok) == n * bs
    keys = KT._fast(tok, n, bs)
    assert keys is not None and keys == block_keys(tuple(ids), n, bs)
    assert [decode_ids(k, bs, bs) for k in keys] == [tuple(ids[i:i + bs]) for i in range(0, n * bs, bs)]
    assert b"".join(keys) == ENC(ids)[tok.offset:]


def test_keep_text_samples_stay_bounded_for_huge_blocks():
    # CONSTRUCTED: blocks of 2 000 token ids; the second prompt has a new first block and repeats the
    # first prompt's later blocks under it (a dynamic-prefix vote): its sample is at most 1 024 ids
    bs = 2000
    shared = tuple(range(70_000, 70_000 + 2 * bs))
    fleet = FleetLedger(keep_text=True)
    for i, head in enumerate((1, 2)):
        ids = (head,) * bs + shared
        fleet.on_batch("a", "m", KvBatch(i, 1.0 + i, [Stored((10 * head, 10 * head + 1, 10 * head + 2), None,
                                                            EncodedTokens.of(ENC(ids)), bs)]), 1.0 + i)  # type: ignore[arg-type]
    samples = fleet.text_samples("a")
    assert samples == [(2,) * 1024]
