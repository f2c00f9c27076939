"""Recording rules and alerts, as Prometheus rule groups (plain dicts).

Every metric name comes from ``cachemon.catalog`` and every number from
``cachemon.thresholds``; the alerts read the recorded ratios so that the dashboards, the
alerts and `promtool test rules` all look at the same series.

The hit ratio is computed from the reset-corrected token counters (``rate(hit) /
rate(query)``, cache="local"), never from cachemon's own ``*_hit_ratio`` gauge: rates
aggregate correctly across engines and replicas, a ratio of ratios does not.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from cachemon import catalog as c
from cachemon import thresholds as t
from cachemon.jsontypes import JsonObject, JsonValue
from cachemon.monitoring.site import MonitoringConfig
from cachemon.normalise.tenant_label import OTHER
from cachemon.normalise.updates import REJECT_BUDGET
from cachemon.state.ledger.reasons import NOT_MISSES

# Aggregation levels of the recorded series. The level name is the first part of the
# `level:metric:operation` rule name. Per-replica levels aggregate `without` the labels
# that split one replica's series, so every target label (namespace, pod, cluster, ...) stays
# and Alertmanager can route and inhibit by it. Fleet levels keep `job`, the site's
# `target_labels` and the level's own labels. `upstream` stays with `instance`: one cachemon
# instance may poll several vLLM servers, and a replica is (instance, upstream).
REPLICA_LEVELS = {
    "model_instance_engine": (c.CACHE,),
    "model_instance": (c.ENGINE, c.CACHE),
}
FLEET_LEVELS = {
    "model": ("job", c.MODEL),
    "job": ("job",),
}
LEVELS = (*REPLICA_LEVELS, *FLEET_LEVELS)
LOCAL = f'{c.CACHE}="local"'   # vLLM's own KV cache; external (KV connector) is a different cache


def fleet_labels(cfg: MonitoringConfig, level: str) -> tuple[str, ...]:
    return (*cfg.target_labels, *FLEET_LEVELS[level])


def replica(cfg: MonitoringConfig) -> tuple[str, ...]:
    """Labels identifying one replica (cachemon instance, upstream): the alerts' join keys."""
    return (*cfg.target_labels, "job", "instance", c.UPSTREAM)


def aggregate(cfg: MonitoringConfig, level: str) -> str:
    if level in REPLICA_LEVELS:
        return f"sum without ({by(REPLICA_LEVELS[level])})"
    return f"sum by ({by(fleet_labels(cfg, level))})"


def num(x: float) -> str:
    """A threshold as PromQL wants it (0.8, not 0.80000001)."""
    return f"{x:g}"


def pct(x: float) -> str:
    return f"{x * 100:g}%"


def by(labels: Iterable[str]) -> str:
    return ", ".join(labels)


def sel(cfg: MonitoringConfig, *extra: str) -> str:
    return "{" + ", ".join((cfg.cachemon_selector,) + extra) + "}"


# --- recorded series names ------------------------------------------------------------
def _base(spec: c.MetricSpec) -> str:
    return spec.name   # counters' names without _total, as the naming convention wants


def rec_rate(level: str, spec: c.MetricSpec, window: str) -> str:
    return f"{level}:{_base(spec)}:rate{window}"


def rec_ratio(level: str, window: str) -> str:
    per = c.QUERY_TOKENS.name.removeprefix(c.PREFIX + "prefix_cache_")   # ..._hit_tokens_per_query_tokens
    return f"{level}:{_base(c.HIT_TOKENS)}_per_{per}:ratio_rate{window}"


def recording_group(cfg: MonitoringConfig) -> JsonObject:
    rules: list[JsonValue] = []
    finest = LEVELS[0]
    for w in t.RATIO_WINDOWS:
        for spec in (c.HIT_TOKENS, c.QUERY_TOKENS):
            rules.append({
                "record": rec_rate(finest, spec, w),
                "expr": f"{aggregate(cfg, finest)} (rate({spec.sample_name}{sel(cfg, LOCAL)}[{w}]))",
            })
        # Coarser levels sum the finest recorded rates (cheap, and consistent with them).
        for level in LEVELS[1:]:
            for spec in (c.HIT_TOKENS, c.QUERY_TOKENS):
                rules.append({"record": rec_rate(level, spec, w),
                              "expr": f"{aggregate(cfg, level)} ({rec_rate(finest, spec, w)})"})
        for level in LEVELS:
            # `> 0` drops idle series instead of producing NaN (0/0) or a fake 0 %.
            rules.append({"record": rec_ratio(level, w),
                          "expr": f"{rec_rate(level, c.HIT_TOKENS, w)}\n  / ({rec_rate(level, c.QUERY_TOKENS, w)} > 0)"})
    return {"name": cfg.recording_group, "rules": rules + tenant_recording(cfg)}


