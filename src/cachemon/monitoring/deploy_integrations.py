"""The sidecar in deployments that already run (deploy/kubernetes/README.md): a kustomize component,
vLLM production-stack's Helm chart (a post-renderer using that component), llm-d's modelservice chart
(values) and KServe (an InferenceService with the sidecar in ``predictor.containers``); each for GPU
and for NPU (vllm-ascend)."""
from __future__ import annotations

from cachemon.jsontypes import JsonObject, as_object
from cachemon.monitoring import serialise
from cachemon.monitoring.deploy_kubernetes import (
    ACCELERATORS,
    COMPONENT,
    CONTAINER_SECURITY,
    GPU_RESOURCE,
    NPU_RESOURCE,
    SIDECAR_LABEL,
    VLLM_ASCEND_IMAGE,
    _checkov_annotations,
    _endpoint,
    _pod_spec,
    _sidecar,
    network_policy,
)
from cachemon.monitoring.site import MonitoringConfig


def sidecar_patch(cfg: MonitoringConfig) -> list[JsonObject]:
    """JSON patch (RFC 6902) for a Deployment / StatefulSet: the sidecar container and the pod label the
    PodMonitor selects. A JSON patch and not a strategic merge: nothing else of the workload changes."""
    return [
        {"op": "add", "path": f"/spec/template/metadata/labels/{SIDECAR_LABEL.replace('/', '~1')}", "value": "true"},
        {"op": "add", "path": "/spec/template/spec/containers/-", "value": _sidecar(cfg)},
    ]


def sidecar_pod_monitor(cfg: MonitoringConfig, namespace: str | None = None) -> JsonObject:
    """The cachemon PodMonitor for pods with the sidecar label (no namespace: the overlay's applies)."""
    meta: JsonObject = {"name": "cachemon-sidecar", "labels": dict(cfg.operator_labels)}
    if namespace:
        meta["namespace"] = namespace
    return {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor", "metadata": meta,
        "spec": {"selector": {"matchLabels": {SIDECAR_LABEL: "true"}},
                 "podMetricsEndpoints": [_endpoint(cfg.cachemon_job, "cachemon-metrics")]},
    }


def component() -> JsonObject:
    target = {"group": "apps", "version": "v1", "labelSelector": f"{SIDECAR_LABEL}=true"}
    return {
        "apiVersion": "kustomize.config.k8s.io/v1alpha1", "kind": "Component",
        "resources": ["podmonitor.yaml"],
        "patches": [{"path": "sidecar.patch.yaml", "target": {**target, "kind": kind}} for kind in ("Deployment", "StatefulSet")],
    }


EXISTING_LABELS: JsonObject = {"app.kubernetes.io/name": "my-vllm"}


