"""The three questions on top of the simulator: pool size (one-pass curve), routing
(N replicas), and the shortfall split. Real traffic from
tests/fixtures/vllm-0.32.0-cpu-analyze-v2 plus seeded synthetic streams."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from assert_support import nonempty
from cachemon.analyze.pipeline import analyze
from cachemon.analyze.requests_io import Request, parse_line
from cachemon.analyze.sim.block_hash import block_hashes
from cachemon.analyze.sim.fleet import ROUTING_POLICIES, Fleet
from cachemon.analyze.sim.pool_curve import PoolCurve
from cachemon.analyze.sim.prefix import PrefixCacheSim
from cachemon.analyze.tokenize import ModelTokenizer
from cachemon.cli import main
from helpers import FIXTURES

V2 = FIXTURES / "vllm-0.32.0-cpu-analyze-v2"
STREAM = str(V2 / "requests-pool160.jsonl")     # the same bodies ran on every pool size


@pytest.fixture(scope="module")
def tok():
    return ModelTokenizer(V2 / "model")


@pytest.fixture(scope="module")
def unlimited(tok):
    return analyze(STREAM, tok, block_size=128, what_if=False, compare_routing=2)


def parse_lines(path: Path) -> list:
    return [it for n, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) for it in parse_line(raw, n)]


def real_hits(pool: int) -> int:
    return sum((json.loads(ln)["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
               for ln in (V2 / f"requests-pool{pool}.jsonl").read_text().splitlines() if '"usage"' in ln)


@pytest.mark.parametrize("pool", (36, 40, 48, 160))
def test_curve_equals_real_servers_at_their_pool_sizes(unlimited, pool):
    curve = unlimited.curve
    assert curve[min(pool, len(curve) - 1)] == real_hits(pool)


def test_curve_equals_the_exact_simulation_at_every_pool_size(tok, unlimited):
    curve = unlimited.curve
    assert len(curve) > 22, len(curve)            # pool sizes from one that fits the largest request on
    for pool in range(22, len(curve) + 3):        # 22: the largest request (21 blocks) fits
        res = analyze(STREAM, tok, block_size=128, cache_blocks=pool, what_if=False, curve=False)
        assert res.total_cached == curve[min(pool, len(curve) - 1)], pool


def synthetic(seed: int, n: int = 300, bs: int = 4):
    rng = random.Random(seed)
    heads = [[rng.randrange(1000) for _ in range(rng.randrange(1, 40))] for _ in range(10)]
    return [(rng.choice(heads) + [rng.randrange(1000) for _ in range(rng.randrange(0, 12))], rng.choice([1, 3, 9]))
            for _ in range(n)]


@pytest.mark.parametrize("seed", range(4))
def test_curve_tracks_the_exact_simulation_on_synthetic_streams(seed):
    # Off by at most a block or two per duplicate (a block recomputed while still
    # cached is one stack entry, two vLLM blocks), never at pools that fit every request.
    bs, stream = 4, synthetic(seed)
    pc = PoolCurve(bs)
    for ids, out in stream:
        pc.run(len(ids), block_hashes(ids, bs), out)
    curve = pc.curve()
    total = sum(len(ids) for ids, _ in stream)
    assert pc.inexact == 0
    for pool in (16, 24, 32, 48, 64, 100, 200, 400):
        sim = PrefixCacheSim(bs, pool)
        for ids, out in stream:
            sim.run(ids, None, None, out)
        assert sim.oversized == 0
        assert abs(curve[min(pool, len(curve) - 1)] - sim.cached_tokens) <= 0.01 * total, pool


def test_pool_needed_for_80_and_90_percent(unlimited):
    full = unlimited.curve[-1]
    for frac in nonempty((0.8, 0.9, 1.0)):
        c = unlimited.pool_for(frac)
        assert unlimited.curve[c] >= frac * full > unlimited.curve[c - 1]


def test_routing_policies_on_real_traffic(unlimited):
    got = unlimited.routing_results
    assert set(got) == set(ROUTING_POLICIES)
    assert all(t == unlimited.total_prompt for _, t in got.values())
    # one unlimited server is the upper bound; prefix-aware routing keeps shared heads together
    assert max(c for c, _ in got.values()) <= unlimited.total_cached
    assert got["prefix"][0] > got["round-robin"][0]


def test_round_robin_fleet_is_two_servers_on_alternate_requests():
    bs, stream = 4, synthetic(7)
    fleet = Fleet(2, "round-robin", bs, 24)
    a, b = PrefixCacheSim(bs, 24), PrefixCacheSim(bs, 24)
    for i, (ids, out) in nonempty(enumerate(stream)):
        got = fleet.run(ids, None, None, out)
        assert got == (a if i % 2 == 0 else b).run(ids, None, None, out)


def test_session_and_prefix_routing_are_sticky():
    fleet = Fleet(4, "session", 4, None)
    assert len({fleet.route([1, 2, 3], "chat-a") for _ in range(10)}) == 1
    fleet = Fleet(4, "prefix", 4, None)
    head = list(range(8))
    assert len({fleet.route(head + [i] * 5, None) for i in range(20)}) == 1


def test_shortfall_parts_add_up_and_name_each_loss(tok):
    # the setup the capture really ran on: one server, 36 blocks
    res = analyze(str(V2 / "requests-pool36.jsonl"), tok, block_size=128, cache_blocks=36)
    sf = res.shortfall
    parts = dict(sf.parts())
    assert sum(parts.values()) == sf.fixed - sf.start
    assert sf.observed == real_hits(36)                  # every line reports cached_tokens
    assert parts["not explained by the simulation"] == 0
    assert parts["capacity (finite KV pool)"] == res.unlimited_cached_total - res.total_cached > 0
    assert parts["routing (several replicas)"] == 0
    assert parts["events (resets, restarts)"] > 0        # the reset mid-stream
    # the same traffic spread over two replicas: routing takes its share
    res = analyze(str(V2 / "requests-pool36.jsonl"), tok, block_size=128, replicas=2, routing="random")
    parts = dict(res.shortfall.parts())
    assert parts["routing (several replicas)"] > 0 and parts["capacity (finite KV pool)"] == 0


def test_eviction_misses_are_charged_to_capacity_not_to_the_text(tok):
    res = analyze(str(V2 / "requests-pool36.jsonl"), tok, block_size=128, cache_blocks=36)
    assert res.total_cached < res.unlimited_cached_total
    assert res.causes == []          # the text itself has no varying segment in front of reused blocks


def test_cli_prints_the_three_answers(tok):
    out = CliRunner().invoke(main, ["analyze", str(V2 / "requests-pool36.jsonl"), "--tokenizer", str(V2 / "model"),
                                    "--metrics-file", str(V2 / "metrics-pool36.txt"), "--compare-routing", "2",
                                    "--format", "json"])
    assert out.exit_code == 0, out.output
    d = json.loads(out.output)
    assert d["block_size"] == 128 and d["cache_blocks"] == 36
    assert d["pool_curve"]["pool_for_90pct_of_unlimited"] is not None
    assert d["routing_comparison"]["replicas"] == 2
    parts = d["shortfall"]["parts"]
    assert round(sum(p["hit_ratio_points"] for p in parts), 4) == round(
        d["shortfall"]["ideal_hit_ratio"] - d["shortfall"]["hit_ratio"], 4)


def test_capped_curve_is_the_same_curve_up_to_the_cap_and_forgets_the_rest():
    bs, stream = 4, synthetic(3, n=3000)
    full, capped = PoolCurve(bs), PoolCurve(bs, max_blocks=40)
    for ids, out in stream:
        h = block_hashes(ids, bs)
        full.run(len(ids), h, out)
        capped.run(len(ids), h, out)
    a, b = full.curve(), capped.curve()
    assert list(b) == list(a[:len(b)]) and len(b) == 41
    assert capped._cut > 0 and len(capped._where) <= 4 * 40 + 1024 * 12


ROUTED = ("round-robin", "prefix")


def served(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if '"usage"' in ln]


def cached(line: dict) -> int:
    return (line["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)


def counter(page: Path, name: str) -> float:
    return sum(s.value for fam in text_string_to_metric_families(page.read_text())
               for s in fam.samples if s.name == name)


def counted(policy: str, replica: int, name: str) -> float:
    """What one live server counted during `policy`'s run (its /metrics after minus before)."""
    pages = [V2 / f"metrics-live-routing-{policy}-{when}-replica{replica}.txt" for when in ("before", "after")]
    return counter(pages[1], name) - counter(pages[0], name)


