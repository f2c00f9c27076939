"""Generator settings that are not thresholds: selectors, URLs, names of jobs and uids.

Thresholds and windows live in ``cachemon.thresholds``; this holds what a deployment
may want to change (like a monitoring-mixin's ``_config``). ``load`` overlays a YAML file
so `cachemon monitoring --config site.yaml --out DIR` renders a site-specific bundle.
"""
from __future__ import annotations

from dataclasses import dataclass

from cachemon.config import load_section, load_yaml


@dataclass(frozen=True)
class MonitoringConfig:
    # Label matchers (without braces) that select cachemon's and vLLM's scrape jobs.
    cachemon_selector: str = 'job="cachemon"'
    vllm_selector: str = 'job="vllm"'
    # Job names used in the example scrape configs; must agree with the selectors above.
    cachemon_job: str = "cachemon"
    vllm_job: str = "vllm"
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

    def runbook_url(self, alertname: str) -> str:
        return f"{self.runbook_base_url}#{alertname.lower()}"


DEFAULT = MonitoringConfig()


def load(path: str | None) -> MonitoringConfig:
    """DEFAULT overlaid with a YAML file; every field is checked against its annotated type."""
    if not path:
        return DEFAULT
    return load_section(MonitoringConfig, load_yaml(path), "")
