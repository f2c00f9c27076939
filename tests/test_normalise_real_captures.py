"""The era table on the real vLLM captures: cachemon's unified counters equal vLLM's own, exactly.

vLLM's values are read with prometheus_client's parser (independent of cachemon's
selective parser), so a parsing bug cannot hide behind itself.
"""
from __future__ import annotations

import pytest

from cachemon import catalog as C
from cachemon.normalise.normaliser import normalise_text
from helpers import FIXTURES, samples, value

CAPTURES = sorted(p for p in FIXTURES.glob("vllm-*/metrics-*.txt") if not p.parent.name.endswith("-constructed"))
V1_CAPTURES = [p for p in CAPTURES if "0.8.5" not in p.parent.name]
KEY = ("tiny", "0", "local")


def test_every_capture_is_covered():
    # 14 from shared/fixtures + 20 of the analyze-v2 capture (4 pools x 2 pages, 4 sequential routing
    # replicas, 8 live-routing pages: 2 policies x 2 servers x before/after)
    assert len(CAPTURES) == 34
    assert len(V1_CAPTURES) == 30


@pytest.mark.parametrize("path", V1_CAPTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_unified_hit_and_query_tokens_equal_vllms_own_counters(path):
    text = path.read_text()
    vllm = samples(text)
    n = normalise_text(text)
    q = value(vllm, "vllm:prefix_cache_queries_total", model_name="tiny", engine="0")
    h = value(vllm, "vllm:prefix_cache_hits_total", model_name="tiny", engine="0")
    assert q is not None and h is not None
    assert n.era.name == "v1-prefix-cache"
    assert n.counters[(C.QUERY_TOKENS.name, KEY)] == q
    assert n.counters[(C.HIT_TOKENS.name, KEY)] == h
    assert n.counters[(C.MISS_TOKENS.name, KEY)] == q - h
    assert n.counters[(C.PROMPT_TOKENS.name, ("tiny", "0"))] == value(vllm, "vllm:prompt_tokens_total", engine="0")
    assert n.counters[(C.GENERATION_TOKENS.name, ("tiny", "0"))] == value(vllm, "vllm:generation_tokens_total", engine="0")
    assert n.counters[(C.PREEMPTIONS.name, ("tiny", "0"))] == value(vllm, "vllm:num_preemptions_total", engine="0")
    assert n.gauges[(C.KV_CACHE_USAGE.name, ("tiny", "0"))] == value(vllm, "vllm:kv_cache_usage_perc", engine="0")
    assert n.block_size == 128 and n.prefix_caching == "true" and n.hash_algo == "sha256"


@pytest.mark.parametrize("scenario,queries,hits", [
    ("idle", 0, 0),
    ("static-system-prompt", 13296, 11520),
    ("timestamp-in-system-prompt", 26880, 11520),
    ("request-id-at-head", 40627, 11520),
])
def test_032_scenarios_match_the_readme_figures(scenario, queries, hits):
    # The figures vLLM's README of the capture states, after each scenario.
    n = normalise_text((FIXTURES / "vllm-0.32.0-cpu" / f"metrics-{scenario}.txt").read_text())
    assert n.counters[(C.QUERY_TOKENS.name, KEY)] == queries
    assert n.counters[(C.HIT_TOKENS.name, KEY)] == hits


@pytest.mark.parametrize("folder", ["vllm-0.10.2-cpu", "vllm-0.11.2-cpu-show-hidden-0.10"])
def test_pages_with_old_and_new_names_are_counted_once(folder):
    text = (FIXTURES / folder / "metrics-static-system-prompt.txt").read_text()
    vllm = samples(text)
    # Both generations are on the page with equal values ...
    assert value(vllm, "vllm:gpu_prefix_cache_queries_total") == value(vllm, "vllm:prefix_cache_queries_total") == 13296
    n = normalise_text(text)
    # ... and cachemon counts them once.
    assert n.counters[(C.QUERY_TOKENS.name, KEY)] == 13296
    assert n.counters[(C.HIT_TOKENS.name, KEY)] == 11520
    assert sum(v for (m, _), v in n.counters.items() if m == C.QUERY_TOKENS.name) == 13296


def test_032_by_source_and_cached_counters():
    text = (FIXTURES / "vllm-0.32.0-cpu" / "metrics-static-system-prompt.txt").read_text()
    n = normalise_text(text)
    by = {k[1][2]: v for k, v in n.counters.items() if k[0] == C.PROMPT_TOKENS_BY_SOURCE.name}
    assert by == {"local_compute": 1776.0, "local_cache_hit": 11520.0, "external_kv_transfer": 0.0}
    assert n.counters[(C.PROMPT_CACHED_TOKENS.name, ("tiny", "0"))] == 11520.0
    # external tier is kept apart from the local cache
    assert n.counters[(C.QUERY_TOKENS.name, ("tiny", "0", "external"))] == 0.0


def test_v0_hidden_gauges_give_the_ratio_only():
    text = (FIXTURES / "vllm-0.8.5-cpu-v0-show-hidden-0.7" / "metrics-static-system-prompt.txt").read_text()
    n = normalise_text(text)
    assert n.era.name == "v0-hit-rate-gauge"
    # No token counter is invented from a ratio.
    assert not [k for k in n.counters if k[0] in (C.QUERY_TOKENS.name, C.HIT_TOKENS.name)]
    assert n.gauges[(C.REPORTED_HIT_RATIO.name, ("tiny", "", "local", "since_start_blocks"))] == 0.9375
    assert n.hash_algo == "builtin"


def test_v0_default_page_has_no_prefix_cache_metric():
    n = normalise_text((FIXTURES / "vllm-0.8.5-cpu-v0" / "metrics-static-system-prompt.txt").read_text())
    assert n.era.name == "none"
    assert not [k for k in n.counters if k[0] in (C.QUERY_TOKENS.name, C.HIT_TOKENS.name)]
    assert n.counters[(C.PROMPT_TOKENS.name, ("tiny", ""))] == 13296    # V0 still counts prompt tokens
    assert n.gauges[(C.KV_CACHE_USAGE.name, ("tiny", ""))] == 0.0


def test_v0_idle_page_only_has_cache_config():
    n = normalise_text((FIXTURES / "vllm-0.8.5-cpu-v0-show-hidden-0.7" / "metrics-idle.txt").read_text())
    assert n.era.name == "none"
    assert n.block_size == 128 and n.prefix_caching == "true"
