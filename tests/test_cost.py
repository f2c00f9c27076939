"""Cost arithmetic: both worked examples from their stated inputs, config errors, the collector on real captures."""
from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cachemon import catalog as C
from cachemon.config import ConfigError
from cachemon.config.cost import CostModel, GpuHourPrices, TokenPrices, parse_cost_config
from cachemon.expose.render import render
from cachemon.normalise.normaliser import normalise_text
from cachemon.runtime.cost import CostCollector, estimate, series_tokens
from cachemon.runtime.poller import to_update
from cachemon.state.store import Store

REAL_032 = Path(__file__).resolve().parent / "fixtures" / "vllm-0.32.0-cpu"


def test_96_percent_hit_rate_is_3_2x_cheaper_with_stated_prices():
    # Inputs (docs/changes-warmup-cost.md): $3.00 uncached input, $0.30 cached input, $15.00 output per
    # million tokens; 20 M prompt tokens at a 96 % hit rate, 1 M output tokens (20 input tokens per output token).
    model = parse_cost_config({"currency": "USD", "per_million_tokens":
                               {"uncached_input": 3.0, "cached_input": 0.30, "output": 15.0}})
    e = estimate(model, hit_tokens=19_200_000, miss_tokens=800_000, output_tokens=1_000_000)
    assert e.with_cache == pytest.approx(0.8 * 3 + 19.2 * 0.3 + 15)          # 23.16
    assert e.without_cache == pytest.approx(20 * 3 + 15)                     # 75.00
    assert e.saving_factor == pytest.approx(75 / 23.16)
    assert round(e.saving_factor, 1) == 3.2
    # Output is 15 of the 23.16 spent: it dominates, and the cache cannot touch it.
    assert e.output_share == pytest.approx(15 / 23.16)
    assert e.output_dominates


def test_input_only_pricing_gives_the_classic_7_4x_not_3_2x():
    # The note: cached at 10 % and no output -> 1 / (0.04 + 0.96 * 0.1) = 7.35.
    e = estimate(CostModel(tokens=TokenPrices(1.0, 0.1)), hit_tokens=96, miss_tokens=4)
    assert e.saving_factor == pytest.approx(1 / (0.04 + 0.96 * 0.1))
    assert not e.output_dominates


def test_22_to_3_5_gpu_hours_is_6_3x():
    # Inputs: 10,000 prompt tokens/s of measured prefill throughput per GPU, $2.50 per GPU hour,
    # 792 M prompt tokens of which 666 M hit the prefix cache (84.1 %).
    model = parse_cost_config({"gpu_hour": {"price": 2.5, "prefill_tokens_per_second": 10_000}})
    e = estimate(model, hit_tokens=666_000_000, miss_tokens=126_000_000)
    assert e.without_cache_gpu_hours == pytest.approx(22.0)
    assert e.with_cache_gpu_hours == pytest.approx(3.5)
    assert e.without_cache == pytest.approx(22 * 2.5)
    assert e.with_cache == pytest.approx(3.5 * 2.5)
    assert round(e.saving_factor, 1) == 6.3


def test_gpu_hour_model_prices_decode_time_when_measured():
    m = CostModel(gpu=GpuHourPrices(price=2.0, prefill_tokens_per_second=1000, decode_tokens_per_second=100))
    e = estimate(m, hit_tokens=3_600_000, miss_tokens=3_600_000, output_tokens=360_000)
    # prefill: 1 h with cache, 2 h without; decode: 1 h either way
    assert (e.with_cache_gpu_hours, e.without_cache_gpu_hours) == pytest.approx((2.0, 3.0))
    assert e.saving_factor == pytest.approx(1.5)


def test_no_traffic_has_no_saving_factor():
    e = estimate(CostModel(tokens=TokenPrices(3, 0.3, 15)), 0, 0, 0)
    assert e.saving_factor is None and e.output_share is None


