"""Routing policies a user can choose offline (issue 36, Build 4): consistent hash on a prefix, and cache-aware by
longest routed prefix with a load tie-break, as vLLM's router does it (fleet_sim.py's docstring cites its source).

Real: tests/fixtures/vllm-0.32.0-cpu-analyze-v2 (35 requests that ran on one real 36-block vLLM 0.32.0 server,
which hit 17 536 tokens). Constructed (labelled at each test): token streams built here."""
from __future__ import annotations

import json
import random
import re

import pytest
from click.testing import CliRunner

from cachemon.analyze.pipeline import analyze
from cachemon.analyze.sim.fleet import CACHE_THRESHOLD, Fleet
from cachemon.analyze.tokenize import ModelTokenizer
from cachemon.cli import main
from helpers import FIXTURES

V2 = FIXTURES / "vllm-0.32.0-cpu-analyze-v2"


def real_hits(pool: int) -> int:
    page = (V2 / f"metrics-pool{pool}.txt").read_text()
    return int(float(re.search(r"^vllm:prefix_cache_hits_total\{[^}]*\} (\S+)", page, re.M).group(1)))


@pytest.fixture(scope="module")
def compared():
    res = analyze(str(V2 / "requests-pool36.jsonl"), ModelTokenizer(V2 / "model"), block_size=128, cache_blocks=36,
                  compare_routing=2, what_if=False, curve=False)
    return res


def test_cache_aware_on_sequential_traffic_is_the_one_real_server(compared):
    """vllm-router's cache_aware sends a low match to the least-loaded worker, ties to the first; one request at
    a time every load is 0, so every request lands on replica 0: exactly the one server the capture ran on."""
    cached, prompt = compared.routing_results["cache-aware"]
    assert cached == real_hits(36) == compared.total_cached
    assert prompt == compared.total_prompt


def test_every_policy_is_reported_in_tokens_and_against_round_robin():
    r = CliRunner().invoke(main, ["analyze", str(V2 / "requests-pool36.jsonl"), "--tokenizer", str(V2 / "model"),
                                  "--metrics-file", str(V2 / "metrics-pool36.txt"), "--compare-routing", "2",
                                  "--no-curve", "--top", "0", "--format", "json"])
    pols = json.loads(r.output)["routing_comparison"]["policies"]
    rr = pols["round-robin"]["cached_tokens"]
    for p in ("consistent-hash", "cache-aware", "cache-aware-balanced"):
        assert pols[p]["cached_tokens_vs_round_robin"] == pols[p]["cached_tokens"] - rr
    assert pols["cache-aware"]["cached_tokens"] > rr          # one cache holds what round-robin split in two
    assert pols["cache-aware"]["requests_per_replica"] == [35, 0]      # the skew is shown, not hidden
    assert pols["round-robin"]["requests_per_replica"] == [18, 17]     # as the real live pair served them
    text = CliRunner().invoke(main, ["analyze", str(V2 / "requests-pool36.jsonl"), "--tokenizer", str(V2 / "model"),
                                     "--metrics-file", str(V2 / "metrics-pool36.txt"), "--compare-routing", "2",
                                     "--no-curve", "--top", "0"]).output
    assert re.search(r"cache-aware +17 536 +54\.9 % +\+\d[\d ]* vs round-robin +requests per replica 35/0", text), text


def test_cache_aware_follows_the_longest_match_above_the_threshold():
    # Constructed: two 64-token heads (16 blocks of 4), each continued by different tails.
    bs = 4
    a, b = list(range(1000, 1064)), list(range(2000, 2064))
    fleet = Fleet(2, "cache-aware-balanced", bs, None)
    fleet.run(a + [1, 2, 3])                       # nothing routed yet: least loaded, replica 0
    assert fleet.last_replica == 0
    fleet.run(b + [4, 5, 6])                       # no match: least routed so far, replica 1
    assert fleet.last_replica == 1
    hit = fleet.run(b + [7, 8, 9, 10])             # 64 of 68 tokens routed to replica 1 before: follows it
    assert (fleet.last_replica, hit) == (1, 64)
    hit = fleet.run(a + [11])
    assert (fleet.last_replica, hit) == (0, 64)
    # a match of at most the threshold is no match: the request goes by load (2 requests each: ties to the first)
    short = a[:8] + list(range(3000, 3000 + int(8 / CACHE_THRESHOLD) + 8))
    assert 8 / len(short) <= CACHE_THRESHOLD
    fleet.run(short)
    assert fleet.last_replica == 0
    # the router's own rule, one request at a time: every low match to the first replica, so all of it there
    plain = Fleet(2, "cache-aware", bs, None)
    for ids in (a + [1], b + [2], b + [3], a + [4]):
        plain.run(ids)
    assert plain.routed == [4, 0]


def test_consistent_hash_is_sticky_by_head_and_spreads_like_a_ring():
    # Constructed: 2 000 random heads over 4 replicas; 160 ring points each.
    rng = random.Random(5)
    fleet = Fleet(4, "consistent-hash", 4, None)
    counts = [0] * 4
    for _ in range(2000):
        head = [rng.randrange(50_000) for _ in range(8)]
        r = fleet.route(head + [1, 2, 3], None)
        assert fleet.route(head + [9, 9], None) == r          # the head decides, not the tail
        counts[r] += 1
    assert all(0.15 < c / 2000 < 0.35 for c in counts), counts
