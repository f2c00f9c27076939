"""vllm-ascend's /metrics: the same vLLM series, a non-128 block size, and multiprocess pages.

The pages are CONSTRUCTED (tests/fixtures/vllm-ascend-constructed/make_pages.py renders them with
the real prometheus_client; see the README there for the vLLM / vllm-ascend files and tags).

* Its schedulers (v0.22.1rc1 ``vllm_ascend/core/recompute_scheduler.py`` lines 440-446 and
  587-592, ``scheduler_profiling_chunk.py`` 601-605, ``patch/platform/patch_balance_schedule.py``
  464-468) fill vLLM's own ``PrefixCacheStats`` objects and hand them to vLLM's stat loggers via
  the inherited ``Scheduler.make_stats``: the series are vLLM's ``vllm:prefix_cache_*`` and
  ``vllm:external_prefix_cache_*``, read here as the local and external tiers.
* ``vllm_ascend/utils.py::refresh_block_size`` (v0.22.1rc1): 128 by default and with prefix
  caching, but deepseek_v4 keeps 32/64/128 (default 32) and hybrid models their own size.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from assert_support import nonempty
from cachemon import catalog as C
from cachemon.analyze.command import read_cache_config
from cachemon.analyze.sim.prefix import PrefixCacheSim
from cachemon.check import diagnose, multiprocess_findings
from cachemon.judge.attribute import short_prompt_fraction
from cachemon.normalise.normaliser import normalise_text, to_update
from cachemon.state.store import Store

FIX = Path(__file__).parent / "fixtures" / "vllm-ascend-constructed"
SINGLE = FIX / "metrics-deepseek-v4-block32.txt"
MULTI = FIX / "metrics-multiprocess.txt"


def counters(n) -> dict:
    return {(s.key.metric, s.key.labels): s.value for s in n.samples}


def test_fixtures_say_they_are_constructed():
    files = [f for f in FIX.iterdir() if f.suffix in (".txt", ".log")]
    assert files
    for f in files:
        assert "CONSTRUCTED" in f.read_text().splitlines()[0], f


def test_scheduler_stats_arrive_as_vllms_own_series():
    n = normalise_text(SINGLE.read_text())
    assert n.era.name == "v1-prefix-cache"
    c = counters(n)
    ident = ("deepseek-v4", "0")
    assert c[(C.QUERY_TOKENS.name, ident + ("local",))] == 4000
    assert c[(C.HIT_TOKENS.name, ident + ("local",))] == 2016
    assert c[(C.QUERY_TOKENS.name, ident + ("external",))] == 1984
    assert c[(C.HIT_TOKENS.name, ident + ("external",))] == 640
    assert n.problems == [] and not n.multiprocess.multiprocess


def test_block_size_32_comes_from_cache_config_info():
    n = normalise_text(SINGLE.read_text())
    assert n.block_size == 32
    g = {k.metric: v for k, v in to_update(n).gauges.items()}
    assert g[C.BLOCK_SIZE.name] == 32
    assert g[C.KV_CACHE_CAPACITY.name] == 8192 * 32
    cfg = read_cache_config(None, str(SINGLE))
    assert (cfg.block_size, cfg.num_blocks) == (32, 8192)


def test_block_size_decides_what_can_hit():
    # two requests sharing a 100-token prefix: whole 32-token blocks hit, 128-token blocks cannot
    a = list(range(100)) + [1000 + i for i in range(60)]
    b = list(range(100)) + [2000 + i for i in range(60)]
    got = {}
    for bs in (32, 128):
        sim = PrefixCacheSim(bs)
        sim.run(a)
        got[bs] = sim.run(b)
    assert got == {32: 96, 128: 0}
    # prompts at most one block long (cannot hit): 1 of 5 with 32-token blocks, 3 of 5 with 128
    buckets = tuple(sorted((float(le), float(v)) for le, v in re.findall(
        r'^vllm:request_prompt_tokens_bucket\{[^}]*le="([^"]+)"[^}]*\} (\S+)$', SINGLE.read_text(), re.M)))
    assert len(buckets) == 13
    assert short_prompt_fraction(buckets, 32) == pytest.approx(1 / 5)
    assert short_prompt_fraction(buckets, 128) == pytest.approx(3 / 5)


def test_multiprocess_page_reads_like_a_single_process_one():
    text = MULTI.read_text()
    assert "_created" not in text and "process_start_time_seconds" not in text
    assert re.search(r'vllm:kv_cache_usage_perc\{[^}]*pid="\d+"', text)
    n = normalise_text(text)
    ident = ("deepseek-v4", "0")
    c = counters(n)
    assert c[(C.QUERY_TOKENS.name, ident + ("local",))] == 9000          # summed over the 2 processes
    assert c[(C.HIT_TOKENS.name, ident + ("local",))] == 4064
    assert all(s.created is None for s in n.samples)
    g = {k.metric: v for k, v in n.gauges.items()}
    assert g[C.KV_CACHE_USAGE.name] == 0.5                               # max over the pids
    assert g[C.REQUESTS_RUNNING.name] == 3                               # mostrecent: one series
    assert n.block_size == 32 and n.problems == []
    mp = n.multiprocess
    assert mp.multiprocess and mp.per_process == ("kv_cache_usage_perc",) and len(mp.pids) == 2
    assert not mp.process_start_time
    found = [f for f in diagnose(n) + multiprocess_findings(n) if f["code"] == "multiprocess_page"]
    assert len(found) == 1 and found[0]["severity"] == "info" and "counters falling" in found[0]["message"]


def test_multiprocess_restart_is_told_by_counters_falling():
    text = MULTI.read_text()
    store = Store({"1m": 60.0})
    st = store.upstream("npu-0")
    assert st.apply(to_update(normalise_text(text)), 1000.0) is None
    assert st.apply(to_update(normalise_text(text)), 1002.0) is None
    # vLLM restarted: a new PROMETHEUS_MULTIPROC_DIR, counters from 0
    restarted = re.sub(r"(prefix_cache_(?:queries|hits)_total\{[^}]*\}) [0-9.]+", r"\1 32.0", text)
    assert st.apply(to_update(normalise_text(restarted)), 1004.0) is not None


@pytest.mark.slow
def test_make_pages_renders_the_same_shape(tmp_path):
    """The generator still renders what is committed with the installed prometheus_client."""
    script = FIX / "make_pages.py"
    subprocess.run([sys.executable, str(script), "--out", str(tmp_path)], check=True, timeout=120,
                   env={k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"})

    def shape(p: Path) -> list[str]:
        lines = [ln for ln in p.read_text().splitlines()[1:] if ln.startswith("vllm:")]
        return sorted(re.sub(r'pid="\d+"', 'pid="_"', ln.rsplit(" ", 1)[0]) for ln in lines
                      if "_created" not in ln)

    for name in nonempty((SINGLE.name, MULTI.name)):
        assert shape(tmp_path / name) == shape(FIX / name), name


def test_other_gauge_modes_and_per_pid_config_rows():
    """CONSTRUCTED page (inline): what prometheus_client's other modes would give, should a vLLM
    version mark these gauges differently. ``all``: a pid label per process; ``livesum``/``max``:
    one reduced series. cache_config_info per pid (mode all) still yields one engine config."""
    page = "\n".join([
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
        "# TYPE vllm:cache_config_info gauge",
        'vllm:cache_config_info{block_size="64",enable_prefix_caching="True",engine="0",num_gpu_blocks="100",pid="11"} 1.0',
        'vllm:cache_config_info{block_size="64",enable_prefix_caching="True",engine="0",num_gpu_blocks="100",pid="12"} 1.0',
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        'vllm:num_requests_running{engine="0",model_name="m"} 7.0',
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge",
        'vllm:num_requests_waiting{engine="0",model_name="m",pid="11"} 1.0',
        'vllm:num_requests_waiting{engine="0",model_name="m",pid="12"} 4.0',
        "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.",
        "# TYPE vllm:prefix_cache_queries_total counter",
        'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 640.0',
        "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.",
        "# TYPE vllm:prefix_cache_hits_total counter",
        'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 320.0',
        ""])
    n = normalise_text(page)
    assert n.problems == [] and n.block_size == 64 and len(n.engines) == 1
    g = {k.metric: v for k, v in n.gauges.items()}
    assert g[C.REQUESTS_WAITING.name] == 4 and g[C.REQUESTS_RUNNING.name] == 7
    assert n.multiprocess.per_process == ("cache_config_info", "num_requests_waiting")
    assert n.multiprocess.pids == ("11", "12")
    assert counters(n)[(C.HIT_TOKENS.name, ("m", "0", "local"))] == 320
