"""deploy/: Kubernetes manifests, a systemd unit and a compose stack.

The PrometheusRule embeds the very rule groups written to ``prometheus/`` and ``alerts/``
and the dashboard ConfigMaps embed the very JSON written to ``dashboards/``: the
generator renders both from one object, and a test compares them after parsing.

Besides the full example (vLLM + sidecar, GPU), the sidecar goes into deployments that already
run (deploy/kubernetes/README.md): a kustomize component, vLLM production-stack's Helm chart
(a post-renderer using that component), llm-d's modelservice chart (values) and KServe (an
InferenceService with the sidecar in ``predictor.containers``); each for GPU and for NPU
(vllm-ascend). Every pod spec is the same sidecar container, ``_sidecar``.
"""
from __future__ import annotations

from typing import Any

from cachemon import __version__
from cachemon.monitoring import compose_demo, render
from cachemon.monitoring.config import MonitoringConfig

APP = "vllm"
LABELS = {"app.kubernetes.io/name": APP, "app.kubernetes.io/instance": "vllm-tiny"}


def _cachemon_args(cfg: MonitoringConfig, vllm_port: int | None = None) -> list[str]:
    return ["run", f"--upstream=vllm=http://127.0.0.1:{vllm_port or cfg.vllm_port}/metrics",
            f"--listen=0.0.0.0:{cfg.cachemon_port}"]


# Pod Security Standards "restricted" (https://kubernetes.io/docs/concepts/security/pod-security-standards/):
# non-root, RuntimeDefault seccomp, no privilege escalation, every capability dropped.
POD_SECURITY = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
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


def _checkov_annotations() -> dict[str, str]:
    return {f"checkov.io/skip{i}": f"{check}={reason}" for i, (check, reason) in enumerate(CHECKOV_SKIPS.items(), 1)}


def _sidecar(cfg: MonitoringConfig, vllm_port: int | None = None) -> dict[str, Any]:
    def probe(path: str, period: int, failures: int) -> dict[str, Any]:
        return {"httpGet": {"path": path, "port": "cachemon-metrics"}, "periodSeconds": period,
                "timeoutSeconds": 5, "failureThreshold": failures}
    return {
        "name": "cachemon", "image": cfg.cachemon_image, "imagePullPolicy": "IfNotPresent",
        "args": _cachemon_args(cfg, vllm_port),
        "ports": [{"name": "cachemon-metrics", "containerPort": cfg.cachemon_port}],
        # /-/ready: listening and the first poll cycle has run, never "vLLM is up": an unready
        # sidecar takes the whole pod, vLLM included, out of the Service.
        "readinessProbe": probe("/-/ready", 10, 3),
        "livenessProbe": probe("/-/healthy", 20, 3),
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"cpu": "500m", "memory": "256Mi"}},
        "securityContext": {**CONTAINER_SECURITY, "runAsNonRoot": True, "runAsUser": NOBODY, "runAsGroup": NOBODY,
                            "readOnlyRootFilesystem": True, "seccompProfile": {"type": "RuntimeDefault"}},
    }


def _vllm_command(cfg: MonitoringConfig, accelerator: str) -> dict[str, Any]:
    serve = [cfg.model, "--port", str(cfg.vllm_port), "--enable-prefix-caching"]
    if accelerator == "npu":   # vllm-ascend's image runs /bin/bash by default (its Dockerfile's CMD)
        return {"command": ["vllm", "serve"], "args": serve}
    return {"args": ["--model", *serve[:1], *serve[1:]]}   # vllm/vllm-openai's entrypoint is the API server


def _vllm(cfg: MonitoringConfig, accelerator: str = "gpu") -> dict[str, Any]:
    device = GPU_RESOURCE if accelerator == "gpu" else NPU_RESOURCE
    health = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10}
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


