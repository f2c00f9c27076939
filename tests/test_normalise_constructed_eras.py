"""The era table on constructed pages for the eras no real capture covers (see fixtures/constructed/README.md)."""
from __future__ import annotations

from cachemon import catalog as C
from cachemon.normalise.normaliser import normalise_text
from helpers import FIXTURES

Q, H, M = C.QUERY_TOKENS.name, C.HIT_TOKENS.name, C.MISS_TOKENS.name


def norm(name: str):
    return normalise_text((FIXTURES / "constructed" / name).read_text())


def test_v1_block_counters_are_converted_with_the_block_size():
    n = norm("v1-0.8.4-blocks.txt")
    assert n.era.name == "v1-gpu-prefix-cache-blocks" and n.era.unit == "blocks"
    assert n.counters[(Q, ("llama", "0", "local"))] == 1000 * 16
    assert n.counters[(H, ("llama", "0", "local"))] == 900 * 16
    assert n.counters[(M, ("llama", "0", "local"))] == 100 * 16
    assert n.gauges[(C.KV_CACHE_USAGE.name, ("llama", "0"))] == 0.25
    assert n.counters[(C.PREEMPTIONS.name, ("llama", "0"))] == 3


def test_blocks_help_is_recognised_in_openmetrics_flavour():
    n = norm("openmetrics-help.txt")
    assert n.era.name == "v1-gpu-prefix-cache-blocks"
    assert n.counters[(Q, ("m", "0", "local"))] == 10 * 32
    assert n.counters[(H, ("m", "0", "local"))] == 4 * 32


def test_blocks_without_block_size_are_not_converted_but_reported():
    text = (FIXTURES / "constructed" / "v1-0.8.4-blocks.txt").read_text()
    text = "\n".join(line for line in text.splitlines() if "cache_config_info" not in line) + "\n"
    n = normalise_text(text)
    assert (Q, ("llama", "0", "local")) not in n.counters      # no wrong number
    assert any(p.code == "blocks_without_block_size" for p in n.problems)


def test_v1_token_era_of_0_9_and_vllm_ascend():
    n = norm("v1-0.9.1-tokens.txt")
    assert n.era.name == "v1-gpu-prefix-cache-tokens"
    assert n.counters[(Q, ("qwen", "0", "local"))] == 40960
    assert n.counters[(H, ("qwen", "0", "local"))] == 30720
    assert n.block_size == 128


def test_data_parallel_engines_and_models_stay_apart():
    n = norm("v1-dp-two-models.txt")
    assert n.counters[(Q, ("a", "0", "local"))] == 1000
    assert n.counters[(Q, ("a", "1", "local"))] == 2000
    assert n.counters[(Q, ("b", "0", "local"))] == 300
    assert n.counters[(H, ("b", "0", "local"))] == 0
    assert n.gauges[(C.KV_CACHE_USAGE.name, ("a", "1"))] == 0.9


def test_ray_sanitised_names_and_collapsed_replicas_are_summed():
    n = norm("ray-0.33.txt")
    assert n.era.name == "v1-prefix-cache"
    assert n.prefix == "vllm_"
    assert n.counters[(Q, ("m", "0", "local"))] == 400
    assert n.counters[(H, ("m", "0", "local"))] == 300


def test_ray_vllm_prefix():
    n = norm("ray-vllm-prefix.txt")
    assert n.prefix == "ray_vllm:"
    assert n.counters[(Q, ("m", "0", "local"))] == 500
    assert n.counters[(H, ("m", "0", "local"))] == 400


def test_v0_disabled_prefix_caching_is_detected_not_exported_as_a_ratio():
    n = norm("v0-disabled.txt")
    assert n.era.name == "v0-hit-rate-gauge"
    assert n.prefix_caching == "false"
    assert not [k for k in n.gauges if k[0] == C.REPORTED_HIT_RATIO.name]


def test_external_connector_tier_is_kept_apart():
    n = norm("v1-external-connector.txt")
    assert n.counters[(Q, ("m", "0", "local"))] == 1000
    assert n.counters[(H, ("m", "0", "local"))] == 600
    assert n.counters[(Q, ("m", "0", "external"))] == 400
    assert n.counters[(H, ("m", "0", "external"))] == 300
    assert n.counters[(M, ("m", "0", "external"))] == 100
    assert n.counters[(C.PROMPT_CACHED_TOKENS.name, ("m", "0"))] == 900
