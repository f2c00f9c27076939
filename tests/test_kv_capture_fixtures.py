"""The real KV-event recordings (tests/fixtures/vllm-0.32.0-cpu-kv-events/) are intact and say
what the other parts of the KV-event feature rely on (docs/kv-events.md, the notes' facts).

Decoding uses msgspec's msgpack only (no vllm). Every scenario was recorded by
scripts/e2e/kv_record.py from real vLLM 0.32.0 CPU servers; nothing here is constructed.
"""
from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from assert_support import nonempty

msgspec = pytest.importorskip("msgspec")

FIX = Path(__file__).parent / "fixtures" / "vllm-0.32.0-cpu-kv-events"
BS = 128
SCENARIOS = ["tiny_pool", "reset", "restart", "dynamic_prefix_head", "dynamic_prefix_tail", "routing",
             "bursts", "multiturn", "cold_start", "block_edge", "bursts_tiny_pool", "cache_salt", "routing_hashseed"]
SEQUENTIAL = [s for s in SCENARIOS if not s.startswith("bursts")]     # one request at a time (per replica)
# the keys of each event map, in wire order, as vLLM 0.32.0 sent them (none omitted in these runs)
KEYS = {"BlockStored": ("type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                        "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind"),
        "BlockRemoved": ("type", "block_hashes", "medium", "group_idx"),
        "AllBlocksCleared": ("type",)}
KNOWN = set(KEYS)


def _present():
    return [s for s in SCENARIOS if (FIX / s / "events.jsonl").is_file()]


def load(scenario):
    d = FIX / scenario
    msgs = []
    for line in (d / "events.jsonl").read_text().splitlines():
        m = json.loads(line)
        ts, events, dp_rank = msgspec.msgpack.decode(base64.b64decode(m["payload_b64"]))
        msgs.append({**m, "ts": ts, "events": events, "dp_rank": dp_rank})
    reqs = [json.loads(x) for x in (d / "requests.jsonl").read_text().splitlines() if x.strip()]
    meta = json.loads((d / "metadata.json").read_text())
    # every test here loops over these: a capture without events or requests would prove nothing
    assert msgs and reqs, f"{scenario}: {len(msgs)} event batches, {len(reqs)} requests"
    return msgs, reqs, meta


def stored_blocks(events):
    return sum(len(e["block_hashes"]) for e in events if e["type"] == "BlockStored")


def predicted_blocks(r):
    u = r["usage"]
    p, c = u["prompt_tokens"], u["completion_tokens"]
    cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return (p + c - 1) // BS - cached // BS


def test_every_scenario_was_recorded():
    assert _present() == SCENARIOS


@pytest.mark.parametrize("scenario", _present())
def test_every_message_decodes_and_has_the_0_32_shape(scenario):
    msgs, _, meta = load(scenario)
    assert msgs and meta["vllm_version"].startswith("0.32.0")
    big = 0
    for m in msgs:
        assert m["frames"] == 3 and m["topic"] == "kv-events" and m["dp_rank"] == 0
        assert isinstance(m["ts"], float) and m["events"]
        assert 0 <= m["t"] - m["ts"] < 5      # ts is the engine's wall clock at publishing
        for e in m["events"]:
            assert e["type"] in KNOWN, e["type"]
            assert tuple(e) == KEYS[e["type"]]      # every field present, even null ones
            if e["type"] == "BlockStored":
                assert e["block_size"] == BS and len(e["extra_keys"]) == len(e["block_hashes"])
                salts = [] if scenario != "cache_salt" else [x for x in e["extra_keys"][:1] if x is not None]
                assert e["extra_keys"] == salts + [None] * (len(e["block_hashes"]) - len(salts))
                assert (e["medium"], e["group_idx"], e["kv_cache_spec_kind"]) == ("GPU", 0, "full_attention")
                assert len(e["token_ids"]) == BS * len(e["block_hashes"])
                assert e["parent_block_hash"] is None or isinstance(e["parent_block_hash"], int)
            for h in e.get("block_hashes", []):
                assert isinstance(h, int) and 0 <= h < 2 ** 64
                big += h > 2 ** 53
    assert big > 0    # hashes exceed 2^53: never pass them through a double


@pytest.mark.parametrize("scenario", _present())
def test_seq_counts_up_by_one_per_replica_and_restarts_at_zero(scenario):
    msgs, reqs, meta = load(scenario)
    restarts = sum(1 for r in reqs if r.get("event") == "restart")
    for replica in nonempty({m["replica"] for m in msgs}):
        seqs = [m["seq"] for m in msgs if m["replica"] == replica]
        assert seqs[0] == 0
        backs = [i for i in range(1, len(seqs)) if seqs[i] != seqs[i - 1] + 1]
        assert len(backs) == restarts
        assert all(seqs[i] == 0 for i in backs)


@pytest.mark.parametrize("scenario", [s for s in _present() if s in SEQUENTIAL])
def test_stored_blocks_per_request_follow_the_formula(scenario):
    """floor((prompt + completion - 1) / bs) - cached / bs blocks stored per request, each request's
    events arriving between its send and the next request's send (requests run one at a time)."""
    msgs, reqs, _ = load(scenario)
    for replica in nonempty({m["replica"] for m in msgs}):
        rs = [r for r in reqs if "request" in r and r["replica"] == replica]
        mine = [m for m in msgs if m["replica"] == replica]
        assert sum(stored_blocks(m["events"]) for m in mine) == sum(predicted_blocks(r) for r in rs)
        for k, r in enumerate(rs):
            end = rs[k + 1]["t_send"] if k + 1 < len(rs) else float("inf")
            got = sum(stored_blocks(m["events"]) for m in mine if r["t_send"] <= m["t"] < end)
            assert got == predicted_blocks(r), (k, r["usage"])


@pytest.mark.parametrize("scenario", ["bursts", "bursts_tiny_pool"])
def test_bursts_total_stored_blocks_follow_the_formula(scenario):
    msgs, reqs, _ = load(scenario)
    assert sum(stored_blocks(m["events"]) for m in msgs) == sum(predicted_blocks(r) for r in reqs if "request" in r)


@pytest.mark.parametrize("scenario", [s for s in _present() if s in SEQUENTIAL])
def test_block_removed_comes_just_before_the_store_that_needed_it(scenario):
    """True when requests run one at a time; NOT always under concurrency (next test)."""
    msgs, _, _ = load(scenario)
    for m in nonempty(msgs):
        types = [e["type"] for e in m["events"]]
        for i, t in enumerate(types):
            if t == "BlockRemoved":
                assert "BlockStored" in types[i + 1:], types


def test_under_concurrency_a_removal_can_come_without_a_store():
    """A removal is published when a cached block is taken for reuse, also for a block that is not
    full yet (a prompt's partial last block), which stores nothing: with 8 concurrent requests on a
    40-block pool some batches end with removals, one holds nothing else."""
    msgs, _, _ = load("bursts_tiny_pool")
    tails = [m for m in msgs if m["events"][-1]["type"] == "BlockRemoved"]
    assert tails and any(all(e["type"] == "BlockRemoved" for e in m["events"]) for m in tails)


@pytest.mark.parametrize("scenario", _present())
def test_removals_name_cached_blocks_under_reference_counts(scenario):
    """Replaying the events into a reference-counted ledger per replica and process: every removed
    hash is cached at that moment; a cleared cache starts empty; a restart starts empty."""
    from collections import Counter

    msgs, _, _ = load(scenario)
    cached: dict[str, Counter] = {}
    for m in nonempty(msgs):
        c = cached.setdefault(m["replica"], Counter())
        if m["seq"] == 0:
            c.clear()
        for e in m["events"]:
            if e["type"] == "BlockStored":
                c.update(e["block_hashes"])
            elif e["type"] == "BlockRemoved":
                assert len(e["block_hashes"]) == 1
                h = e["block_hashes"][0]
                assert c[h] > 0, (scenario, m["seq"])
                c[h] -= 1
            else:
                c.clear()


def test_tiny_pool_evicts():
    msgs, _, meta = load("tiny_pool")
    removed = sum(len(e["block_hashes"]) for m in msgs for e in m["events"] if e["type"] == "BlockRemoved")
    assert removed > 0 and meta["replicas"]["vllm"]["pool_blocks_override"] == 36


@pytest.mark.parametrize("scenario", _present())
def test_vllm_counters_equal_the_usage_of_the_last_process(scenario):
    _, reqs, meta = load(scenario)
    for replica, c in nonempty(meta["final_counters"].items()):
        last = [r for r in reqs if r.get("replica") == replica]
        cut = max((i for i, r in enumerate(last) if r.get("event") == "restart"), default=-1)
        rs = [r for r in last[cut + 1:] if "request" in r]
        assert c["vllm:prefix_cache_queries_total"] == sum(r["usage"]["prompt_tokens"] for r in rs)
        assert c["vllm:prefix_cache_hits_total"] == sum(
            (r["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0 for r in rs)


def test_reset_publishes_one_all_blocks_cleared_at_the_next_step():
    msgs, reqs, _ = load("reset")
    t_reset = next(r["time"] for r in reqs if r.get("event") == "reset_prefix_cache")
    t_next = min(r["t_send"] for r in reqs if "request" in r and r["t_send"] > t_reset)
    cleared = [m for m in msgs if any(e["type"] == "AllBlocksCleared" for e in m["events"])]
    assert len(cleared) == 1
    assert [e["type"] for e in cleared[0]["events"]] == ["AllBlocksCleared", "BlockStored"]
    assert cleared[0]["t"] >= t_next            # not at the reset itself: at the next engine step
    assert not any(e["type"] == "BlockRemoved" for m in msgs for e in m["events"])


def test_restart_keeps_sha256_hashes_equal_across_processes():
    msgs, _, _ = load("restart")
    back = next(i for i in range(1, len(msgs)) if msgs[i]["seq"] == 0)
    def hashes(ms):
        return {h for m in ms for e in m["events"] if e["type"] == "BlockStored" for h in e["block_hashes"]}
    before, after = hashes(msgs[:back]), hashes(msgs[back:])
    assert before and before == after     # the same traffic after the restart: the same hashes


@pytest.mark.parametrize("scenario", _present())
def test_replay_socket_returned_the_current_process_buffer(scenario):
    msgs, _, meta = load(scenario)
    for replica, rc in nonempty(meta["replay_check"].items()):
        seqs = [m["seq"] for m in msgs if m["replica"] == replica]
        last_start = max(i for i, s in enumerate(seqs) if s == 0)
        assert rc["end_marker"] and rc["contiguous"] and rc["frames_per_message"] == 4
        assert (rc["first_seq"], rc["last_seq"], rc["batches"]) == (0, seqs[-1], len(seqs) - last_start)


@pytest.mark.parametrize("scenario", _present())
def test_metric_polls_are_valid_expositions_ending_at_the_final_counters(scenario):
    from prometheus_client.parser import text_string_to_metric_families

    _, _, meta = load(scenario)
    last: dict[str, dict] = {}
    polls = 0
    for line in (FIX / scenario / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        if m.get("unchanged"):
            assert m["replica"] in last     # "unchanged" always follows a full poll of that replica
            continue
        polls += 1
        values: dict[str, float] = {}
        for fam in text_string_to_metric_families(m["text"]):
            for s in fam.samples:
                values[s.name] = values.get(s.name, 0.0) + s.value
        assert "process_start_time_seconds" in values
        last[m["replica"]] = values
    assert polls
    for replica, c in meta["final_counters"].items():
        for name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"):
            assert last[replica][name] == c[name]


def test_routing_stores_the_same_content_on_both_replicas_under_the_same_hashes():
    """Round-robin sends each tenant's second request to the replica without its prefix: both
    replicas store the same blocks (the `routing` reason on the second). With PYTHONHASHSEED unset,
    sha256 hashes agree across the two processes."""
    msgs, reqs, _ = load("routing")
    by = {}
    for m in msgs:
        for e in m["events"]:
            if e["type"] == "BlockStored":
                by.setdefault(m["replica"], []).extend(zip(e["block_hashes"], map(tuple, _chunks(e["token_ids"])), strict=True))
    assert set(by) == {"replica0", "replica1"} and by["replica0"] and by["replica0"] == by["replica1"]
    assert {r["replica"] for r in reqs} == {"replica0", "replica1"}


def _chunks(ids):
    return [ids[i:i + BS] for i in range(0, len(ids), BS)]


def test_blocks_filled_by_generated_tokens_are_stored_with_the_output_ids():
    msgs, reqs, _ = load("multiturn")
    first = reqs[0]
    p = first["usage"]["prompt_tokens"]
    ids = [t for m in msgs if first["t_send"] <= m["t"] < reqs[1]["t_send"]
           for e in m["events"] if e["type"] == "BlockStored" for t in e["token_ids"]]
    assert len(ids) == (p + 200 - 1) // BS * BS > p       # prompt blocks and blocks of the generation
    assert ids[p:] == first["completion_token_ids"][:len(ids) - p]
    # the next turn of that conversation repeats the reply as text, and hits every stored block
    assert reqs[2]["usage"]["prompt_tokens_details"]["cached_tokens"] == len(ids)


def test_an_exact_block_multiple_prompt_stores_its_last_block_again_while_cached():
    """Count references per hash, not set membership: the repeat of a 256-token prompt hits only
    128 tokens (at most prompt - 1 can hit) and stores block 1 again under the same hash."""
    msgs, reqs, _ = load("block_edge")
    first, again = reqs[0], reqs[1]
    assert first["usage"]["prompt_tokens"] == again["usage"]["prompt_tokens"] == 256
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 128

    def stored(r, nxt):
        return [h for m in msgs if r["t_send"] <= m["t"] < nxt["t_send"]
                for e in m["events"] if e["type"] == "BlockStored" for h in e["block_hashes"]]
    one, two = stored(first, again), stored(again, reqs[2])
    assert len(one) == 2 and two == one[1:]
    assert not any(e["type"] == "BlockRemoved" for m in msgs for e in m["events"])


def test_dynamic_head_value_makes_every_first_block_new_and_repeats_deeper_content():
    """The signature a dynamic-prefix detector sees: 20 chains from the root (parent null), every
    block 0 distinct, while the shared text below repeats block for block under different parents
    whenever the per-request value has the same token length (9 of the 10 time-only requests here)."""
    msgs, _, _ = load("dynamic_prefix_head")
    from collections import Counter
    first, deeper = Counter(), Counter()
    for m in msgs:
        for e in m["events"]:
            assert e["type"] == "BlockStored" and e["parent_block_hash"] is None and len(e["block_hashes"]) == 6
            blocks = _chunks(e["token_ids"])
            first[tuple(blocks[0])] += 1
            deeper.update(tuple(b) for b in blocks[1:])
    assert len(first) == 20 and set(first.values()) == {1}
    assert max(deeper.values()) == 9


def test_chunked_prefill_continues_a_chain_in_the_next_batch():
    """In the first burst one prompt's 6 blocks come as 3 (parent null) then 3 whose parent is the
    previous event's last block: a continuation of the same request, not a divergence."""
    msgs, _, _ = load("bursts")
    stored = [e for m in msgs for e in m["events"] if e["type"] == "BlockStored"]
    conts = [e for e in stored if e["parent_block_hash"] is not None]
    assert conts
    ends = {e["block_hashes"][-1]: e for e in stored}
    for e in conts:
        head = ends[e["parent_block_hash"]]
        assert head["parent_block_hash"] is None and len(head["block_hashes"]) + len(e["block_hashes"]) == 6


def test_cache_salt_is_block_zeros_extra_key_and_starts_its_own_chain():
    """The same prompt with cache_salt a, b, a, none, a: three chains of 6 blocks with equal token ids
    and different hashes; block 0's extra_keys carries the salt untagged (["tenant-a"])."""
    msgs, reqs, _ = load("cache_salt")
    stored = [e for m in msgs for e in m["events"] if e["type"] == "BlockStored"]
    assert [e["extra_keys"][0] for e in stored] == [["tenant-a"], ["tenant-b"], None]
    assert stored[0]["token_ids"] == stored[1]["token_ids"] == stored[2]["token_ids"]
    assert len({h for e in stored for h in e["block_hashes"]}) == 18
    assert [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in reqs] == [0, 0, 768, 0, 768]


def test_with_different_hash_seeds_the_same_content_gets_different_hashes():
    """routing_hashseed = routing with PYTHONHASHSEED 1 and 2 on the two replicas: the same blocks by
    token ids, no hash in common. A cross-replica ledger must key on content, not on vLLM's hashes."""
    msgs, _, meta = load("routing_hashseed")
    assert [meta["replicas"][r]["PYTHONHASHSEED"] for r in ("replica0", "replica1")] == ["1", "2"]
    tokens: dict[str, list] = {}
    hashes: dict[str, set] = {}
    for m in msgs:
        for e in m["events"]:
            if e["type"] == "BlockStored":
                tokens.setdefault(m["replica"], []).extend(map(tuple, _chunks(e["token_ids"])))
                hashes.setdefault(m["replica"], set()).update(e["block_hashes"])
    assert tokens["replica0"] and tokens["replica0"] == tokens["replica1"]
    assert not hashes["replica0"] & hashes["replica1"]
    plain, _, _ = load("routing")       # and neither seed gives the unseeded hashes
    unseeded = {h for m in plain for e in m["events"] if e["type"] == "BlockStored" for h in e["block_hashes"]}
    assert not unseeded & (hashes["replica0"] | hashes["replica1"])