# --- per tenant and adapter (KV events; docs/runbook.md "CachemonTenantHitRatioCollapsed") -------------
TENANT_LEVELS = {"model_tenant_adapter": (c.TENANT, c.ADAPTER), "model_tenant": (c.TENANT,), "model_adapter": (c.ADAPTER,)}
# A tenant's KV tokens: served from the cache (hits, full-report requests only) or computed and stored.
HIT_OR_STORED = c.PREFIX + "kv_tenant_hit_or_stored_tokens"


def rec_tenant(level: str, what: str, op: str = f"rate{t.ALERT_RATIO_WINDOW}") -> str:
    return f"{level}:{what}:{op}"


TENANT_RATIO = rec_tenant("model_tenant", f"{_base(c.KV_TENANT_HIT_TOKENS)}_per_{HIT_OR_STORED.split('tenant_')[1]}",
                          f"ratio_rate{t.ALERT_RATIO_WINDOW}")
TENANT_REST_RATIO = TENANT_RATIO.replace(":ratio_rate", ":rest_ratio_rate")
TENANT_KV = rec_tenant("model_tenant", HIT_OR_STORED)


def tenant_recording(cfg: MonitoringConfig) -> list[JsonValue]:
    """Per (tenant, adapter), per tenant and per adapter: stored tokens by reason and hits (fleet of the
    model summed); the isolation cost; the tenant's hit ratio where full-report hits exist, and the ratio
    of the model's other tenants beside it, so one tenant's collapse cannot hide in the average."""
    w, fine = t.ALERT_RATIO_WINDOW, "model_tenant_adapter"
    labels = by((*fleet_labels(cfg, "model"), *TENANT_LEVELS[fine]))
    stored, hits = _base(c.KV_TENANT_STORED_TOKENS), _base(c.KV_TENANT_HIT_TOKENS)
    out: list[JsonValue] = [{"record": rec_tenant(fine, stored), "expr": f"sum by ({labels}, {c.REASON}) "
            f"(rate({c.KV_TENANT_STORED_TOKENS.sample_name}{sel(cfg)}[{w}]))"},
           {"record": rec_tenant(fine, hits),
            "expr": f"sum by ({labels}) (rate({c.KV_TENANT_HIT_TOKENS.sample_name}{sel(cfg)}[{w}]))"}]
    for level, keep in TENANT_LEVELS.items():
        drop = by(x for x in TENANT_LEVELS[fine] if x not in keep)
        if drop:
            out += [{"record": rec_tenant(level, m), "expr": f"sum without ({drop}) ({rec_tenant(fine, m)})"}
                    for m in (stored, hits)]
        out.append({"record": rec_tenant(level, stored, f"isolation_rate{w}"),
                    "expr": f'sum without ({c.REASON}) ({rec_tenant(level, stored)}{{{c.REASON}="isolation"}})'})
    h = rec_tenant("model_tenant", hits)
    model = by(fleet_labels(cfg, "model"))
    out += [
        {"record": TENANT_KV, "expr": f"{h} + sum without ({c.REASON}) ({rec_tenant('model_tenant', stored)})\nor {h}"},
        {"record": TENANT_RATIO, "expr": f"{h}\n  / ({TENANT_KV} > 0)"},
        {"record": TENANT_REST_RATIO,
         "expr": f"(sum by ({model}) ({h}) - on ({model}) group_right() {h})\n"
                 f"  / ((sum by ({model}) ({TENANT_KV}) - on ({model}) group_right() {TENANT_KV}) > 0)"},
    ]
    return out


