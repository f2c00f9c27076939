"""docs/runbook.md: one section per alert, the threshold table, the causes.

Numbers and names are substituted from ``cachemon.thresholds``, the catalog and the rules
(``$name`` placeholders, string.Template), so the runbook says what the alerts do.
Section headings are the alert names: ``runbook_url`` anchors are their lower-case form.
"""
from __future__ import annotations

from string import Template

from cachemon import catalog as c
from cachemon import thresholds as t
from cachemon.monitoring import prometheus_rules
from cachemon.monitoring.runbook_causes import attribution_sections
from cachemon.monitoring.site import MonitoringConfig


def model_overrides(cfg: MonitoringConfig) -> str:
    if not cfg.model_hit_ratio:
        return "No model has its own thresholds in this bundle"
    return "Models with their own thresholds: " + "; ".join(
        f"`{m}` {prometheus_rules.pct(cfg.hit_ratio(m).warning)} / {prometheus_rules.pct(cfg.hit_ratio(m).critical)}"
        for m in sorted(cfg.model_hit_ratio))


def context(cfg: MonitoringConfig) -> dict[str, str]:
    limits = cfg.hit_ratio()
    return {
        "warn": prometheus_rules.pct(limits.warning), "crit": prometheus_rules.pct(limits.critical), "for": cfg.alert_for(),
        "overrides": model_overrides(cfg), "kept": ", ".join(cfg.target_labels),
        "absent_for": t.ABSENT_FOR, "absent_lookback": t.ABSENT_LOOKBACK,
        "floor": f"{t.TRAFFIC_FLOOR_TOKENS_PER_SECOND:g}", "w": t.ALERT_RATIO_WINDOW,
        "down_for": t.DOWN_FOR, "disabled_for": t.CACHING_DISABLED_FOR,
        "change_drop": f"{t.CHANGE_DROP * 100:g}", "lookback": t.CHANGE_LOOKBACK, "recovery_for": t.RECOVERY_FOR,
        "skew": f"{t.SKEW_DROP * 100:g}", "skew_for": t.SKEW_FOR,
        "kv_high": prometheus_rules.pct(t.KV_CACHE_USAGE_HIGH), "kv_for": t.KV_CACHE_FOR,
        "preempt": f"{t.PREEMPTIONS_PER_SECOND_HIGH:g}", "preempt_for": t.PREEMPTIONS_FOR,
        "log_age": str(t.LOG_STATS_STALE_SECONDS), "log_for": t.LOG_STALLED_FOR,
        "overflow_for": t.OVERFLOW_FOR, "overflow_lookback": t.OVERFLOW_LOOKBACK,
        "overflow": c.SERIES_OVERFLOW.sample_name, "rejected": c.REJECTED_SAMPLES.sample_name,
        "ratio": prometheus_rules.RATIO, "queries": prometheus_rules.QUERIES, "fleet_ratio": prometheus_rules.FLEET_RATIO,
        "sel": cfg.cachemon_selector,
        "hit": c.HIT_TOKENS.sample_name, "query": c.QUERY_TOKENS.sample_name,
        "up": c.UPSTREAM_UP.sample_name, "last_error": c.LAST_ERROR.sample_name, "info": c.UPSTREAM_INFO.sample_name,
        "enabled": c.PREFIX_CACHING_ENABLED.sample_name, "block": c.BLOCK_SIZE.sample_name,
        "changes": c.CHANGES.sample_name, "restarts": c.RESTARTS.sample_name, "resets": c.CACHE_RESETS.sample_name,
        "kv": c.KV_CACHE_USAGE.sample_name, "preemptions": c.PREEMPTIONS.sample_name,
        "log_age_metric": c.LOG_STATS_AGE.sample_name, "log_lines": c.LOG_LINES.sample_name,
        "saving": c.COST_SAVING_FACTOR.sample_name, "tokenizer": c.TOKENIZER_INFO.sample_name,
        "stored": c.KV_STORED_TOKENS.sample_name, "capacity_share": prometheus_rules.pct(t.CAPACITY_SHARE_HIGH),
        "capacity_for": t.CAPACITY_SHARE_FOR, "dynamic_for": t.DYNAMIC_PREFIX_FOR,
        "router_blind_for": t.ROUTER_BLIND_FOR,
        "tenant_low": prometheus_rules.pct(t.TENANT_HIT_RATIO_LOW), "tenant_for": t.TENANT_FOR,
        "tenant_ratio": prometheus_rules.TENANT_RATIO, "tenant_rest": prometheus_rules.TENANT_REST_RATIO,
        "tenant_stored": c.KV_TENANT_STORED_TOKENS.sample_name, "overflow_tenants": c.KV_TENANT_LABEL_OVERFLOW.sample_name,
    }