def _pod_spec(cfg: MonitoringConfig, accelerator: str, sidecar: bool) -> dict[str, Any]:
    return {
        # Neither vLLM nor cachemon talks to the Kubernetes API.
        "automountServiceAccountToken": False,
        "securityContext": {**POD_SECURITY, "fsGroup": VLLM_UID},
        # The sidecar polls vLLM over the pod's loopback: no Service hop, same lifecycle.
        "containers": [_vllm(cfg, accelerator), *([_sidecar(cfg)] if sidecar else [])],
        "volumes": [{"name": "home", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}},
                    {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}}],
    }


def deployment(cfg: MonitoringConfig, accelerator: str = "gpu") -> dict[str, Any]:
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


def network_policy(cfg: MonitoringConfig, name: str, pod_labels: dict[str, str], ports: list[str]) -> dict[str, Any]:
    """Ingress only to the named ports (vLLM's API, cachemon's /metrics); egress stays open (model downloads)."""
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": cfg.namespace},
        "spec": {"podSelector": {"matchLabels": pod_labels}, "policyTypes": ["Ingress"],
                 "ingress": [{"ports": [{"port": port, "protocol": "TCP"} for port in ports]}]},
    }


def service(cfg: MonitoringConfig) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "vllm-tiny", "namespace": cfg.namespace, "labels": LABELS},
        "spec": {"selector": LABELS, "ports": [
            {"name": "http", "port": cfg.vllm_port, "targetPort": "http"},
            {"name": "cachemon-metrics", "port": cfg.cachemon_port, "targetPort": "cachemon-metrics"},
        ]},
    }


def _endpoint(job: str, port: str) -> dict[str, Any]:
    return {
        "port": port, "path": "/metrics", "interval": "15s",
        # The operator's default job is <namespace>/<name>; the alerts select cachemon_selector,
        # whose job config.validate keeps equal to cachemon_job.
        "relabelings": [
            {"action": "replace", "targetLabel": "job", "replacement": job},
            {"action": "replace", "sourceLabels": ["__meta_kubernetes_pod_name"], "targetLabel": "instance"},
        ],
    }


def _monitors(cfg: MonitoringConfig, kind: str, endpoints_key: str) -> list[dict[str, Any]]:
    return [{
        "apiVersion": "monitoring.coreos.com/v1", "kind": kind,
        "metadata": {"name": name, "namespace": cfg.namespace, "labels": dict(cfg.operator_labels)},
        "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": APP}},
                 endpoints_key: [_endpoint(job, port)]},
    } for name, job, port in (("cachemon", cfg.cachemon_job, "cachemon-metrics"), ("vllm", cfg.vllm_job, "http"))]


def pod_monitors(cfg: MonitoringConfig) -> list[dict[str, Any]]:
    return _monitors(cfg, "PodMonitor", "podMetricsEndpoints")


def service_monitors(cfg: MonitoringConfig) -> list[dict[str, Any]]:
    """The same scrape through the Service, for Prometheus setups that select only ServiceMonitors."""
    return _monitors(cfg, "ServiceMonitor", "endpoints")


# checkov's secrets scan (detect-secrets' Base64HighEntropyString) takes long recording-rule names (the
# ratio rules', the tenant isolation rule's) for secrets. Skipped on those lines only, with the reason,
# by checkov's inline comment.
SECRET_SKIP = "  # checkov:skip=CKV_SECRET_6: a Prometheus recording-rule name, not a secret"


def _skip_secret_false_positives(text: str) -> str:
    return "".join(line + SECRET_SKIP + "\n" if line.lstrip().startswith("- record: ") and
                   ("_per_" in line or "isolation_" in line) else line + "\n" for line in text.splitlines())


def prometheus_rule(cfg: MonitoringConfig, groups: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
        "metadata": {"name": "cachemon", "namespace": cfg.namespace,
                     "labels": {**cfg.operator_labels, "role": "alert-rules"}},
        "spec": {"groups": groups},
    }


