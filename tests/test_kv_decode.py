"""KV-event payload decoding (normalise/kv_decode.py): the real vLLM 0.32.0 capture, and payloads of the
releases no capture covers.

The older-release payloads here are CONSTRUCTED: each is encoded with msgspec from struct declarations
written down in this file from vllm/distributed/kv_events.py at the tag named beside them (field names,
order, defaults and struct options: array_like, tag, omit_defaults), as read from that release's wheel.
"""
from __future__ import annotations

import base64
import json
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest

from assert_support import nonempty
from cachemon.normalise.kv_batch import Cleared, Removed, Stored
from cachemon.normalise.kv_decode import ERAS, KvDecodeError, KvDecoder, decode_payload
from helpers import FIXTURES

CAPTURE = FIXTURES / "vllm-0.32.0-cpu-kv-events"
# a scenario is complete once its metadata.json is written (the recorder's last step)
SCENARIOS = sorted(p.parent for p in CAPTURE.glob("*/events.jsonl") if (p.parent / "metadata.json").exists())
HUGE = 2**64 - 12345          # a hash above 2**53: a float would round it


def messages(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# --- the real capture ---------------------------------------------------------------------------------

def _oracle(payload: bytes) -> list[dict]:
    """The same payload read with no schema at all (msgspec's untyped msgpack): the batch is
    [ts, events, dp_rank] and each 0.32.0 event a map with "type"."""
    ts, events, *rest = msgspec.msgpack.decode(payload)
    return events


@pytest.mark.skipif(not SCENARIOS, reason="the 0.32.0 KV-event capture (capture branch) is not in this checkout")
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda p: p.name)
def test_every_captured_message_decodes_and_agrees_with_a_schemaless_read(scenario):
    decoders: dict[str, KvDecoder] = {}
    by_type: Counter[str] = Counter()
    oracle_types: Counter[str] = Counter()
    big = 0
    for m in messages(scenario / "events.jsonl"):
        payload = base64.b64decode(m["payload_b64"])
        batch = decoders.setdefault(m["replica"], KvDecoder()).decode(payload, m["seq"])
        assert batch.seq == m["seq"] and batch.unknown == 0 and batch.dp_rank == 0
        assert "0.32.0" in _release_range(batch.release)
        raw = _oracle(payload)
        assert len(raw) == len(batch.events)
        for ev, r in zip(batch.events, raw, strict=True):
            oracle_types[r["type"]] += 1
            if isinstance(ev, Stored):
                by_type["BlockStored"] += 1
                assert list(ev.hashes) == r["block_hashes"] and ev.parent == r["parent_block_hash"]
                assert list(ev.tokens) == r["token_ids"] and ev.block_size == r["block_size"]
                assert len(ev.tokens) == len(ev.hashes) * ev.block_size
                assert ev.medium == r.get("medium") == "GPU" and ev.group == r.get("group_idx", 0)
                big += sum(1 for h in ev.hashes if isinstance(h, int) and h > 2**53)
            elif isinstance(ev, Removed):
                by_type["BlockRemoved"] += 1
                assert list(ev.hashes) == r["block_hashes"] and len(ev.hashes) == 1   # one per event on 0.32.0
            else:
                assert isinstance(ev, Cleared)
                by_type["AllBlocksCleared"] += 1
    assert by_type == oracle_types and by_type["BlockStored"] > 0
    assert big > 0                                   # hashes above 2**53 came through exact
    if scenario.name == "tiny_pool":
        assert by_type["BlockRemoved"] > 0           # the tiny pool evicts
    if scenario.name == "reset":
        assert by_type["AllBlocksCleared"] >= 1


def _release_range(label: str) -> list[str]:
    """Every release name the label's range covers (by the era table's order)."""
    first, _, last = label.partition("-")
    names = [n for e in ERAS for n in (e.first, e.last)]
    return names[names.index(first): names.index(last or first) + 1]


@pytest.mark.skipif(not (CAPTURE / "restart").exists(), reason="the capture's restart scenario is not in this checkout")
def test_the_captured_restart_begins_again_at_seq_0():
    seqs = [m["seq"] for m in messages(CAPTURE / "restart" / "events.jsonl")]
    assert seqs[0] == 0 and 0 in seqs[1:]          # what the source reads as a new process


