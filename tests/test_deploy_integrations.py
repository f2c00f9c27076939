"""The sidecar in deployments that already run, each path rendered and validated by a real tool.

- kustomize (kubectl's built-in): the component on GPU and NPU example Deployments, and vLLM
  production-stack's post-renderer on the chart's (constructed) output; the results under
  `kubernetes-validate --strict`, the prometheus-operator CRD schemas and Pod Security "restricted";
- the Helm values files (production-stack, llm-d) against the charts' own values.schema.json, and the
  llm-d sidecar entry as the chart's container helper turns it into a container;
- KServe's InferenceService / ServingRuntime against KServe's CRD schemas, and the pod its controller
  assembles (runtime container, then the predictor's containers).

Upstream files read: tests/fixtures/deploy-schemas/README.md and deploy/kubernetes/README.md.
"""
from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from cachemon.monitoring import deploy, deploy_kubernetes
from cachemon.monitoring import site as mconfig
from helpers import FIXTURES, require_binary
from pod_security import pod_spec, restricted_violations
from test_kubernetes_manifests import crd_validator, run_validate, strict

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "kubernetes"
SCHEMAS = FIXTURES / "deploy-schemas"
CONSTRUCTED = FIXTURES / "deploy-constructed"
CFG = mconfig.DEFAULT
ACCELERATORS = {"gpu": (deploy.GPU_RESOURCE, deploy.NPU_RESOURCE), "npu": (deploy.NPU_RESOURCE, deploy.GPU_RESOURCE)}


def kustomize(directory: Path) -> list[dict]:
    kubectl = require_binary("kubectl", "kubectl (the upstream release binary: kustomize is built in)")
    r = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, check=False, timeout=120)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def post_render(rendered: Path) -> list[dict]:
    require_binary("kubectl", "kubectl (the upstream release binary: kustomize is built in)")
    r = subprocess.run(["sh", str(K8S / "production-stack" / "post-render")], stdin=rendered.open(), capture_output=True,
                       text=True, check=False, timeout=120)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def validate_all(docs: list[dict], tmp_path: Path) -> str:
    """Core kinds under kubernetes-validate --strict, operator kinds against the CRD schemas."""
    core = [d for d in docs if not d["apiVersion"].startswith("monitoring.coreos.com/")]
    for d in docs:
        if d["apiVersion"].startswith("monitoring.coreos.com/"):
            errors = [e.message for e in crd_validator(d["kind"]).iter_errors(d)]
            assert not errors, (d["kind"], errors)
    path = tmp_path / "rendered.yaml"
    path.write_text(yaml.safe_dump_all(core))
    r = run_validate(path)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "ERROR" not in out, out
    return out


def containers(doc: dict) -> dict[str, dict]:
    spec = pod_spec(doc)
    assert spec is not None
    return {c["name"]: c for c in spec["containers"]}


def the_sidecar(port: int) -> dict:
    return deploy_kubernetes._sidecar(CFG, port)


@pytest.fixture(scope="module", params=sorted(ACCELERATORS))
def accelerator(request) -> str:
    return request.param


# --- the kustomize component -----------------------------------------------------------------------------

@pytest.mark.slow
def test_component_adds_the_sidecar_and_podmonitor_to_an_existing_deployment(accelerator, tmp_path):
    docs = kustomize(K8S / "examples" / f"existing-{accelerator}")
    assert sorted(d["kind"] for d in docs) == ["Deployment", "NetworkPolicy", "PodMonitor"]
    out = validate_all(docs, tmp_path)
    assert "passed for resource deployment/my-vllm" in out
    dep = next(d for d in docs if d["kind"] == "Deployment")
    by_name = containers(dep)
    assert list(by_name) == ["vllm", "cachemon"] and by_name["cachemon"] == the_sidecar(CFG.vllm_port)
    assert dep["spec"]["template"]["metadata"]["labels"][deploy.SIDECAR_LABEL] == "true"
    assert restricted_violations(pod_spec(dep)) == []
    mon = next(d for d in docs if d["kind"] == "PodMonitor")
    assert mon["spec"]["selector"]["matchLabels"] == {deploy.SIDECAR_LABEL: "true"}
    assert mon["metadata"]["namespace"] == CFG.namespace            # the overlay's namespace (the example's)
    # GPU / NPU: the device the vLLM container asks for, and never the other one.
    want, never = ACCELERATORS[accelerator]
    text = json.dumps(dep)
    assert by_name["vllm"]["resources"]["limits"][want] == 1 and never not in text
    if accelerator == "npu":
        assert by_name["vllm"]["image"] == deploy.VLLM_ASCEND_IMAGE and by_name["vllm"]["command"] == ["vllm", "serve"]