def dashboard_configmaps(cfg: MonitoringConfig, dashboards: dict[str, str]) -> list[dict[str, Any]]:
    return [{
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": f"grafana-dashboard-{name.removesuffix('.json')}", "namespace": cfg.namespace,
                     # Picked up by Grafana's dashboard sidecar (kube-prometheus-stack default label),
                     # filed in the folder the annotation names (sidecar folderAnnotation).
                     "labels": dict(cfg.grafana_dashboard_label),
                     "annotations": dict(cfg.grafana_folder_annotation)},
        "data": {name: text},
    } for name, text in sorted(dashboards.items())]


def kustomization() -> dict[str, Any]:
    return {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "resources": ["vllm-cachemon.yaml", "podmonitor.yaml", "prometheusrule.yaml", "grafana-dashboards.yaml"]}


# --- the sidecar in a deployment that already runs --------------------------------------------------------


def sidecar_patch(cfg: MonitoringConfig) -> list[dict[str, Any]]:
    """JSON patch (RFC 6902) for a Deployment / StatefulSet: the sidecar container and the pod label the
    PodMonitor selects. A JSON patch and not a strategic merge: nothing else of the workload changes."""
    return [
        {"op": "add", "path": f"/spec/template/metadata/labels/{SIDECAR_LABEL.replace('/', '~1')}", "value": "true"},
        {"op": "add", "path": "/spec/template/spec/containers/-", "value": _sidecar(cfg)},
    ]


def sidecar_pod_monitor(cfg: MonitoringConfig, namespace: str | None = None) -> dict[str, Any]:
    """The cachemon PodMonitor for pods with the sidecar label (no namespace: the overlay's applies)."""
    meta: dict[str, Any] = {"name": "cachemon-sidecar", "labels": dict(cfg.operator_labels)}
    if namespace:
        meta["namespace"] = namespace
    return {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor", "metadata": meta,
        "spec": {"selector": {"matchLabels": {SIDECAR_LABEL: "true"}},
                 "podMetricsEndpoints": [_endpoint(cfg.cachemon_job, "cachemon-metrics")]},
    }


def component() -> dict[str, Any]:
    target = {"group": "apps", "version": "v1", "labelSelector": f"{SIDECAR_LABEL}=true"}
    return {
        "apiVersion": "kustomize.config.k8s.io/v1alpha1", "kind": "Component",
        "resources": ["podmonitor.yaml"],
        "patches": [{"path": "sidecar.patch.yaml", "target": {**target, "kind": kind}} for kind in ("Deployment", "StatefulSet")],
    }


EXISTING_LABELS = {"app.kubernetes.io/name": "my-vllm"}


def existing_deployment(cfg: MonitoringConfig, accelerator: str) -> dict[str, Any]:
    """Stands for a user's own vLLM Deployment (constructed): labelled for the component, nothing else."""
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "my-vllm", "namespace": cfg.namespace,
                     "labels": {**EXISTING_LABELS, SIDECAR_LABEL: "true"}, "annotations": _checkov_annotations()},
        "spec": {"replicas": 1, "selector": {"matchLabels": EXISTING_LABELS},
                 "template": {"metadata": {"labels": EXISTING_LABELS}, "spec": _pod_spec(cfg, accelerator, sidecar=False)}},
    }


def existing_example(cfg: MonitoringConfig, accelerator: str) -> dict[str, str]:
    base = f"deploy/kubernetes/examples/existing-{accelerator}"
    head = render.GENERATED + (f"# Stands for your own vLLM Deployment ({accelerator.upper()}); the only addition for cachemon "
                               f"is the label {SIDECAR_LABEL}: \"true\".\n")
    return {
        f"{base}/vllm.yaml": render.to_yaml_docs([
            existing_deployment(cfg, accelerator),
            network_policy(cfg, "my-vllm", EXISTING_LABELS, ["http", "cachemon-metrics"])], head),
        f"{base}/kustomization.yaml": render.to_yaml(
            {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "namespace": cfg.namespace,
             "resources": ["vllm.yaml"], "components": ["../../components/cachemon-sidecar"]}, render.GENERATED),
    }