# --- constructed payloads of every release's encoding ---------------------------------------------------

_H = int | bytes
# Per release: (batch has data_parallel_rank, events array_like, BlockStored fields, BlockRemoved fields),
# each field (name, type, default or REQUIRED), in declaration order, from vllm/distributed/kv_events.py at that tag.
REQ = msgspec.NODEFAULT
_S0 = [("block_hashes", list[int], REQ), ("parent_block_hash", int | None, REQ), ("token_ids", list[int], REQ),
       ("block_size", int, REQ), ("lora_id", int | None, REQ)]
_S1 = [(n, (list[_H] if n == "block_hashes" else _H | None if n == "parent_block_hash" else t), d) for n, t, d in _S0] \
    + [("medium", str | None, REQ)]
_S2 = _S1 + [("lora_name", str | None, REQ)]
_S3 = _S2 + [("extra_keys", list[Any] | None, None)]
_S4 = _S3 + [("group_idx", int | None, None)]
_S5 = _S4 + [("kv_cache_spec_kind", str | None, None), ("kv_cache_spec_sliding_window", int | None, None)]
_R0 = [("block_hashes", list[int], REQ)]
_R1 = [("block_hashes", list[_H], REQ), ("medium", str | None, REQ)]
_R2 = _R1 + [("group_idx", int | None, None)]
RELEASES = {
    "0.9.0": (False, True, _S0, _R0),
    "0.9.1": (True, True, _S0, _R0),
    "0.10.2": (True, True, _S1, _R1),
    "0.14.0": (True, True, _S2, _R1),
    "0.17.0": (True, True, _S3, _R1),
    "0.20.0": (True, True, _S4, _R2),
    "0.22.0": (True, True, _S5, _R2),
    "0.24.0": (True, False, _S5, _R2),
    "0.26.0": (True, False, _S5 + [("locality", str | None, None)], _R2 + [("locality", str | None, None)]),
    "0.29.0": (True, False, _S5 + [("locality", str | None, None), ("ownership", str | None, None)],
               _R2 + [("locality", str | None, None), ("ownership", str | None, None)]),
    "0.30.0": (True, False, _S5 + [("locality", str | None, None), ("ownership", str | None, None),
                                   ("session_id", str | None, None)],
               _R2 + [("locality", str | None, None), ("ownership", str | None, None)]),
    "0.33.0": (True, False, _S5 + [("locality", str | None, None), ("ownership", str | None, None),
                                   ("session_id", str | None, None), ("lookahead_token_ids", list[list[int]] | None, None)],
               _R2 + [("locality", str | None, None), ("ownership", str | None, None)]),
}


def structs(release: str):
    """msgspec Structs declared like that release's (constructed: see the module docstring)."""
    dp, array_like, stored, removed = RELEASES[release]
    opts = {"omit_defaults": True, "tag": True, "array_like": array_like}
    fields = lambda fs: [(n, t) if d is REQ else (n, t, d) for n, t, d in fs]     # noqa: E731
    S = msgspec.defstruct("BlockStored", fields(stored), **opts)
    R = msgspec.defstruct("BlockRemoved", fields(removed), **opts)
    A = msgspec.defstruct("AllBlocksCleared", [], **opts)
    batch_fields = [("ts", float), ("events", list[Any])] + ([("data_parallel_rank", int | None, None)] if dp else [])
    B = msgspec.defstruct("KVEventBatch", batch_fields, array_like=True, omit_defaults=True)
    return B, S, R, A, dp


def payload_of(release: str, *, hashes=(HUGE, 7), parent=None, extra: dict | None = None, bytes_hashes=False) -> bytes:
    B, S, R, A, dp = structs(release)
    names = {f for f, *_ in RELEASES[release][2]}
    hs = [h.to_bytes(8, "big") if bytes_hashes and isinstance(h, int) else h for h in hashes]
    kw = {"block_hashes": hs, "parent_block_hash": parent, "token_ids": list(range(16 * len(hs))),
          "block_size": 16, "lora_id": None}
    kw.update({k: v for k, v in {"medium": "GPU", "lora_name": None}.items() if k in names})
    kw.update(extra or {})
    removed_fields = {f for f, *_ in RELEASES[release][3]}
    removed = {"block_hashes": [hs[0]]} | ({"medium": "GPU"} if "medium" in removed_fields else {})
    events = [R(**removed), S(**kw), A()]
    return msgspec.msgpack.encode(B(1700000000.5, events, **({"data_parallel_rank": 0} if dp else {})))


