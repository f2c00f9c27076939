"""Kubernetes: the pod (vLLM + the cachemon sidecar, ``_sidecar``, the one container every pod spec
uses) and the full example (Deployment, Service, NetworkPolicy, monitors, PrometheusRule, dashboard
ConfigMaps, kustomization).

The PrometheusRule embeds the very rule groups written to ``prometheus/`` and ``alerts/`` and the
dashboard ConfigMaps embed the very JSON written to ``dashboards/``: the generator renders both from
one object, and a test compares them after parsing."""
from __future__ import annotations

from cachemon.jsontypes import JsonObject, JsonValue
from cachemon.monitoring.site import MonitoringConfig

APP = "vllm"
LABELS: JsonObject = {"app.kubernetes.io/name": APP, "app.kubernetes.io/instance": "vllm-tiny"}


def _cachemon_args(cfg: MonitoringConfig, vllm_port: int | None = None) -> list[str]:
    return ["run", f"--upstream=vllm=http://127.0.0.1:{vllm_port or cfg.vllm_port}/metrics",
            f"--listen=0.0.0.0:{cfg.cachemon_port}"]


# Pod Security Standards "restricted" (https://kubernetes.io/docs/concepts/security/pod-security-standards/):
# non-root, RuntimeDefault seccomp, no privilege escalation, every capability dropped.
POD_SECURITY: JsonObject = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY: JsonObject = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
NOBODY = 65534        # the cachemon image's user
VLLM_UID = 10001      # any non-root uid >= 10000 (checkov CKV_K8S_40); vLLM writes only to HOME and /tmp (emptyDirs)
VLLM_HOME = "/home/vllm"

# Accelerators. NPU: vllm-ascend's image (docs/source/conf.py `vllm_ascend_version` and the
# deployment tutorial template, vllm-project/vllm-ascend v0.23.0) and the resource name of Ascend's
# device plugin (MindCluster; docs/source/user_guide/deployment_guide/using_volcano_kthena.md, v0.23.0).
GPU_RESOURCE = "nvidia.com/gpu"
NPU_RESOURCE = "huawei.com/Ascend910"
VLLM_ASCEND_IMAGE = "quay.io/ascend/vllm-ascend:v0.23.0"
ACCELERATORS = ("gpu", "npu")

# Pods carrying the sidecar, for the PodMonitor; a Deployment / StatefulSet labelled so gets the sidecar
# from the kustomize component.
SIDECAR_LABEL = "cachemon.io/sidecar"
COMPONENT = "deploy/kubernetes/components/cachemon-sidecar"

# checkov (https://www.checkov.io) runs in the tests over everything under deploy/: 0 failures. The checks
# skipped on the workloads, with the reason checkov records (annotation checkov.io/skipN).
CHECKOV_SKIPS = {
    "CKV_K8S_43": "images are pinned to release tags; pin digests in your overlay (kustomize `images:` with `digest:`)",
    "CKV_K8S_15": "IfNotPresent with release tags: Always would make every pod restart depend on the registry",
}


def _checkov_annotations() -> JsonObject:
    return {f"checkov.io/skip{i}": f"{check}={reason}" for i, (check, reason) in enumerate(CHECKOV_SKIPS.items(), 1)}


def _sidecar(cfg: MonitoringConfig, vllm_port: int | None = None) -> JsonObject:
    def probe(path: str, period: int, failures: int) -> JsonObject:
        return {"httpGet": {"path": path, "port": "cachemon-metrics"}, "periodSeconds": period,
                "timeoutSeconds": 5, "failureThreshold": failures}
    return {
        "name": "cachemon", "image": cfg.cachemon_image, "imagePullPolicy": "IfNotPresent",
        "args": [*_cachemon_args(cfg, vllm_port)],
        "ports": [{"name": "cachemon-metrics", "containerPort": cfg.cachemon_port}],
        # /-/ready: listening and the first poll cycle has run, never "vLLM is up": an unready
        # sidecar takes the whole pod, vLLM included, out of the Service.
        "readinessProbe": probe("/-/ready", 10, 3),
        "livenessProbe": probe("/-/healthy", 20, 3),
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"cpu": "500m", "memory": "256Mi"}},
        "securityContext": {**CONTAINER_SECURITY, "runAsNonRoot": True, "runAsUser": NOBODY, "runAsGroup": NOBODY,
                            "readOnlyRootFilesystem": True, "seccompProfile": {"type": "RuntimeDefault"}},
    }


