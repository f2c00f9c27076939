"""Prefix-cache data series: what vLLM reports about its prompts, cache and scheduler, as cachemon re-exports it."""
from __future__ import annotations

from cachemon.catalog.spec import CACHE_LABELS, SERIES_LABELS, WINDOW, _m

QUERY_TOKENS = _m(
    "prefix_cache_query_tokens", "counter", "tokens", CACHE_LABELS,
    "Prompt tokens looked up in the prefix cache, reset-corrected across upstream restarts.",
    "vllm:prefix_cache_queries_total, vllm:gpu_prefix_cache_queries_total (tokens, or blocks x block_size), "
    "vllm:external_prefix_cache_queries_total (cache=external), or exact counts from log rules",
)
HIT_TOKENS = _m(
    "prefix_cache_hit_tokens", "counter", "tokens", CACHE_LABELS,
    "Prompt tokens served from the prefix cache, reset-corrected across upstream restarts.",
    "vllm:prefix_cache_hits_total, vllm:gpu_prefix_cache_hits_total, vllm:external_prefix_cache_hits_total, log rules",
)
MISS_TOKENS = _m(
    "prefix_cache_miss_tokens", "counter", "tokens", CACHE_LABELS,
    "Prompt tokens looked up but not found in the prefix cache (query minus hit), reset-corrected.",
    "derived: query - hit",
)
HIT_RATIO = _m(
    "prefix_cache_hit_ratio", "gauge", "ratio", CACHE_LABELS + (WINDOW,),
    "Hit tokens / query tokens over the trailing window, computed by cachemon from its polls. "
    "Absent while the window saw no queries. A convenience series: the shipped rules, alerts and "
    "dashboards compute the ratio from the token counters instead.",
    "derived from the reset-corrected counters",
)
REPORTED_HIT_RATIO = _m(
    "prefix_cache_reported_hit_ratio", "gauge", "ratio", CACHE_LABELS + ("basis",),
    "Hit ratio exactly as vLLM reports it, where vLLM gives no counters. basis=since_start_blocks: "
    "V0 gauge, block lookups since engine start; basis=recent_requests: the log line's window of the "
    "last ~1000 requests; basis=interval: the Rust frontend's log line, the last 10 s; basis=per_batch_tokens: "
    "SGLang's sglang:cache_hit_rate, the last prefill batch; basis=since_start_tokens: MindIE's "
    "npu_prefix_cache_hit_rate. Never mixed into the token counters.",
    "vllm:gpu_prefix_cache_hit_rate / vllm:cpu_prefix_cache_hit_rate (V0), log stats lines, "
    "sglang:cache_hit_rate, npu_prefix_cache_hit_rate",
)
PROMPT_TOKENS = _m(
    "prompt_tokens", "counter", "tokens", SERIES_LABELS,
    "Prompt tokens of finished prefills (V1: includes cached tokens), reset-corrected.",
    "vllm:prompt_tokens_total",
)
GENERATION_TOKENS = _m(
    "generation_tokens", "counter", "tokens", SERIES_LABELS,
    "Generated tokens, reset-corrected.",
    "vllm:generation_tokens_total",
)
PROMPT_TOKENS_BY_SOURCE = _m(
    "prompt_tokens_by_source", "counter", "tokens", SERIES_LABELS + ("source",),
    "Prompt tokens by where their KV came from (local_compute, local_cache_hit, external_kv_transfer), "
    "reset-corrected. vLLM >= 0.16 only.",
    "vllm:prompt_tokens_by_source_total",
)
HIT_TOKENS_BY_SOURCE = _m(
    "prefix_cache_hit_tokens_by_source", "counter", "tokens", SERIES_LABELS + ("source",),
    "Prompt tokens served from a cache, by the tier that held them (device, host, disk, p2p, "
    "external_unspecified), reset-corrected: a hit from the CPU tier is a hit, not a loss. vLLM >= 0.32 only.",
    "vllm:prompt_tokens_cached_by_source_total",
)
SAMPLING_REQUESTS = _m(
    "sampling_requests", "counter", "requests", SERIES_LABELS,
    "Finished requests counted once whatever their n (vLLM's request_params_n histogram _count), "
    "reset-corrected. With sampling_sequences: parallel sampling's share.",
    "vllm:request_params_n_count",
)
SAMPLING_SEQUENCES = _m(
    "sampling_sequences", "counter", "requests", SERIES_LABELS,
    "Sequences of finished requests (the sum of their n: request_params_n _sum), reset-corrected. Above "
    "sampling_requests, parallel sampling (n > 1) queried each prompt n times, and its copies hit each other.",
    "vllm:request_params_n_sum",
)
PROMPT_CACHED_TOKENS = _m(
    "prompt_cached_tokens", "counter", "tokens", SERIES_LABELS,
    "Prompt tokens served from any cache (local + external), reset-corrected. vLLM >= 0.16 only.",
    "vllm:prompt_tokens_cached_total",
)
PREEMPTIONS = _m(
    "preemptions", "counter", "events", SERIES_LABELS,
    "Requests preempted by the scheduler (KV cache pressure), reset-corrected.",
    "vllm:num_preemptions_total",
)
PROMPT_LENGTH_REQUESTS = _m(
    "request_prompt_tokens", "histogram", "tokens", SERIES_LABELS,
    "Prompt length of finished requests in tokens: vLLM's own histogram re-exported as a histogram (its "
    "buckets, _sum and _count), each series reset-corrected. Against block_size it shows prompts too short "
    "to hit. (_sum and _count only where vLLM's page has _sum.)",
    "vllm:request_prompt_tokens_bucket, vllm:request_prompt_tokens_sum",
)
KV_EVICTED_BLOCKS = _m(
    "kv_cache_evicted_blocks", "counter", "blocks", SERIES_LABELS,
    "KV-cache blocks evicted, SAMPLED (--kv-cache-metrics-sample), reset-corrected. Only with --kv-cache-metrics.",
    "vllm:kv_block_idle_before_evict_seconds_count",
)
KV_CACHE_CAPACITY = _m(
    "kv_cache_capacity_tokens", "gauge", "tokens", SERIES_LABELS,
    "Size of the KV-cache pool in tokens (blocks x block_size): a working set larger than this cannot stay cached.",
    "vllm:cache_config_info{num_gpu_blocks, block_size}",
)
KV_CACHE_USAGE = _m(
    "kv_cache_usage_ratio", "gauge", "ratio", SERIES_LABELS,
    "Fraction of KV-cache blocks in use (0..1).",
    "vllm:kv_cache_usage_perc, vllm:gpu_cache_usage_perc, log stats lines",
)
REQUESTS_RUNNING = _m(
    "requests_running", "gauge", "requests", SERIES_LABELS,
    "Requests currently running on the engine.",
    "vllm:num_requests_running, log stats lines",
)
REQUESTS_WAITING = _m(
    "requests_waiting", "gauge", "requests", SERIES_LABELS,
    "Requests waiting to be scheduled.",
    "vllm:num_requests_waiting, log stats lines",
)
