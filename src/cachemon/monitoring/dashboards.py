"""Grafana dashboards (JSON models, schemaVersion 39), provisioning-safe.

Panels and annotations query ``${datasource}`` (a datasource variable; no datasource
uid is baked in), so the same JSON imports through the UI, file provisioning and the
kube-prometheus sidecar. Range functions use ``$__rate_interval``; every ratio is
guarded with ``den > 0`` so idle periods show no value instead of 0 % or NaN.
Thresholds come from ``cachemon.thresholds``.
"""
from __future__ import annotations

from cachemon import catalog as c
from cachemon import thresholds as t
from cachemon.jsontypes import JsonObject, JsonValue, as_list, as_object
from cachemon.monitoring import palette, tenant_row
from cachemon.monitoring.grafana import (
    SCHEMA_VERSION,
    annotation,
    defaults,
    hide_all_zero,
    layout,
    neutral,
    no_traffic,
    no_value,
    panel,
    query_var,
    row,
    series_colours,
    stacked,
    table,
    target,
    tokens_per_second,
)
from cachemon.monitoring.queries import (
    CAUSES,
    CM,
    CMM,
    EXTERNAL,
    KVU,
    LOCAL,
    REPORTED,
    RESET_DONE,
    VLLM,
    WITH_CACHE,
    WITHOUT_CACHE,
    rate,
    ratio,
)
from cachemon.monitoring.router_row import router_row
from cachemon.monitoring.site import MonitoringConfig

VLLM_SERIES = "vllm:num_requests_running"
# Each row owns the panels up to the next one (collapsing it hides them): these follow the tenant row.
LATENCY_ROW = "Daily hits, latency, KV-cache pressure and cost"
# The rolling 24-hour total's resolution: Grafana's min interval (the step never falls below it), so a
# week's range does not ask Prometheus for a day of samples at every one of a thousand points.
DAILY_STEP = "1m"


def ratio_steps(cfg: MonitoringConfig) -> list[JsonValue]:
    limits = cfg.hit_ratio()
    return [{"color": "red", "value": None},
            {"color": "orange", "value": limits.critical},
            {"color": "green", "value": limits.warning}]


def why_row() -> list[JsonObject]:
    """The overview's "Why" row: which causes the attribution engine has active, over time."""
    active = panel(
        "state-timeline", "Why: active causes",
        "Causes cachemon's attribution engine holds, per upstream and model, over time: every cause that cost "
        "prompt tokens, whatever the ratio (cachemon_cause_active; the same engine as `cachemon check`). Each "
        "cause links to its runbook section. "
        "Restart, reset and change annotations mark the events.", "none",
        [target(f"max by ({c.UPSTREAM}, {c.MODEL}, {c.CAUSE}) ({c.CAUSE_ACTIVE.sample_name}{{{CAUSES}}})",
                "{{upstream}} / {{model_name}}: {{cause}}")], w=16, h=8,
        options_extra={"showValue": "never", "mergeValues": True, "rowHeight": 0.8})
    # each lane in its cause's colour (the same as in "Missed tokens by cause"): the mapping names the state only
    defaults(active)["mappings"] = [{"type": "value", "options": {"1": {"text": "active", "index": 0}}}]
    series_colours(active, palette.causes(), ": {}$")
    since = table("Active causes since",
                  "When each active cause became active (cachemon_cause_since_timestamp_seconds).",
                  f"max by ({c.UPSTREAM}, {c.MODEL}, {c.CAUSE}) ({c.CAUSE_SINCE.sample_name}{{{CAUSES}}}) * 1000",
                  w=8, h=8)
    defaults(since)["unit"] = "dateTimeFromNow"
    since["transformations"] = [{"id": "organize", "options": {"excludeByName": {"Time": True}}}]
    return [row("Why"), active, since]


def _quantiles(spec: c.MetricSpec, matchers: str) -> list[JsonObject]:
    return [target(f"histogram_quantile({q}, sum by ({c.UPSTREAM}, le) ({rate(spec, matchers)}))",
                   f"p{int(q * 100)} {{{{upstream}}}}") for q in (0.5, 0.9)]


