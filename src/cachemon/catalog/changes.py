"""Changes, restarts, warm-up and cost (runtime/change_detector, warmup, cost)."""
from __future__ import annotations

from cachemon.catalog.spec import MODEL, SERIES_LABELS, UPSTREAM, _m

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
