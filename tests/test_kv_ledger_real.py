"""The ledger on REAL vLLM 0.32.0 (CPU build) KV-event captures, recorded by
scripts/e2e/kv_record.py into tests/fixtures/vllm-0.32.0-cpu-kv-events/<scenario>/.

What is asserted, per scenario:
* the split equals what the events imply: an oracle written here with vLLM's own hashes (in one
  vLLM release with the default sha256 hashing they agree across these processes; the ledger
  never relies on that, it derives content ids from token ids) classifies every stored block;
* the split's total equals the tokens of all stored blocks;
* per request (one at a time): blocks stored = floor((prompt + completion - 1) / bs) - cached / bs
  (vLLM's usage);
* the scenario's cause is named (capacity, reset, restart, routing, a dynamic prefix at the depth
  the prompts' tokens put it) and nothing else is (no dynamic prefix where there is none).
"""
from __future__ import annotations

from collections import Counter

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from assert_support import nonempty
from cachemon import catalog as C
from cachemon.expose.kv_collector import KvLedgerCollector
from cachemon.expose.render import render, render_openmetrics
from cachemon.normalise.kv_batch import Cleared, Removed, Stored
from cachemon.state.ledger.fleet import REASONS, FleetLedger
from kv_support import KV_FIXTURES, replay, requests, scenario

ALL = ["tiny_pool", "reset", "restart", "dynamic_prefix_head", "dynamic_prefix_tail", "routing", "bursts",
       "multiturn", "cold_start", "block_edge", "bursts_tiny_pool"]
SEQUENTIAL = ["tiny_pool", "reset", "restart", "dynamic_prefix_head", "dynamic_prefix_tail", "multiturn",
              "cold_start", "block_edge"]


def _folder(name: str):
    p = scenario(name)
    if not (p / "events.jsonl").exists() or not (p / "events.jsonl").stat().st_size:
        pytest.skip(f"capture {name} not in {KV_FIXTURES} (recorded on the capture branch)")
    return p


def _run(name: str):
    fleet = FleetLedger(keep_text=True)
    msgs = replay(_folder(name), fleet)
    assert msgs, f"{name}: no event batches (the tests loop over them)"
    return fleet, msgs


def oracle(msgs) -> dict[str, Counter]:
    """The split by vLLM's own hashes: an independent, plain re-reading of the events."""
    cached: dict[str, Counter] = {}
    left: dict[str, dict[int, str]] = {}
    split: dict[str, Counter] = {}
    last: dict[str, int] = {}
    for m in msgs:
        rep, seq = m["replica"], m["seq"]
        c, gone, out = cached.setdefault(rep, Counter()), left.setdefault(rep, {}), split.setdefault(rep, Counter())
        if rep in last and seq == 0:
            for h in c:
                gone[h] = "restart"
            c.clear()
        last[rep] = seq
        for e in m["batch"].events:
            if isinstance(e, Cleared):
                for h in c:
                    gone[h] = "reset"
                c.clear()
            elif isinstance(e, Removed):
                for h in e.hashes:
                    c[h] -= 1
                    if c[h] == 0:
                        del c[h]
                        gone[h] = "capacity"
            elif isinstance(e, Stored):
                for h in e.hashes:
                    if h in c:
                        why = "recompute_last_block"
                    elif h in gone:
                        why = gone.pop(h)
                    elif any(h in other for r, other in cached.items() if r != rep):
                        why = "routing"
                    else:
                        why = "first"
                    out[why] += e.block_size
                    c[h] += 1
    return split


def _split(fleet: FleetLedger, rep: str) -> dict[str, float]:
    v = fleet.view(rep)
    assert v is not None
    return {k: x for k, x in v.stored_tokens.items() if x}


@pytest.mark.parametrize("name", ALL)
def test_split_equals_what_the_events_imply_and_totals_all_stored_tokens(name):
    fleet, msgs = _run(name)
    expect = oracle(msgs)
    for rep, want in nonempty(expect.items()):
        assert _split(fleet, rep) == {k: float(v) for k, v in want.items()}, rep
        stored = sum(len(e.hashes) * e.block_size for m in msgs if m["replica"] == rep
                     for e in m["batch"].events if isinstance(e, Stored))
        v = fleet.view(rep)
        assert v is not None and sum(v.stored_tokens.values()) == stored
        assert v.in_sync


@pytest.mark.parametrize("name", SEQUENTIAL)
def test_blocks_stored_per_request_follow_vllms_usage(name):
    fleet, msgs = _run(name)
    reqs = sorted(requests(scenario(name)), key=lambda r: r["t_send"])
    assert reqs, name
    bs = next(e.block_size for m in msgs for e in m["batch"].events if isinstance(e, Stored))
    bounds = [r["t_send"] for r in reqs] + [float("inf")]
    for i, r in enumerate(reqs):
        got = sum(len(e.hashes) for m in msgs if bounds[i] <= m["t"] < bounds[i + 1]
                  for e in m["batch"].events if isinstance(e, Stored))
        u = r["usage"]
        want = (u["prompt_tokens"] + u["completion_tokens"] - 1) // bs - u["prompt_tokens_details"]["cached_tokens"] // bs
        assert got == want, (i, got, want)


def test_tiny_pool_names_capacity_equal_to_re_stored_evicted_content():
    fleet, msgs = _run("tiny_pool")
    removed: set[int] = set()
    re_stored = 0
    for m in msgs:
        for e in m["batch"].events:
            if isinstance(e, Removed):
                removed.update(e.hashes)
            elif isinstance(e, Stored):
                for h in e.hashes:
                    if h in removed:
                        re_stored += e.block_size
                        removed.discard(h)
    s = _split(fleet, "vllm")
    assert s["capacity"] > 0 and s["capacity"] == re_stored
    assert set(s) == {"first", "capacity"}
    snap = fleet.snapshot()[0]
    assert snap.lifetime.count == sum(len(e.hashes) for m in msgs for e in m["batch"].events if isinstance(e, Removed))