# vLLM production-stack's Helm chart (vllm-project/production-stack, helm/ at a6c01db, after vllm-stack-0.1.12):
# templates/deployment-vllm-multi.yaml renders one Deployment per servingEngineSpec.modelSpec[] with the
# fixed containers "vllm" (port 8000, servingEngineSpec.containerPort) and, with LoRA, its own "sidecar";
# there is no value for an extra container. It adds modelSpec[].labels to the Deployment's labels: that
# label selects the Deployment for the component, applied by a Helm post-renderer.
PRODUCTION_STACK_VALUES_NOTE = """\
# vLLM production-stack (Helm chart vllm-stack): the values cachemon needs, merged into YOUR modelSpec
# entries (Helm replaces lists, so copy `labels` into each entry that should get the sidecar).
# The chart has no value for an extra container; the post-renderer next to this file adds it:
#   helm install vllm vllm/vllm-stack -f your-values.yaml -f values-cachemon-{accelerator}.yaml \\
#     --post-renderer deploy/kubernetes/production-stack/post-render
"""


def production_stack_values(cfg: MonitoringConfig, accelerator: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": "qwen", "repository": "vllm/vllm-openai", "tag": cfg.vllm_image.rsplit(":", 1)[1],
                  "modelURL": cfg.model, "replicaCount": 1, "requestCPU": 4, "requestMemory": "16Gi", "requestGPU": 1,
                  "vllmConfig": {"enablePrefixCaching": True},
                  "labels": {SIDECAR_LABEL: "true"}}
    if accelerator == "npu":
        repo, tag = VLLM_ASCEND_IMAGE.rsplit(":", 1)
        # The chart's default servingEngineSpec.runtimeClassName is "nvidia": none on NPU nodes. It runs
        # `vllm serve` itself for any repository but lmcache/vllm-openai, so vllm-ascend's shell CMD is moot.
        spec.update(repository=repo, tag=tag, requestGPUType=NPU_RESOURCE, runtimeClassName="")
    return {"servingEngineSpec": {"modelSpec": [spec]}}


POST_RENDER = """\
#!/bin/sh
# Generated by `cachemon monitoring`; do not edit.
# Helm post-renderer: Helm's rendered manifests on stdin, the same with cachemon's sidecar added to every
# Deployment / StatefulSet labelled cachemon.io/sidecar=true (and cachemon's PodMonitor) on stdout.
#   helm install ... --post-renderer deploy/kubernetes/production-stack/post-render
# Needs kubectl (its built-in kustomize) or kustomize.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/helm-output.yaml"
# kustomize takes components by relative path only: a copy of deploy/kubernetes/components/cachemon-sidecar.
cp -R "$here/../components/cachemon-sidecar" "$work/cachemon-sidecar"
cat > "$work/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [helm-output.yaml]
components: [cachemon-sidecar]
EOF
# not exec: the EXIT trap must run after the build to remove the work directory
if command -v kustomize >/dev/null 2>&1; then
    kustomize build "$work"
else
    kubectl kustomize "$work"
fi
"""


# llm-d's modelservice chart (llm-d-incubation/llm-d-modelservice, charts/llm-d-modelservice at v0.4.12):
# decode.containers / prefill.containers are lists of containers rendered by the "llm-d-modelservice.container"
# helper (templates/_helpers.tpl). Each entry gets the accelerator added to its resources unless it names
# the resource itself, so the sidecar sets it to 0. accelerator.resources admits only the chart's own
# types (values.schema.json) and an unknown type falls back to nvidia.com/gpu ("acceleratorResource"), so
# for NPUs accelerator.type is cpu (nothing added) and the vllm container names huawei.com/Ascend910
# itself. `modelCommand: custom` takes command/args as given;
# `mountModelVolume: false` keeps the model volume out. vLLM listens on routing.proxy.targetPort (8200) in
# decode pods when the routing proxy is enabled (the "llm-d-modelservice.vllmPort" helper), else on 8000.
LLMD_VLLM_PORT = 8200
LLMD_VALUES_NOTE = """\
# llm-d modelservice chart: cachemon as one more entry of decode.containers (and prefill.containers).
# Helm replaces lists: append the `cachemon` entry to YOUR containers list. On GPUs it names the
# accelerator resource with 0, else the chart would give the sidecar an accelerator of its own.
"""