@pytest.mark.parametrize("policy", ROUTED)
def test_fleet_prediction_matches_two_live_servers_request_by_request(tok, policy):
    # Both real 36-block servers ran at the same time behind scripts/e2e/router.py; the
    # stream is what the client saw (each line's usage from the replica that served it).
    stream = V2 / f"live-routing-{policy}.jsonl"
    fleet = analyze(str(stream), tok, block_size=128, cache_blocks=36, replicas=2, routing=policy,
                    what_if=False, curve=False)
    assert fleet.requests == len(served(stream)) == 35
    assert fleet.observed_prompt_match == fleet.observed_compared == fleet.requests
    assert fleet.cached_matched == fleet.cached_compared == fleet.requests
    assert not fleet.mismatch_lines and not fleet.skipped_count
    # the fleet's totals are the two servers' own counters
    for metric, total in (("vllm:prefix_cache_hits_total", fleet.total_cached),
                          ("vllm:prefix_cache_queries_total", fleet.total_prompt)):
        assert counted(policy, 0, metric) + counted(policy, 1, metric) == total > 0


@pytest.mark.parametrize("policy", ROUTED)
def test_live_router_sent_every_request_where_the_simulated_fleet_routes_it(tok, policy):
    routed = [json.loads(ln) for ln in (V2 / f"live-routing-{policy}-router.jsonl").read_text().splitlines()]
    stream = [it for it in parse_lines(V2 / f"live-routing-{policy}.jsonl") if isinstance(it, Request)]
    fleet = Fleet(2, policy, 128, None)
    assert [fleet.route(e.ids, None) for e in tok.encode_many(stream)] == [r["replica"] for r in routed]
    assert not any(r["fallback"] for r in routed)
    assert [r["cached_tokens"] for r in routed] == [cached(ln) for ln in served(V2 / f"live-routing-{policy}.jsonl")]
    for replica in (0, 1):       # each server's hits are the hits of the requests routed to it
        mine = sum(r["cached_tokens"] for r in routed if r["replica"] == replica)
        assert counted(policy, replica, "vllm:prefix_cache_hits_total") == mine
    assert {r["replica"] for r in routed} == {0, 1}


