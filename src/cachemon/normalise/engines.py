"""The serving engines cachemon reads, one row each: where their facts live, not branches in the code.

A row says which metric prefix the engine's /metrics page uses, which ``eras.ERAS`` rows read it, how
its cumulative totals are exposed (``counter``, or ``gauge-as-counter``: a gauge that only grows
between restarts, read as a reset-aware counter), which ``kv_schema.ERAS`` rows decode its KV events,
and what its log lines are. The era a page matches names its engine (``Era.engine``), and so does the
KV-event era a stream speaks (``KvEra.engine``, its release label); ``ServerProfile.engine`` and the
``engine`` label of ``cachemon_upstream_info`` come from there. Nothing else is renamed:
every engine feeds the same counters, ledger, dashboards and alerts. ``docs/vllm-eras.md``'s engine
table is rendered from these rows (scripts/readme.py), each with how it was proven.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Engine:
    name: str                       # the `engine` label value on the info metrics
    versions: str                   # releases the row was read from (for humans)
    metric_prefixes: tuple[str, ...]   # the names on its page start with one of these ("": bare names)
    counters: str                   # "counter" | "gauge-as-counter" | "none" (no token totals on its page)
    kv_wire: str                    # how its KV events are decoded (kv_schema.ERAS rows of this engine)
    log_lines: str                  # what cachemon reads of its log
    source: str                     # the source files (and lines) the row was read from
    evidence: str = "constructed"   # real capture(s) under tests/fixtures, or "constructed" (fixtures named)


VLLM = "vllm"
SGLANG = "sglang"
TRTLLM = "tensorrt-llm"
MINDIE = "mindie"
ASCEND = "vllm-ascend"

ENGINES: tuple[Engine, ...] = (
    Engine(VLLM, "0.5.5 - 0.33 (V0, V1; Python and Rust frontends)", ("vllm:", "vllm_", "ray_vllm:", "ray_vllm_"),
           "counter", "every release of `vllm/distributed/kv_events.py` (0.9.0 on)",
           "stats lines (`log_grammar.GRAMMARS`), start-up config lines (`CONFIG_LINES`)",
           "vllm/v1/metrics/loggers.py, vllm/distributed/kv_events.py (each release's wheel)",
           evidence="vllm-0.8.5-cpu-v0, vllm-0.10.2-cpu, vllm-0.11.2-cpu, vllm-0.32.0-cpu (+ -kv-events)"),
    Engine(ASCEND, "v0.22.1rc1 (vLLM 0.22.1's metrics and KV events)", ("vllm:",), "counter",
           "vLLM's rows (its AscendStore connector publishes vLLM's BlockStored, `medium=\"cpu\"`, no LoRA: "
           "the CPU tier whatever its case)",
           "vLLM's stats lines behind `[vllm-ascend] - `; rotated files",
           "vllm_ascend/distributed/kv_transfer/kv_pool/ascend_store/kv_transfer.py:829-850, "
           "vllm_ascend/core/recompute_scheduler.py:1274-1288 (main 182b75ea84; docs/vllm-ascend.md)",
           evidence="constructed: vllm-ascend-constructed"),
    Engine(SGLANG, "0.5.23", ("sglang:",), "counter",
           "`[ts, events, attn_dp_rank]`, tagged maps, explicit `cache_salt` (tenant), `session_id`, "
           "media GPU|CPU_PINNED|DISK|EXTERNAL, page size 1 by default (one hash per token); publisher "
           "port = base + dp rank",
           "`Prefill batch, #new-seq: N, #new-token: N, #cached-token: N, ...`: the `sglang_prefill` row of "
           "`log_grammar.GRAMMARS`, that batch's ratio as a reported ratio (per_batch_tokens)",
           "srt/observability/metrics_collector.py:388-393,1855-1859,1934-1938,2092-2134; "
           "srt/disaggregation/kv_events.py:233-300,416,651-668; "
           "srt/managers/scheduler_components/metrics_reporter.py:753-762; srt/mem_cache/events.py:308",
           evidence="constructed: sglang-constructed"),
    Engine(TRTLLM, "main @13599e9 (PR #17023)", (), "none",
           "vLLM's map wire plus `mm_keys`; token ids int or str (multimodal digests); replay ends with "
           "seq -1 (`END_SEQ`)",
           "-",
           "tensorrt_llm/_torch/pyexecutor/kv_cache_events.py (EventBatch, BlockStored, ZmqEventPublisher)",
           evidence="constructed: tensorrt-llm-constructed"),
    Engine(MINDIE, "MindIE-LLM (2026-04 on: the radix-match totals)", ("",), "gauge-as-counter",
           "-", "-",
           "Ascend/MindIE-LLM src/server/endpoint/http_wrapper/prometheus_metrics.cpp:199-219 (the gauges), "
           "430-447 (RadixMatchDataCollect), commit 8b4871a",
           evidence="constructed: mindie-constructed"),
)

BY_NAME = {e.name: e for e in ENGINES}


def engine(name: str) -> Engine:
    """The row of an engine by its label value (KeyError for an unknown one)."""
    return BY_NAME[name]