def _chart_container(cfg: MonitoringConfig, vllm_port: int, device: str | None) -> dict[str, Any]:
    sidecar = _sidecar(cfg, vllm_port)
    zero = {device: "0"} if device else {}
    return {
        "name": "cachemon", "image": sidecar["image"], "modelCommand": "custom", "command": ["cachemon"],
        "args": sidecar["args"], "ports": sidecar["ports"], "mountModelVolume": False,
        "resources": {"requests": {**sidecar["resources"]["requests"], **zero},
                      "limits": {**sidecar["resources"]["limits"], **zero}},
        "extraConfig": {key: sidecar[key] for key in ("imagePullPolicy", "readinessProbe", "livenessProbe", "securityContext")},
    }


LLMD_CUDA_IMAGE = "ghcr.io/llm-d/llm-d-cuda:v0.3.0"   # as the chart's examples pinned it (commit 7d78630)


def llmd_values(cfg: MonitoringConfig, accelerator: str) -> dict[str, Any]:
    vllm: dict[str, Any] = {"name": "vllm", "image": LLMD_CUDA_IMAGE if accelerator == "gpu" else VLLM_ASCEND_IMAGE,
                  "modelCommand": "vllmServe", "args": ["--enable-prefix-caching"],
                  "ports": [{"name": "http", "containerPort": LLMD_VLLM_PORT}]}
    values: dict[str, Any] = {"decode": {"podAnnotations": {"cachemon.io/scrape": "true"}}}
    if accelerator == "npu":
        values["accelerator"] = {"type": "cpu"}
        vllm["resources"] = {"requests": {NPU_RESOURCE: "1"}, "limits": {NPU_RESOURCE: "1"}}
    values["decode"]["containers"] = [vllm, _chart_container(cfg, LLMD_VLLM_PORT, GPU_RESOURCE if accelerator == "gpu" else None)]
    return values


def llmd_pod_monitor(cfg: MonitoringConfig) -> dict[str, Any]:
    """llm-d labels decode pods llm-d.ai/role=decode (templates/_helpers.tpl "llm-d-modelservice.decodelabels")."""
    mon = sidecar_pod_monitor(cfg, cfg.namespace)
    mon["metadata"]["name"] = "cachemon-llm-d"
    mon["spec"]["selector"] = {"matchExpressions": [{"key": "llm-d.ai/role", "operator": "In", "values": ["decode", "prefill"]}]}
    return mon


# KServe (kserve/kserve at aaac4e2, after v0.20.0-rc0): an InferenceService's predictor may list
# containers besides the model; pkg/controller/v1beta1/inferenceservice/components/predictor.go appends
# every predictor container other than transformer-container to the pod after the runtime's. The vLLM
# runtime (config/runtimes/kserve-vllmserver.yaml) serves on 8080. Pods carry the predictor's `labels`.
KSERVE_VLLM_PORT = 8080


def kserve_inference_service(cfg: MonitoringConfig, accelerator: str) -> dict[str, Any]:
    device = GPU_RESOURCE if accelerator == "gpu" else NPU_RESOURCE
    model: dict[str, Any] = {"modelFormat": {"name": "vLLM"}, "storageUri": f"hf://{cfg.model}",
                   "resources": {"requests": {"cpu": "4", "memory": "16Gi", device: "1"},
                                 "limits": {"cpu": "8", "memory": "32Gi", device: "1"}}}
    if accelerator == "npu":
        model["runtime"] = "vllm-ascend"
    return {
        "apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
        "metadata": {"name": f"qwen-{accelerator}", "namespace": cfg.namespace,
                     # Knative allows one container with ports: the standard (raw Deployment) mode.
                     "annotations": {"serving.kserve.io/deploymentMode": "Standard"}},
        "spec": {"predictor": {
            "labels": {SIDECAR_LABEL: "true"},
            "model": model,
            "containers": [_sidecar(cfg, KSERVE_VLLM_PORT)],
        }},
    }