@pytest.mark.parametrize("release", list(RELEASES))
def test_each_release_encoding_decodes_and_names_its_release(release):
    batch = decode_payload(payload_of(release), seq=3)
    assert release in _release_range(batch.release)
    removed, stored, cleared = batch.events
    assert isinstance(removed, Removed) and removed.hashes == (HUGE,)
    assert isinstance(stored, Stored) and stored.hashes == (HUGE, 7) and stored.parent is None
    assert stored.tokens == tuple(range(32)) and stored.block_size == 16 and stored.group == 0
    assert isinstance(cleared, Cleared)
    assert batch.ts == 1700000000.5 and batch.seq == 3 and batch.unknown == 0


def test_the_release_range_is_exact_for_arrays_and_narrows_with_the_keys_a_map_stream_sends():
    # msgspec writes every field of an array_like struct (None included): each array era has its own length
    for release, label in (("0.9.0", "0.9.0-0.9.0.1"), ("0.9.1", "0.9.1-0.10.1.1"), ("0.10.2", "0.10.2-0.13.0"),
                           ("0.14.0", "0.14.0-0.16.0"), ("0.17.0", "0.17.0-0.19.1"), ("0.20.0", "0.20.0-0.21.0"),
                           ("0.22.0", "0.22.0-0.23.0")):
        assert decode_payload(payload_of(release)).release == label
    # maps omit None-valued optional keys: the range narrows only when one is sent
    assert decode_payload(payload_of("0.24.0")).release == "0.24.0-0.34.0"
    assert decode_payload(payload_of("0.26.0", extra={"locality": "LOCAL"})).release == "0.26.0-0.34.0"
    assert decode_payload(payload_of("0.30.0", extra={"session_id": "s"})).release == "0.30.0-0.34.0"
    assert decode_payload(payload_of("0.33.0", extra={"lookahead_token_ids": [[1], [2]]})).release == "0.33.0-0.34.0"


def test_a_newer_release_with_fields_no_release_has_decodes_and_says_so():
    # constructed: 0.33.0's maps with one more key, and 0.22.0's arrays with one more element
    raw = msgspec.msgpack.decode(payload_of("0.33.0"))
    raw[1][1]["some_future_field"] = [1, 2]
    b = decode_payload(msgspec.msgpack.encode(raw))
    assert b.release == "0.33.0+" and isinstance(b.events[1], Stored) and b.events[1].hashes == (HUGE, 7)
    raw = msgspec.msgpack.decode(payload_of("0.22.0"))
    raw[1][1].append("future")
    b = decode_payload(msgspec.msgpack.encode(raw))
    assert b.release == "0.22.0+" and b.events[1].tokens == tuple(range(32))


def test_old_signed_hashes_and_digest_bytes_stay_exact():
    b = decode_payload(payload_of("0.9.1", hashes=(-(2**63), 2**63 - 1), parent=-5))
    assert b.events[1].hashes == (-(2**63), 2**63 - 1) and b.events[1].parent == -5      # Python hash(): signed
    b = decode_payload(payload_of("0.10.2", hashes=(HUGE,), bytes_hashes=True))        # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0
    assert b.events[1].hashes == (HUGE.to_bytes(8, "big"),)


def test_lora_extra_keys_group_and_lookahead_are_kept():
    b = decode_payload(payload_of("0.33.0", extra={
        "lora_name": "sql", "lora_id": 3, "extra_keys": [["sql", ["mm-1", 0], "salt"], None], "group_idx": 2,
        "lookahead_token_ids": [[1, 2], [3]]}))
    s = b.events[1]
    assert s.lora == "sql" and s.group == 2
    assert s.extra == (("sql", ("mm-1", 0), "salt"), None)            # hashable: it feeds the content id
    assert s.lookahead == ((1, 2), (3,))
    hash(s.extra)
    old = decode_payload(payload_of("0.9.1", extra={"lora_id": 3})).events[1]
    assert old.lora == "3"                                             # no names before 0.14.0: the id


# --- unknown types, malformed payloads ----------------------------------------------------------------