def tenant_alert(cfg: MonitoringConfig) -> Alert:
    key = by((*fleet_labels(cfg, "model"), c.TENANT))
    healthy = cfg.hit_ratio().warning
    return Alert(
        "CachemonTenantHitRatioCollapsed", "warning",
        # "other" is many tenants past the label budget, not one: its collapse is not this alert's
        f"{TENANT_RATIO}{{{c.TENANT}!={quote(OTHER)}}} < {num(t.TENANT_HIT_RATIO_LOW)}\n"
        f"and on ({key}) {TENANT_REST_RATIO} >= {num(healthy)}\n"
        f"and on ({key}) {TENANT_KV} > {num(t.TRAFFIC_FLOOR_TOKENS_PER_SECOND)}",
        t.TENANT_FOR,
        "One tenant's prefix-cache hit ratio collapsed while the model's other tenants hold.",
        f"Tenant {{{{ $labels.tenant }}}} of model {{{{ $labels.model_name }}}} (job {{{{ $labels.job }}}}) got "
        f"{{{{ $value | humanizePercentage }}}} of its KV tokens from the prefix cache over the last {W}, below "
        f"{pct(t.TENANT_HIT_RATIO_LOW)}, while the model's other tenants together are at or above "
        f"{pct(healthy)}: something in this tenant's prompts (a timestamp or request id at the head, a salt "
        f"per request) defeats the cache. Dashboard row *Tenants and adapters*; `cachemon analyze --by-tenant`.",
    )


# --- alerts -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Alert:
    name: str
    severity: str
    expr: str
    for_: str
    summary: str
    description: str

    def rule(self, cfg: MonitoringConfig, for_override: str | None = None) -> JsonObject:
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": for_override or self.for_,
            "labels": {"severity": self.severity},
            "annotations": {
                "summary": self.summary,
                "description": self.description,
                "runbook_url": cfg.runbook_url(self.name),
            },
        }


W = t.ALERT_RATIO_WINDOW
RATIO = rec_ratio("model_instance", W)
QUERIES = rec_rate("model_instance", c.QUERY_TOKENS, W)
FLEET_RATIO = rec_ratio("model", W)
WHERE = "model {{ $labels.model_name }} on {{ $labels.instance }} (upstream {{ $labels.upstream }})"


def traffic_floor() -> str:
    # Idle or nearly idle upstreams have no meaningful ratio: the alerts stay silent.
    return f"{QUERIES} > {num(t.TRAFFIC_FLOOR_TOKENS_PER_SECOND)}"


# The hit-ratio alert's label when it fires on vLLM's reported ratio (no token counters on that era):
# its description says which ratio it read.
RATIO_SOURCE = "ratio_source"
REPORTED = "vllm_reported"


def reported_ratio_low(cfg: MonitoringConfig, threshold: float) -> str:
    """Ratio-only sources (V0's since-start gauge, log-only sources): vLLM's reported ratio, where
    no token counters exist for the replica, so a V0 server is not invisible to alerting. Labels as
    the per-replica ratio's (everything but engine, cache and the ratio's basis).

    A tailed log is its own upstream (``log:<file>``, no model_name), so the per-replica `unless`
    cannot see that the sidecar's /metrics upstream already has counters for the same server. Its
    ratio (vLLM's last ~1000 requests, not the alert window) then fired beside the counter-based
    alert and kept firing long after the 5m ratio recovered (real vLLM, scripts/e2e). A log
    upstream's ratio therefore alerts only on a cachemon instance with no token counters at all."""
    instance = by((*cfg.target_labels, "job", "instance"))
    log_kind = f'{c.KIND}="log"'
    log_upstreams = f"{c.UPSTREAM_INFO.sample_name}{sel(cfg, log_kind)}"
    return (f"min without ({c.ENGINE}, {c.CACHE}, basis) "
            f"({c.REPORTED_HIT_RATIO.sample_name}{sel(cfg, LOCAL)}) < {num(threshold)}\n"
            f"unless on ({by((*replica(cfg), c.MODEL))}) {QUERIES}\n"
            f"unless on ({by(replica(cfg))}) ({log_upstreams} and on ({instance}) {QUERIES})")