def existing_deployment(cfg: MonitoringConfig, accelerator: str) -> JsonObject:
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
    head = serialise.GENERATED + (f"# Stands for your own vLLM Deployment ({accelerator.upper()}); the only addition "
                                  f"for cachemon is the label {SIDECAR_LABEL}: \"true\".\n")
    return {
        f"{base}/vllm.yaml": serialise.to_yaml_docs([
            existing_deployment(cfg, accelerator),
            network_policy(cfg, "my-vllm", EXISTING_LABELS, ["http", "cachemon-metrics"])], head),
        f"{base}/kustomization.yaml": serialise.to_yaml(
            {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "namespace": cfg.namespace,
             "resources": ["vllm.yaml"], "components": ["../../components/cachemon-sidecar"]}, serialise.GENERATED),
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


def production_stack_values(cfg: MonitoringConfig, accelerator: str) -> JsonObject:
    spec: JsonObject = {"name": "qwen", "repository": "vllm/vllm-openai", "tag": cfg.vllm_image.rsplit(":", 1)[1],
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


def _chart_container(cfg: MonitoringConfig, vllm_port: int, device: str | None) -> JsonObject:
    sidecar = _sidecar(cfg, vllm_port)
    resources = as_object(sidecar["resources"])
    zero: JsonObject = {device: "0"} if device else {}
    return {
        "name": "cachemon", "image": sidecar["image"], "modelCommand": "custom", "command": ["cachemon"],
        "args": sidecar["args"], "ports": sidecar["ports"], "mountModelVolume": False,
        "resources": {"requests": {**as_object(resources["requests"]), **zero},
                      "limits": {**as_object(resources["limits"]), **zero}},
        "extraConfig": {key: sidecar[key] for key in ("imagePullPolicy", "readinessProbe", "livenessProbe", "securityContext")},
    }


LLMD_CUDA_IMAGE = "ghcr.io/llm-d/llm-d-cuda:v0.3.0"   # as the chart's examples pinned it (commit 7d78630)


def llmd_values(cfg: MonitoringConfig, accelerator: str) -> JsonObject:
    vllm: JsonObject = {"name": "vllm", "image": LLMD_CUDA_IMAGE if accelerator == "gpu" else VLLM_ASCEND_IMAGE,
                  "modelCommand": "vllmServe", "args": ["--enable-prefix-caching"],
                  "ports": [{"name": "http", "containerPort": LLMD_VLLM_PORT}]}
    values: JsonObject = {"decode": {"podAnnotations": {"cachemon.io/scrape": "true"}}}
    if accelerator == "npu":
        values["accelerator"] = {"type": "cpu"}
        vllm["resources"] = {"requests": {NPU_RESOURCE: "1"}, "limits": {NPU_RESOURCE: "1"}}
    device = GPU_RESOURCE if accelerator == "gpu" else None
    as_object(values["decode"])["containers"] = [vllm, _chart_container(cfg, LLMD_VLLM_PORT, device)]
    return values


def llmd_pod_monitor(cfg: MonitoringConfig) -> JsonObject:
    """llm-d labels decode pods llm-d.ai/role=decode (templates/_helpers.tpl "llm-d-modelservice.decodelabels")."""
    mon = sidecar_pod_monitor(cfg, cfg.namespace)
    as_object(mon["metadata"])["name"] = "cachemon-llm-d"
    as_object(mon["spec"])["selector"] = {
        "matchExpressions": [{"key": "llm-d.ai/role", "operator": "In", "values": ["decode", "prefill"]}]}
    return mon


# KServe (kserve/kserve at aaac4e2, after v0.20.0-rc0): an InferenceService's predictor may list
# containers besides the model; pkg/controller/v1beta1/inferenceservice/components/predictor.go appends
# every predictor container other than transformer-container to the pod after the runtime's. The vLLM
# runtime (config/runtimes/kserve-vllmserver.yaml) serves on 8080. Pods carry the predictor's `labels`.
KSERVE_VLLM_PORT = 8080


def kserve_inference_service(cfg: MonitoringConfig, accelerator: str) -> JsonObject:
    device = GPU_RESOURCE if accelerator == "gpu" else NPU_RESOURCE
    model: JsonObject = {"modelFormat": {"name": "vLLM"}, "storageUri": f"hf://{cfg.model}",
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


def kserve_ascend_runtime(cfg: MonitoringConfig) -> JsonObject:
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
    y = serialise.to_yaml
    out = {
        f"{COMPONENT}/kustomization.yaml": y(component(), serialise.GENERATED),
        f"{COMPONENT}/sidecar.patch.yaml": y(sidecar_patch(cfg), serialise.GENERATED),
        f"{COMPONENT}/podmonitor.yaml": y(sidecar_pod_monitor(cfg), serialise.GENERATED),
        "deploy/kubernetes/production-stack/post-render": POST_RENDER,
        "deploy/kubernetes/llm-d/podmonitor.yaml": y(llmd_pod_monitor(cfg), serialise.GENERATED),
        "deploy/kubernetes/kserve/podmonitor.yaml": y(sidecar_pod_monitor(cfg, cfg.namespace), serialise.GENERATED),
        "deploy/kubernetes/kserve/servingruntime-vllm-ascend.yaml": y(kserve_ascend_runtime(cfg), serialise.GENERATED),
    }
    for acc in ACCELERATORS:
        out.update(existing_example(cfg, acc))
        out[f"deploy/kubernetes/production-stack/values-cachemon-{acc}.yaml"] = y(
            production_stack_values(cfg, acc), serialise.GENERATED + PRODUCTION_STACK_VALUES_NOTE.format(accelerator=acc))
        out[f"deploy/kubernetes/llm-d/values-cachemon-{acc}.yaml"] = y(llmd_values(cfg, acc),
                                                                 serialise.GENERATED + LLMD_VALUES_NOTE)
        out[f"deploy/kubernetes/kserve/inferenceservice-{acc}.yaml"] = y(kserve_inference_service(cfg, acc), serialise.GENERATED)
    return out