@pytest.mark.parametrize("array_like", [True, False])
def test_unknown_event_types_are_counted_and_skipped(array_like):
    release = "0.22.0" if array_like else "0.30.0"
    B, S, R, A, _ = structs(release)
    Future = msgspec.defstruct("BlockPromoted", [("block_hashes", list[int])], tag=True, array_like=array_like)
    Other = msgspec.defstruct("X" * 500, [], tag=True, array_like=array_like)
    kw = {"block_hashes": [5], "parent_block_hash": None, "token_ids": list(range(16)), "block_size": 16,
          "lora_id": None, "medium": "GPU", "lora_name": None}
    payload = msgspec.msgpack.encode(B(1.0, [Future([1]), S(**kw), Future([2]), Other(), A()], 0))
    dec = KvDecoder()
    b = dec.decode(payload, 0)
    assert [type(e) for e in b.events] == [Stored, Cleared]
    assert b.unknown == 3 and b.skipped == {"BlockPromoted": 2, "X" * 64: 1}      # names bounded
    # the stream keeps decoding fast afterwards
    assert dec.decode(payload_of(release), 1).unknown == 0


@pytest.mark.parametrize("payload, reason", [
    (b"\xc1", "bad_batch"),                                            # not msgpack
    (msgspec.msgpack.encode({"ts": 1.0, "events": []}), "bad_batch"),  # a map batch: no release sends one
    (msgspec.msgpack.encode([1.0, [1, 2]]), "bad_event"),              # events that are not structs
    (msgspec.msgpack.encode([1.0, [["BlockStored", [1], None, [1, 2, 3], 16, None]], 0]), "token_count"),
    (msgspec.msgpack.encode([1.0, [{"type": "BlockStored", "block_hashes": [1]}], 0]), "unknown_era"),
    (msgspec.msgpack.encode([1.0, [["BlockRemoved", [1]], {"type": "AllBlocksCleared"}], 0]), "bad_event"),
])
def test_malformed_payloads_raise_a_typed_error_with_a_reason(payload, reason):
    with pytest.raises(KvDecodeError) as e:
        decode_payload(payload)
    assert e.value.reason == reason


def test_hostile_nesting_is_a_decode_error_not_a_crash():
    deep = b"\x91" * 100_000 + b"\xc0"                      # constructed: [[[[...]]]] 100 000 deep
    ts = msgspec.msgpack.encode(1.0)
    for payload in nonempty((b"\x93" + ts + deep, b"\x93" + ts + b"\x91\x82\xa4type\xabBlockStored\xaaextra_keys" + deep)):
        with pytest.raises(KvDecodeError) as e:
            decode_payload(payload)
        assert e.value.reason in ("bad_batch", "bad_event")


def test_a_known_event_that_does_not_fit_fails_the_batch_once_the_era_is_known():
    dec = KvDecoder()
    dec.decode(payload_of("0.30.0"), 0)
    bad = msgspec.msgpack.encode([1.0, [{"type": "BlockRemoved", "block_hashes": "nope"}], 0])
    with pytest.raises(KvDecodeError) as e:
        dec.decode(bad, 1)
    assert e.value.reason == "bad_event"
    assert dec.decode(payload_of("0.30.0"), 2).events        # and the next good batch decodes


def test_a_new_release_after_a_restart_is_detected_again():
    dec = KvDecoder()
    assert dec.decode(payload_of("0.22.0"), 0).release == "0.22.0-0.23.0"
    dec.reset()                                                         # what the source does at a restart
    assert dec.decode(payload_of("0.30.0"), 0).release == "0.24.0-0.34.0"
    # and even without a seen restart, a layout change is learnt instead of failing every batch
    assert dec.decode(payload_of("0.17.0"), 1).release == "0.17.0-0.19.1"
    assert isinstance(dec.decode(payload_of("0.17.0"), 2).events[1], Stored)


def test_the_docs_table_lists_every_era_of_the_decoder():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "kv-events.md").read_text()
    section = doc[doc.index("### Releases decoded"): doc.index("### Configuration")]
    rows = [line.split("|")[1].strip() for line in section.splitlines() if line.startswith("| 0.")]
    assert rows == [e.first if e.first == e.last else f"{e.first} - {e.last}" for e in ERAS]
    assert [e.layout for e in ERAS] == ["array"] * 7 + ["map"] * 5
