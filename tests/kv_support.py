"""Test support for the KV-event ledger: read a recorded capture and decode vLLM 0.32.0 payloads.

A stand-in for normalise/kv_decode.py (written on another branch): at merge the lead swaps
``decode_0_32`` for the real decoder. It knows only vLLM 0.32.0's encoding (docs/kv-events.md,
vllm/distributed/kv_events.py in v0.32.0): the payload is msgpack ``[ts, [event, ...], dp_rank]``
and each event a map tagged by "type" whose default-valued fields may be omitted.

A capture folder (tests/fixtures/vllm-0.32.0-cpu-kv-events/<scenario>/) holds events.jsonl, one
line per ZMQ message ``{t, replica, topic, seq, payload_b64}``, and requests.jsonl.
"""
from __future__ import annotations

import base64
import json
from pathlib import Path

import msgspec

from cachemon.normalise.kv_events import Cleared, KvBatch, Removed, Stored

KV_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "vllm-0.32.0-cpu-kv-events"
_DEC = msgspec.msgpack.Decoder()


def decode_0_32(seq: int, payload: bytes) -> KvBatch:
    ts, events, *rest = _DEC.decode(payload)
    out: list = []
    unknown = 0
    for e in events:
        kind = e.get("type")
        if kind == "BlockStored":
            extra = e.get("extra_keys")
            out.append(Stored(tuple(e["block_hashes"]), e.get("parent_block_hash"), tuple(e["token_ids"]),
                              int(e["block_size"]), e.get("lora_name") or (None if e.get("lora_id") is None
                                                                           else str(e["lora_id"])),
                              e.get("medium"), None if extra is None else tuple(extra), int(e.get("group_idx") or 0)))
        elif kind == "BlockRemoved":
            out.append(Removed(tuple(e["block_hashes"]), e.get("medium"), int(e.get("group_idx") or 0)))
        elif kind == "AllBlocksCleared":
            out.append(Cleared(e.get("medium")))
        else:
            unknown += 1
    return KvBatch(seq, float(ts), out, rest[0] if rest else None, unknown, "0.32.0")


def scenario(name: str) -> Path:
    return KV_FIXTURES / name


def messages(folder: Path) -> list[dict]:
    """The recorded messages in arrival order, each with its decoded batch under "batch"."""
    out = []
    with open(folder / "events.jsonl") as f:
        for line in f:
            if not line.strip():
                continue
            d = json.loads(line)
            d["batch"] = decode_0_32(int(d["seq"]), base64.b64decode(d["payload_b64"]))
            out.append(d)
    out.sort(key=lambda d: d["t"])
    return out


def requests(folder: Path) -> list[dict]:
    with open(folder / "requests.jsonl") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r for r in rows if "usage" in r]        # the recorder also logs events (a restart) here


def metadata(folder: Path) -> dict:
    return json.loads((folder / "metadata.json").read_text())


def replay(folder: Path, sink, model: str = "tiny") -> list[dict]:
    """Feed a capture to a KvSink as the source would: a sequence going back to 0 is a restart
    (the source's rule, sources/kv_events); messages in arrival order."""
    msgs = messages(folder)
    last: dict[str, int] = {}
    for m in msgs:
        rep, seq = m["replica"], int(m["seq"])
        if rep in last and seq <= last[rep] and seq == 0:
            sink.on_restart(rep, m["t"])
        last[rep] = seq
        sink.on_batch(rep, model, m["batch"], m["t"])
    return msgs