@pytest.mark.slow
def test_component_leaves_unlabelled_workloads_alone(tmp_path):
    """A second Deployment in the same overlay, without the label: untouched."""
    work = tmp_path / "overlay"
    work.mkdir()
    other = deploy.existing_deployment(CFG, "gpu")
    other["metadata"]["name"] = "other"
    del other["metadata"]["labels"][deploy.SIDECAR_LABEL]
    mine = deploy.existing_deployment(CFG, "gpu")
    (work / "apps.yaml").write_text(yaml.safe_dump_all([mine, other]))
    (work / "cachemon-sidecar").symlink_to(K8S / "components" / "cachemon-sidecar")
    (work / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": ["apps.yaml"], "components": ["cachemon-sidecar"]}))
    docs = {d["metadata"]["name"]: d for d in kustomize(work)}
    assert list(containers(docs["my-vllm"])) == ["vllm", "cachemon"]
    assert docs["other"] == other


@pytest.mark.slow
def test_the_full_example_has_a_gpu_and_every_workload_is_restricted():
    docs = kustomize(K8S)
    dep = next(d for d in docs if d["kind"] == "Deployment")
    assert containers(dep)["vllm"]["resources"]["limits"][deploy.GPU_RESOURCE] == 1
    assert restricted_violations(pod_spec(dep)) == []
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"] == dep["spec"]["template"]["metadata"]["labels"]


# --- vLLM production-stack (Helm chart vllm-stack) ---------------------------------------------------------

def helm_schema(name: str, strict_: bool) -> jsonschema.protocols.Validator:
    schema = json.loads((SCHEMAS / name).read_text())
    return jsonschema.validators.validator_for(schema)(strict(schema) if strict_ else schema)


@pytest.mark.parametrize("strict_", [False, True], ids=["as-helm", "strict"])
def test_production_stack_values_pass_the_charts_schema(accelerator, strict_):
    values = yaml.safe_load((K8S / "production-stack" / f"values-cachemon-{accelerator}.yaml").read_text())
    validator = helm_schema("production-stack-values.schema.json", strict_)
    assert [e.message for e in validator.iter_errors(values)] == []
    spec = values["servingEngineSpec"]["modelSpec"][0]
    assert spec["labels"] == {deploy.SIDECAR_LABEL: "true"}      # what selects the Deployment for the post-renderer
    if accelerator == "npu":
        assert (spec["repository"], spec["tag"]) == tuple(deploy.VLLM_ASCEND_IMAGE.rsplit(":", 1))
        assert spec["requestGPUType"] == deploy.NPU_RESOURCE and spec["runtimeClassName"] == ""
    # The schema can fail: a misspelt key (strict) or a wrong type (as Helm checks it).
    bad = copy.deepcopy(values)
    bad["servingEngineSpec"]["modelSpec"][0]["replicaCount"] = "one"
    assert list(validator.iter_errors(bad))


@pytest.mark.slow
def test_production_stack_post_renderer_adds_the_sidecar_to_the_engine_only(tmp_path):
    docs = post_render(CONSTRUCTED / "production-stack-rendered.yaml")
    validate_all(docs, tmp_path)
    by_name = {d["metadata"]["name"]: d for d in docs}
    engine = containers(by_name["vllm-qwen-deployment-vllm"])
    assert list(engine) == ["vllm", "cachemon"]
    # The chart's vLLM listens on 8000 (servingEngineSpec.containerPort): the sidecar's upstream.
    assert engine["vllm"]["ports"][0]["containerPort"] == CFG.vllm_port and engine["cachemon"] == the_sidecar(CFG.vllm_port)
    assert list(containers(by_name["vllm-deployment-router"])) == ["router-container"]
    # No namespace of its own: Helm puts it in the release's namespace, next to the pods it selects.
    assert by_name["cachemon-sidecar"]["kind"] == "PodMonitor" and "namespace" not in by_name["cachemon-sidecar"]["metadata"]
    # The chart's own pod runs vLLM as root: Pod Security restricted is the sidecar's alone here.
    spec = copy.deepcopy(pod_spec(by_name["vllm-qwen-deployment-vllm"]))
    spec["containers"] = [engine["cachemon"]]
    spec["securityContext"] = {}
    assert restricted_violations(spec) == []


# --- llm-d (llm-d-modelservice chart) ---------------------------------------------------------------------

def llmd_container(entry: dict, accelerator_resource: str | None) -> dict:
    """CONSTRUCTED emulation of the chart's "llm-d-modelservice.container" helper (templates/_helpers.tpl,
    v0.4.12) for a `modelCommand: custom` entry: name, image, extraConfig, command/args, env, ports, resources
    (the accelerator added unless the entry names it), volumeMounts only with mountModelVolume."""
    out = {"name": entry["name"], "image": entry["image"], **entry.get("extraConfig", {}),
           "command": entry["command"], "args": entry.get("args", []), "env": entry.get("env", []),
           "ports": entry.get("ports", [])}
    limits = dict(entry.get("resources", {}).get("limits", {}))
    requests = dict(entry.get("resources", {}).get("requests", {}))
    if accelerator_resource:
        limits.setdefault(accelerator_resource, "1")
        requests.setdefault(accelerator_resource, "1")
    out["resources"] = {"limits": limits, "requests": requests}
    assert entry["mountModelVolume"] is False and "volumeMounts" not in entry
    return out


@pytest.mark.slow
def test_llmd_values_pass_the_charts_schema_and_the_sidecar_is_a_valid_restricted_container(accelerator, tmp_path):
    values = yaml.safe_load((K8S / "llm-d" / f"values-cachemon-{accelerator}.yaml").read_text())
    assert [e.message for e in helm_schema("llm-d-modelservice-values.schema.json", True).iter_errors(values)] == []
    entries = {c["name"]: c for c in values["decode"]["containers"]}
    assert list(entries) == ["vllm", "cachemon"] and entries["cachemon"]["modelCommand"] == "custom"
    # The chart adds the accelerator to every container that does not name it (GPU: nvidia); NPU: type cpu.
    resource = deploy.GPU_RESOURCE if accelerator == "gpu" else None
    assert values.get("accelerator", {}).get("type", "nvidia") == ("nvidia" if accelerator == "gpu" else "cpu")
    sidecar = llmd_container(entries["cachemon"], resource)
    if resource:
        assert sidecar["resources"]["limits"][resource] == "0"     # no accelerator for the sidecar
    else:
        assert entries["vllm"]["resources"]["limits"] == {deploy.NPU_RESOURCE: "1"}
    assert f"--upstream=vllm=http://127.0.0.1:{deploy.LLMD_VLLM_PORT}/metrics" in sidecar["args"]
    assert entries["vllm"]["ports"][0]["containerPort"] == deploy.LLMD_VLLM_PORT
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "decode", "namespace": CFG.namespace},
           "spec": {"securityContext": dict(deploy.POD_SECURITY), "containers": [sidecar]}}
    validate_all([pod, yaml.safe_load((K8S / "llm-d" / "podmonitor.yaml").read_text())], tmp_path)
    assert restricted_violations(pod["spec"]) == []


