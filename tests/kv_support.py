"""Reading the real KV-event recordings (tests/fixtures/vllm-0.32.0-cpu-kv-events/SCENARIO/) in tests,
and a reference classifier of the blocks vLLM stored.

``events.jsonl`` (written by scripts/e2e/kv_record.py) has one line per ZMQ message a replica
published: ``{"t", "replica", "topic", "seq", "payload_b64"}``; the payload is vLLM 0.32.0's
msgpack ``KVEventBatch``, ``[ts, [event, ...], dp_rank]``, each event a map with a ``"type"`` tag
(``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``; vllm/distributed/kv_events.py, 0.32.0),
or an older release's array ``[tag, field, ...]`` (the 0.11.2 capture), read as that map.
Decoded here with msgspec only (no vllm, no cachemon code), so the tests that use it check
cachemon against vLLM's own record.

``reference_split`` is deliberately the plainest reading of the classification in docs/kv-events.md
("Classification of stored blocks"), block by block, with exact content identities (interned
tuples of parent identity, token ids, extra keys, lora: no hashing, no bounds), so that it can be
read and believed. It is the yardstick ``cachemon analyze`` and the live ledger are held to.

The second half (``scenario``, ``messages``, ``replay``) feeds the same recordings to the live
ledger through cachemon's own decoder (normalise/kv_decode.py), as the KV-event stage would.
"""
from __future__ import annotations

import base64
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

# The reasons, written out independently of cachemon's; isolation (another cache_salt or adapter) never
# comes out of this reference (it keys content with its salt), nor out of analyze's simulation; nor does
# sliding_window (a hybrid model's window cost: tests/test_kv_hybrid_real.py derives it from both groups), nor
# cache_opt_out (requests that skip the lookup: tests/test_kv_opt_out_real.py derives it from their stores).
REASONS = ("restart", "reset", "capacity", "routing", "first", "recompute_last_block", "isolation", "sliding_window",
           "cache_opt_out")


@dataclass
class KvMessage:
    """One published message of one replica, decoded."""
    t: float                  # receive time (the recorder's clock)
    replica: str
    seq: int
    ts: float                 # vLLM's batch timestamp
    events: list[dict]
    dp_rank: int | None


# Array-like events (vLLM up to 0.23.0: ``[tag, field, ...]``, every field of the release present, in
# declaration order; vllm/distributed/kv_events.py of each release): the field names in that order, the
# union over releases (a release's array simply ends earlier). Read as the maps 0.24.0 on sends.
ARRAY_FIELDS = {"BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                                "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
                                "kv_cache_spec_sliding_window"),
                "BlockRemoved": ("block_hashes", "medium", "group_idx"),
                "AllBlocksCleared": ()}


def as_map(event: dict | list) -> dict:
    """An event as a map with ``"type"``: a map as it came, an array event named by ``ARRAY_FIELDS``."""
    if isinstance(event, dict):
        return event
    tag, *values = event
    names = ARRAY_FIELDS[tag]
    assert len(values) <= len(names), f"{tag} with {len(values)} fields"
    return {"type": tag, **dict(zip(names, values, strict=False))}


def load_messages(scenario_dir: str | Path) -> list[KvMessage]:
    """Every message of ``events.jsonl``, in the order they were received (all replicas); events as
    maps whatever the release sent (``as_map``)."""
    import msgspec
    out = []
    for line in (Path(scenario_dir) / "events.jsonl").read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        m = json.loads(line)
        ts, events, dp_rank = msgspec.msgpack.decode(base64.b64decode(m["payload_b64"]))
        out.append(KvMessage(m["t"], m["replica"], m["seq"], ts, [as_map(e) for e in events], dp_rank))
    out.sort(key=lambda x: x.t)
    return out


def load_requests(scenario_dir: str | Path) -> list[dict]:
    """The lines of ``requests.jsonl`` (requests and ``{"event": ...}`` lines), as recorded."""
    text = (Path(scenario_dir) / "requests.jsonl").read_text(encoding="utf-8")
    return [json.loads(x) for x in text.splitlines() if x.strip()]


