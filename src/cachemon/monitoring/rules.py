"""Recording rules and alerts, as Prometheus rule groups (plain dicts).

Every metric name comes from ``cachemon.catalog`` and every number from
``cachemon.thresholds``; the alerts read the recorded ratios so that the dashboards, the
alerts and `promtool test rules` all look at the same series.

The hit ratio is computed from the reset-corrected token counters (``rate(hit) /
rate(query)``, cache="local"), never from cachemon's own ``*_hit_ratio`` gauge: rates
aggregate correctly across engines and replicas, a ratio of ratios does not.
"""
from __future__ import annotations

from dataclasses import dataclass

from cachemon import catalog as c
from cachemon import thresholds as t
from cachemon.monitoring.config import MonitoringConfig

# Aggregation levels of the recorded series: name -> labels kept. The level name is the
# first part of the `level:metric:operation` rule name. `upstream` stays with `instance`:
# one cachemon instance may poll several vLLM servers, and a replica is (instance, upstream).
LEVELS = {
    "model_instance_engine": ("job", "instance", c.UPSTREAM, c.MODEL, c.ENGINE),
    "model_instance": ("job", "instance", c.UPSTREAM, c.MODEL),
    "model": ("job", c.MODEL),
    "job": ("job",),
}
LOCAL = f'{c.CACHE}="local"'   # vLLM's own KV cache; external (KV connector) is a different cache
REPLICA = LEVELS["model_instance"][:3]   # (job, instance, upstream): labels of per-upstream metrics


def num(x: float) -> str:
    """A threshold as PromQL wants it (0.8, not 0.80000001)."""
    return f"{x:g}"


def pct(x: float) -> str:
    return f"{x * 100:g}%"


def by(labels) -> str:
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


def recording_group(cfg: MonitoringConfig) -> dict:
    rules = []
    for w in t.RATIO_WINDOWS:
        finest = next(iter(LEVELS))
        for spec in (c.HIT_TOKENS, c.QUERY_TOKENS):
            rules.append({
                "record": rec_rate(finest, spec, w),
                "expr": f"sum by ({by(LEVELS[finest])}) (rate({spec.sample_name}{sel(cfg, LOCAL)}[{w}]))",
            })
        # Coarser levels sum the finer recorded rates (cheap, and consistent with them).
        for level, labels in list(LEVELS.items())[1:]:
            for spec in (c.HIT_TOKENS, c.QUERY_TOKENS):
                rules.append({"record": rec_rate(level, spec, w),
                              "expr": f"sum by ({by(labels)}) ({rec_rate(finest, spec, w)})"})
        for level in LEVELS:
            # `> 0` drops idle series instead of producing NaN (0/0) or a fake 0 %.
            rules.append({"record": rec_ratio(level, w),
                          "expr": f"{rec_rate(level, c.HIT_TOKENS, w)}\n  / ({rec_rate(level, c.QUERY_TOKENS, w)} > 0)"})
    return {"name": cfg.recording_group, "rules": rules}


# --- alerts -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Alert:
    name: str
    severity: str
    expr: str
    for_: str
    summary: str
    description: str

    def rule(self, cfg: MonitoringConfig, for_override: str | None = None) -> dict:
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