CAUSES = """\
## Causes of a low hit ratio

vLLM caches whole KV blocks keyed by the hash of *everything before them*. A prompt hits
only up to its first differing token, rounded down to a block. The causes seen in practice:

- **Dynamic content at the head of the prompt.** A timestamp, request id, user name or
  shuffled tool list before the static system prompt makes every prompt differ from its
  first block: 0 hits. In the bundled vLLM 0.32.0 captures the same ~800-token system
  prompt gives 768 of 831 tokens cached per request, and 0 once `Current time: …` or
  `[Request ID: …]` is put in front of it. Fix: static content first, dynamic content last.
- **Chat template or tokenizer change.** The same messages render to different tokens,
  so nothing cached before the change matches. Shows as a `tokenizer` or `chat_template`
  change in `$changes`; the ratio recovers as the new prefixes fill the cache.
- **Model upgrade or vLLM version change.** A new model (or new weights) starts with an
  empty cache; a new vLLM version may change the block hash or the block size.
- **Restart or cache reset.** The cache is empty afterwards (cold start). It warms up with
  traffic; `cachemon warmup` can replay the common prefixes ahead of users.
- **Cache too small.** Blocks are evicted before they are reused: KV-cache usage near
  $kv_high, preemptions, a ratio that falls as load grows. Give vLLM more KV memory
  (`--gpu-memory-utilization`, smaller `--max-model-len`, fewer concurrent sequences,
  a KV offload connector) or fewer models per GPU.
- **Replicas without a shared cache or affinity routing.** Each replica and each
  data-parallel engine has its own cache; round-robin spreads one prefix over all of them,
  so each sees it 1/N as often. Route by prefix (session or prefix-hash affinity) or add a
  shared KV cache (e.g. LMCache).
- **Prefixes shorter than a block.** Only full blocks are cached: with a block size of
  128 tokens (`$block`), a 100-token shared prefix can never hit.
- **Decode-dominated cost.** A high hit ratio saves prefill only. When responses are long
  compared with prompts the cost-saving factor (`$saving`) stays near 1 however high the
  hit ratio; that is expected, not a cache fault.
"""