# --- KServe ------------------------------------------------------------------------------------------------

def kserve_validator(name: str) -> jsonschema.Draft7Validator:
    schema = strict(json.loads((SCHEMAS / name).read_text()))
    schema["properties"]["metadata"] = {"type": "object"}
    return jsonschema.Draft7Validator(schema)


@pytest.mark.slow
def test_kserve_manifests_pass_kserves_crd_schemas(accelerator, tmp_path):
    isvc = yaml.safe_load((K8S / "kserve" / f"inferenceservice-{accelerator}.yaml").read_text())
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
              for e in kserve_validator("kserve-InferenceService.v1beta1.json").iter_errors(isvc)]
    assert errors == []
    runtime = yaml.safe_load((K8S / "kserve" / "servingruntime-vllm-ascend.yaml").read_text())
    assert [e.message for e in kserve_validator("kserve-ServingRuntime.v1alpha1.json").iter_errors(runtime)] == []
    predictor = isvc["spec"]["predictor"]
    want, never = ACCELERATORS[accelerator]
    assert predictor["model"]["resources"]["limits"][want] == "1" and never not in json.dumps(isvc)
    assert predictor["labels"] == {deploy.SIDECAR_LABEL: "true"}
    # The pod KServe's controller assembles: the runtime's kserve-container, then the predictor's containers.
    serve = runtime["spec"]["containers"][0] if accelerator == "npu" else {
        "name": "kserve-container", "image": "vllm/vllm-openai:v0.32.0",
        "args": [f"--port={deploy.KSERVE_VLLM_PORT}", "--model=/mnt/models"]}
    assert f"--port={deploy.KSERVE_VLLM_PORT}" in serve["args"]
    sidecar = next(c for c in predictor["containers"] if c["name"] == "cachemon")
    assert sidecar == the_sidecar(deploy.KSERVE_VLLM_PORT)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "predictor", "namespace": CFG.namespace},
           "spec": {"containers": [serve, *predictor["containers"]]}}
    validate_all([pod, yaml.safe_load((K8S / "kserve" / "podmonitor.yaml").read_text())], tmp_path)
    assert restricted_violations({"securityContext": {}, "containers": [sidecar]}) == []
    # The schema can fail: a misspelt predictor key is rejected.
    bad = copy.deepcopy(isvc)
    bad["spec"]["predictor"]["sidecars"] = bad["spec"]["predictor"].pop("containers")
    assert list(kserve_validator("kserve-InferenceService.v1beta1.json").iter_errors(bad))


