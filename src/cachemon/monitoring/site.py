"""Generator settings: selectors, kept labels, thresholds, URLs, images, Kubernetes labels.

Default numbers live in ``cachemon.thresholds``; this holds what a deployment may want to
change (like a monitoring-mixin's ``_config``), all in ONE YAML file:

    cachemon monitoring --config site.yaml --out DIR

renders the whole bundle (Kubernetes manifests under DIR/deploy/kubernetes/) for the
namespace, selector and labels given there. Threshold fields left unset (None) follow
``cachemon.thresholds`` at render time. Every key is a typed setting of cachemon.config's
loader: a bad value is one ConfigError line naming its key.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TypeVar

from cachemon import thresholds as t
from cachemon.config import (
    DURATION_RE,
    ConfigError,
    Parser,
    check_keys,
    list_of,
    load_section,
    load_yaml,
    mapping_of,
    optional,
    setting,
    string,
    subkey,
    text,
)

T = TypeVar("T")

# A Prometheus label name, and one `name op "value"` matcher of a selector.
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')


@dataclass(frozen=True)
class HitRatioThresholds:
    warning: float
    critical: float


def selector_matchers(selector: str) -> list[tuple[str, str, str]]:
    """`a="x", b=~"y"` -> [(a, =, x), (b, =~, y)]; ValueError if it is not such a list."""
    out, pos = [], 0
    while pos < len(selector):
        m = _MATCHER.match(selector, pos)
        if not m:
            raise ValueError(f'not a list of label matchers like job="cachemon": {selector!r}')
        out.append((m.group(1), m.group(2), json.loads(f'"{m.group(3)}"')))
        pos = m.end()
    if not out:
        raise ValueError("empty selector")
    return out


def _selector(v: object, k: str) -> str:
    s = text(v, k)
    try:
        selector_matchers(s)
    except ValueError as e:
        raise ConfigError(k, str(e)) from None
    return s


def _ratio(v: object, k: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
        raise ConfigError(k, f"expected a ratio in (0, 1], got {v!r}")
    return float(v)


def _label_name(v: object, k: str) -> str:
    if not isinstance(v, str) or not _LABEL.match(v) or v in ("job", "instance", "pod"):
        raise ConfigError(k, f"expected a label name other than job / instance / pod, got {v!r}")
    return v


def _labels(v: object, k: str) -> dict[str, str]:
    labels = mapping_of(string, what='a mapping of label name to string value, e.g. {release: "kps"}')(v, k)
    for name in labels:
        if not isinstance(name, str) or not re.match(r"^[a-zA-Z0-9]([-a-zA-Z0-9_./]*[a-zA-Z0-9])?$", name):
            raise ConfigError(subkey(k, name), "not a Kubernetes label / annotation key")
    out: dict[str, str] = labels
    return out


def _duration(v: object, k: str) -> str:
    if not isinstance(v, str) or not v or not DURATION_RE.fullmatch(v):
        raise ConfigError(k, f"expected a Prometheus duration such as 5m, got {v!r}")
    return v


def _model_overrides(v: object, k: str) -> dict[str, dict[str, float]]:
    """{model_name: {warning, critical}}; a side left out inherits the site's default at render time."""
    def one(d: object, key: str) -> dict[str, float]:
        if not isinstance(d, dict) or not d:
            raise ConfigError(key, "expected a mapping with warning and/or critical")
        check_keys(d, ("warning", "critical"), key)
        return {side: _ratio(x, subkey(key, side)) for side, x in d.items()}
    models: dict[str, dict[str, float]] = mapping_of(one, what="a mapping of model_name to {warning, critical}")(v, k)
    return models


def _tuple_of(parse: Parser[T]) -> Parser[tuple[T, ...]]:
    return lambda v, k: tuple(list_of(parse)(v, k))