def kserve_ascend_runtime(cfg: MonitoringConfig) -> dict[str, Any]:
    """A ServingRuntime for vllm-ascend, shaped like KServe's kserve-vllmserver runtime."""
    return {
        "apiVersion": "serving.kserve.io/v1alpha1", "kind": "ServingRuntime",
        "metadata": {"name": "vllm-ascend", "namespace": cfg.namespace},
        "spec": {
            "supportedModelFormats": [{"name": "vLLM", "version": "1", "autoSelect": False}],
            "containers": [{
                "name": "kserve-container", "image": VLLM_ASCEND_IMAGE,
                "command": ["vllm", "serve", "/mnt/models"],
                "args": [f"--port={KSERVE_VLLM_PORT}", "--served-model-name={{.Name}}", "--enable-prefix-caching"],
                "env": [{"name": "HOME", "value": "/tmp"}, {"name": "HF_HOME", "value": "/tmp"}],
                "ports": [{"containerPort": KSERVE_VLLM_PORT, "protocol": "TCP"}],
                "securityContext": {**CONTAINER_SECURITY, "privileged": False},
            }],
        },
    }


def integration_files(cfg: MonitoringConfig) -> dict[str, str]:
    y = render.to_yaml
    out = {
        f"{COMPONENT}/kustomization.yaml": y(component(), render.GENERATED),
        f"{COMPONENT}/sidecar.patch.yaml": y(sidecar_patch(cfg), render.GENERATED),
        f"{COMPONENT}/podmonitor.yaml": y(sidecar_pod_monitor(cfg), render.GENERATED),
        "deploy/kubernetes/production-stack/post-render": POST_RENDER,
        "deploy/kubernetes/llm-d/podmonitor.yaml": y(llmd_pod_monitor(cfg), render.GENERATED),
        "deploy/kubernetes/kserve/podmonitor.yaml": y(sidecar_pod_monitor(cfg, cfg.namespace), render.GENERATED),
        "deploy/kubernetes/kserve/servingruntime-vllm-ascend.yaml": y(kserve_ascend_runtime(cfg), render.GENERATED),
    }
    for acc in ACCELERATORS:
        out.update(existing_example(cfg, acc))
        out[f"deploy/kubernetes/production-stack/values-cachemon-{acc}.yaml"] = y(
            production_stack_values(cfg, acc), render.GENERATED + PRODUCTION_STACK_VALUES_NOTE.format(accelerator=acc))
        out[f"deploy/kubernetes/llm-d/values-cachemon-{acc}.yaml"] = y(llmd_values(cfg, acc), render.GENERATED + LLMD_VALUES_NOTE)
        out[f"deploy/kubernetes/kserve/inferenceservice-{acc}.yaml"] = y(kserve_inference_service(cfg, acc), render.GENERATED)
    return out


SYSTEMD_EXEC = "/opt/cachemon/bin/cachemon"   # what the README's install step produces (a venv in /opt/cachemon)


def systemd_install_lines() -> list[str]:
    """How to install what the unit runs. cachemon is not on PyPI (yet): from a clone, or from the wheel
    `python -m build` writes to dist/ (tests/test_packaging.py installs that wheel into a clean venv)."""
    return [
        "git clone https://github.com/cachemon/cachemon && python3 -m venv /opt/cachemon",
        "/opt/cachemon/bin/pip install ./cachemon",
        f"# or a wheel: /opt/cachemon/bin/pip install cachemon-{__version__}-py3-none-any.whl  (`python -m build` in the clone)",
        "cp cachemon/deploy/systemd/cachemon.service /etc/systemd/system/",
        "systemctl daemon-reload && systemctl enable --now cachemon",
    ]