@dataclass
class _Replica:
    by_hash: dict[int, int] = field(default_factory=dict)      # vLLM hash -> content identity
    refs: Counter = field(default_factory=Counter)              # vLLM hash -> cached copies
    cached: Counter = field(default_factory=Counter)            # content identity -> cached copies
    departed: dict[int, str] = field(default_factory=dict)     # content identity -> how it left (latest)
    split: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    last_seq: int | None = None


def _ref_removed(rep: _Replica, hashes: list[int]) -> None:
    """One copy of each block leaves; the last copy of a content: capacity."""
    for h in hashes:
        rep.refs[h] -= 1
        assert rep.refs[h] >= 0, "BlockRemoved of a block never stored"
        c = rep.by_hash[h]
        rep.cached[c] -= 1
        if rep.refs[h] == 0:
            del rep.refs[h], rep.by_hash[h]
        if rep.cached[c] == 0:
            del rep.cached[c]
            rep.departed[c] = "capacity"


def _ref_stored(rep: _Replica, reps: dict[str, _Replica], e: dict, content) -> None:
    """Each block of a store, classified in the contract's order (reference_split's docstring)."""
    bs = e["block_size"]
    toks = e["token_ids"]
    parent = e.get("parent_block_hash")
    pc = None if parent is None else rep.by_hash[parent]   # the parent is in use: cached
    extras = e.get("extra_keys") or []
    for k, h in enumerate(e["block_hashes"]):
        c = content(pc, tuple(toks[k * bs:(k + 1) * bs]), extras[k] if k < len(extras) else None,
                    e.get("lora_name") or e.get("lora_id"))
        if rep.cached[c] > 0:
            why = "recompute_last_block"
        elif c in rep.departed:
            why = rep.departed.pop(c)
        elif any(o.cached[c] > 0 for o in reps.values() if o is not rep):
            why = "routing"
        else:
            why = "first"
        rep.split[why] += bs
        rep.cached[c] += 1
        rep.refs[h] += 1
        rep.by_hash[h] = c
        pc = c

def reference_split(messages: list[KvMessage]) -> dict[str, dict[str, int]]:
    """Stored tokens by reason, per replica, from the events alone.

    Per stored block, in the contract's order: its content is cached on this replica now
    (``recompute_last_block``); else it was cached on this replica and left -- the reason of its
    latest departure: a restart (the replica's sequence number went back to 0: a new vLLM process),
    an ``AllBlocksCleared`` (reset) or a ``BlockRemoved`` of its last copy (capacity); else it is
    cached now on another replica (``routing``); else ``first``. Content is the chain of token ids
    from the start of the prompt (plus extra keys and lora), never vLLM's hash, which is per
    process. Requires messages in the order they happened (one request at a time)."""
    interned: dict[tuple, int] = {}
    reps: dict[str, _Replica] = {}

    def content(parent: int | None, tokens: tuple, extra, lora) -> int:
        key = (parent, tokens, json.dumps(extra, sort_keys=True, default=str), lora)
        return interned.setdefault(key, len(interned))

    def depart_all(rep: _Replica, why: str) -> None:
        for c in rep.cached:
            rep.departed[c] = why
        rep.cached.clear()
        rep.by_hash.clear()
        rep.refs.clear()

    for m in messages:
        rep = reps.setdefault(m.replica, _Replica())
        if m.seq == 0 and rep.last_seq is not None:
            depart_all(rep, "restart")          # a new publisher process: nothing survived it
        rep.last_seq = m.seq
        for e in m.events:
            kind = e["type"]
            if kind == "AllBlocksCleared":
                depart_all(rep, "reset")
            elif kind == "BlockRemoved":
                _ref_removed(rep, e["block_hashes"])
            elif kind == "BlockStored":
                _ref_stored(rep, reps, e, content)
            else:
                raise AssertionError(f"unknown event type {kind!r}")
    return {name: r.split for name, r in reps.items()}