@pytest.mark.slow   # runs the post-renderer (sh)
def test_the_post_renderer_removes_its_work_directory_on_success_and_on_failure(tmp_path):
    # mktemp -d honours TMPDIR: whatever the run leaves behind stays in this folder. A shim
    # kustomize (constructed: prints its argument's kustomization, or fails) stands in for the build,
    # so this runs without kubectl; the real build is test_production_stack_* above.
    bin_dir, tmp = tmp_path / "bin", tmp_path / "tmp"
    bin_dir.mkdir()
    tmp.mkdir()
    shim = bin_dir / "kustomize"
    shim.write_text('#!/bin/sh\n[ -n "${FAIL:-}" ] && exit 3\ncat "$2/kustomization.yaml"\n')
    shim.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "TMPDIR": str(tmp)}
    ok = subprocess.run(["sh", str(K8S / "production-stack" / "post-render")], input="kind: List\n",
                        capture_output=True, text=True, env=env, timeout=60)
    assert ok.returncode == 0 and "components: [cachemon-sidecar]" in ok.stdout, ok.stderr
    assert list(tmp.iterdir()) == []
    bad = subprocess.run(["sh", str(K8S / "production-stack" / "post-render")], input="kind: List\n",
                         capture_output=True, text=True, env={**env, "FAIL": "1"}, timeout=60)
    assert bad.returncode == 3
    assert list(tmp.iterdir()) == []