def systemd_unit(cfg: MonitoringConfig) -> str:
    args = " ".join(_cachemon_args(cfg))
    install = "".join(f"#   {line}\n" for line in systemd_install_lines())
    return f"""\
# Generated by `cachemon monitoring`; do not edit.
# cachemon next to a `vllm serve` started by vllm.service on the same host. Install (no PyPI release yet):
{install}[Unit]
Description=cachemon: prefix-cache exporter for vLLM
Documentation=https://github.com/cachemon/cachemon
After=network-online.target vllm.service
Wants=network-online.target

[Service]
Type=simple
ExecStart={SYSTEMD_EXEC} {args} --log-level=info
Restart=on-failure
RestartSec=5
# Exit status 2 is a config or usage error: restarting cannot fix it.
RestartPreventExitStatus=2
DynamicUser=yes
# The log tailer's state (only with --log-file) goes to /var/lib/cachemon.
StateDirectory=cachemon
Environment=XDG_STATE_HOME=%S
MemoryMax=256M
UMask=0077
# Hardening: `systemd-analyze security cachemon.service` (tests assert the exposure score).
CapabilityBoundingSet=
AmbientCapabilities=
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
PrivateDevices=yes
ProtectClock=yes
ProtectControlGroups=yes
ProtectHostname=yes
ProtectKernelLogs=yes
ProtectKernelModules=yes
ProtectKernelTunables=yes
# /proc/self and /proc/stat stay readable: the process_* metrics read them.
ProtectProc=invisible
RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
SystemCallArchitectures=native
SystemCallFilter=@system-service
SystemCallFilter=~@privileged @resources
SystemCallErrorNumber=EPERM

[Install]
WantedBy=multi-user.target
"""


def _healthcheck(test: list[str]) -> dict[str, Any]:
    return {"test": test, "interval": "15s", "timeout": "5s", "retries": 3, "start_period": "20s"}


def _http_ok(url: str) -> list[str]:
    """A healthcheck for images with Python but no curl/wget (vLLM's, cachemon's)."""
    return ["CMD", "python3", "-c", f"import urllib.request; urllib.request.urlopen({url!r}, timeout=4)"]


def compose(cfg: MonitoringConfig) -> dict[str, Any]:
    cachemon_port = cfg.cachemon_port
    return {
        "name": "cachemon",
        "services": {
            "vllm": {
                "image": cfg.vllm_image,
                "command": ["--model", cfg.model, "--port", str(cfg.vllm_port), "--enable-prefix-caching"],
                "ports": [f"{cfg.vllm_port}:{cfg.vllm_port}"],
                "healthcheck": dict(_healthcheck(_http_ok(f"http://127.0.0.1:{cfg.vllm_port}/health")),
                                    start_period="300s"),     # model download + load
                "deploy": {"resources": {"reservations": {
                    "devices": [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]}}},
            },
            "cachemon": {
                # `docker compose build` (or `make image`, which tags the same name) builds the image.
                "build": {"context": "../..", "dockerfile": "Containerfile"},
                "image": cfg.cachemon_image,
                "command": ["run", f"--upstream=vllm=http://vllm:{cfg.vllm_port}/metrics",
                            f"--listen=0.0.0.0:{cachemon_port}"],
                # Started with vLLM, not after it is healthy: cachemon reports a down upstream itself.
                "depends_on": {"vllm": {"condition": "service_started"}},
                "ports": [f"{cachemon_port}:{cachemon_port}"],
                "user": "65534:65534",
                "read_only": True,
                "tmpfs": ["/tmp"],
                "volumes": ["cachemon-state:/var/lib/cachemon"],
                "cap_drop": ["ALL"],
                "security_opt": ["no-new-privileges:true"],
                "healthcheck": _healthcheck(_http_ok(f"http://127.0.0.1:{cachemon_port}/-/healthy")),
            },
            "prometheus": {
                "image": cfg.prometheus_image,
                "volumes": ["./prometheus.yml:/etc/prometheus/prometheus.yml:ro",
                            "../../prometheus/recording_rules.yaml:/etc/prometheus/rules/recording_rules.yaml:ro",
                            "../../alerts/cachemon-alerts.yaml:/etc/prometheus/rules/cachemon-alerts.yaml:ro"],
                "ports": ["9090:9090"],
                "healthcheck": _healthcheck(["CMD", "wget", "-q", "-O", "/dev/null", "http://127.0.0.1:9090/-/ready"]),
                "depends_on": {"cachemon": {"condition": "service_healthy"}},
            },
            "alertmanager": compose_demo.alertmanager_service(cfg),
            "grafana": {
                "image": cfg.grafana_image,
                # Anonymous viewing only when asked: GRAFANA_ANONYMOUS=true docker compose up.
                "environment": {"GF_AUTH_ANONYMOUS_ENABLED": "${GRAFANA_ANONYMOUS:-false}",
                                "GF_AUTH_ANONYMOUS_ORG_ROLE": "Viewer"},
                "volumes": ["./grafana/provisioning:/etc/grafana/provisioning:ro",
                            "../../dashboards:/var/lib/grafana/dashboards/cachemon:ro"],
                "ports": ["3000:3000"],
                "healthcheck": _healthcheck(["CMD", "wget", "-q", "-O", "/dev/null", "http://127.0.0.1:3000/api/health"]),
                "depends_on": {"prometheus": {"condition": "service_healthy"}},
            },
        },
        "volumes": {"cachemon-state": {}},
    }