def cause_text(cfg: MonitoringConfig) -> str:
    """Alert-description template naming the causes cachemon's attribution engine has active for the
    alert's replica, each with its runbook section."""
    q = (f'max by (cause) ({c.CAUSE_ACTIVE.sample_name}{{{cfg.cachemon_selector}, instance="%s", '
         f'{c.UPSTREAM}="%s", {c.MODEL}="%s"}})')
    return (f' {{{{ with query (printf "{q.replace(chr(34), chr(92) + chr(34))}" $labels.instance $labels.upstream '
            f'$labels.model_name) }}}}Active cause(s): {{{{ range . }}}}{{{{ .Labels.cause }}}} '
            f'({cfg.runbook_base_url}#cause-{{{{ .Labels.cause }}}}) {{{{ end }}}}{{{{ else }}}}No cause identified by '
            f'cachemon yet: `cachemon check` explains what it sees.{{{{ end }}}}')


def quote(value: str) -> str:
    """A PromQL string literal (JSON escaping is a subset of PromQL's Go-style escapes)."""
    return json.dumps(value)


def hit_ratio_low(cfg: MonitoringConfig, floor: str) -> list[Alert]:
    """The warning / critical pair; with per-model overrides, one rule per severity still.

    Each model_name is compared with exactly one threshold per severity: the default clause
    excludes every overridden model (model_name!="..."), each override has its own clause,
    joined with `or`. One rule per (alertname, severity) also keeps `promtool check rules`'
    duplicate-rule lint quiet, and the description names the threshold that applied.
    """
    overridden = sorted(cfg.model_hit_ratio)
    out = []
    for severity in ("warning", "critical"):
        def limit(model: str | None, severity: str = severity) -> float:
            return float(getattr(cfg.hit_ratio(model), severity))
        clauses = [(f"{RATIO}{{{', '.join(f'{c.MODEL}!={quote(m)}' for m in overridden)}}}" if overridden else RATIO,
                    limit(None))]
        clauses += [(f"{RATIO}{{{c.MODEL}={quote(m)}}}", limit(m)) for m in overridden]
        if overridden:
            cond = "(\n" + "\n  or\n".join(f"  {series} < {num(x)}" for series, x in clauses) + "\n)"
            shown = "".join(f"{{{{ {'if' if i == 0 else 'else if'} eq $labels.{c.MODEL} {quote(m)} }}}}{pct(limit(m))}"
                            for i, m in enumerate(overridden)) + f"{{{{ else }}}}{pct(limit(None))}{{{{ end }}}}"
        else:
            cond, shown = f"{RATIO} < {num(limit(None))}", pct(limit(None))
        out.append(Alert(
            "CachemonPrefixCacheHitRatioLow", severity,
            f"(\n  {cond}\n  and {floor}\n)\nor\n"
            f'label_replace(\n  {reported_ratio_low(cfg, limit(None))},\n  "{RATIO_SOURCE}", "{REPORTED}", "", ""\n)',
            cfg.alert_for(),
            "Prefix-cache hit ratio is low.",
            f"Prefix-cache hit ratio of {WHERE} is {{{{ $value | humanizePercentage }}}} "
            f"{{{{ if $labels.{RATIO_SOURCE} }}}}as vLLM reports it (this vLLM exports no token counters)"
            f"{{{{ else }}}}over the last {W}{{{{ end }}}}, "
            f"below the {shown} {severity} threshold." + cause_text(cfg),
        ))
    return out


def below_warning(cfg: MonitoringConfig) -> str:
    """The replica's ratio below its model's warning threshold (per-model overrides applied once each),
    the gate every cause alert shares with CachemonPrefixCacheHitRatioLow: no cause alert above it."""
    overridden = sorted(cfg.model_hit_ratio)
    if not overridden:
        return f"{RATIO} < {num(cfg.hit_ratio().warning)}"
    clauses = [f"{RATIO}{{{', '.join(f'{c.MODEL}!={quote(m)}' for m in overridden)}}} < {num(cfg.hit_ratio().warning)}"]
    clauses += [f"{RATIO}{{{c.MODEL}={quote(m)}}} < {num(cfg.hit_ratio(m).warning)}" for m in overridden]
    return "(" + " or ".join(clauses) + ")"


