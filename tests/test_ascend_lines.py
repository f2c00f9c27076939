"""vllm-ascend's own log lines: the ``[vllm-ascend] [module] -`` prefix and its CPU-offload hit rate.

Sources (vllm-project/vllm-ascend, tag v0.22.1rc1): ``vllm_ascend/logger.py``
(``_format_with_ascend_prefix``, ``_infer_module_name``, ``_FORMAT``) and
``vllm_ascend/distributed/kv_transfer/kv_pool/cpu_offload/cpu_kv_cache_manager.py`` line 29
(``CPU Prefix cache hit rate: %.1f%%``). The fixtures under tests/fixtures/vllm-ascend-constructed/
are constructed from those files (no NPU was run).
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cachemon import catalog as C
from cachemon.normalise import log_grammar as V
from cachemon.normalise.log_updates import log_gauges
from logs_support import Clock, config, source

FIX = Path(__file__).parent / "fixtures" / "vllm-ascend-constructed"
FIRST = "vllm_ascend_20261201_201806_4711.log"
SECOND = "vllm_ascend_20261201_201806_4711_002.log"


@pytest.mark.parametrize("line, module, rest", [
    # a record from vllm_ascend/distributed/...: "[vllm-ascend] [distributed] - "
    ("INFO 12-01 20:18:45 [cpu_kv_cache_manager.py:29] [vllm-ascend] [distributed] - CPU Prefix cache hit rate: 1.0%",
     "distributed", "INFO 12-01 20:18:45 [cpu_kv_cache_manager.py:29] CPU Prefix cache hit rate: 1.0%"),
    # a record from vllm_ascend/utils.py: filename == module + ".py", so "[vllm-ascend] - " only
    ("WARNING 12-01 20:19:12 [utils.py:1267] [vllm-ascend] - For deepseek_v4 model",
     "", "WARNING 12-01 20:19:12 [utils.py:1267] For deepseek_v4 model"),
])
def test_prefix_is_taken_off(line, module, rest):
    assert V.ascend_prefix(line) == (module, rest)


def test_no_prefix_and_quoted_prefix_are_left_alone():
    plain = "INFO 12-01 20:18:40 [loggers.py:271] Engine 000: Avg prompt throughput: 1.0 tokens/s"
    assert V.ascend_prefix(plain) is None
    # a prompt quoting the words is not at the message start: not a prefix
    assert V.ascend_prefix("INFO 12-01 [serving.py:1] prompt: 'see [vllm-ascend] docs'") is None


def test_prefixed_lines_parse_like_unprefixed_ones():
    body = ("Engine 000: Avg prompt throughput: 10.0 tokens/s, Avg generation throughput: 2.0 tokens/s, "
            "Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 5.0%, Prefix cache hit rate: 40.0%")
    a = V.parse(f"INFO 12-01 20:18:40 [loggers.py:271] {body}")
    b = V.parse(f"INFO 12-01 20:18:40 [patch_x.py:9] [vllm-ascend] [patch] - {body}")
    assert a is not None and b is not None
    assert (a.kind, a.engine, a.hit_rates, a.kv_usage, a.timestamp) == (b.kind, b.engine, b.hit_rates,
                                                                        b.kv_usage, b.timestamp)
    assert V.reset_event("INFO 12-01 20:19:00 [block_pool.py:1] [vllm-ascend] [core] - Successfully reset "
                         "prefix cache") == "done"
    # with colours (the console handler: AscendColoredFormatter)
    c = V.parse(f"\x1b[32mINFO\x1b[0m 12-01 20:18:40 [x.py:1] [vllm-ascend] [core] - {body}")
    assert c is not None and c.hit_rates == {"local": 0.4}


def test_cpu_offload_hit_rate_line():
    s = V.parse("INFO 12-01 20:18:45 [cpu_kv_cache_manager.py:29] [vllm-ascend] [distributed] - "
                "CPU Prefix cache hit rate: 12.5%")
    assert s is not None and s.kind == "ascend_cpu_offload"
    assert s.hit_rates == {"ascend_cpu_offload": 0.125}
    with pytest.raises(V.MalformedLine):
        V.parse("INFO 12-01 20:18:45 [cpu_kv_cache_manager.py:29] CPU Prefix cache hit rate: 120.0%")
    # vLLM's V0 "Prefix cache hit rate: GPU: ..., CPU: ..." is something else
    assert V.parse("INFO 12-01 [metrics.py:1] Prefix cache hit rate: GPU: 10.00%, CPU: 0.00%").kind == "v0_prefix"


def test_fixture_directory_through_the_log_source(tmp_path):
    d = tmp_path / "vllm_ascend"
    d.mkdir()
    shutil.copy(FIX / FIRST, d / FIRST)
    cfg = config([str(d) + "/"], tmp_path, from_beginning=True, rules=())
    cfg.builtin_parsers = True
    clock = Clock()
    src = source(cfg, clock)
    src.poll()
    stream = src.entries[0].stream
    assert stream.lines["parsed"] == 5      # 2 stats lines, 2 CPU hit-rate lines, 1 reset line
    assert stream.era == "v1-log-0.20+"                 # Deferred: vLLM >= 0.20 (v0.22.1rc1 pairs 0.22.1)
    g = {(k.metric, k.labels): v for k, v in log_gauges(stream).items()}
    ratio = C.REPORTED_HIT_RATIO.name
    assert g[(ratio, ("", "0", "local", "recent_requests"))] == pytest.approx(0.63)
    assert g[(ratio, ("", "0", "external", "recent_requests"))] == pytest.approx(0.20)
    assert g[(ratio, ("", "", "ascend_cpu_offload", "recent_requests"))] == pytest.approx(0.25)
    assert g[(C.KV_CACHE_USAGE.name, ("", "0"))] == pytest.approx(0.091)
    assert stream.last_reset_log_time is not None        # "Successfully reset prefix cache"
    # the handler switches to _002.log: picked up, nothing of the first file read again
    shutil.copy(FIX / SECOND, d / SECOND)
    src.poll()
    assert stream.lines["parsed"] == 6
    g = {(k.metric, k.labels): v for k, v in log_gauges(stream).items()}
    assert g[(ratio, ("", "0", "local", "recent_requests"))] == pytest.approx(0.50)
    src.close()


def test_cpu_line_alone_does_not_make_the_log_v0(tmp_path):
    log = tmp_path / "a.log"
    log.write_text("INFO 12-01 20:18:45 [cpu_kv_cache_manager.py:29] [vllm-ascend] [distributed] - "
                   "CPU Prefix cache hit rate: 12.5%\n")
    cfg = config([log], tmp_path, from_beginning=True, rules=())
    src = source(cfg)
    src.poll()
    assert src.entries[0].stream.era != "v0-log"
    src.close()