def kv_row() -> list[JsonObject]:
    """What vLLM's KV-cache events tell (docs/kv-events.md): why each recomputed token was not cached,
    where prompts diverge, how long blocks live, and whether the event stream can be trusted."""
    return [
        row("Where the misses go (KV-cache events)"),
        hide_all_zero(series_colours(stacked(tokens_per_second(panel(
            "timeseries", "Where the misses go",
            "Tokens vLLM computed and stored per second, by why they were not cached already, from its KV-cache "
            "events (cachemon_kv_stored_tokens_total): first (never cached: new content, and generated tokens), "
            "capacity (evicted here earlier: the pool is too small), reset, restart, routing (cached on another "
            "replica), recompute_last_block and cache_opt_out (not misses: still cached), sliding_window (held by "
            "the full-attention layers, "
            "recomputed for want of the sliding window before the hit: a legitimate miss of hybrid models). "
            "Exact while the ledger is in sync. Reasons at 0 over the whole range are not drawn. Needs KV events "
            "(upstreams[].kv_events; `make demo` replays real ones).", "short",
            [target(f"sum by ({c.REASON}) ({rate(c.KV_STORED_TOKENS, CAUSES)})", "{{reason}}")], w=12))),
            palette.reasons())),
        series_colours(stacked(tokens_per_second(panel(
            "timeseries", "Missed tokens by cause",
            "Prompt tokens each cause cost per second (cachemon_cause_missed_tokens_total), whatever the hit "
            "ratio: certainty exact (KV events), measured (KV events after a loss: a lower bound) or estimated "
            "(from the counters; the runbook says how per cause). Exact causes need KV events.", "short",
            [target(f"sum by ({c.CAUSE}, {c.CERTAINTY}) ({rate(c.CAUSE_MISSED_TOKENS, CAUSES)})",
                    "{{cause}} ({{certainty}})")], w=12))), palette.causes(), r"^{} \("),
        panel("timeseries", "Divergence depth",
              "Where stored prompts stop matching the cache, in blocks from the start (median and 90th percentile "
              "of cachemon_kv_divergence_depth_blocks). A dynamic prefix pins it at the depth of the per-request "
              "value (x block size = token position); 0 means the very first block differs. Needs KV events.",
              "none",
              _quantiles(c.KV_DIVERGENCE_DEPTH, CAUSES), w=6, axis="blocks", min_=0),
        panel("timeseries", "KV block lifetime",
              "How long blocks stayed cached before vLLM evicted them (median and 90th percentile of "
              "cachemon_kv_block_lifetime_seconds). Seconds under load: the pool is too small to keep prefixes "
              "until they are reused. Needs KV events, and evictions (BlockRemoved): empty while the pool "
              "never fills.", "s", _quantiles(c.KV_BLOCK_LIFETIME, CAUSES), w=6, min_=0),
        panel("timeseries", "KV event stream up and ledger in sync",
              "1 while cachemon receives the upstream's KV-event stream (cachemon_kv_stream_up) and while its "
              "ledger has seen every event since the last known-empty cache (cachemon_kv_ledger_in_sync; 0 after "
              "lost batches until the next reset or restart: the split is then a lower bound).", "none",
              [target(f"min by ({c.UPSTREAM}) ({c.KV_STREAM_UP.sample_name}{{{KVU}}})", "stream up {{upstream}}"),
               target(f"min by ({c.UPSTREAM}) ({c.KV_LEDGER_IN_SYNC.sample_name}{{{KVU}}})",
                      "in sync {{upstream}}")], w=6,
              steps=[{"color": "red", "value": None}, {"color": "green", "value": 1}], min_=0, max_=1),
        panel("timeseries", "KV events and lost batches per second",
              "KV-cache events received per second by type (stored, removed, cleared, unknown), and event batches "
              "lost per second by reason (gap, decode_error, oversized, duplicate, seq_jump, handler). Any loss "
              "puts the ledger out of sync.",
              "short", [target(f"sum by ({c.UPSTREAM}, type) ({rate(c.KV_EVENTS, KVU)})", "{{type}} {{upstream}}"),
                        target(f"sum by ({c.UPSTREAM}, {c.REASON}) ({rate(c.KV_LOST_BATCHES, KVU)})",
                               "lost: {{reason}} {{upstream}}")], w=6, axis="per second"),
    ]


def tenant_panels(cfg: MonitoringConfig) -> list[JsonObject]:
    """The row of monitoring/tenant_row.py, built with this module's helpers."""
    out = [row(tenant_row.TITLE)]
    for s in tenant_row.panels(CAUSES):
        targets = [target(e, legend) for e, legend in s.targets]
        if s.ratio:
            p = panel("timeseries", s.title, s.description, "percentunit", targets, w=s.w,
                      steps=ratio_steps(cfg), min_=0, max_=1)
        else:
            p = stacked(tokens_per_second(panel("timeseries", s.title, s.description, "short", targets, w=s.w)))
        out.append(no_value(p, tenant_row.NO_TENANTS))
    return out