SECTIONS: dict[str, str] = {
    "CachemonPrefixCacheHitRatioLow": """\
**Means.** Over the last $w, less than $warn (warning) or $crit (critical) of the prompt
tokens looked up in vLLM's local prefix cache were found there, for $for, on one model of
one replica, while it served more than $floor query token/s (idle replicas never alert).
$overrides (`model_hit_ratio` in the monitoring config). Both severities fire below
$crit. The alerts keep every target label of the replica (namespace, pod, ...) and the
fleet-level series keep $kept, so kube-prometheus-stack's default inhibit rule
(critical inhibits warning with `equal: [namespace, alertname]`) silences the warning only
inside the critical alert's own namespace. To inhibit per replica and model instead:

```yaml
inhibit_rules:
  - source_matchers: [alertname="CachemonPrefixCacheHitRatioLow", severity="critical"]
    target_matchers: [alertname="CachemonPrefixCacheHitRatioLow", severity="warning"]
    equal: [namespace, job, instance, upstream, model_name]
```

**Confirm.**
- Overview dashboard: *Hit ratio per instance* and *Hit vs miss tokens per second*. Look
  for annotations (restart, change, cache reset) just before the drop.
- `$ratio{model_name="…"}` and `$queries`.
- `$enabled` is 1 and `$block` is small compared with the shared prefix.
- Run `cachemon analyze` on a sample of the real requests: it shows where consecutive
  prompts first differ (a timestamp or id at the head shows as a divergence at token 0-20).

**Do.** Follow the cause (see [Causes of a low hit ratio](#causes-of-a-low-hit-ratio)):
move dynamic content to the end of the prompt; after a change or restart, wait for or run a
warm-up; if KV usage is high, give the cache more memory; with several replicas, route by
prefix affinity.
""",
    "CachemonExporterDown": """\
**Means.** Prometheus has failed to scrape cachemon (`up{$sel} == 0`) for $down_for. Every
other cachemon alert for that instance is blind.

**Confirm.** Prometheus *Targets* page for the scrape error; `curl http://<pod>:9867/metrics`;
the cachemon container's logs and restarts (`kubectl logs -c cachemon`, `systemctl status cachemon`).

**Do.** Restart the sidecar; fix the listen address / port, network policy or the
`--web-config-file` TLS / basic-auth settings if Prometheus is refused.
""",
    "CachemonExporterAbsent": """\
**Means.** Prometheus has no cachemon target matching `{$sel}` any more: for $absent_for
there has been no `up{$sel}` series in a namespace (target labels $kept) that had one in
the last $absent_lookback, or none at all. A target that is down is
CachemonExporterDown; this one means discovery lost it, so no cachemon alert can fire there.

**Confirm.** Prometheus *Service Discovery* and *Targets* pages; `kubectl get podmonitor -A`
and the PodMonitor's labels (kube-prometheus-stack selects them by `release`); the pods'
labels and the `cachemon-metrics` port name; `up{$sel}` over the last $absent_lookback.

**Do.** Restore the PodMonitor / scrape config or the pod labels it selects. If the
deployment was removed on purpose, the alert resolves $absent_lookback later (or silence it).
""",
    "CachemonUpstreamDown": """\
**Means.** cachemon is running but its polls of the vLLM `/metrics` page have failed
(`$up == 0`) for $down_for: vLLM is down, restarting, overloaded, or unreachable.

**Confirm.** `$last_error` gives the reason (refused, timeout, http_status, truncated, …);
cachemon's own log (a warning per failed poll) and `cachemon check` give the error's text; the
exporter dashboard's *Upstream polls and errors per second*; vLLM's own logs.

**Do.** Fix vLLM (or the `--upstream` URL). A vLLM that is up but slow to answer `/metrics`
under load needs a longer poll timeout.
""",
    "CachemonSeriesOverflow": """\
**Means.** For $overflow_for, cachemon has refused (model_name, engine) label sets of an
upstream within the last $overflow_lookback: `$overflow` grew (the cardinality guard already
keeps `normalise.max_series_per_upstream` label sets: each refused one is counted once), or
`$rejected{reason="label_set_budget"}` did (a page with more than twice that many label sets:
samples of further new ones are not read, which bounds each poll's time and memory). The
refused models have no series: their hit ratio is not watched.

**Confirm.** cachemon's log says once per upstream (then at most every 10 minutes) how many
were refused; `curl <upstream>/metrics | grep -c prefix_cache_queries_total` counts the label
sets vLLM shows. Many distinct `model_name` values usually mean a router or a LoRA setup that
creates a name per request or per adapter, or a hostile upstream.

**Do.** Raise `normalise.max_series_per_upstream` if the models are real (each costs a few KB).
Otherwise fix the upstream's naming. Names that appear once and vanish free their slot for
a new label set at once; names seen on several polls keep theirs until `normalise.evict_after`.
""",
    "CachemonPrefixCachingDisabled": """\
**Means.** vLLM reports prefix caching off on an engine for $disabled_for
(`$enabled == 0`, from `vllm:cache_config_info` or the V0 hit-rate gauge at -1). No
prompt token can hit; the hit-ratio alerts cannot tell you because vLLM counts no queries.

**Confirm.** Exporter dashboard, *Cache config* (`$info`); vLLM's start-up flags.

**Do.** Start vLLM with `--enable-prefix-caching` (the default on V1, unless disabled by a
flag, a model or an attention backend that does not support it).
""",
    "CachemonHitRatioDroppedAfterChange": """\
**Means.** Within $lookback of a change cachemon detected on the upstream
(`$changes`, kind = model, version, cache_config, tokenizer or chat_template), the
replica's $w hit ratio fell more than $change_drop points below its value $lookback ago,
for $for, with traffic.

**Confirm.** Overview annotations and `increase($changes[$lookback])` for the kind; for
a tokenizer / chat-template change compare `$tokenizer` hashes; `cachemon fingerprint`
on the old and new tokenizer files.

**Do.** A model or version change: expect a cold cache and watch it recover (warm up with
`cachemon warmup`). A chat-template or tokenizer change that was not intended: roll it
back; if intended, check that the template does not now put dynamic content (dates,
ids) before the system prompt. A cache_config change (block size, hash algorithm,
prefix caching off): revert the flag.
""",
    "CachemonHitRatioNotRecovered": """\
**Means.** vLLM restarted or its prefix cache was reset (`$restarts`, `$resets`) in the
last $lookback, the replica was at or above $warn before, and $recovery_for later its hit
ratio is still below $warn while it has traffic: the cache did not warm up.

**Confirm.** Overview annotations; `$kv` (a smaller KV cache after the restart, e.g. a
changed `--gpu-memory-utilization`); whether the traffic mix after the restart is the
same as before; `$changes` for a change made with the restart.

**Do.** Warm the cache (`cachemon warmup`) with the common prefixes; check that the
restart did not change flags (block size, memory, max model length); if the traffic
changed, this is a new baseline, see the hit-ratio alert.
""",
    "CachemonReplicaHitRatioSkew": """\
**Means.** One replica's $w hit ratio is more than $skew points below its model's ratio
over all replicas (`$fleet_ratio`) for $skew_for, with traffic. The replicas do not
share a cache, and requests with the same prefix are not reaching the replica that holds it.

**Confirm.** Fleet dashboard: *Replica skew vs model fleet*, *Traffic share per replica*
and *Hit ratio per engine* (data-parallel engines are separate caches too).

**Do.** Route by prefix or session affinity (production-stack's prefix-aware router, the
llm-d / Gateway API inference extension prefix scorer), or share the KV cache (LMCache);
check that the replica runs the same model, template and flags as the others.
""",
    "CachemonKVCacheNearlyFull": """\
**Means.** More than $kv_high of the engine's KV-cache blocks have been in use for
$kv_for. Blocks holding cached prefixes are freed for running requests and evicted before
reuse, so the hit ratio falls as load rises.

**Confirm.** Overview: *KV-cache usage*, *Preemptions per second* and the hit ratio at the
same time; `vllm:num_requests_waiting`.

**Do.** Give the KV cache more memory (`--gpu-memory-utilization`, a smaller
`--max-model-len`, KV offloading), cap concurrency (`--max-num-seqs`), or add replicas
with prefix-affinity routing.
""",
    "CachemonKVCachePreemptionSpike": """\
**Means.** vLLM's scheduler preempted more than $preempt requests per second over $w for
$preempt_for (`$preemptions`): running requests ran out of KV cache and are recomputed,
which also throws away cached prefixes.

**Confirm.** Overview: *Preemptions per second* next to *KV-cache usage* and TTFT p95.

**Do.** As for a nearly full KV cache: more KV memory, lower concurrency, more replicas.
""",
    "CachemonKVCapacityDominatesMisses": """\
**Means.** vLLM's KV-cache events (followed by cachemon's ledger, `upstreams[].kv_events`) show that
more than $capacity_share of the prompt tokens vLLM computed and stored over the last $w were content
this replica had cached before and evicted (`$stored{reason="capacity"}`), for $capacity_for, while
the replica's hit ratio is below its warning threshold and it has traffic. The pool is too small for
the working set: prefixes are evicted before they are reused. This is exact (every block is
accounted for), not the counter heuristic behind `capacity_eviction` without events.

**Confirm.** Overview dashboard, *Where the misses go* (capacity on top), *KV block lifetime* (short
lifetimes: blocks evicted seconds after they were stored), *KV-cache usage* near $kv_high and
*Preemptions per second*; `cachemon_kv_ledger_in_sync` is 1 (otherwise the split is a lower bound).

**Do.** Give the KV cache more memory: `--gpu-memory-utilization` (GPU) or `VLLM_CPU_KVCACHE_SPACE`
(CPU build), or `--kv-cache-memory-bytes`; shorten `--max-model-len` (the pool is sized for the longest
sequence) and cap `--max-num-seqs`; offload evicted blocks to CPU memory (vLLM's KV offloading: `--kv-offloading-size GiB` with
`--kv-offloading-backend native` or `lmcache`, `vllm/config/cache.py` in 0.32.0) so that a recomputation
becomes a transfer; or add replicas with prefix-affinity routing.
""",
    "CachemonDynamicPrefixFound": """\
**Means.** cachemon's KV-event ledger found the signature of a per-request value in the prompts of a
model on one replica: one cached parent block followed by a different child block in every request,
each stored once, and the shared content after it recomputed under each (cause `dynamic_prefix`,
exact), for $dynamic_for, while the hit ratio is below its warning threshold with traffic. Typical
values: a timestamp or request id in the system prompt, a user name before the instructions, tools
serialised in a different order.

**Confirm.** `cachemon check --kv-events …` prints the depth in blocks (× block size = the token
position) where requests diverge; with `--show-text --tokenizer DIR` (opt-in, never in metrics or
logs) it shows the tokens there. Overview: *Divergence depth* sits at that depth; *Missed tokens by
cause* shows `dynamic_prefix`.

**Do.** Move the per-request value after the shared part of the prompt (end of the system prompt,
or the user message), keep tool lists in a stable order, and confirm with `cachemon analyze` on a
sample of requests.
""",
    "CachemonRouterBlind": """\
**Means.** The router of `routers:` in front of this replica made no prefix decision for $router_blind_for
while the replica hit (cause `router_blind`): all its decisions `blind` (vllm-router `missing_tokens`), every
lookup of its KV index a miss, or 0 credited tokens. The hits come from the traffic's order, not from routing.

**Confirm.** Fleet dashboard, *Router vs engine*; the router's page (`vllm_router_prefix_routing_decisions_total`,
`vllm_router_kv_placement_lookups_total`); vLLM's access log (`POST /v1/chat/completions/render` 403).

**Do.** vllm-router on vLLM 0.32: start the workers with `--enable-scale-out`; `kv_aware`: check each
`--kv-event-source` and that `--kv-event-block-size` is vLLM's block size. Other routers: their row's fix.
""",
    "CachemonTenantHitRatioCollapsed": """\
**Means.** One tenant (a `cache_salt`, named as below) got less than $tenant_low of its KV tokens from the
prefix cache over the last $w (`$tenant_ratio`: hits / (hits + stored tokens), from vLLM's KV-cache events
of requests with `kv_cache_report_mode` full) for $tenant_for, while the model's *other* tenants together
are at or above $warn (`$tenant_rest`) and the tenant has traffic. Comparing the tenant with the rest, not
with the model's average, is deliberate: one tenant whose prompts start with a timestamp misses on every
request, yet barely moves a model-wide ratio carried by healthy tenants. Without full-report requests there
are no per-tenant hits, so no ratio and no alert: stores are known per tenant, lookups are not.
A new tenant's series are served at 0 for `kv_events.new_series_hold` (90s) before its counts, so its first
(cold) stores count in the ratio: its ratio shows up that much later, and is exact once it does. Set the hold
above the scrape interval of every Prometheus scraping the sidecar, or that one misses the tenant's first
stores and reads its ratio too high.

**Tenant names.** The salt is never exported or logged. `tenant` is the name configured for it
(`kv_events.tenants`: sha256 of the salt, hex -> name), else `h-` and 12 hex digits of HMAC-SHA256 with the
configured key, `kv_events.tenant_key` (`cachemon analyze --tenant-config` with the same config file gives
the same names), `""` without
a salt, and `other` for tenants past the label budget (top-K; `$overflow_tenants` counts them; `other`
never fires this alert: it is many tenants, not one).
`adapter` is the LoRA name, `""` for the base model.

**Confirm.** Overview dashboard, row *Tenants and adapters*: the tenant's *missed tokens by reason*
(`$tenant_stored`) is mostly `first` (new content on every request: a per-request value at the head) or
`isolation` (content cached under another salt or adapter: the price of the separation). Offline,
`cachemon analyze --by-tenant requests.jsonl` prints the same split per tenant and names the varying segment.

**Do.** For `first`: move the per-request value (timestamp, request id) after the shared part of the prompt.
For `isolation`: the tenant pays for its salt; shared content (a common system prompt) is computed once per
salt, because vLLM puts the salt in the first block and every later block inherits it. Keep the salt if
isolation is the point (it stops tenants from detecting each other's cached prompts by timing); otherwise
send requests whose prompts hold nothing private without a salt, or give one salt to tenants that may share.
""",
    "CachemonLogSourceStalled": """\
**Means.** cachemon has read no vLLM stats line from a log file for more than
$log_age s (`time() - $log_age_metric`) for $log_for, while the same cachemon sees prompt traffic
(vLLM logs stats every few seconds while busy, nothing while idle). The log-derived series
are stale.

**Confirm.** Exporter dashboard: *Age of the last stats line*, *Log lines per second by
outcome* (malformed lines mean the log format changed), *Log files open, rotations and
truncations*.

**Do.** Check the `--log-file` path or glob still matches after log rotation, that the
vLLM log level still includes INFO stats lines (`--disable-log-stats` off), and the file
permissions.
""",
}