@pytest.mark.parametrize("raw, key", [
    ({"per_million_tokens": {"uncached_input": 3}}, "cost.per_million_tokens.cached_input"),
    ({"per_million_tokens": {"uncached_input": 1, "cached_input": 2}}, "cost.per_million_tokens.cached_input"),
    ({"per_million_tokens": {"uncached_input": "3", "cached_input": 1}}, "cost.per_million_tokens.uncached_input"),
    ({"gpu_hour": {"price": 2}}, "cost.gpu_hour.prefill_tokens_per_second"),
    ({"gpu_hour": {"price": 2, "prefill_tokens_per_second": 0}}, "cost.gpu_hour.prefill_tokens_per_second"),
    ({}, "cost"),
    ({"gpu_hour": {"price": 1, "prefill_tokens_per_second": 1},
      "per_million_tokens": {"uncached_input": 1, "cached_input": 0}}, "cost"),
    ({"per_million_tokens": {"uncached_input": 1, "cached_input": 0}, "currenzy": "EUR"}, "cost.currenzy"),
    ([1, 2], "cost"),
])
def test_malformed_cost_config_names_the_key(raw, key):
    with pytest.raises(ConfigError) as ei:
        parse_cost_config(raw)
    assert ei.value.key == key


def test_cost_counters_from_a_real_0_32_capture():
    """The collector prices the exported counters of the real static-system-prompt page (real data)."""
    store = Store({"1m": 60.0})
    st = store.upstream("vllm")
    n = normalise_text((REAL_032 / "metrics-static-system-prompt.txt").read_text())
    st.apply(to_update(n), 1000.0)
    toks = series_tokens(st.counters)
    # vLLM's own counters on that page: 13296 queried, 11520 hit, 64 generated
    assert toks == {("tiny", "0"): (11520.0, 1776.0, 64.0)}
    model = CostModel(tokens=TokenPrices(3.0, 0.3, 15.0))
    text = render([CostCollector(store, model)]).decode()
    got = {(s.name, s.labels.get("scenario")): s.value
           for fam in text_string_to_metric_families(text) for s in fam.samples}
    with_c = (1776 * 3 + 11520 * 0.3 + 64 * 15) / 1e6
    without_c = (13296 * 3 + 64 * 15) / 1e6
    assert got[(C.ESTIMATED_COST.sample_name, "with_cache")] == pytest.approx(with_c, rel=1e-12)
    assert got[(C.ESTIMATED_COST.sample_name, "without_cache")] == pytest.approx(without_c, rel=1e-12)
    assert got[(C.COST_SAVING_FACTOR.name, None)] == pytest.approx(without_c / with_c, rel=1e-12)


@pytest.mark.slow
def test_malformed_cost_config_exits_2_from_cachemon_run(tmp_path):
    import subprocess
    import sys

    import yaml
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"upstreams": ["http://127.0.0.1:9/metrics"],
                                   "cost": {"per_million_tokens": {"uncached_input": 1, "cached_input": 5}}}))
    p = subprocess.run([sys.executable, "-m", "cachemon.cli", "run", "--config", str(cfg), "--listen", "127.0.0.1:0"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2
    assert "cost.per_million_tokens.cached_input" in p.stderr


def test_series_tokens_skips_a_log_counter_that_names_no_model():
    """A `--log-file` upstream's reset counter has the upstream label only: the cost stage read it as
    (model_name, engine) and failed every scrape in the real-Prometheus test (found at the v3 merge)."""
    counters = {
        (C.QUERY_TOKENS.name, ("tiny", "0", "local")): 1000.0,
        (C.HIT_TOKENS.name, ("tiny", "0", "local")): 750.0,
        (C.GENERATION_TOKENS.name, ("tiny", "0")): 40.0,
        (C.LOG_CACHE_RESETS.name, ("success",)): 2.0,
    }
    assert series_tokens(counters) == {("tiny", "0"): (750.0, 250.0, 40.0)}