def exported_panels(cfg: MonitoringConfig) -> list[JsonObject]:
    """What cachemon exports that the other panels do not show."""
    return [
        row("Caches, prompts and what vLLM reports"),
        no_traffic(panel(
            "timeseries", "External (KV-connector) cache hit ratio",
            "Hit tokens / query tokens of the external cache behind a KV connector (LMCache, ...), cache=\"external\" "
            "(vLLM >= 0.11.1). Apart from the local prefix cache. Empty without a KV connector.", "percentunit",
            [target(f"sum by ({c.UPSTREAM}) ({rate(c.HIT_TOKENS, EXTERNAL)})\n/ (sum by ({c.UPSTREAM}) "
                    f"({rate(c.QUERY_TOKENS, EXTERNAL)}) > 0)", "{{upstream}}")], w=8, min_=0, max_=1)),
        series_colours(tokens_per_second(panel(
            "timeseries", "Prompt tokens by source",
            "Prompt tokens per second by where their KV came from: computed locally, local cache hit, external "
            "KV transfer (vllm:prompt_tokens_by_source, vLLM >= 0.16).", "short",
            [target(f"sum by (source) ({rate(c.PROMPT_TOKENS_BY_SOURCE, CMM)})", "{{source}}")], w=8)),
            palette.SOURCE_COLOURS),
        series_colours(tokens_per_second(panel(
            "timeseries", "Cached prompt tokens per second",
            "Prompt tokens served from any cache, local or external (vllm:prompt_tokens_cached, vLLM >= 0.16), "
            "beside the local prefix cache's hit tokens.", "short",
            [target(f"sum ({rate(c.PROMPT_CACHED_TOKENS, CMM)})", "cached (any cache)"),
             target(f"sum ({rate(c.HIT_TOKENS, LOCAL)})", "local prefix-cache hits")], w=8)),
            {"cached (any cache)": "blue", "local prefix-cache hits": palette.HIT}),
        neutral(panel(
            "stat", "KV block size",
            "KV-cache block size in tokens per upstream: only full blocks are cached, so prompts or shared "
            "prefixes shorter than this never hit.", "none",
            [target(f"max by ({c.UPSTREAM}) ({c.BLOCK_SIZE.sample_name}{{{CMM}}})", "{{upstream}}: tokens per block")],
            w=8, h=6)),
        no_traffic(panel(
            "timeseries", "Hit ratio as vLLM reports it (V0, logs)",
            "The ratio vLLM itself reports where it gives no token counters: V0's block ratio since engine start "
            "(basis since_start_blocks) and the log line's recent-request window (recent_requests). On V0 this is "
            "the ratio the hit-ratio alert reads. Not filtered by model: a log line names no model. Empty on a V1 "
            "/metrics upstream without a log source.", "percentunit",
            [target(f"max by ({c.UPSTREAM}, {c.MODEL}, basis) ({c.REPORTED_HIT_RATIO.sample_name}{{{REPORTED}}})",
                    "{{upstream}} / {{model_name}} ({{basis}})")], w=8, steps=ratio_steps(cfg), min_=0, max_=1)),
        neutral(panel(
            "stat", "KV pool size",
            "Size of the KV-cache pool in tokens (blocks x block size): a working set larger than this is evicted "
            "before reuse (cause capacity_eviction).", "short",
            [target(f"sum by ({c.UPSTREAM}) ({c.KV_CACHE_CAPACITY.sample_name}{{{CMM}}})", "{{upstream}}: tokens")],
            w=8, h=6)),
    ]