@dataclass(frozen=True)
class MonitoringConfig:
    # Label matchers (without braces) that select cachemon's and vLLM's scrape targets. The
    # operator's default job of a PodMonitor is "<namespace>/<name>"; the rendered PodMonitors
    # set job to cachemon_job / vllm_job, so an equality matcher on job must name that job.
    cachemon_selector: str = setting(_selector, 'job="cachemon"')
    vllm_selector: str = setting(_selector, 'job="vllm"')
    cachemon_job: str = setting(text, "cachemon")
    vllm_job: str = setting(text, "vllm")
    # Target labels every recorded series and alert keeps besides job (per-replica series keep
    # all target labels). Alertmanager routes and inhibits by them (kube-prometheus-stack:
    # equal [namespace, alertname]), so dropping them merges unrelated alerts.
    target_labels: tuple[str, ...] = setting(_tuple_of(_label_name), ("cluster", "namespace"))
    # Hit-ratio alert thresholds; None = cachemon.thresholds. Per-model overrides by model_name.
    hit_ratio_warning: float | None = setting(optional(_ratio), None)
    hit_ratio_critical: float | None = setting(optional(_ratio), None)
    hit_ratio_for: str | None = setting(optional(_duration), None)
    model_hit_ratio: dict[str, dict[str, float]] = setting(_model_overrides, default_factory=dict)
    cachemon_port: int = 9867
    vllm_port: int = 8000
    # Alerts link to "<runbook_base_url>#<lower-case alert name>".
    runbook_base_url: str = "https://github.com/cachemon/cachemon/blob/main/docs/runbook.md"
    alert_group: str = "cachemon-alerts"
    recording_group: str = "cachemon-recording"
    dashboard_tags: tuple[str, ...] = ("cachemon", "vllm", "prefix-cache")
    dashboard_uid_prefix: str = "cachemon"
    dashboard_title_prefix: str = "cachemon / "
    # Images for deploy/ (kubernetes, compose).
    vllm_image: str = "vllm/vllm-openai:v0.32.0"
    cachemon_image: str = "ghcr.io/cachemon/cachemon:0.1.0"
    prometheus_image: str = "prom/prometheus:v2.53.0"
    grafana_image: str = "grafana/grafana:11.1.0"
    alertmanager_image: str = "prom/alertmanager:v0.27.0"
    alertmanager_port: int = 9093
    demo_vllm_port: int = 18000       # `cachemon demo`'s fake vLLM (--vllm-listen)
    model: str = "Qwen/Qwen2.5-0.5B-Instruct"
    namespace: str = "vllm"
    # Unit of the cost panels: Grafana's currency<CODE> (USD, EUR, GBP, ...); match `cost.currency`.
    currency: str = "USD"
    # kube-prometheus-stack selects PodMonitors and PrometheusRules by these labels
    # (its default: release=<helm release name>).
    operator_labels: dict[str, str] = setting(_labels, default_factory=lambda: {"release": "kube-prometheus-stack"})
    # Grafana's dashboard sidecar: the label it watches ConfigMaps for, the annotation naming the folder.
    grafana_dashboard_label: dict[str, str] = setting(_labels, default_factory=lambda: {"grafana_dashboard": "1"})
    grafana_folder_annotation: dict[str, str] = setting(_labels, default_factory=lambda: {"grafana_folder": "cachemon"})

    def runbook_url(self, alertname: str) -> str:
        return f"{self.runbook_base_url}#{alertname.lower()}"

    def hit_ratio(self, model: str | None = None) -> HitRatioThresholds:
        """Thresholds for `model` (its override, the side it leaves out from the default), else the defaults."""
        default = HitRatioThresholds(
            t.HIT_RATIO_WARNING if self.hit_ratio_warning is None else self.hit_ratio_warning,
            t.HIT_RATIO_CRITICAL if self.hit_ratio_critical is None else self.hit_ratio_critical)
        override = self.model_hit_ratio.get(model, {}) if model is not None else {}
        return HitRatioThresholds(override.get("warning", default.warning), override.get("critical", default.critical))

    def alert_for(self) -> str:
        return self.hit_ratio_for or t.ALERT_FOR


DEFAULT = MonitoringConfig()


def validate(cfg: MonitoringConfig) -> MonitoringConfig:
    """Cross-key checks: rules Prometheus would load but that could never match or never alert right."""
    for key, job in (("cachemon_selector", cfg.cachemon_job), ("vllm_selector", cfg.vllm_job)):
        for name, op, value in selector_matchers(getattr(cfg, key)):
            if name == "job" and op == "=" and value != job:
                raise ConfigError(key, f'selects job="{value}" but the rendered scrape configs and PodMonitor set '
                                       f'job="{job}"; set {key.split("_")[0]}_job: "{value}" too')
    for model in (None, *sorted(cfg.model_hit_ratio)):
        pair = cfg.hit_ratio(model)
        if pair.critical >= pair.warning:
            where = "hit_ratio_critical" if model is None else subkey("model_hit_ratio", model)
            raise ConfigError(where, f"critical ({pair.critical:g}) must be below warning ({pair.warning:g})")
    return cfg


def load(path: str | None) -> MonitoringConfig:
    """DEFAULT overlaid with a YAML file; every field is checked against its annotated type."""
    if not path:
        return DEFAULT
    return validate(load_section(MonitoringConfig, load_yaml(path), ""))
