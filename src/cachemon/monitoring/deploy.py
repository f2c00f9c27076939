"""deploy/: Kubernetes manifests (``deploy_kubernetes.py``), the sidecar in deployments that already run
(``deploy_integrations.py``), a systemd unit and a compose stack (``deploy_host.py``): ``files`` writes
them all."""
from __future__ import annotations

from cachemon.jsontypes import JsonValue
from cachemon.monitoring import deploy_helm, serialise
from cachemon.monitoring.deploy_host import (
    SYSTEMD_EXEC,
    compose,
    grafana_dashboard_provider,
    grafana_datasource,
    systemd_install_lines,
    systemd_unit,
)
from cachemon.monitoring.deploy_integrations import (
    KSERVE_VLLM_PORT,
    LLMD_VLLM_PORT,
    existing_deployment,
    integration_files,
)
from cachemon.monitoring.deploy_kubernetes import (
    CHECKOV_SKIPS,
    GPU_RESOURCE,
    LABELS,
    NPU_RESOURCE,
    POD_SECURITY,
    SIDECAR_LABEL,
    VLLM_ASCEND_IMAGE,
    _skip_secret_false_positives,
    dashboard_configmaps,
    deployment,
    kustomization,
    network_policy,
    pod_monitors,
    prometheus_rule,
    service,
    service_monitors,
)
from cachemon.monitoring.site import MonitoringConfig

# What the tests and the generator read here, wherever it is made.
__all__ = ["CHECKOV_SKIPS", "GPU_RESOURCE", "KSERVE_VLLM_PORT", "LABELS", "LLMD_VLLM_PORT", "NPU_RESOURCE", "POD_SECURITY",
           "SIDECAR_LABEL", "SYSTEMD_EXEC", "VLLM_ASCEND_IMAGE", "deployment", "existing_deployment", "files",
           "grafana_dashboard_provider", "network_policy", "systemd_install_lines"]


def files(cfg: MonitoringConfig, rule_groups: list[JsonValue], dashboards: dict[str, str]) -> dict[str, str]:
    y = serialise.to_yaml
    return {
        "deploy/kubernetes/vllm-cachemon.yaml": serialise.to_yaml_docs(
            [deployment(cfg), service(cfg), network_policy(cfg, "vllm-tiny", LABELS, ["http", "cachemon-metrics"])],
            serialise.GENERATED),
        "deploy/kubernetes/podmonitor.yaml": serialise.to_yaml_docs(pod_monitors(cfg), serialise.GENERATED),
        # Not in kustomization.yaml: an alternative to podmonitor.yaml, never both (double scrape).
        "deploy/kubernetes/servicemonitor.yaml": serialise.to_yaml_docs(
            service_monitors(cfg),
            serialise.GENERATED + "# Use INSTEAD of podmonitor.yaml when your Prometheus selects only ServiceMonitors.\n"),
        "deploy/kubernetes/prometheusrule.yaml":
            _skip_secret_false_positives(y(prometheus_rule(cfg, rule_groups), serialise.GENERATED)),
        "deploy/kubernetes/grafana-dashboards.yaml":
            serialise.to_yaml_docs(dashboard_configmaps(cfg, dashboards), serialise.GENERATED),
        "deploy/kubernetes/kustomization.yaml": y(kustomization(), serialise.GENERATED),
        "deploy/systemd/cachemon.service": systemd_unit(cfg),
        "deploy/compose/compose.yaml": y(compose(cfg), serialise.GENERATED),
        "deploy/compose/grafana/provisioning/datasources/prometheus.yaml": y(grafana_datasource(), serialise.GENERATED),
        "deploy/compose/grafana/provisioning/dashboards/cachemon.yaml":
            y(grafana_dashboard_provider("/var/lib/grafana/dashboards/cachemon"), serialise.GENERATED),
        **integration_files(cfg),
        **deploy_helm.files(cfg, rule_groups, dashboards),
    }