def variables() -> list[JsonValue]:
    # Labels as dashboard-linter wants them: "Data source", and Title-case of the name.
    return [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
         "current": {}, "options": [], "refresh": 1, "hide": 0, "regex": ""},
        # cachemon's own series, not up: on a shared Prometheus `up` lists every target of the cluster
        query_var("job", "Job", f"label_values({c.UPSTREAM_UP.sample_name}, job)"),
        query_var("instance", "Instance", f'label_values({c.UPSTREAM_UP.sample_name}{{job=~"$job"}}, instance)'),
        query_var(c.UPSTREAM, "Upstream", f'label_values({c.UPSTREAM_UP.sample_name}{{{CM}}}, {c.UPSTREAM})'),
        query_var("model_name", "Model", f'label_values({c.QUERY_TOKENS.sample_name}{{{CM}}}, {c.MODEL})'),
        # V0 and log sources have no engine index (""): All must match the empty value too.
        query_var(c.ENGINE, "Engine", f'label_values({c.QUERY_TOKENS.sample_name}{{{CM}}}, {c.ENGINE})', ".*"),
        # vLLM's own scrape job (its TTFT and prefill histograms), by a series every vLLM exports
        query_var("vllm_job", "vLLM job", f"label_values({VLLM_SERIES}, job)"),
        query_var("vllm_instance", "vLLM instance", f'label_values({VLLM_SERIES}{{job=~"$vllm_job"}}, instance)'),
    ]


def event_annotations() -> list[JsonValue]:
    # increase() over the counters, not the *_timestamp gauges: one marker per event,
    # and the counters survive cachemon restarts of their own.
    return [
        annotation("Upstream restarts", f"sum by (instance, {c.UPSTREAM}) ({rate(c.RESTARTS, CM, 'increase')}) > 0",
                   "vLLM restart", "{{instance}} / {{upstream}}", "red", "upstream"),
        annotation("Model / version / config changes",
                   f"sum by (instance, {c.UPSTREAM}, {c.KIND}) ({rate(c.CHANGES, CM, 'increase')}) > 0",
                   "{{kind}} change", "{{instance}} / {{upstream}}", "orange", "upstream,kind"),
        annotation("Prefix-cache resets", f"sum by (instance, {c.UPSTREAM}) ({rate(c.CACHE_RESETS, CM, 'increase')}) > 0",
                   "prefix-cache reset (heuristic)", "{{instance}} / {{upstream}}", "purple", "upstream"),
        annotation("Prefix-cache resets logged by vLLM",
                   f"sum by (instance, {c.UPSTREAM}) ({rate(c.LOG_CACHE_RESETS, RESET_DONE, 'increase')}) > 0",
                   "prefix-cache reset (vLLM log)", "{{instance}} / {{upstream}}", "purple", "upstream"),
    ]


def dashboard(cfg: MonitoringConfig, slug: str, title: str, description: str, panels: list[JsonObject]) -> JsonObject:
    return {
        "id": None,
        "uid": f"{cfg.dashboard_uid_prefix}-{slug}",
        "title": cfg.dashboard_title_prefix + title,
        "description": description,
        "tags": list(cfg.dashboard_tags),
        "timezone": "browser",
        "editable": False,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "time": {"from": "now-6h", "to": "now"},
        "timepicker": {},
        "templating": {"list": variables()},
        "annotations": {"list": event_annotations()},   # restart / change / reset marks on every dashboard
        "links": [{"type": "dashboards", "tags": ["cachemon"], "asDropdown": True, "title": "cachemon",
                   "includeVars": True, "keepTime": True}],
        "panels": layout(panels),
    }


def _histogram_p95(metric: str) -> str:
    return f"histogram_quantile(0.95, sum by (le) ({rate(metric, VLLM)}))"