def grafana_datasource() -> dict[str, Any]:
    return {"apiVersion": 1, "datasources": [
        {"name": "Prometheus", "type": "prometheus", "access": "proxy", "url": "http://prometheus:9090",
         "isDefault": True, "jsonData": {"timeInterval": "15s"}}]}


def grafana_dashboard_provider(path: str) -> dict[str, Any]:
    return {"apiVersion": 1, "providers": [
        {"name": "cachemon", "folder": "cachemon", "type": "file", "disableDeletion": False,
         "allowUiUpdates": False, "updateIntervalSeconds": 60, "options": {"path": path, "foldersFromFilesStructure": False}}]}


def files(cfg: MonitoringConfig, rule_groups: list[dict[str, Any]], dashboards: dict[str, str]) -> dict[str, str]:
    y = render.to_yaml
    return {
        "deploy/kubernetes/vllm-cachemon.yaml": render.to_yaml_docs(
            [deployment(cfg), service(cfg), network_policy(cfg, "vllm-tiny", LABELS, ["http", "cachemon-metrics"])],
            render.GENERATED),
        "deploy/kubernetes/podmonitor.yaml": render.to_yaml_docs(pod_monitors(cfg), render.GENERATED),
        # Not in kustomization.yaml: an alternative to podmonitor.yaml, never both (double scrape).
        "deploy/kubernetes/servicemonitor.yaml": render.to_yaml_docs(
            service_monitors(cfg),
            render.GENERATED + "# Use INSTEAD of podmonitor.yaml when your Prometheus selects only ServiceMonitors.\n"),
        "deploy/kubernetes/prometheusrule.yaml":
            _skip_secret_false_positives(y(prometheus_rule(cfg, rule_groups), render.GENERATED)),
        "deploy/kubernetes/grafana-dashboards.yaml": render.to_yaml_docs(dashboard_configmaps(cfg, dashboards), render.GENERATED),
        "deploy/kubernetes/kustomization.yaml": y(kustomization(), render.GENERATED),
        "deploy/systemd/cachemon.service": systemd_unit(cfg),
        "deploy/compose/compose.yaml": y(compose(cfg), render.GENERATED),
        "deploy/compose/grafana/provisioning/datasources/prometheus.yaml": y(grafana_datasource(), render.GENERATED),
        "deploy/compose/grafana/provisioning/dashboards/cachemon.yaml":
            y(grafana_dashboard_provider("/var/lib/grafana/dashboards/cachemon"), render.GENERATED),
        **integration_files(cfg),
    }