def _vllm_command(cfg: MonitoringConfig, accelerator: str) -> JsonObject:
    serve: list[JsonValue] = [cfg.model, "--port", str(cfg.vllm_port), "--enable-prefix-caching"]
    if accelerator == "npu":   # vllm-ascend's image runs /bin/bash by default (its Dockerfile's CMD)
        return {"command": ["vllm", "serve"], "args": serve}
    return {"args": ["--model", *serve[:1], *serve[1:]]}   # vllm/vllm-openai's entrypoint is the API server


def _vllm(cfg: MonitoringConfig, accelerator: str = "gpu") -> JsonObject:
    device = GPU_RESOURCE if accelerator == "gpu" else NPU_RESOURCE
    health: JsonObject = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10}
    return {
        "name": "vllm", "image": cfg.vllm_image if accelerator == "gpu" else VLLM_ASCEND_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        **_vllm_command(cfg, accelerator),
        "env": [{"name": "HOME", "value": VLLM_HOME}, {"name": "HF_HOME", "value": f"{VLLM_HOME}/.cache/huggingface"}],
        "ports": [{"name": "http", "containerPort": cfg.vllm_port}],
        # Model download and load: up to 30 minutes before liveness counts.
        "startupProbe": {**health, "failureThreshold": 180},
        "readinessProbe": health,
        "livenessProbe": {**health, "timeoutSeconds": 5, "failureThreshold": 6},
        # Extended resources (GPU / NPU): requests equal limits.
        "resources": {"requests": {"cpu": "4", "memory": "16Gi", device: 1},
                      "limits": {"cpu": "8", "memory": "32Gi", device: 1}},
        "volumeMounts": [{"name": "home", "mountPath": VLLM_HOME}, {"name": "tmp", "mountPath": "/tmp"},
                         {"name": "dshm", "mountPath": "/dev/shm"}],
        "securityContext": {**CONTAINER_SECURITY, "runAsUser": VLLM_UID, "runAsGroup": VLLM_UID,
                            "readOnlyRootFilesystem": True},
    }


def _pod_spec(cfg: MonitoringConfig, accelerator: str, sidecar: bool) -> JsonObject:
    return {
        # Neither vLLM nor cachemon talks to the Kubernetes API.
        "automountServiceAccountToken": False,
        "securityContext": {**POD_SECURITY, "fsGroup": VLLM_UID},
        # The sidecar polls vLLM over the pod's loopback: no Service hop, same lifecycle.
        "containers": [_vllm(cfg, accelerator), *([_sidecar(cfg)] if sidecar else [])],
        "volumes": [{"name": "home", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}},
                    {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}}],
    }


def deployment(cfg: MonitoringConfig, accelerator: str = "gpu") -> JsonObject:
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "vllm-tiny", "namespace": cfg.namespace, "labels": LABELS,
                     "annotations": _checkov_annotations()},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": LABELS},
            "template": {
                "metadata": {"labels": LABELS,
                             # Opt-in for the plain pod-discovery scrape config in prometheus/.
                             "annotations": {"cachemon.io/scrape": "true"}},
                "spec": _pod_spec(cfg, accelerator, sidecar=True),
            },
        },
    }