def overview(cfg: MonitoringConfig) -> JsonObject:
    panels = [
        no_traffic(panel("stat", "Prefix-cache hit ratio",
              f"Hit tokens / query tokens of vLLM's local prefix cache over the selection. Warning below "
              f"{cfg.hit_ratio().warning:.0%}, critical below {cfg.hit_ratio().critical:.0%} (alerts after {cfg.alert_for()}). "
              "Shows \"No traffic\" while idle. Ratio-only eras (V0): the ratio vLLM reports.", "percentunit",
              [target(f"(\n{ratio()}\n)\nor\nmin ({c.REPORTED_HIT_RATIO.sample_name}{{{LOCAL}}})", "hit ratio")],
              w=6, h=6, steps=ratio_steps(cfg), min_=0, max_=1)),
        tokens_per_second(panel("stat", "Query tokens per second",
              "Prompt tokens looked up in the prefix cache per second: the traffic the ratio is computed on. "
              f"Hit-ratio alerts stay silent below {t.TRAFFIC_FLOOR_TOKENS_PER_SECOND:g} token/s.",
              "short", [target(f"sum ({rate(c.QUERY_TOKENS, LOCAL)})", "query tokens/s")], w=6, h=6)),
        neutral(panel("stat", "Estimated cost-saving factor",
              "Estimated cost without the prefix cache / cost with it, over the recent traffic (3 = three times "
              "cheaper), from the estimated_cost counters. Only when the cost model (`cost:` in the cachemon "
              "config) is configured. A high hit ratio with a low factor means the cost is dominated by decode, "
              "not prefill.",
              "short", [target(f"sum ({rate(c.ESTIMATED_COST, WITHOUT_CACHE)})\n"
                               f"/ (sum ({rate(c.ESTIMATED_COST, WITH_CACHE)}) > 0)", "times cheaper")], w=6, h=6)),
        neutral(panel("stat", "Hit tokens per day",
              "Prompt tokens served from the prefix cache at the current rate, extrapolated to a day: "
              "the effective hits, i.e. prefill work not recomputed.",
              "short", [target(f"sum ({rate(c.HIT_TOKENS, LOCAL)}) * 86400", "hit tokens/day")], w=6, h=6)),
        panel("timeseries", "Hit ratio per instance",
              "Prefix-cache hit ratio per cachemon instance and upstream. The lines mark the warning and "
              "critical thresholds.",
              "percentunit", [target(ratio(f"instance, {c.UPSTREAM}"), "{{instance}} / {{upstream}}")],
              steps=ratio_steps(cfg), min_=0, max_=1),
        series_colours(tokens_per_second(panel("timeseries", "Hit vs miss tokens per second",
              "Prompt tokens per second found in the prefix cache (hit) and recomputed (miss).",
              "short", [target(f"sum ({rate(c.HIT_TOKENS, LOCAL)})", "hit"),
                        target(f"sum ({rate(c.MISS_TOKENS, LOCAL)})", "miss")], axis="tokens/s")),
              {"hit": palette.HIT, "miss": palette.MISS}),
        series_colours(panel("timeseries", "Hit tokens over the last 24 hours",
              "Prompt tokens served from the prefix cache in the 24 hours before each point (a rolling daily "
              "total; since the first scrape while the data is younger than a day): the effective hits.",
              "short", [target(f"sum (increase({c.HIT_TOKENS.sample_name}{{{LOCAL}}}[1d]))", "hit tokens, 24 h")],
              w=8, interval=DAILY_STEP, axis="tokens"), {"hit tokens, 24 h": palette.HIT}),
        panel("timeseries", "Time to first token p95",
              "95th percentile of vLLM's time to first token (vllm:time_to_first_token_seconds, read from the vLLM "
              "scrape job). Falls when more of the prompt is served from the cache.",
              "s", [target(_histogram_p95("vllm:time_to_first_token_seconds_bucket"), "TTFT p95")], w=8),
        panel("timeseries", "Prefill time p95",
              "95th percentile of vLLM's request prefill time (vllm:request_prefill_time_seconds, vLLM scrape job).",
              "s", [target(_histogram_p95("vllm:request_prefill_time_seconds_bucket"), "prefill p95")], w=8),
        panel("timeseries", "KV-cache usage",
              f"Fraction of KV-cache blocks in use per engine. Above {t.KV_CACHE_USAGE_HIGH:.0%} cached prefixes "
              "are evicted before they can be reused.",
              "percentunit", [target(f"max by (instance, {c.UPSTREAM}, {c.ENGINE}) ({c.KV_CACHE_USAGE.sample_name}{{{CMM}}})",
                                     "{{instance}} / {{upstream}} / engine {{engine}}")],
              w=8, steps=[{"color": "green", "value": None}, {"color": "red", "value": t.KV_CACHE_USAGE_HIGH}],
              min_=0, max_=1),
        panel("timeseries", "Preemptions per second",
              "Requests preempted by vLLM's scheduler for lack of KV-cache space. Alert above "
              f"{t.PREEMPTIONS_PER_SECOND_HIGH:g}/s.",
              "short", [target(f"sum by (instance, {c.UPSTREAM}) ({rate(c.PREEMPTIONS, CMM)})",
                               "{{instance}} / {{upstream}}")],
              w=8, axis="preemptions/s",
              steps=[{"color": "green", "value": None}, {"color": "red", "value": t.PREEMPTIONS_PER_SECOND_HIGH}]),
        series_colours(neutral(panel("timeseries", "Estimated cost per second, with and without cache",
              "Estimated cost per second of the traffic in the configured currency, as served (with_cache) and "
              "as it would have been with no prefix cache (without_cache). Needs `cost:` in the cachemon config.",
              f"currency{cfg.currency}", [target(f"sum by (scenario) ({rate(c.ESTIMATED_COST, CMM)})", "{{scenario}}")],
              w=8)), palette.SCENARIO_COLOURS),
    ]
    # the headline stats, the ratio over time, then what explains it: where the misses go (KV events)
    # and the causes named; latency and pressure after; what is exported but not shown above, last
    panels = (panels[:6] + kv_row() + why_row() + tenant_panels(cfg) + [row(LATENCY_ROW)] + panels[6:]
              + exported_panels(cfg))
    return dashboard(cfg, "overview", "Prefix cache overview",
                     "vLLM prefix-cache hit ratio, traffic, latency and KV-cache pressure, with vLLM restarts, "
                     "model/config changes and cache resets as annotations.", panels)