def test_a_prompt_of_whole_blocks_sent_twice_recomputes_its_last_block_while_cached():
    fleet, msgs = _run("block_edge")
    s = _split(fleet, "vllm")
    bs = next(e.block_size for m in msgs for e in m["batch"].events if isinstance(e, Stored))
    # the 256-token prompt (2 whole blocks) sent again: its last block is stored while cached
    assert s.get("recompute_last_block", 0) == bs
    counts = Counter(h for m in msgs for e in m["batch"].events if isinstance(e, Stored) for h in e.hashes)
    assert max(counts.values()) == 2            # the same vLLM hash stored twice: two references


def test_concurrent_bursts_in_a_tiny_pool_name_capacity():
    fleet, _ = _run("bursts_tiny_pool")
    s = _split(fleet, "vllm")
    assert s.get("capacity", 0) > 0 and set(s) <= {"first", "capacity", "recompute_last_block"}


def test_reset_names_reset():
    fleet, msgs = _run("reset")
    s = _split(fleet, "vllm")
    assert s.get("reset", 0) > 0 and "capacity" not in s and "restart" not in s
    assert any(isinstance(e, Cleared) for m in msgs for e in m["batch"].events)


def test_restart_names_restart():
    fleet, msgs = _run("restart")
    s = _split(fleet, "vllm")
    assert s.get("restart", 0) > 0 and "reset" not in s and "capacity" not in s
    assert [m["seq"] for m in msgs].count(0) == 2


def test_routing_names_routing_on_both_replicas():
    fleet, msgs = _run("routing")
    reps = sorted({m["replica"] for m in msgs})
    assert len(reps) == 2
    assert sum(_split(fleet, r).get("routing", 0) for r in reps) > 0


def _prompt_tokens(msgs) -> list[tuple[int, ...]]:
    """Each request's leading prompt tokens as vLLM tokenized them: the stores from the root."""
    return [e.tokens for m in msgs for e in m["batch"].events if isinstance(e, Stored) and e.parent is None]


def test_dynamic_prefix_at_the_head_is_found_at_its_depth():
    fleet, msgs = _run("dynamic_prefix_head")
    prompts = _prompt_tokens(msgs)
    bs = next(e.block_size for m in msgs for e in m["batch"].events if isinstance(e, Stored))
    # where the prompts first differ (the per-request value), in blocks
    first_diff = min(next(i for i, (a, b) in enumerate(zip(p, q, strict=False)) if a != b)
                     for p, q in zip(prompts, prompts[1:], strict=False))
    v = fleet.view("vllm")
    assert v is not None and v.dynamic_prefix is not None
    assert v.dynamic_prefix.depth_blocks == first_diff // bs
    assert 0 < v.dynamic_prefix.recomputed_tokens <= v.stored_tokens["first"]
    assert msgs[0]["t"] <= v.dynamic_prefix.since <= msgs[-1]["t"]
    # the opt-in text sample holds the block where requests diverge, bounded to a block
    samples = fleet.text_samples("vllm")
    assert samples and all(len(s) == bs for s in samples)
    d = first_diff // bs
    assert all(s in {p[d * bs:(d + 1) * bs] for p in prompts} for s in samples)


@pytest.mark.parametrize("name", ["dynamic_prefix_tail", "cold_start", "tiny_pool", "reset", "restart", "bursts",
                                  "multiturn", "routing", "block_edge", "bursts_tiny_pool"])
def test_no_dynamic_prefix_where_there_is_none(name):
    fleet, msgs = _run(name)
    for rep in nonempty({m["replica"] for m in msgs}):
        v = fleet.view(rep)
        assert v is not None and v.dynamic_prefix is None, rep


def test_collector_renders_every_family_and_prometheus_client_reads_both_formats():
    fleet, _ = _run("tiny_pool")
    col = KvLedgerCollector(fleet)
    text = render([col]).decode()
    om = render_openmetrics([col]).decode()
    fams = {f.name: f for f in parse_text(text)}
    omf = {f.name: f for f in parse_openmetrics(om)}
    for spec in (C.KV_STORED_TOKENS, C.KV_CACHED_BLOCKS, C.KV_LEDGER_IN_SYNC, C.KV_BLOCK_LIFETIME,
                 C.KV_DIVERGENCE_DEPTH, C.KV_HISTORY_EVICTED):
        assert spec.name in fams and spec.name in omf, spec.name
        assert fams[spec.name].type == spec.type and omf[spec.name].type == spec.type
    v = fleet.view("vllm")
    assert v is not None
    stored = {s.labels["reason"]: s.value for s in omf[C.KV_STORED_TOKENS.name].samples}
    assert set(stored) == set(REASONS) and stored == v.stored_tokens
    snap = fleet.snapshot()[0]
    for fam in (fams, omf):
        life = fam[C.KV_BLOCK_LIFETIME.name].samples
        count = [s.value for s in life if s.name.endswith("_count")]
        inf = [s.value for s in life if s.name.endswith("_bucket") and s.labels["le"] == "+Inf"]
        assert count == inf == [snap.lifetime.count] and snap.lifetime.count > 0
        buckets = [s.value for s in life if s.name.endswith("_bucket")]
        assert buckets == sorted(buckets)
        depth = fam[C.KV_DIVERGENCE_DEPTH.name].samples
        assert [s.value for s in depth if s.name.endswith("_count")] == [snap.depth.count]