def network_policy(cfg: MonitoringConfig, name: str, pod_labels: JsonObject, ports: list[str]) -> JsonObject:
    """Ingress only to the named ports (vLLM's API, cachemon's /metrics); egress stays open (model downloads)."""
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": cfg.namespace},
        "spec": {"podSelector": {"matchLabels": pod_labels}, "policyTypes": ["Ingress"],
                 "ingress": [{"ports": [{"port": port, "protocol": "TCP"} for port in ports]}]},
    }


def service(cfg: MonitoringConfig) -> JsonObject:
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "vllm-tiny", "namespace": cfg.namespace, "labels": LABELS},
        "spec": {"selector": LABELS, "ports": [
            {"name": "http", "port": cfg.vllm_port, "targetPort": "http"},
            {"name": "cachemon-metrics", "port": cfg.cachemon_port, "targetPort": "cachemon-metrics"},
        ]},
    }


def _endpoint(job: str, port: str) -> JsonObject:
    return {
        "port": port, "path": "/metrics", "interval": "15s",
        # The operator's default job is <namespace>/<name>; the alerts select cachemon_selector,
        # whose job config.validate keeps equal to cachemon_job.
        "relabelings": [
            {"action": "replace", "targetLabel": "job", "replacement": job},
            {"action": "replace", "sourceLabels": ["__meta_kubernetes_pod_name"], "targetLabel": "instance"},
        ],
    }


def _monitors(cfg: MonitoringConfig, kind: str, endpoints_key: str) -> list[JsonObject]:
    return [{
        "apiVersion": "monitoring.coreos.com/v1", "kind": kind,
        "metadata": {"name": name, "namespace": cfg.namespace, "labels": dict(cfg.operator_labels)},
        "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": APP}},
                 endpoints_key: [_endpoint(job, port)]},
    } for name, job, port in (("cachemon", cfg.cachemon_job, "cachemon-metrics"), ("vllm", cfg.vllm_job, "http"))]


def pod_monitors(cfg: MonitoringConfig) -> list[JsonObject]:
    return _monitors(cfg, "PodMonitor", "podMetricsEndpoints")


def service_monitors(cfg: MonitoringConfig) -> list[JsonObject]:
    """The same scrape through the Service, for Prometheus setups that select only ServiceMonitors."""
    return _monitors(cfg, "ServiceMonitor", "endpoints")


# checkov's secrets scan (detect-secrets' Base64HighEntropyString) takes long recording-rule names (the
# ratio rules', the tenant isolation rule's) for secrets. Skipped on those lines only, with the reason,
# by checkov's inline comment.
SECRET_SKIP = "  # checkov:skip=CKV_SECRET_6: a Prometheus recording-rule name, not a secret"


def _skip_secret_false_positives(text: str) -> str:
    return "".join(line + SECRET_SKIP + "\n" if line.lstrip().startswith("- record: ") and
                   ("_per_" in line or "isolation_" in line) else line + "\n" for line in text.splitlines())


def prometheus_rule(cfg: MonitoringConfig, groups: list[JsonValue]) -> JsonObject:
    return {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
        "metadata": {"name": "cachemon", "namespace": cfg.namespace,
                     "labels": {**cfg.operator_labels, "role": "alert-rules"}},
        "spec": {"groups": groups},
    }


def dashboard_configmaps(cfg: MonitoringConfig, dashboards: dict[str, str]) -> list[JsonObject]:
    return [{
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": f"grafana-dashboard-{name.removesuffix('.json')}", "namespace": cfg.namespace,
                     # Picked up by Grafana's dashboard sidecar (kube-prometheus-stack default label),
                     # filed in the folder the annotation names (sidecar folderAnnotation).
                     "labels": dict(cfg.grafana_dashboard_label),
                     "annotations": dict(cfg.grafana_folder_annotation)},
        "data": {name: text},
    } for name, text in sorted(dashboards.items())]


def kustomization() -> JsonObject:
    return {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "resources": ["vllm-cachemon.yaml", "podmonitor.yaml", "prometheusrule.yaml", "grafana-dashboards.yaml"]}
