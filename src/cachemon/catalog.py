"""The one list of every metric cachemon exports.

The collector, the docs/metrics.md table and the monitoring generator (alerts, recording
rules, dashboards) all read this module, so a name is spelled in exactly one place.
Names follow Prometheus conventions: base units, ``_total`` on counters, ``_ratio``
for 0..1 values, ``_info`` for metadata, no colons.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

PREFIX = "cachemon_"

# Label names shared by the data series.
UPSTREAM = "upstream"      # configured name of the source (a /metrics URL or a log file)
MODEL = "model_name"       # vLLM's served model name
ENGINE = "engine"          # vLLM's data-parallel engine index ("" where the era has none)
CACHE = "cache"            # "local" (vLLM's own KV cache) or "external" (KV connector)
WINDOW = "window"          # duration string of a cachemon-computed window, e.g. "5m"

SERIES_LABELS = (UPSTREAM, MODEL, ENGINE)
CACHE_LABELS = SERIES_LABELS + (CACHE,)


@dataclass(frozen=True)
class MetricSpec:
    name: str            # full exported name; for counters without the _total suffix
    type: str            # counter | gauge | info | histogram
    unit: str            # tokens, seconds, ratio, requests, events, bytes, lines, ""
    labels: tuple[str, ...]
    help: str
    source: str          # where the value comes from, for the docs/metrics.md table

    @property
    def sample_name(self) -> str:
        """The name of the exposed sample (what PromQL queries)."""
        if self.type == "counter":
            return self.name + "_total"
        if self.type == "info":
            return self.name + "_info"
        if self.type == "histogram":
            return self.name + "_bucket"
        return self.name

    @property
    def openmetrics_unit(self) -> str:
        """The unit of the family's OpenMetrics ``# UNIT`` line: the catalog's unit where the name ends
        with it (OpenMetrics requires that), else none. Units such as requests or events say what a
        count counts; they are not name suffixes, so those families carry no UNIT line."""
        return self.unit if self.unit and self.name.endswith("_" + self.unit) else ""


def _m(name: str, type_: str, unit: str, labels: tuple[str, ...], help_: str, source: str) -> MetricSpec:
    return MetricSpec(PREFIX + name, type_, unit, tuple(labels), help_, source)


# --- prefix-cache data series --------------------------------------------------
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
    "last ~1000 requests; basis=interval: the Rust frontend's log line, the last 10 s. Never mixed into the "
    "token counters.",
    "vllm:gpu_prefix_cache_hit_rate / vllm:cpu_prefix_cache_hit_rate (V0), log stats lines",
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

# --- attribution (runtime/attribution.py) ------------------------------------------------
CAUSE = "cause"
CERTAINTY = "certainty"
CAUSE_ACTIVE = _m(
    "cause_active", "gauge", "", (UPSTREAM, MODEL, CAUSE, CERTAINTY),
    "1 while the cause explains missed prompt tokens of the model on the upstream, whatever the ratio "
    "(prefix_caching_disabled, cold_cache, prompts_shorter_than_block, capacity_eviction, "
    "hits_inflated_by_preemption, restart, cache_reset, cache_reset_suspected, change, routing_skew, "
    "dynamic_prefix, dynamic_prefix_suspected); certainty: exact, measured or heuristic. Held down: active "
    "after attribution.hold evaluations (at once when it cost tokens), inactive attribution.hold_down after "
    "it last held. Absent while inactive.",
    "cachemon attribution engine",
)
CAUSE_SINCE = _m(
    "cause_since_timestamp_seconds", "gauge", "seconds", (UPSTREAM, MODEL, CAUSE),
    "Unix time at which the active cause became active (for the Why timeline).",
    "cachemon attribution engine",
)
LOG_CACHE_RESETS = _m(
    "log_prefix_cache_resets", "counter", "", (UPSTREAM, "result"),
    "Prefix-cache resets read from vLLM's log: result=requested ('Resetting prefix cache'), done "
    "('Successfully reset prefix cache'), failed ('Failed to reset prefix cache').",
    "vLLM log lines",
)

# --- KV-cache events: the miss ledger (docs/kv-events.md) -------------------------------------
REASON = "reason"
KV_STORED_TOKENS = _m(
    "kv_stored_tokens", "counter", "tokens", (UPSTREAM, MODEL, REASON),
    "Tokens of blocks vLLM stored (computed and cached), from its KV-cache events, by why they were not "
    "cached already: first (never cached before here, not cached on another replica now; includes "
    "generated tokens), capacity (evicted here earlier), reset (cleared by a prefix-cache reset), restart "
    "(cached by an earlier vLLM process), routing (cached now on another replica of the model), "
    "recompute_last_block (still cached: a prompt of whole blocks recomputes its last one).",
    "vLLM KV-cache events (BlockStored, BlockRemoved, AllBlocksCleared) through cachemon's ledger",
)
KV_REUSED_TOKENS = _m(
    "kv_reused_tokens", "counter", "tokens", (UPSTREAM, MODEL),
    "Tokens of cached blocks that requests reused (prefix-cache hits), as vLLM reports them for requests "
    "with kv_cache_report_mode=\"full\" (a BlockStored of the reused blocks, parent null). Never counted "
    "as stored; requests in the default incremental mode report no hits, so this is a lower bound of the "
    "replica's hits unless every request asks for full reports.",
    "vLLM KV-cache events (full report mode) through cachemon's ledger",
)
KV_CACHED_BLOCKS = _m(
    "kv_cached_blocks", "gauge", "blocks", (UPSTREAM, MODEL),
    "Blocks the ledger holds as cached on the replica now (stored and not yet removed or cleared).",
    "cachemon KV-event ledger",
)
KV_EVENTS = _m(
    "kv_events", "counter", "events", (UPSTREAM, "type"),
    "KV-cache events received, by type: stored, removed, cleared, unknown (a type this cachemon does not "
    "know; counted and skipped).",
    "vLLM KV-cache event stream",
)
KV_LOST_BATCHES = _m(
    "kv_lost_batches", "counter", "", (UPSTREAM, REASON),
    "Event batches lost, by reason: gap (sequence numbers missed and not recovered from the replay socket), "
    "decode_error (a frame that does not decode), oversized (a frame over kv_events.max_frame_bytes), "
    "duplicate (a batch of the same publisher process received again: skipped). "
    "After a loss the ledger is out of sync until the next reset or restart.",
    "cachemon KV-event source",
)
KV_RECOVERED_BATCHES = _m(
    "kv_recovered_batches", "counter", "", (UPSTREAM,),
    "Event batches missed on the live stream and recovered from vLLM's replay socket.",
    "cachemon KV-event source",
)
KV_LEDGER_IN_SYNC = _m(
    "kv_ledger_in_sync", "gauge", "", (UPSTREAM,),
    "1 while the ledger has seen every event since its last known-empty state (process start or reset); "
    "0 after a lost batch until the next reset or restart (its split is then a lower bound).",
    "cachemon KV-event ledger",
)
KV_STREAM_UP = _m(
    "kv_stream_up", "gauge", "", (UPSTREAM,),
    "1 while cachemon is connected to the upstream's KV-event publisher and receiving, else 0.",
    "cachemon KV-event source",
)
KV_BLOCK_LIFETIME = _m(
    "kv_block_lifetime_seconds", "histogram", "seconds", (UPSTREAM, MODEL),
    "How long blocks stayed cached, from BlockStored to the BlockRemoved that evicted them.",
    "cachemon KV-event ledger",
)
KV_DIVERGENCE_DEPTH = _m(
    "kv_divergence_depth_blocks", "histogram", "blocks", (UPSTREAM, MODEL),
    "For each stored chain, the depth (in blocks from the prompt's start) of its first new block: where "
    "the prompt stopped matching what was cached.",
    "cachemon KV-event ledger",
)
KV_LEDGER_ANOMALIES = _m(
    "kv_ledger_anomalies", "counter", "events", (UPSTREAM, "kind"),
    "Events the ledger could not place, by kind: overflow_blocks (stored blocks over kv_events.max_blocks, "
    "not tracked), orphan_stores (a BlockStored whose parent the ledger did not hold), unknown_removed (a "
    "BlockRemoved of a hash it did not hold), malformed_stores (token ids that do not fit the block size or "
    "are not integers), other_groups (events of a second KV-cache group of a hybrid model, not ledgered), "
    "ambiguous_reports (a chain-head BlockStored of cached blocks that may be a full-report reuse report or a "
    "recompute: a single block, or a hybrid group without a window to judge by).",
    "cachemon KV-event ledger",
)
TENANT = "tenant"
ADAPTER = "adapter"
TENANT_LABELS = (UPSTREAM, MODEL, TENANT, ADAPTER)
KV_TENANT_STORED_TOKENS = _m(
    "kv_tenant_stored_tokens", "counter", "tokens", TENANT_LABELS + (REASON,),
    "cachemon_kv_stored_tokens_total per tenant and adapter. tenant: the name kv_events.tenants gives "
    "sha256(cache_salt) (hex), else h- and 12 hex digits of HMAC-SHA256(kv_events.tenant_key, cache_salt), "
    "else unnamed; empty without a cache_salt; other beyond kv_events.tenant_top_k hashed tenants. The salt "
    "itself is never exported. adapter: the LoRA name, empty without one. reason: as "
    "cachemon_kv_stored_tokens_total, plus isolation (the block's token content was cached at that moment "
    "under another cache_salt or adapter, on this or another replica of the model).",
    "vLLM KV-cache events (BlockStored extra_keys' cache_salt, lora_name) through cachemon's ledger",
)
KV_TENANT_HIT_TOKENS = _m(
    "kv_tenant_hit_tokens", "counter", "tokens", TENANT_LABELS,
    "cachemon_kv_reused_tokens_total per tenant and adapter (labels as cachemon_kv_tenant_stored_tokens_total): "
    "hits reported by requests with kv_cache_report_mode=\"full\". Without full reports the queries are not "
    "known per tenant, only the stores.",
    "vLLM KV-cache events (full report mode) through cachemon's ledger",
)
KV_TENANT_LABEL_OVERFLOW = _m(
    "kv_tenant_label_overflow", "counter", "events", (UPSTREAM,),
    "Stores and reuse reports counted under tenant=\"other\": their tenant came after kv_events.tenant_top_k "
    "hashed tenants had their own series.",
    "cachemon KV-event ledger",
)
MEDIUM = "medium"
KV_TIER_STORED_BLOCKS = _m(
    "kv_tier_stored_blocks", "counter", "blocks", (UPSTREAM, MODEL, MEDIUM),
    "Blocks vLLM reports stored in a tier other than its GPU pool (medium: CPU, FS, OBJ, STORAGE, as the "
    "event names it), from its KV connector's events. Kept apart from the pool's split.",
    "vLLM KV-cache events (medium other than GPU)",
)
KV_TIER_REMOVED_BLOCKS = _m(
    "kv_tier_removed_blocks", "counter", "blocks", (UPSTREAM, MODEL, MEDIUM),
    "Blocks vLLM reports removed from a tier other than its GPU pool, by medium.",
    "vLLM KV-cache events (medium other than GPU)",
)
KV_TIER_HIT_TOKENS = _m(
    "kv_tier_hit_tokens", "counter", "tokens", (UPSTREAM, MODEL, MEDIUM),
    "Tokens of blocks stored in the GPU pool that another tier (medium) of the replica held at that moment "
    "(the leading blocks of a store): loaded from that tier, not computed, so not counted in "
    "cachemon_kv_stored_tokens_total (an eviction from the GPU that the tier caught is no capacity loss).",
    "vLLM KV-cache events (medium other than GPU)",
)
KV_HISTORY_EVICTED = _m(
    "kv_history_evicted", "counter", "blocks", (UPSTREAM,),
    "Departed block contents dropped from the ledger's bounded history (kv_events.history_blocks); if "
    "stored again they count as first.",
    "cachemon KV-event ledger",
)
CAUSE_MISSED_TOKENS = _m(
    "cause_missed_tokens", "counter", "tokens", (UPSTREAM, MODEL, CAUSE, CERTAINTY),
    "Prompt tokens recomputed because of each cause, counted whenever the cause cost tokens (not only below "
    "the alert threshold). certainty: exact (the KV-event ledger), measured (the ledger after lost events: a "
    "lower bound) or estimated (from the counters where no events are followed; docs/runbook.md says how, "
    "per cause).",
    "cachemon attribution engine",
)

# --- upstream health and metadata -----------------------------------------------
UPSTREAM_UP = _m(
    "upstream_up", "gauge", "", (UPSTREAM,),
    "1 if the last poll of the upstream succeeded, else 0.",
    "cachemon poller",
)
SCRAPE_DURATION = _m(
    "upstream_scrape_duration_seconds", "gauge", "seconds", (UPSTREAM,),
    "Duration of the last poll of the upstream (fetch + parse + normalise).",
    "cachemon poller",
)
SCRAPES = _m(
    "upstream_scrapes", "counter", "", (UPSTREAM,),
    "Polls of the upstream, successful or not.",
    "cachemon poller",
)
SCRAPE_ERRORS = _m(
    "upstream_scrape_errors", "counter", "", (UPSTREAM, "reason"),
    "Failed polls of the upstream by reason (refused, timeout, http_status, too_large, truncated, "
    "not_exposition, parse, other).",
    "cachemon poller",
)
LAST_ERROR = _m(
    "upstream_last_error", "info", "", (UPSTREAM, "reason"),
    "The reason of the last poll error of the upstream (one of upstream_scrape_errors' reasons); absent while "
    "the upstream is up. The error's text is in cachemon's log and in `cachemon check`, not in a label.",
    "cachemon poller",
)
LAST_SUCCESS = _m(
    "upstream_last_success_timestamp_seconds", "gauge", "seconds", (UPSTREAM,),
    "Unix time of the last successful poll.",
    "cachemon poller",
)
RESTARTS = _m(
    "upstream_restarts", "counter", "", (UPSTREAM,),
    "Polls that saw an upstream restart: a series fell to at most half its value or its *_created timestamp "
    "changed to a later one (that series is corrected), or process_start_time_seconds changed to a later one "
    "(every series of the process is; confirmed by a second page unless every counter fell). A smaller fall "
    "is a glitch, held (rejected_samples reason glitch).",
    "cachemon reset detection",
)
LAST_RESTART = _m(
    "upstream_last_restart_timestamp_seconds", "gauge", "seconds", (UPSTREAM,),
    "Unix time at which cachemon detected the last upstream restart (for Grafana annotations).",
    "cachemon reset detection",
)
UPSTREAM_INFO = _m(
    "upstream", "info", "",
    (UPSTREAM, "kind", "era", "vllm_version", "prefix_caching", "block_size", "hash_algo", "counter_unit"),
    "What cachemon detected about the upstream: metric era, vLLM version (from /version, if served), "
    "cache config (from vllm:cache_config_info) and the unit vLLM counts prefix-cache queries in.",
    "vllm:cache_config_info, HELP texts, /version",
)
PREFIX_CACHING_ENABLED = _m(
    "prefix_caching_enabled", "gauge", "", SERIES_LABELS,
    "1 if prefix caching is enabled on the engine, 0 if disabled (absent if unknown).",
    "vllm:cache_config_info{enable_prefix_caching}, V0 hit-rate gauge = -1",
)
BLOCK_SIZE = _m(
    "kv_cache_block_size_tokens", "gauge", "tokens", SERIES_LABELS,
    "KV-cache block size: only full blocks are cached, so shorter shared prefixes cannot hit.",
    "vllm:cache_config_info{block_size}",
)
MATCH_FLOOR = _m(
    "prefix_cache_match_floor_tokens", "gauge", "tokens", SERIES_LABELS,
    "The shortest prefix that can hit: a prompt of at most this many tokens never hits. vLLM's resolved "
    "hit alignment where the page says it, else the prefix match unit / hash block size (a lower bound), "
    "else the full-attention block size, else block_size (hybrid and sliding-window models: 784-4096).",
    "vllm:cache_config_info{cache_hit_alignment_tokens, prefix_match_unit, hash_block_size, "
    "effective_attention_block_size, block_size}",
)
SERIES_OVERFLOW = _m(
    "series_overflow", "counter", "", (UPSTREAM,),
    "(model_name, engine) label sets refused because the upstream already had max_series_per_upstream "
    "of them (cardinality guard, counted once per label set).",
    "cachemon state",
)
SERIES_EVICTED = _m(
    "series_evicted", "counter", "", (UPSTREAM,),
    "(model_name, engine) label sets evicted with all their series after the upstream stopped reporting them "
    "for normalise.evict_after (frees their cardinality-guard slot).",
    "cachemon state",
)
REJECTED_SAMPLES = _m(
    "upstream_rejected_samples", "counter", "", (UPSTREAM, "reason"),
    "Upstream samples refused, by reason: duplicate_series (the page repeats a label set, an invalid "
    "exposition; the first is kept), nan, infinite, negative, implausible_value (a counter sample that is "
    "not a count, or at or above 2^53; the series keeps its last good value), out_of_range (a gauge outside "
    "its unit's range: a ratio outside 0..1, a count below 0; not exported), glitch (a counter a little "
    "below its last value with no sign of a restart: the last value is held), implausible_jump (a counter "
    "step faster than 1e10 per second), other_process (a sample from a second process behind the same URL).",
    "cachemon normaliser",
)
MULTIPLE_PROCESSES = _m(
    "upstream_multiple_processes", "gauge", "", (UPSTREAM,),
    "1 if more than one vLLM process answered on the upstream's URL (different "
    "process_start_time_seconds, e.g. a load balancer alternating replicas) within normalise.evict_after: "
    "only the first process's series are exported, the others' samples are refused "
    "(reason other_process). 0 otherwise.",
    "cachemon reset detection",
)
HTTP_REFUSED = _m(
    "http_refused", "counter", "", ("reason",),
    "Connections or requests cachemon's listener refused or cut, by reason: auth_queue_full (429: too many "
    "unverified credentials waiting for bcrypt), auth_per_client (429: that many from one address), "
    "busy (503: too many /-/ready probes waiting), "
    "connection_limit (an idle connection closed to make room), request_timeout, handshake_timeout, "
    "write_timeout, handshake_failed, plain_http_on_tls, bad_request, headers_too_large, fd_limit.",
    "cachemon listener",
)
BUILD_INFO = _m(
    "build", "info", "", ("version", "revision", "python_version"),
    "cachemon build information: version, git revision it was built from (unknown outside a git build) and "
    "the Python version it runs on.",
    "cachemon",
)
STAGE_DURATION = _m(
    "stage_collect_duration_seconds", "gauge", "seconds", ("stage",),
    "Time the stage took to build its metrics for this scrape (as node_exporter's "
    "node_scrape_collector_duration_seconds{collector}).",
    "cachemon daemon, per stage: store, logs, changes, warmup, cost, kv_events, attribution",
)
STAGE_SUCCESS = _m(
    "stage_collect_success", "gauge", "", ("stage",),
    "1 when the stage built its metrics for this scrape, 0 when it failed (its series are missing "
    "and the error is in cachemon's log; as node_exporter's node_scrape_collector_success{collector}).",
    "cachemon daemon, per stage: store, logs, changes, warmup, cost, kv_events, attribution",
)

# --- log source (sources/logs) -----------------------------------------------------
FILE = "file"
LOG_LINES = _m(
    "log_lines", "counter", "lines", (UPSTREAM, "outcome"),
    "Log lines read, by outcome: parsed (a stats line or a user rule matched), unmatched, malformed "
    "(looked like a stats line but did not parse), too_long (over max_line_bytes; skipped, since a cut line "
    "could carry a cut number).",
    "log tailer",
)
LOG_BYTES = _m(
    "log_read_bytes", "counter", "bytes", (UPSTREAM,),
    "Bytes read from the log files.",
    "log tailer",
)
LOG_ROTATIONS = _m(
    "log_rotations", "counter", "", (UPSTREAM,),
    "Rotations followed (rename+create, delete+recreate, symlink switch).",
    "log tailer",
)
LOG_TRUNCATIONS = _m(
    "log_truncations", "counter", "", (UPSTREAM,),
    "Truncations detected (copytruncate): the file shrank below the read offset.",
    "log tailer",
)
LOG_FILES_OPEN = _m(
    "log_files_open", "gauge", "", (UPSTREAM,),
    "Log files currently open.",
    "log tailer",
)
LOG_FILES_REFUSED = _m(
    "log_files_refused", "counter", "", (UPSTREAM, REASON),
    "Log files matched but never read, each counted once per reason: own_output (cachemon's own stdout, "
    "stderr or log file: tailing it would feed on itself), foreign_owner (running as root, a file the "
    "service user could not read: not owned by logs.expected_owner or the watched directory's owner, "
    "and not readable by everyone or that owner's group), symlink (a glob or directory matched a symlink "
    "that leaves the directory, does not resolve, or names a file not of the directory's owner).",
    "log tailer",
)
LOG_STATS_AGE = _m(
    "log_last_stats_line_timestamp_seconds", "gauge", "seconds", (UPSTREAM, FILE),
    "Unix time at which cachemon read the last parsed stats line of the file (vLLM logs none while idle): "
    "its age is time() minus this.",
    "log tailer",
)
LOG_STATE_SAVE_ERRORS = _m(
    "log_state_save_errors", "counter", "", (),
    "Failed writes of the log state file (offsets + counters). After a restart the tailer resumes "
    "from the last good save.",
    "log tailer",
)
LOG_STATE_LOAD_ERRORS = _m(
    "log_state_load_errors", "counter", "", (),
    "Starts at which the log state file was unusable (unreadable, damaged, other schema, or a valid checksum "
    "over content of the wrong type); logs.on_state_error decided where reading resumed.",
    "log tailer",
)
PROMPT_TOKENS_ESTIMATED = _m(
    "prompt_tokens_estimated", "counter", "tokens", SERIES_LABELS,
    "ESTIMATE of prompt tokens from the log's 'Avg prompt throughput' x the interval between stats lines. "
    "vLLM >= 0.16 logs computed (uncached) tokens only.",
    "log stats lines",
)

# --- changes, restarts, warm-up, cost (diagnostics/changes, warmup, cost) ----------------
KIND = "kind"
MODEL_INFO = _m(
    "upstream_model", "info", "", (UPSTREAM, "model_id", "root", "max_model_len"),
    "A model served by the upstream, from /v1/models.",
    "/v1/models",
)
TOKENIZER_INFO = _m(
    "tokenizer", "info", "", (UPSTREAM, MODEL, "tokenizer_hash", "chat_template_hash"),
    "Fingerprints of the tokenizer and chat template configured for the model (see `cachemon fingerprint`).",
    "models[].tokenizer in the config",
)
CHANGES = _m(
    "upstream_changes", "counter", "", (UPSTREAM, KIND),
    "Changes detected on the upstream, by kind: model (served models), version (vLLM version), "
    "cache_config (block size, hash algorithm, prefix caching on/off), tokenizer, chat_template.",
    "/v1/models, /version, vllm:cache_config_info, tokenizer files",
)
LAST_CHANGE = _m(
    "upstream_last_change_timestamp_seconds", "gauge", "seconds", (UPSTREAM, KIND),
    "Unix time of the last detected change of that kind (for Grafana annotations).",
    "change detection",
)
CACHE_RESETS = _m(
    "prefix_cache_resets", "counter", "", (UPSTREAM,),
    "Prefix-cache resets detected without a restart (hits collapse while queries continue, "
    "e.g. after POST /reset_prefix_cache).",
    "change detection",
)
LAST_CACHE_RESET = _m(
    "prefix_cache_last_reset_timestamp_seconds", "gauge", "seconds", (UPSTREAM,),
    "Unix time of the last detected prefix-cache reset.",
    "change detection",
)
WARMUPS = _m(
    "warmups", "counter", "", (UPSTREAM, "trigger", "result"),
    "Cache warm-ups run by the daemon (trigger: restart, model_change; result: done, refused_load, failed).",
    "warmup_on in the config",
)
ESTIMATED_COST = _m(
    "estimated_cost", "counter", "", SERIES_LABELS + ("scenario",),
    "Estimated cost in the configured currency of the traffic so far, scenario=with_cache (what it cost) "
    "or without_cache (what it would have cost with no prefix cache). Needs `cost:` in the config.",
    "cost model x token counters",
)
COST_SAVING_FACTOR = _m(
    "cost_saving_factor", "gauge", "", SERIES_LABELS,
    "Estimated cost without cache / cost with cache over the traffic the cost counters cover (e.g. 3.2 = 3.2x "
    "cheaper). A convenience series: the shipped dashboards divide the estimated_cost counters instead.",
    "cost model",
)

ALL: tuple[MetricSpec, ...] = tuple(v for v in dict(globals()).values() if isinstance(v, MetricSpec))
_SPECS: dict[str, MetricSpec] = {s.name: s for s in ALL}

# Ratios cachemon computes itself. Convenience series only: the shipped rules, alerts and dashboards
# never query them (tests/test_monitoring_generate.py holds that); they divide the counters instead.
CONVENIENCE: tuple[MetricSpec, ...] = (HIT_RATIO, COST_SAVING_FACTOR)

# The state keeps a re-exported histogram as counters: one per bucket, keyed by the histogram's name
# with its labels plus ``le``, and its sum under this name (labels without ``le``). Not exported by
# itself (so not in ALL): the collector folds both back into the one histogram family.
PROMPT_LENGTH_SUM = MetricSpec(PROMPT_LENGTH_REQUESTS.name + "_sum", "counter", "tokens", SERIES_LABELS,
                               "Sum of the prompt lengths (internal part of the histogram).",
                               "vllm:request_prompt_tokens_sum")
_SPECS[PROMPT_LENGTH_SUM.name] = PROMPT_LENGTH_SUM


class SeriesKey(NamedTuple):
    """One exported series: a catalog metric and its label values in the spec's order,
    without the leading ``upstream`` label (the state adds it). Every layer keys series by it
    (sources' log rules, normalise, state, expose), so it lives with the specs it is bound to.

    A NamedTuple so it hashes at C speed on the polling path and compares equal to the
    plain ``(name, labels)`` pair older call sites build.
    """

    metric: str
    labels: tuple[str, ...]

    @classmethod
    def of(cls, spec: MetricSpec, labels: tuple[str, ...]) -> SeriesKey:
        if len(labels) != len(spec.labels) - 1:
            raise ValueError(f"{spec.name} takes {spec.labels[1:]}, got {labels!r}")
        return cls(spec.name, labels)

    @property
    def spec(self) -> MetricSpec:
        return _SPECS[self.metric]

    @property
    def ident(self) -> tuple[str, str]:
        """(model_name, engine): the unit the cardinality guard counts."""
        return self.labels[0], self.labels[1]


def by_name(name: str) -> MetricSpec:
    for spec in ALL:
        if spec.name == name or spec.sample_name == name:
            return spec
    raise KeyError(name)