def fleet(cfg: MonitoringConfig) -> JsonObject:
    replica = f"instance, {c.UPSTREAM}, {c.MODEL}"
    skew = (f"(\n{ratio(f'job, {replica}')}\n)\n- on (job, {c.MODEL}) group_left()\n(\n{ratio(f'job, {c.MODEL}')}\n)")
    panels = [
        panel("timeseries", "Hit ratio per replica",
              "Prefix-cache hit ratio of every replica (cachemon instance and upstream) and model.",
              "percentunit", [target(ratio(replica), "{{instance}} / {{upstream}} / {{model_name}}")],
              steps=ratio_steps(cfg), min_=0, max_=1),
        panel("timeseries", "Replica skew vs model fleet",
              "Replica hit ratio minus the hit ratio of its model across the fleet. Far below zero (alert at "
              f"-{t.SKEW_DROP:g} for {t.SKEW_FOR}) means requests sharing a prefix land on replicas that do not "
              "have it cached: use prefix-affinity routing or a shared KV cache.",
              "percentunit", [target(skew, "{{instance}} / {{upstream}} / {{model_name}}")],
              steps=[{"color": "red", "value": None}, {"color": "green", "value": -t.SKEW_DROP}]),
        panel("timeseries", "Fleet hit ratio per model",
              "Prefix-cache hit ratio of each model over all selected replicas.",
              "percentunit", [target(ratio(c.MODEL), "{{model_name}}")], steps=ratio_steps(cfg), min_=0, max_=1),
        panel("timeseries", "Hit ratio per engine",
              "Prefix-cache hit ratio per vLLM data-parallel engine. Engines do not share their caches.",
              "percentunit", [target(ratio(f"instance, {c.UPSTREAM}, {c.ENGINE}"),
                                     "{{instance}} / {{upstream}} / engine {{engine}}")],
              steps=ratio_steps(cfg), min_=0, max_=1),
        panel("timeseries", "Traffic share per replica",
              "Share of the selection's query tokens each replica receives. Uneven shares with uneven ratios "
              "point at routing.",
              "percentunit",
              [target(f"sum by ({replica}) ({rate(c.QUERY_TOKENS, LOCAL)})\n/ on ({c.MODEL}) group_left()\n"
                      f"(sum by ({c.MODEL}) ({rate(c.QUERY_TOKENS, LOCAL)}) > 0)",
                      "{{instance}} / {{upstream}} / {{model_name}}")], min_=0, max_=1),
        *router_row(),
    ]
    return dashboard(cfg, "fleet", "Fleet and replicas",
                     "Per-replica and per-engine prefix-cache hit ratio, skew against the model's fleet ratio and "
                     "traffic share; the router's decisions beside the engines' hits.", panels)