def kv_alerts(cfg: MonitoringConfig, floor: str) -> list[Alert]:
    """Alerts on what the KV-event ledger found (docs/kv-events.md), gated like the hit-ratio alert."""
    rep_model = by((*replica(cfg), c.MODEL))
    stored = c.KV_STORED_TOKENS.sample_name
    capacity = f'{c.REASON}="capacity"'
    counted = f'{c.REASON}!~"{"|".join(sorted(NOT_MISSES))}"'     # not a miss: the block is still cached
    return [
        Alert(
            "CachemonKVCapacityDominatesMisses", "warning",
            f"(\n  sum without ({c.REASON}) (rate({stored}{sel(cfg, capacity)}[{W}]))\n"
            f"  / (sum without ({c.REASON}) (rate({stored}{sel(cfg, counted)}[{W}])) > 0)\n)"
            f" > {num(t.CAPACITY_SHARE_HIGH)}\n"
            f"and on ({rep_model}) {below_warning(cfg)}\n"
            f"and on ({rep_model}) {floor}",
            t.CAPACITY_SHARE_FOR,
            "Most recomputed prompt tokens were evicted for lack of KV-cache space.",
            f"{WHERE[0].upper()}{WHERE[1:]}: {{{{ $value | humanizePercentage }}}} of the tokens vLLM stored over "
            f"the last {W} were cached on this replica before and evicted (KV-cache events, reason capacity), "
            f"while its hit ratio is below the warning threshold: the KV cache is too small for the working "
            f"set. Give it more memory, a shorter --max-model-len, or CPU offload." + cause_text(cfg),
        ),
        Alert(
            "CachemonDynamicPrefixFound", "warning",
            f"max without ({c.CAUSE}, {c.CERTAINTY}) "
            f'({c.CAUSE_ACTIVE.sample_name}{sel(cfg, c.CAUSE + chr(61) + quote("dynamic_prefix"))})\n'
            f"and on ({rep_model}) {below_warning(cfg)}\n"
            f"and on ({rep_model}) {floor}",
            t.DYNAMIC_PREFIX_FOR,
            "A per-request value near the head of the prompts defeats the prefix cache.",
            f"cachemon's KV-event ledger finds, for {WHERE}, one cached prefix followed by a different block "
            f"in every request, with the shared content after it recomputed each time (cause dynamic_prefix), "
            f"while the hit ratio is below the warning threshold. `cachemon check --kv-events` prints the "
            f"depth; move the per-request value (timestamp, request id) after the shared part of the prompt.",
        ),
        Alert(
            "CachemonRouterBlind", "warning",
            f"max without ({c.CAUSE}, {c.CERTAINTY}) "
            f'({c.CAUSE_ACTIVE.sample_name}{sel(cfg, c.CAUSE + chr(61) + quote("router_blind"))})\n'
            f"and on ({rep_model}) {floor}",
            t.ROUTER_BLIND_FOR,
            "The prefix-aware router in front of a replica makes no prefix decision.",
            f"The router (`routers:`) in front of {WHERE} made no prefix decision (no prompt tokens, every "
            f"lookup of its index a miss, or 0 credited tokens) while this replica hit (cause router_blind): "
            f"cache hits are luck, not routing. vllm-router on vLLM 0.32: start the workers with "
            f"--enable-scale-out.",
        ),
    ]