def threshold_table(cfg: MonitoringConfig) -> str:
    limits = cfg.hit_ratio()
    rows = [
        ("Hit ratio, warning", f"< {prometheus_rules.pct(limits.warning)} over {t.ALERT_RATIO_WINDOW}", cfg.alert_for()),
        ("Hit ratio, critical", f"< {prometheus_rules.pct(limits.critical)} over {t.ALERT_RATIO_WINDOW}", cfg.alert_for()),
    ]
    rows += [(f"Hit ratio of `{m}`, warning / critical",
              f"< {prometheus_rules.pct(p.warning)} / < {prometheus_rules.pct(p.critical)} over {t.ALERT_RATIO_WINDOW}",
              cfg.alert_for())
             for m, p in ((m, cfg.hit_ratio(m)) for m in sorted(cfg.model_hit_ratio))]
    rows += [
        ("Traffic floor (all hit-ratio alerts)", f"> {t.TRAFFIC_FLOOR_TOKENS_PER_SECOND:g} query token/s", "-"),
        ("Exporter / upstream down", "up == 0", t.DOWN_FOR),
        ("Exporter absent", f"no target where there was one in the last {t.ABSENT_LOOKBACK}", t.ABSENT_FOR),
        ("Prefix caching disabled", "enabled == 0", t.CACHING_DISABLED_FOR),
        ("Drop after a change",
         f"> {t.CHANGE_DROP * 100:g} points below {t.CHANGE_LOOKBACK} ago, change in the last {t.CHANGE_LOOKBACK}",
         t.ALERT_FOR),
        ("Not recovered after restart / reset",
         f"< {prometheus_rules.pct(limits.warning)}, event in the last {t.CHANGE_LOOKBACK}", t.RECOVERY_FOR),
        ("Replica skew", f"> {t.SKEW_DROP * 100:g} points below the model's fleet ratio", t.SKEW_FOR),
        ("KV cache nearly full", f"> {prometheus_rules.pct(t.KV_CACHE_USAGE_HIGH)} in use", t.KV_CACHE_FOR),
        ("Preemption spike", f"> {t.PREEMPTIONS_PER_SECOND_HIGH:g} preemptions/s over {t.ALERT_RATIO_WINDOW}", t.PREEMPTIONS_FOR),
        ("Log source stalled", f"no stats line for > {t.LOG_STATS_STALE_SECONDS} s with traffic", t.LOG_STALLED_FOR),
        ("KV capacity dominates the misses (KV events)",
         f"capacity > {prometheus_rules.pct(t.CAPACITY_SHARE_HIGH)} of stored tokens over {t.ALERT_RATIO_WINDOW}, "
         f"ratio < {prometheus_rules.pct(limits.warning)}", t.CAPACITY_SHARE_FOR),
        ("Dynamic prefix found (KV events)", f"cause dynamic_prefix active, ratio < {prometheus_rules.pct(limits.warning)}",
         t.DYNAMIC_PREFIX_FOR),
        ("Router blind (`routers:`)", "cause router_blind active", t.ROUTER_BLIND_FOR),
        ("One tenant's ratio collapsed (KV events, full report)",
         f"tenant < {prometheus_rules.pct(t.TENANT_HIT_RATIO_LOW)}, "
         f"the model's other tenants >= {prometheus_rules.pct(limits.warning)}",
         t.TENANT_FOR),
    ]
    out = ["| condition | threshold | for |", "|---|---|---|"]
    out += [f"| {a} | {b} | {f} |" for a, b, f in rows]
    return "\n".join(out)