def exporter(cfg: MonitoringConfig) -> JsonObject:
    up_steps: list[JsonValue] = [{"color": "red", "value": None}, {"color": "green", "value": 1}]
    per_up = f"instance, {c.UPSTREAM}"
    handler_lost = f'{CM}, {c.REASON}="handler"'
    panels = [
        panel("timeseries", "cachemon targets up",
              "Prometheus' up for cachemon's targets: 1 when the exporter answered the last scrape. Only the jobs "
              "of targets that exported cachemon_build_info within the range (the job variable's All selects "
              "every job of a shared Prometheus; the join keeps cachemon's, a target down included).",
              "none", [target(f"up{{{CM}}}\nand on (job) group by (job) "
                              f"(last_over_time({c.BUILD_INFO.sample_name}{{{CM}}}[$__range]))", "{{instance}}")],
              w=8, steps=up_steps, min_=0, max_=1),
        panel("timeseries", "Upstreams up",
              "1 when cachemon's last poll of the vLLM /metrics page succeeded.",
              "none", [target(f"{c.UPSTREAM_UP.sample_name}{{{CM}}}", "{{instance}} / {{upstream}}")],
              w=8, steps=up_steps, min_=0, max_=1),
        panel("timeseries", "Upstream polls and errors per second",
              "cachemon's polls of each upstream per second, and failed polls by reason.",
              "short", [target(f"sum by ({per_up}) ({rate(c.SCRAPES, CM)})", "polls {{instance}} / {{upstream}}"),
                        target(f"sum by ({per_up}, reason) ({rate(c.SCRAPE_ERRORS, CM)})",
                               "errors {{instance}} / {{upstream}}: {{reason}}")], w=8, axis="polls/s"),
        panel("timeseries", "Upstream poll duration",
              "Duration of the last poll (fetch, parse, normalise) of each upstream.",
              "s", [target(f"{c.SCRAPE_DURATION.sample_name}{{{CM}}}", "{{instance}} / {{upstream}}")], w=8),
        panel("timeseries", "Restarts, changes and cache resets",
              "Events cachemon detected on its upstreams: vLLM restarts (counters went down), model / version / "
              "tokenizer / chat-template / cache-config changes, and prefix-cache resets.",
              "short", [target(f"sum by ({per_up}) ({rate(c.RESTARTS, CM, 'increase')})", "restart {{instance}} / {{upstream}}"),
                        target(f"sum by ({per_up}, {c.KIND}) ({rate(c.CHANGES, CM, 'increase')})",
                               "{{kind}} change {{instance}} / {{upstream}}"),
                        target(f"sum by ({per_up}) ({rate(c.CACHE_RESETS, CM, 'increase')})",
                               "cache reset {{instance}} / {{upstream}}")], w=8, draw="bars", axis="events"),
        panel("timeseries", "Series dropped by the cardinality guard",
              "Label sets per second cachemon dropped because an upstream exceeded max_series_per_upstream.",
              "short", [target(f"sum by ({per_up}) ({rate(c.SERIES_OVERFLOW, CM)})", "{{instance}} / {{upstream}}")],
              w=8, axis="series/s"),
        table("Detected vLLM era and version",
              "What cachemon detected per upstream: metrics era, vLLM version (from /version) and the unit vLLM "
              "counts prefix-cache queries in.",
              f"max by ({per_up}, {c.KIND}, era, vllm_version, counter_unit) ({c.UPSTREAM_INFO.sample_name}{{{CM}}})"),
        table("Cache config",
              "vLLM's cache configuration per upstream (vllm:cache_config_info): prefix caching on/off, KV block "
              "size (only whole blocks can hit) and prefix hash algorithm.",
              f"max by ({per_up}, prefix_caching, block_size, hash_algo) ({c.UPSTREAM_INFO.sample_name}{{{CM}}})"),
        panel("timeseries", "Prefix caching enabled per engine",
              "1 when vLLM reports prefix caching enabled on the engine, 0 when it is disabled.",
              "none", [target(f"{c.PREFIX_CACHING_ENABLED.sample_name}{{{CM}}}",
                              "{{instance}} / {{upstream}} / engine {{engine}}")], w=12, steps=up_steps, min_=0, max_=1),
        table("Last poll error",
              "The reason of the last poll error per upstream (the error's text is in cachemon's log and in "
              "`cachemon check`); empty while every upstream is up.",
              f"max by ({per_up}, reason) ({c.LAST_ERROR.sample_name}{{{CM}}})"),
        panel("timeseries", "Log lines per second by outcome",
              "Lines read from the vLLM log files: parsed stats / rule lines, unmatched, malformed (looked like a "
              "stats line but did not parse) and too long. Needs a log source (log_paths).",
              "short", [target(f"sum by ({per_up}, outcome) ({rate(c.LOG_LINES, CM)})",
                               "{{instance}} / {{upstream}}: {{outcome}}")], w=8, axis="lines/s"),
        panel("timeseries", "Age of the last stats line",
              f"Seconds since the last parsed vLLM stats line per log file. vLLM logs none while idle; above "
              f"{t.LOG_STATS_STALE_SECONDS}s while the server has traffic the log source has stalled. Needs a log "
              "source (log_paths).",
              "s", [target(f"time() - max by ({per_up}, {c.FILE}) ({c.LOG_STATS_AGE.sample_name}{{{CM}}})",
                           "{{instance}} / {{upstream}}: {{file}}")],
              w=8, steps=[{"color": "green", "value": None}, {"color": "red", "value": t.LOG_STATS_STALE_SECONDS}]),
        panel("timeseries", "Log files open, rotations and truncations",
              "Log files cachemon has open, and rotations / truncations (copytruncate) it followed. Needs a log "
              "source (log_paths).",
              "short", [target(f"sum by ({per_up}) ({c.LOG_FILES_OPEN.sample_name}{{{CM}}})", "open {{instance}} / {{upstream}}"),
                        target(f"sum by ({per_up}) ({rate(c.LOG_ROTATIONS, CM, 'increase')})",
                               "rotations {{instance}} / {{upstream}}"),
                        target(f"sum by ({per_up}) ({rate(c.LOG_TRUNCATIONS, CM, 'increase')})",
                               "truncations {{instance}} / {{upstream}}")], w=8),
        series_colours(panel(
            "timeseries", "KV event stream: disconnects and errors",
            "Connections to vLLM's KV-event publisher that broke (ZMQ reconnects; the replay socket fills the "
            "gap), connections ZMQ gave up on a protocol error (a frame over 4x kv_events.max_frame_bytes, or no "
            "ZMTP peer at the endpoint: a new socket), and batches whose handling raised (a cachemon bug: the "
            "batch is lost). Batches lost for any reason are on the overview's KV panels. Needs KV events.",
            "short", [target(f"sum by ({per_up}) ({rate(c.KV_STREAM_DISCONNECTS, CM, 'increase')})",
                             "disconnects {{instance}} / {{upstream}}"),
                      target(f"sum by ({per_up}) ({rate(c.KV_STREAM_PROTOCOL_ERRORS, CM, 'increase')})",
                             "protocol errors {{instance}} / {{upstream}}"),
                      target(f"sum by ({per_up}) ({rate(c.KV_LOST_BATCHES, handler_lost, 'increase')})",
                             "handler errors {{instance}} / {{upstream}}")], w=12, draw="bars", axis="events"),
            palette.STREAM_COLOURS, r"^{} "),
        panel("timeseries", "Age of the last KV-event message",
              "Seconds since cachemon received the last message of each upstream's KV-event stream "
              "(cachemon_kv_stream_last_message_timestamp_seconds). vLLM publishes nothing while its cache does "
              "not change, so an age that grows while the upstream serves requests is a stalled stream, one that "
              "grows while it is idle is not. Needs KV events.",
              "s", [target(f"time() - max by ({per_up}) ({c.KV_STREAM_LAST_MESSAGE.sample_name}{{{CM}}})",
                           "{{instance}} / {{upstream}}")], w=12, min_=0),
    ]
    return dashboard(cfg, "exporter", "Exporter health and diagnostics",
                     "Is cachemon scraping its upstreams and reading its logs, and what did it detect about vLLM.",
                     panels)