def alerts(cfg: MonitoringConfig) -> list[Alert]:
    s = sel(cfg)
    floor = traffic_floor()
    rep = by(replica(cfg))
    out = hit_ratio_low(cfg, floor)
    out += [
        Alert(
            # warning like kube-prometheus' TargetDown: vLLM still serves, only its monitoring is blind.
            "CachemonExporterDown", "warning",
            f"up{{{cfg.cachemon_selector}}} == 0",
            t.DOWN_FOR,
            "The cachemon exporter cannot be scraped.",
            "Prometheus cannot scrape cachemon at {{ $labels.instance }} (job {{ $labels.job }}); "
            "all prefix-cache alerts for it are blind.",
        ),
        Alert(
            # Per (target labels, job): targets that existed within ABSENT_LOOKBACK and are all
            # gone now, e.g. a namespace's pods lost the scrape annotation or the PodMonitor was
            # deleted; `or on() absent(...)` covers "never seen" (no labels to keep then).
            "CachemonExporterAbsent", "warning",
            f"(\n  group by ({by(fleet_labels(cfg, 'job'))}) (max_over_time(up{s}[{t.ABSENT_LOOKBACK}]))\n"
            f"  unless\n  group by ({by(fleet_labels(cfg, 'job'))}) (up{s})\n)\n"
            f"or on () absent(up{s})",
            t.ABSENT_FOR,
            "No cachemon target is discovered.",
            "Prometheus has discovered no cachemon target matching "
            f"{{{cfg.cachemon_selector}}} "
            "{{ with $labels.namespace }}in namespace {{ . }} {{ end }}"
            f"for {t.ABSENT_FOR}: nothing scrapes cachemon there, so no prefix-cache alert can fire.",
        ),
        Alert(
            "CachemonUpstreamDown", "warning",
            f"{c.UPSTREAM_UP.sample_name}{s} == 0",
            t.DOWN_FOR,
            "The cachemon exporter cannot poll a vLLM server.",
            "cachemon on {{ $labels.instance }} has failed to poll upstream {{ $labels.upstream }} "
            f"for {t.DOWN_FOR}; see {c.LAST_ERROR.sample_name} for the reason.",
        ),
        Alert(
            "CachemonPrefixCachingDisabled", "warning",
            f"{c.PREFIX_CACHING_ENABLED.sample_name}{s} == 0",
            t.CACHING_DISABLED_FOR,
            "Prefix caching is disabled on a vLLM engine.",
            "vLLM upstream {{ $labels.upstream }} on {{ $labels.instance }} (engine {{ $labels.engine }}) "
            "runs with prefix caching disabled, so no prompt token can hit the cache.",
        ),
        Alert(
            "CachemonHitRatioDroppedAfterChange", "warning",
            f"(\n  {RATIO}\n  < on ({rep}) group_left()\n"
            f"  (max by ({rep}) ({RATIO} offset {t.CHANGE_LOOKBACK}) - {num(t.CHANGE_DROP)})\n)\n"
            f"and on ({rep})\n"
            f"  (sum by ({rep}) (increase({c.CHANGES.sample_name}{s}[{t.CHANGE_LOOKBACK}])) > 0)\n"
            f"and {floor}",
            t.ALERT_FOR,
            "Prefix-cache hit ratio dropped sharply after a change on the upstream.",
            f"Prefix-cache hit ratio of {WHERE} fell to {{{{ $value | humanizePercentage }}}}, more than "
            f"{num(t.CHANGE_DROP * 100)} points below its value {t.CHANGE_LOOKBACK} ago, right after a model, "
            "vLLM version, tokenizer, chat template or cache config change (a block size or match floor that rose is a "
            "lasting loss, not a refill: cause match_floor_changed)." + cause_text(cfg),
        ),
        Alert(
            "CachemonHitRatioNotRecovered", "warning",
            f"{RATIO} < {num(cfg.hit_ratio().warning)}\n"
            f"and on ({rep}) (\n"
            f"    sum by ({rep}) (increase({c.RESTARTS.sample_name}{s}[{t.CHANGE_LOOKBACK}])) > 0\n"
            f"  or\n"
            f"    sum by ({rep}) (increase({c.CACHE_RESETS.sample_name}{s}[{t.CHANGE_LOOKBACK}])) > 0\n"
            f")\n"
            # Only replicas that were healthy before the event: otherwise this is just HitRatioLow.
            f"and on ({rep}) (max by ({rep}) ({RATIO} offset {t.CHANGE_LOOKBACK})"
            f" >= {num(cfg.hit_ratio().warning)})\n"
            f"and {floor}",
            t.RECOVERY_FOR,
            "Prefix-cache hit ratio has not recovered after a restart or cache reset.",
            f"Prefix-cache hit ratio of {WHERE} is still {{{{ $value | humanizePercentage }}}}, below "
            f"{pct(cfg.hit_ratio().warning)}, {t.RECOVERY_FOR} after a vLLM restart or prefix-cache reset; "
            f"it was at or above {pct(cfg.hit_ratio().warning)} before (a restart that raised the block size does not "
            f"recover by waiting: cause match_floor_changed)." + cause_text(cfg),
        ),
        Alert(
            "CachemonReplicaHitRatioSkew", "warning",
            f"{RATIO}\n  < on ({by(fleet_labels(cfg, 'model'))}) group_left()\n"
            f"  ({FLEET_RATIO} - {num(t.SKEW_DROP)})\nand {floor}",
            t.SKEW_FOR,
            "One replica's prefix-cache hit ratio is far below its model's fleet.",
            f"Prefix-cache hit ratio of {WHERE} is {{{{ $value | humanizePercentage }}}}, more than "
            f"{num(t.SKEW_DROP * 100)} points below the fleet ratio of the model: requests sharing a prefix "
            "are not reaching the replica that has it cached." + cause_text(cfg),
        ),
        Alert(
            "CachemonKVCacheNearlyFull", "warning",
            f"max without ({c.ENGINE}) ({c.KV_CACHE_USAGE.sample_name}{s}) > {num(t.KV_CACHE_USAGE_HIGH)}",
            t.KV_CACHE_FOR,
            "KV cache is nearly full, cached prefixes are being evicted.",
            f"KV-cache usage of {WHERE} is {{{{ $value | humanizePercentage }}}}, above "
            f"{pct(t.KV_CACHE_USAGE_HIGH)} for {t.KV_CACHE_FOR}: cached prefix blocks are evicted before reuse.",
        ),
        Alert(
            "CachemonKVCachePreemptionSpike", "warning",
            f"sum without ({c.ENGINE}) (rate({c.PREEMPTIONS.sample_name}{s}[{W}])) "
            f"> {num(t.PREEMPTIONS_PER_SECOND_HIGH)}",
            t.PREEMPTIONS_FOR,
            "The vLLM scheduler is preempting requests for lack of KV cache.",
            f"{WHERE[0].upper()}{WHERE[1:]} preempts {{{{ printf \"%.2f\" $value }}}} requests per second "
            f"(threshold {num(t.PREEMPTIONS_PER_SECOND_HIGH)}/s): the KV cache is too small for the load.",
        ),
        *kv_alerts(cfg, floor),
        tenant_alert(cfg),
        Alert(
            "CachemonSeriesOverflow", "warning",
            f"sum by ({rep}) (increase({c.SERIES_OVERFLOW.sample_name}{s}[{t.OVERFLOW_LOOKBACK}])) > 0\n"
            f"or\n"
            f"sum by ({rep}) (increase({c.REJECTED_SAMPLES.sample_name}"
            f"{sel(cfg, f'reason={quote(REJECT_BUDGET)}')}[{t.OVERFLOW_LOOKBACK}])) > 0",
            t.OVERFLOW_FOR,
            "Label sets of a vLLM server are refused: some series are not exported.",
            "cachemon on {{ $labels.instance }} refused {{ $value | humanize }} (model_name, engine) label sets "
            f"or their samples from upstream {{{{ $labels.upstream }}}} in the last {t.OVERFLOW_LOOKBACK}: "
            "the upstream shows more label sets than normalise.max_series_per_upstream, so some models' series "
            "are missing.",
        ),
        Alert(
            "CachemonLogSourceStalled", "warning",
            f"time() - max by ({rep}, {c.FILE}) ({c.LOG_STATS_AGE.sample_name}{s}) > {t.LOG_STATS_STALE_SECONDS}\n"
            f"and on ({by(replica(cfg)[:-1])})\n"
            f"  (sum by ({by(replica(cfg)[:-1])}) (rate({c.QUERY_TOKENS.sample_name}{sel(cfg, LOCAL)}[{W}])) "
            f"> {num(t.TRAFFIC_FLOOR_TOKENS_PER_SECOND)})",
            t.LOG_STALLED_FOR,
            "The vLLM log source has stopped producing stats lines while the server has traffic.",
            "cachemon on {{ $labels.instance }} has read no stats line from {{ $labels.file }} "
            "(upstream {{ $labels.upstream }}) for {{ $value | humanizeDuration }} although the server is "
            "serving prompts.",
        ),
    ]
    return out


def alert_group(cfg: MonitoringConfig, for_override: str | None = None) -> JsonObject:
    """``for_override`` exists for the integration test only; shipped files never set it."""
    return {"name": cfg.alert_group, "rules": [a.rule(cfg, for_override) for a in alerts(cfg)]}


def alert_names(cfg: MonitoringConfig) -> list[str]:
    return list(dict.fromkeys(a.name for a in alerts(cfg)))
