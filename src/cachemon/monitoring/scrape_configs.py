"""Prometheus server configs: the shipped examples, the compose one and the test one.

All of them scrape both cachemon (job ``cfg.cachemon_job``: the normalised prefix-cache
series the alerts read) and vLLM itself (job ``cfg.vllm_job``: its TTFT and prefill
histograms, which the overview dashboard plots next to the hit ratio).
"""
from __future__ import annotations

from cachemon.jsontypes import JsonObject, as_list, as_object
from cachemon.monitoring.site import MonitoringConfig

RULE_FILES = ("recording_rules.yaml", "../alerts/cachemon-alerts.yaml")


def _global(interval: str = "15s") -> JsonObject:
    return {"scrape_interval": interval, "evaluation_interval": interval}


def _alerting(target: str) -> JsonObject:
    """Where the alerts go: an Alertmanager (examples/alertmanager.yml is a starting config)."""
    return {"alertmanagers": [{"static_configs": [{"targets": [target]}]}]}


def static(cfg: MonitoringConfig) -> JsonObject:
    """Sidecar next to `vllm serve` on one host: both ports on localhost."""
    return {
        "global": _global(),
        "rule_files": list(RULE_FILES),
        "alerting": _alerting(f"localhost:{cfg.alertmanager_port}"),
        "scrape_configs": [
            {"job_name": cfg.cachemon_job,
             "static_configs": [{"targets": [f"localhost:{cfg.cachemon_port}"], "labels": {"replica": "vllm-0"}}]},
            {"job_name": cfg.vllm_job,
             "static_configs": [{"targets": [f"localhost:{cfg.vllm_port}"], "labels": {"replica": "vllm-0"}}]},
        ],
    }


def file_sd(cfg: MonitoringConfig) -> JsonObject:
    """Targets from files that deployment tooling rewrites; Prometheus re-reads them on change."""
    return {
        "global": _global(),
        "rule_files": list(RULE_FILES),
        "alerting": _alerting(f"localhost:{cfg.alertmanager_port}"),
        "scrape_configs": [
            {"job_name": cfg.cachemon_job, "file_sd_configs": [{"files": ["targets/cachemon-*.json"], "refresh_interval": "1m"}]},
            {"job_name": cfg.vllm_job, "file_sd_configs": [{"files": ["targets/vllm-*.json"], "refresh_interval": "1m"}]},
        ],
    }


def file_sd_targets(cfg: MonitoringConfig) -> dict[str, list[JsonObject]]:
    hosts = ("gpu-node-1", "gpu-node-2")
    return {
        "cachemon-example.json": [{"targets": [f"{h}:{cfg.cachemon_port}" for h in hosts], "labels": {"cluster": "example"}}],
        "vllm-example.json": [{"targets": [f"{h}:{cfg.vllm_port}" for h in hosts], "labels": {"cluster": "example"}}],
    }


def _pod_job(job: str, port_name: str) -> JsonObject:
    # Keep pods that opt in with the annotation, one target per named container port. The
    # job label stays the job_name, which the alert selectors (job="...") expect.
    return {
        "job_name": job,
        "kubernetes_sd_configs": [{"role": "pod"}],
        "relabel_configs": [
            {"source_labels": ["__meta_kubernetes_pod_annotation_cachemon_io_scrape"], "regex": "true", "action": "keep"},
            {"source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": port_name, "action": "keep"},
            {"source_labels": ["__meta_kubernetes_pod_phase"], "regex": "Pending|Succeeded|Failed|Completed", "action": "drop"},
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            # instance = pod name: cachemon's and vLLM's series of one pod share it.
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "instance"},
            {"source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"], "target_label": "deployment"},
        ],
    }


# Header of prometheus/prometheus-kubernetes.yml. Debian's prometheus/promtool packages are built
# without Kubernetes service discovery, so promtool there rejects the file outright.
KUBERNETES_NOTE = """\
# Pod discovery for a Prometheus WITHOUT the operator (with it: deploy/kubernetes/podmonitor.yaml).
# Check it with the promtool of an upstream Prometheus release: `promtool check config` of Debian's
# (and Ubuntu's) prometheus package fails here with "field kubernetes_sd_configs not found in type
# config.ScrapeConfig", because the distribution builds Prometheus without Kubernetes discovery.
# cachemon's tests check the rest (relabelling, rule files) with the discovery swapped for static targets.
"""


def kubernetes(cfg: MonitoringConfig) -> JsonObject:
    """Pod discovery for Prometheus without the operator (with it, use deploy/kubernetes/podmonitor.yaml)."""
    return {
        "global": _global(),
        "rule_files": list(RULE_FILES),
        "scrape_configs": [_pod_job(cfg.cachemon_job, "cachemon-metrics"), _pod_job(cfg.vllm_job, "http")],
    }


def compose(cfg: MonitoringConfig, vllm_target: str | None = None, interval: str = "15s") -> JsonObject:
    """deploy/compose/prometheus.yml; with ``vllm_target`` the demo's (the fake vLLM inside the
    cachemon container)."""
    return {
        "global": _global(interval),
        "rule_files": ["/etc/prometheus/rules/recording_rules.yaml", "/etc/prometheus/rules/cachemon-alerts.yaml"],
        "alerting": _alerting(f"alertmanager:{cfg.alertmanager_port}"),
        "scrape_configs": [
            {"job_name": cfg.cachemon_job, "static_configs": [{"targets": [f"cachemon:{cfg.cachemon_port}"]}]},
            {"job_name": cfg.vllm_job, "static_configs": [{"targets": [vllm_target or f"vllm:{cfg.vllm_port}"]}]},
        ],
    }


def demo(cfg: MonitoringConfig) -> JsonObject:
    """prometheus/prometheus-demo.yml: `make demo` on this host (cachemon :9867, its fake vLLM :18000)."""
    out = static(cfg)
    out["global"] = _global("5s")
    for job, port in zip(as_list(out["scrape_configs"]), (cfg.cachemon_port, cfg.demo_vllm_port), strict=True):
        as_object(job)["static_configs"] = [{"targets": [f"localhost:{port}"]}]
    return out


def for_test(cfg: MonitoringConfig, cachemon_target: str, vllm_target: str, rule_files: list[str],
             interval: str = "1s") -> JsonObject:
    """The integration test's config: same jobs as the examples, 1 s intervals."""
    return {
        "global": _global(interval),
        "rule_files": [*rule_files],
        "scrape_configs": [
            {"job_name": cfg.cachemon_job, "static_configs": [{"targets": [cachemon_target]}]},
            {"job_name": cfg.vllm_job, "static_configs": [{"targets": [vllm_target]}]},
        ],
    }