def dashboards(cfg: MonitoringConfig) -> dict[str, JsonObject]:
    """file name -> dashboard JSON model."""
    return {f"cachemon-{str(d['uid']).removeprefix(cfg.dashboard_uid_prefix + '-')}.json": d
            for d in (overview(cfg), fleet(cfg), exporter(cfg))}


# dashboard-linter (grafana/dashboard-linter) reads a `.lint` file beside the dashboards: rules it skips,
# each entry an exact (dashboard title, panel title). Its target-job/instance rules want $job and $instance
# in every selector; vLLM's histograms are another scrape job's, selected by $vllm_job / $vllm_instance.
VLLM_LINT_REASON = ("vLLM's own histograms come from vLLM's scrape job, not cachemon's: they are selected by "
                    "$vllm_job and $vllm_instance (variables over vLLM's series), not by $job and $instance.")


def lint_exclusions(cfg: MonitoringConfig) -> JsonObject:
    """The `.lint` file of dashboards/: the panels that select vLLM's scrape job, excluded by name."""
    entries = [{"dashboard": d["title"], "panel": p["title"]}
               for d in dashboards(cfg).values() for p in map(as_object, as_list(d["panels"]))
               if any("$vllm_job" in str(as_object(t)["expr"]) for t in as_list(p.get("targets", [])))]
    return {"exclusions": {rule: {"reason": VLLM_LINT_REASON, "entries": [dict(e) for e in entries]}
                           for rule in ("target-job-rule", "target-instance-rule")}}

