"""The prefix-cache match floor, the pool and the hit tiers from vllm:cache_config_info and 0.32's
per-tier counter: on the real 0.32.0 pages, and on a CONSTRUCTED page (hybrid Mamba, a prefix match unit,
native CPU offloading) whose every label is cited to vLLM 0.32.0's source in the file itself."""
from __future__ import annotations

import pytest

from cachemon import catalog as C
from cachemon.analyze.command import match_unit_blocks, read_cache_config
from cachemon.normalise.normaliser import normalise_text, to_update
from cachemon.normalise.server_profile import ServerProfile
from cachemon.normalise.updates import SeriesKey
from helpers import FIXTURES, samples, value

REAL = FIXTURES / "vllm-0.32.0-cpu" / "metrics-static-system-prompt.txt"
CONSTRUCTED = FIXTURES / "constructed" / "v1-0.32-match-floor.txt"
REAL_032 = sorted((FIXTURES / "vllm-0.32.0-cpu").glob("metrics-*.txt")) + sorted(
    (FIXTURES / "vllm-0.32.0-cpu-analyze-v2").glob("metrics-*.txt"))


def test_real_032_page_floor_is_the_attention_block_and_the_pool_is_vllms_own():
    n = normalise_text(REAL.read_text())
    cfg = n.engines[("tiny", "0")]
    # the real page says cache_hit_alignment_tokens="None", prefix_match_unit="None", hash_block_size="None"
    assert (cfg.match_floor, cfg.match_floor_source) == (128, "effective_attention_block_size")
    assert cfg.pool == 2097152 == 16384 * 128          # kv_cache_size_tokens, equal to blocks x block here
    assert cfg.offloading == "" and cfg.mamba_cache_mode == "none"   # backend "native" but no kv_offloading_size
    gauges = to_update(n).gauges
    assert gauges[SeriesKey(C.MATCH_FLOOR.name, ("tiny", "0"))] == 128.0
    assert gauges[SeriesKey(C.KV_CACHE_CAPACITY.name, ("tiny", "0"))] == 2097152.0


@pytest.mark.parametrize("path", REAL_032, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_real_032_hits_by_tier_equal_vllms_own_counter(path):
    text = path.read_text()
    vllm = samples(text)
    n = normalise_text(text)
    by_tier = {k.labels[2]: v for k, v in n.counters.items() if k.metric == C.HIT_TOKENS_BY_SOURCE.name}
    assert set(by_tier) == {"device", "host", "p2p", "disk", "external_unspecified"}
    for tier, got in by_tier.items():
        assert got == value(vllm, "vllm:prompt_tokens_cached_by_source_total", source=tier, engine="0")
    # vLLM's docs: the tiers sum to local + external hits; on these real pages all of it is the device tier
    local = value(vllm, "vllm:prefix_cache_hits_total", engine="0")
    external = value(vllm, "vllm:external_prefix_cache_hits_total", engine="0")
    assert sum(by_tier.values()) == local + external == by_tier["device"]


def test_real_032_parallel_sampling_counters_equal_the_n_histogram():
    text = REAL.read_text()
    vllm = samples(text)
    n = normalise_text(text)
    assert n.counters[SeriesKey(C.SAMPLING_REQUESTS.name, ("tiny", "0"))] == value(
        vllm, "vllm:request_params_n_count", engine="0") == 16.0
    assert n.counters[SeriesKey(C.SAMPLING_SEQUENCES.name, ("tiny", "0"))] == value(
        vllm, "vllm:request_params_n_sum", engine="0") == 16.0       # every request had n = 1


def test_constructed_hybrid_prefix_match_unit_and_offloading_pages():
    n = normalise_text(CONSTRUCTED.read_text())
    got = {k[1]: (c.match_floor, c.match_floor_source, c.offloading) for k, c in n.engines.items()}
    assert got == {
        "0": (1056, "effective_attention_block_size", ""),     # hybrid Mamba: the raised block
        "1": (64, "prefix_match_unit", ""),                     # hits inside the block (aligned Mamba states)
        "2": (2048, "cache_hit_alignment_tokens", "native"),   # vLLM's own resolution wins
    }
    tiers = {k.labels[2]: v for k, v in n.counters.items() if k.metric == C.HIT_TOKENS_BY_SOURCE.name}
    assert (tiers["device"], tiers["host"]) == (300.0, 700.0)


def test_analyze_simulates_in_the_match_unit(tmp_path):
    p = tmp_path / "page.txt"
    p.write_text(CONSTRUCTED.read_text())
    server = read_cache_config(None, str(p))      # the first cache_config_info row: the hybrid engine 0
    assert (server.block_size, server.match_floor, server.match_floor_source) == (
        1056, 1056, "effective_attention_block_size")
    assert match_unit_blocks(1056, 2000, None, server) == (1056, 2000, "")   # the floor is the block
    # an explicit unit finer than the block: simulated in 64-token blocks, the pool kept in tokens
    bs, blocks, note = match_unit_blocks(1056, 2000, 64, server)
    assert (bs, blocks) == (64, 2000 * 1056 // 64) and "--match-unit" in note
    # a server whose floor is coarser than its block (vLLM's resolved alignment)
    coarse = ServerProfile(block_size=128, num_blocks=100, hash_algo="sha256", match_floor=2048,
                           match_floor_source="cache_hit_alignment_tokens", sources=(("match_floor", "x"),))
    assert match_unit_blocks(128, 100, None, coarse)[:2] == (2048, 6)
    assert match_unit_blocks(16, None, None, None) == (16, None, "")


def test_real_hybrid_pages_floor_and_group_aware_pool():
    """Real vLLM 0.32.0 pages of two hybrid models (model configs constructed, the servers real): a
    sliding-window + full-attention model (served traffic) and a Mamba-2 hybrid (its one page before
    the CPU build's Mamba prefix caching failed). Their pages say block 128 and no match unit, so the
    floor is the attention block; the pool is vLLM's group-aware kv_cache_size_tokens, not 160 x 128."""
    import json

    swa = normalise_text((FIXTURES / "vllm-0.32.0-cpu-hybrid-swa" / "hybrid_swa" / "metrics-final.txt").read_text())
    [cfg] = swa.engines.values()
    assert (cfg.match_floor, cfg.match_floor_source, cfg.pool, cfg.num_blocks * cfg.block_size) == (
        128, "effective_attention_block_size", 12850, 20480)
    line = (FIXTURES / "vllm-0.32.0-cpu-hybrid-mamba" / "metrics.jsonl").read_text().splitlines()[0]
    mamba = normalise_text(json.loads(line)["text"])
    [cfg] = mamba.engines.values()
    assert (cfg.match_floor, cfg.mamba_cache_mode, cfg.pool, cfg.prefix_caching) == (128, "align", 18724, "true")