def alerts(cfg: MonitoringConfig) -> list[Alert]:
    s = sel(cfg)
    floor = traffic_floor()
    out = []
    for severity, threshold in (("warning", t.HIT_RATIO_WARNING), ("critical", t.HIT_RATIO_CRITICAL)):
        out.append(Alert(
            "CachemonPrefixCacheHitRatioLow", severity,
            f"{RATIO} < {num(threshold)}\nand {floor}",
            t.ALERT_FOR,
            "Prefix-cache hit ratio is low.",
            f"Prefix-cache hit ratio of {WHERE} is {{{{ $value | humanizePercentage }}}} over the last {W}, "
            f"below the {pct(threshold)} {severity} threshold.",
        ))
    out += [
        Alert(
            "CachemonExporterDown", "critical",
            f"up{{{cfg.cachemon_selector}}} == 0",
            t.DOWN_FOR,
            "The cachemon exporter cannot be scraped.",
            "Prometheus cannot scrape cachemon at {{ $labels.instance }} (job {{ $labels.job }}); "
            "all prefix-cache alerts for it are blind.",
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
            f"(\n  {RATIO}\n  < on ({by(REPLICA)}) group_left()\n"
            f"  (max by ({by(REPLICA)}) ({RATIO} offset {t.CHANGE_LOOKBACK}) - {num(t.CHANGE_DROP)})\n)\n"
            f"and on ({by(REPLICA)})\n"
            f"  (sum by ({by(REPLICA)}) (increase({c.CHANGES.sample_name}{s}[{t.CHANGE_LOOKBACK}])) > 0)\n"
            f"and {floor}",
            t.ALERT_FOR,
            "Prefix-cache hit ratio dropped sharply after a change on the upstream.",
            f"Prefix-cache hit ratio of {WHERE} fell to {{{{ $value | humanizePercentage }}}}, more than "
            f"{num(t.CHANGE_DROP * 100)} points below its value {t.CHANGE_LOOKBACK} ago, right after a model, "
            "vLLM version, tokenizer, chat template or cache config change.",
        ),
        Alert(
            "CachemonHitRatioNotRecovered", "warning",
            f"{RATIO} < {num(t.HIT_RATIO_WARNING)}\n"
            f"and on ({by(REPLICA)}) (\n"
            f"    sum by ({by(REPLICA)}) (increase({c.RESTARTS.sample_name}{s}[{t.CHANGE_LOOKBACK}])) > 0\n"
            f"  or\n"
            f"    sum by ({by(REPLICA)}) (increase({c.CACHE_RESETS.sample_name}{s}[{t.CHANGE_LOOKBACK}])) > 0\n"
            f")\n"
            # Only replicas that were healthy before the event: otherwise this is just HitRatioLow.
            f"and on ({by(REPLICA)}) (max by ({by(REPLICA)}) ({RATIO} offset {t.CHANGE_LOOKBACK})"
            f" >= {num(t.HIT_RATIO_WARNING)})\n"
            f"and {floor}",
            t.RECOVERY_FOR,
            "Prefix-cache hit ratio has not recovered after a restart or cache reset.",
            f"Prefix-cache hit ratio of {WHERE} is still {{{{ $value | humanizePercentage }}}}, below "
            f"{pct(t.HIT_RATIO_WARNING)}, {t.RECOVERY_FOR} after a vLLM restart or prefix-cache reset; "
            f"it was at or above {pct(t.HIT_RATIO_WARNING)} before.",
        ),
        Alert(
            "CachemonReplicaHitRatioSkew", "warning",
            f"{RATIO}\n  < on (job, {c.MODEL}) group_left()\n  ({FLEET_RATIO} - {num(t.SKEW_DROP)})\nand {floor}",
            t.SKEW_FOR,
            "One replica's prefix-cache hit ratio is far below its model's fleet.",
            f"Prefix-cache hit ratio of {WHERE} is {{{{ $value | humanizePercentage }}}}, more than "
            f"{num(t.SKEW_DROP * 100)} points below the fleet ratio of the model: requests sharing a prefix "
            "are not reaching the replica that has it cached.",
        ),
        Alert(
            "CachemonKVCacheNearlyFull", "warning",
            f"max by ({by(LEVELS['model_instance'])}) ({c.KV_CACHE_USAGE.sample_name}{s}) > {num(t.KV_CACHE_USAGE_HIGH)}",
            t.KV_CACHE_FOR,
            "KV cache is nearly full, cached prefixes are being evicted.",
            f"KV-cache usage of {WHERE} is {{{{ $value | humanizePercentage }}}}, above "
            f"{pct(t.KV_CACHE_USAGE_HIGH)} for {t.KV_CACHE_FOR}: cached prefix blocks are evicted before reuse.",
        ),
        Alert(
            "CachemonKVCachePreemptionSpike", "warning",
            f"sum by ({by(LEVELS['model_instance'])}) (rate({c.PREEMPTIONS.sample_name}{s}[{W}])) "
            f"> {num(t.PREEMPTIONS_PER_SECOND_HIGH)}",
            t.PREEMPTIONS_FOR,
            "The vLLM scheduler is preempting requests for lack of KV cache.",
            f"{WHERE[0].upper()}{WHERE[1:]} preempts {{{{ printf \"%.2f\" $value }}}} requests per second "
            f"(threshold {num(t.PREEMPTIONS_PER_SECOND_HIGH)}/s): the KV cache is too small for the load.",
        ),
        Alert(
            "CachemonLogSourceStalled", "warning",
            f"max by (job, instance, {c.UPSTREAM}, {c.FILE}) ({c.LOG_STATS_AGE.sample_name}{s}) > {t.LOG_STATS_STALE_SECONDS}\n"
            f"and on (job, instance)\n"
            f"  (sum by (job, instance) (rate({c.QUERY_TOKENS.sample_name}{sel(cfg, LOCAL)}[{W}])) "
            f"> {num(t.TRAFFIC_FLOOR_TOKENS_PER_SECOND)})",
            t.LOG_STALLED_FOR,
            "The vLLM log source has stopped producing stats lines while the server has traffic.",
            "cachemon on {{ $labels.instance }} has read no stats line from {{ $labels.file }} "
            "(upstream {{ $labels.upstream }}) for {{ $value | humanizeDuration }} although the server is "
            "serving prompts.",
        ),
    ]
    return out


def alert_group(cfg: MonitoringConfig, for_override: str | None = None) -> dict:
    """``for_override`` exists for the integration test only; shipped files never set it."""
    return {"name": cfg.alert_group, "rules": [a.rule(cfg, for_override) for a in alerts(cfg)]}


def alert_names(cfg: MonitoringConfig) -> list[str]:
    return list(dict.fromkeys(a.name for a in alerts(cfg)))
