"""Upstream health and metadata, and the daemon's own series (scrapes, refusals, stages)."""
from __future__ import annotations

from cachemon.catalog.spec import SERIES_LABELS, UPSTREAM, _m

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
    "Polls that saw an upstream restart: a series fell to at most half its value, or fell while its *_created "
    "timestamp changed to a later one (that series is corrected; a later *_created on a counter that did not "
    "fall is no restart: rejected_samples reason created_moved), or process_start_time_seconds changed to a later one "
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
    (UPSTREAM, "kind", "engine", "era", "vllm_version", "prefix_caching", "block_size", "hash_algo", "counter_unit"),
    "What cachemon detected about the upstream: its engine (vllm, sglang, mindie, ...: the engine table), "
    "metric era, vLLM version (from /version, if served), "
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
    "else the full-attention block size, else block_size (hybrid Mamba models: 784-4096). A floor, not a "
    "promise: on a model with sliding-window layers a longer shared prefix hits only once the window before "
    "it is cached (cachemon_kv_sliding_window_tokens, from KV events; the page does not say it).",
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
    "step faster than 1e10 per second), other_process (a sample from a second process behind the same URL), "
    "created_moved (a later *_created on a counter that did not fall: no new life, so the _created is refused "
    "and the increase taken as the same life's), hits_above_queries (a page's hit counter above its own query "
    "counter: the hits refused for that poll), label_rewritten (a sample whose label values had non-printable "
    "characters, such as NUL or ESC, or were over 256 characters: each such character replaced by U+FFFD, a long "
    "value cut and ended with a digest of the whole; the sample kept).",
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
    "auth_throttled (429 without a bcrypt check: that address's wrong passwords over its budget), "
    "busy (503: too many /-/ready probes waiting), "
    "connection_limit (an idle connection closed to make room), slow_reader (a connection not reading its "
    "replies closed to make room or to free reply memory), request_timeout, handshake_timeout, "
    "write_timeout, handshake_failed, plain_http_on_tls, bad_request, headers_too_large, fd_limit.",
    "cachemon listener",
)
WEB_CONFIG_RELOADS = _m(
    "web_config_reloads", "counter", "", ("outcome",),
    "Re-reads of the web config file (on change or SIGHUP) by outcome: applied; refused (empty, an empty "
    "basic_auth_users, or basic auth gone while it was on, as a torn rewrite reads: the last good config "
    "stays in force); failed (does not load, or TLS turned on or off: /metrics answers 500 until fixed).",
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