def total(splits: dict[str, dict[str, int]]) -> dict[str, int]:
    """The fleet's split: per-replica splits added up."""
    return {r: sum(s[r] for s in splits.values()) for r in REASONS}


def to_batch(m: KvMessage):
    """The message as cachemon's normalised ``KvBatch`` (normalise/kv_batch.py), for feeding the
    live ledger in tests; fields as vLLM 0.32.0 names them (defaults omitted on the wire)."""
    from cachemon.normalise.kv_batch import Cleared, KvBatch, Removed, Stored
    events: list = []
    for e in m.events:
        kind = e["type"]
        if kind == "BlockStored":
            extra = e.get("extra_keys")
            events.append(Stored(tuple(e["block_hashes"]), e.get("parent_block_hash"), tuple(e["token_ids"]),
                                 e["block_size"], e.get("lora_name"), e.get("medium"),
                                 tuple(extra) if extra else None, e.get("group_idx", 0)))
        elif kind == "BlockRemoved":
            events.append(Removed(tuple(e["block_hashes"]), e.get("medium"), e.get("group_idx", 0)))
        elif kind == "AllBlocksCleared":
            events.append(Cleared(e.get("medium")))
        else:
            raise AssertionError(f"unknown event type {kind!r}")
    return KvBatch(m.seq, m.ts, events, m.dp_rank)


def ledger_split(messages: list[KvMessage], model: str = "tiny") -> dict[str, dict[str, int]]:
    """The live ledger's split (state/ledger/fleet.FleetLedger, the contract's KvSink and view), fed
    the recording as the KV-event stage would: a sequence number back at 0 is a restart."""
    from cachemon.state.ledger.fleet import FleetLedger
    fleet = FleetLedger()
    last: dict[str, int] = {}
    for m in messages:
        if m.seq == 0 and m.replica in last:
            fleet.on_restart(m.replica, m.t)
        last[m.replica] = m.seq
        fleet.on_batch(m.replica, model, to_batch(m), m.t)
    out = {}
    for replica in last:
        view = fleet.view(replica)
        assert view is not None and view.in_sync
        out[replica] = {r: int(view.stored_tokens.get(r, 0)) for r in REASONS}
    return out


# --- feeding the live ledger (tests/test_kv_ledger_real.py) ---------------------------------------

KV_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "vllm-0.32.0-cpu-kv-events"
def scenario(name: str) -> Path:
    return KV_FIXTURES / name


def messages(folder: Path) -> list[dict]:
    """The recorded messages in arrival order, each decoded by cachemon's own decoder
    (normalise/kv_decode.py, one per replica as the source keeps one per stream) under "batch"."""
    from cachemon.normalise.kv_decode import KvDecoder
    decoders: dict[str, KvDecoder] = {}
    out = []
    with open(folder / "events.jsonl") as f:
        for line in f:
            if not line.strip():
                continue
            d = json.loads(line)
            dec = decoders.setdefault(d["replica"], KvDecoder())
            d["batch"] = dec.decode(base64.b64decode(d["payload_b64"]), int(d["seq"]))
            out.append(d)
    out.sort(key=lambda d: d["t"])
    return out


def requests(folder: Path) -> list[dict]:
    with open(folder / "requests.jsonl") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r for r in rows if "usage" in r]        # the recorder also logs events (a restart) here


def metadata(folder: Path) -> dict:
    return json.loads((folder / "metadata.json").read_text())


def replay(folder: Path, sink, model: str = "tiny", each=None) -> list[dict]:
    """Feed a capture to a KvSink as the source would: a sequence going back to 0 is a restart
    (the source's rule, sources/kv_events); messages in arrival order. ``each(message)`` is called
    after each one is fed."""
    msgs = messages(folder)
    last: dict[str, int] = {}
    for m in msgs:
        rep, seq = m["replica"], int(m["seq"])
        if rep in last and seq <= last[rep] and seq == 0:
            sink.on_restart(rep, m["t"])
        last[rep] = seq
        sink.on_batch(rep, model, m["batch"], m["t"])
        if each is not None:
            each(m)
    return msgs