@pytest.mark.parametrize("policy", ROUTED)
def test_fleet_prediction_equals_two_sequential_replays(tok, policy):
    # The older check, kept: the 35 requests split by `policy` (split_replicas.py) and each
    # share replayed on its own real 36-block server, one after the other.
    shares = [str(V2 / f"routing-{policy}-replica{r}.jsonl") for r in (0, 1)]
    real = 0
    for share in shares:
        res = analyze(share, tok, block_size=128, cache_blocks=36, what_if=False, curve=False)
        assert res.cached_matched == res.cached_compared == res.requests > 0      # each server: exact
        real += sum(cached(ln) for ln in served(Path(share)))
    fleet = analyze(str(V2 / "requests-pool48.jsonl"), tok, block_size=128, cache_blocks=36, replicas=2,
                    routing=policy, what_if=False, curve=False)
    assert fleet.total_cached == real


def live_hits(policy: str) -> int:
    return sum(cached(ln) for ln in served(V2 / f"live-routing-{policy}.jsonl"))


def test_round_robin_over_two_live_servers_loses_hits_one_server_keeps():
    assert live_hits("round-robin") < sum(cached(ln) for ln in served(V2 / "requests-pool48.jsonl"))


def test_prefix_routing_beats_round_robin_on_live_servers():
    assert live_hits("prefix") > live_hits("round-robin")