def render(cfg: MonitoringConfig) -> str:
    ctx = context(cfg)
    alerts = prometheus_rules.alerts(cfg)
    names = prometheus_rules.alert_names(cfg)
    missing = [n for n in names if n not in SECTIONS]
    if missing:   # a new alert without a runbook section must not ship
        raise ValueError(f"runbook sections missing for: {', '.join(missing)}")
    parts = [
        "<!-- Generated by `cachemon monitoring` from src/cachemon/monitoring/runbook.py; do not edit. -->",
        "# cachemon runbook",
        "",
        "One section per alert in `alerts/cachemon-alerts.yaml`; each alert's `runbook_url` points at its",
        "section. Thresholds and windows come from `src/cachemon/thresholds.py` and the monitoring config",
        "(`cachemon monitoring --config FILE`), the same source as the alert rules and the dashboard thresholds.",
        "",
        "## Thresholds",
        "",
        threshold_table(cfg),
        "",
        "## Alerts",
        "",
        "| alert | severity | summary |",
        "|---|---|---|",
    ]
    for n in names:
        sev = "/".join(dict.fromkeys(a.severity for a in alerts if a.name == n))
        summary = next(a.summary for a in alerts if a.name == n)
        parts.append(f"| [{n}](#{n.lower()}) | {sev} | {summary} |")
    parts.append("")
    for n in names:
        parts += [f"## {n}", "", Template(SECTIONS[n]).substitute(ctx)]
    parts.append(Template(CAUSES).substitute(ctx))
    parts.append(attribution_sections())
    return "\n".join(parts)


