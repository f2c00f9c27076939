"""Generator settings: selectors, kept labels, thresholds, URLs, images, Kubernetes labels.

Default numbers live in ``cachemon.thresholds``; this holds what a deployment may want to
change (like a monitoring-mixin's ``_config``), all in ONE YAML file:

    cachemon monitoring --config site.yaml --out DIR

renders the whole bundle (Kubernetes manifests under DIR/deploy/kubernetes/) for the
namespace, selector and labels given there. Threshold fields left unset (None) follow
``cachemon.thresholds`` at render time.
"""
from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from cachemon import thresholds as t

# A Prometheus label name, and one `name op "value"` matcher of a selector.
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')
_DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")


@dataclass(frozen=True)
class HitRatioThresholds:
    warning: float
    critical: float


@dataclass(frozen=True)
class MonitoringConfig:
    # Label matchers (without braces) that select cachemon's and vLLM's scrape targets. The
    # operator's default job of a PodMonitor is "<namespace>/<name>"; the rendered PodMonitors
    # set job to cachemon_job / vllm_job, so an equality selector on job must name that job.
    cachemon_selector: str = 'job="cachemon"'
    vllm_selector: str = 'job="vllm"'
    cachemon_job: str = "cachemon"
    vllm_job: str = "vllm"
    # Target labels every recorded series and alert keeps besides job (per-replica series keep
    # all target labels). Alertmanager routes and inhibits by them (kube-prometheus-stack:
    # equal [namespace, alertname]), so dropping them merges unrelated alerts.
    target_labels: tuple[str, ...] = ("cluster", "namespace")
    # Hit-ratio alert thresholds; None = cachemon.thresholds. Per-model overrides by model_name.
    hit_ratio_warning: float | None = None
    hit_ratio_critical: float | None = None
    hit_ratio_for: str | None = None
    model_hit_ratio: dict[str, HitRatioThresholds] = field(default_factory=dict)
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
    model: str = "Qwen/Qwen2.5-0.5B-Instruct"
    namespace: str = "vllm"
    # kube-prometheus-stack selects PodMonitors and PrometheusRules by these labels
    # (its default: release=<helm release name>).
    operator_labels: dict[str, str] = field(default_factory=lambda: {"release": "kube-prometheus-stack"})
    # Grafana's dashboard sidecar: the label it watches ConfigMaps for, the annotation naming the folder.
    grafana_dashboard_label: dict[str, str] = field(default_factory=lambda: {"grafana_dashboard": "1"})
    grafana_folder_annotation: dict[str, str] = field(default_factory=lambda: {"grafana_folder": "cachemon"})

    def runbook_url(self, alertname: str) -> str:
        return f"{self.runbook_base_url}#{alertname.lower()}"

    def hit_ratio(self, model: str | None = None) -> HitRatioThresholds:
        """Thresholds for `model` (its override if any), else the site's / cachemon's defaults."""
        if model is not None and model in self.model_hit_ratio:
            return self.model_hit_ratio[model]
        return HitRatioThresholds(
            t.HIT_RATIO_WARNING if self.hit_ratio_warning is None else self.hit_ratio_warning,
            t.HIT_RATIO_CRITICAL if self.hit_ratio_critical is None else self.hit_ratio_critical)

    def alert_for(self) -> str:
        return self.hit_ratio_for or t.ALERT_FOR


DEFAULT = MonitoringConfig()
FIELDS = {f.name for f in dataclasses.fields(MonitoringConfig)}


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


def _ratio(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(f"{key}: expected a ratio in (0, 1], got {value!r}")
    return float(value)


def _labels(value: Any, key: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ValueError(f'{key}: expected a mapping of label name to string value, e.g. {{release: "kps"}}')
    return dict(value)


def _pair(d: Any, key: str, default: HitRatioThresholds) -> HitRatioThresholds:
    if not isinstance(d, dict) or not d or set(d) - {"warning", "critical"}:
        raise ValueError(f"{key}: expected a mapping with warning and/or critical")
    pair = HitRatioThresholds(_ratio(d.get("warning", default.warning), f"{key}.warning"),
                              _ratio(d.get("critical", default.critical), f"{key}.critical"))
    if pair.critical >= pair.warning:
        raise ValueError(f"{key}: critical ({pair.critical:g}) must be below warning ({pair.warning:g})")
    return pair


def validate(cfg: MonitoringConfig) -> MonitoringConfig:
    """Reject settings that would render rules Prometheus loads but that never match."""
    for key in ("cachemon_selector", "vllm_selector"):
        try:
            matchers = selector_matchers(getattr(cfg, key))
        except ValueError as e:
            raise ValueError(f"{key}: {e}") from None
        job = cfg.cachemon_job if key == "cachemon_selector" else cfg.vllm_job
        for name, op, value in matchers:
            if name == "job" and op == "=" and value != job:
                which = key.split("_")[0]
                raise ValueError(f'{key}: selects job="{value}" but the rendered scrape configs and PodMonitor '
                                 f'set job="{job}"; set {which}_job: "{value}" too')
    for name in cfg.target_labels:
        if not _LABEL.match(name) or name in ("job", "instance", "pod"):
            raise ValueError(f"target_labels: {name!r} is not a label name other than job/instance/pod")
    _pair({"warning": cfg.hit_ratio().warning, "critical": cfg.hit_ratio().critical}, "hit_ratio", cfg.hit_ratio())
    if cfg.hit_ratio_for is not None and not _DURATION.match(cfg.hit_ratio_for):
        raise ValueError(f"hit_ratio_for: not a Prometheus duration: {cfg.hit_ratio_for!r}")
    return cfg


def load(path: str | None) -> MonitoringConfig:
    if not path:
        return DEFAULT
    with open(path, encoding="utf-8") as f:
        try:
            data = yaml.safe_load(f) or {}
        except yaml.YAMLError as e:
            raise ValueError(f"{path}: not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of monitoring settings")
    unknown = sorted(set(data) - FIELDS)
    if unknown:
        raise ValueError(f"{path}: unknown monitoring config keys: {', '.join(unknown)}")
    try:
        for key in ("dashboard_tags", "target_labels"):
            if key in data:
                if not isinstance(data[key], list) or not all(isinstance(x, str) for x in data[key]):
                    raise ValueError(f"{key}: expected a list of strings")
                data[key] = tuple(data[key])
        for key in ("operator_labels", "grafana_dashboard_label", "grafana_folder_annotation"):
            if key in data:
                data[key] = _labels(data[key], key)
        for key in ("hit_ratio_warning", "hit_ratio_critical"):
            if key in data:
                data[key] = _ratio(data[key], key)
        base = dataclasses.replace(DEFAULT, **{k: v for k, v in data.items() if k != "model_hit_ratio"})
        per_model = data.get("model_hit_ratio") or {}
        if not isinstance(per_model, dict):
            raise ValueError("model_hit_ratio: expected a mapping of model_name to {warning, critical}")
        data["model_hit_ratio"] = {str(m): _pair(d, f"model_hit_ratio.{m}", base.hit_ratio())
                                   for m, d in per_model.items()}
        return validate(dataclasses.replace(DEFAULT, **data))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None
