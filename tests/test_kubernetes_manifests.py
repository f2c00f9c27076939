"""The Kubernetes manifests `cachemon monitoring --config FILE --out DIR` renders pass admission.

- core kinds (Deployment, Service, ConfigMap) under `kubernetes-validate --strict` (unknown
  fields are errors, as with kubectl's strict field validation);
- PodMonitor / ServiceMonitor / PrometheusRule against the prometheus-operator CRDs'
  openAPIV3Schema (tests/fixtures/prometheus-operator-crds/, see the README there), with
  unknown fields rejected like the API server's strict field validation does;
- every pod spec under Pod Security "restricted" (tests/pod_security.py);
- the sidecar's probes on the listener's /-/healthy and /-/ready;
- everything site-specific (namespace, selector, labels the stack selects by) from the one file.
"""
from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import requests
import yaml
from click.testing import CliRunner

from cachemon.cli import main as cli_main
from cachemon.monitoring import deploy
from cachemon.monitoring import site as mconfig
from helpers import FIXTURES, CachemonProcess
from pod_security import pod_spec, restricted_violations

CRD_SCHEMAS = FIXTURES / "prometheus-operator-crds"
SITE = {
    "namespace": "llm-serving",
    "cachemon_selector": 'job="llm-cachemon", namespace="llm-serving"',
    "cachemon_job": "llm-cachemon",
    "target_labels": ["cluster", "namespace", "team"],
    "hit_ratio_warning": 0.85,
    "model_hit_ratio": {"meta-llama/Llama-3.1-8B-Instruct": {"warning": 0.5, "critical": 0.3}},
    "runbook_base_url": "https://wiki.example/cachemon",
    "cachemon_image": "registry.example/cachemon:1.2.3",
    "operator_labels": {"release": "monitoring"},
    "grafana_dashboard_label": {"grafana_dashboard": "yes"},
    "grafana_folder_annotation": {"k8s-sidecar-target-directory": "/tmp/dashboards/LLM"},
}


EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "monitoring-kubernetes.yaml"


def render_site(tmp_path: Path, site: dict | Path) -> Path:
    """The documented command: `cachemon monitoring --config site.yaml --out DIR`."""
    path = site if isinstance(site, Path) else tmp_path / "site.yaml"
    if not isinstance(site, Path):
        path.write_text(yaml.safe_dump(site))
    r = CliRunner().invoke(cli_main, ["monitoring", "--config", str(path), "--out", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    return tmp_path / "out" / "deploy" / "kubernetes"


@pytest.fixture(scope="module", params=["default", "site", "example"])
def manifests(request, tmp_path_factory) -> Path:
    """Rendered with no settings, with SITE, and with docs/deploy.md's examples/monitoring-kubernetes.yaml."""
    tmp = tmp_path_factory.mktemp(f"k8s-{request.param}")
    return render_site(tmp, {"default": {}, "site": SITE, "example": EXAMPLE}[request.param])


def docs(directory: Path) -> list[dict]:
    out = []
    for p in sorted(directory.glob("*.yaml")):
        out += [d for d in yaml.safe_load_all(p.read_text()) if d]
    return out


def kubernetes_validate() -> str:
    exe = shutil.which("kubernetes-validate", path=str(Path(sys.executable).parent)) or shutil.which("kubernetes-validate")
    if not exe:
        pytest.skip("kubernetes-validate not installed (pip install -e '.[dev]')")
    return exe


def run_validate(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run([kubernetes_validate(), "--strict", *map(str, paths)], check=False, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.slow
def test_core_kinds_pass_kubernetes_validate_strict(manifests):
    files = [p for p in sorted(manifests.glob("*.yaml")) if p.name != "kustomization.yaml"]
    r = run_validate(*files)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    for resource in ("deployment/vllm-tiny", "service/vllm-tiny", "configmap/grafana-dashboard-cachemon-overview"):
        assert f"passed for resource {resource}" in out, out
    assert "ERROR" not in out


@pytest.mark.slow
def test_strict_validation_rejects_an_unknown_field(tmp_path, manifests):
    """So the test above could fail: a misspelt securityContext key is an error."""
    dep = next(d for d in docs(manifests) if d["kind"] == "Deployment")
    dep["spec"]["template"]["spec"]["containers"][1]["securityContext"]["readOnlyRootFileSystem"] = True
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(dep))
    r = run_validate(tmp_path / "bad.yaml")
    assert r.returncode != 0 and "readOnlyRootFileSystem" in r.stdout + r.stderr


def strict(schema):
    """A CRD schema with unknown properties rejected (the API server's strict field validation)."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if out.get("type") == "object" and "properties" in out and "additionalProperties" not in out \
                and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def crd_validator(kind: str):
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema not installed (pip install -e '.[dev]')")
    schema = strict(json.loads((CRD_SCHEMAS / f"{kind}.v1.json").read_text()))
    schema["properties"]["metadata"] = {"type": "object"}   # ObjectMeta: checked by the API server, not the CRD
    return jsonschema.Draft7Validator(schema)


OPERATOR_KINDS = ("PodMonitor", "ServiceMonitor", "PrometheusRule")


def test_operator_kinds_match_the_prometheus_operator_crds(manifests):
    seen = set()
    for d in docs(manifests):
        if d["apiVersion"] == "monitoring.coreos.com/v1":
            assert d["kind"] in OPERATOR_KINDS, d["kind"]
            errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in crd_validator(d["kind"]).iter_errors(d)]
            assert not errors, f"{d['kind']}/{d['metadata']['name']}: {errors}"
            seen.add(d["kind"])
    assert seen == set(OPERATOR_KINDS)


@pytest.mark.parametrize("kind,edit,message", [
    ("PodMonitor", lambda d: d["spec"]["podMetricsEndpoints"][0].update(scrapeInterval="15s"), "scrapeInterval"),
    ("PodMonitor", lambda d: d["spec"]["podMetricsEndpoints"][0]["relabelings"][0].update(action="rename"), "rename"),
    ("PrometheusRule", lambda d: d["spec"]["groups"][0]["rules"][0].update(expression="up"), "expression"),
    ("ServiceMonitor", lambda d: d["spec"].update(endpoints="cachemon-metrics"), "is not of type"),
])
def test_crd_schemas_reject_what_the_operator_would(manifests, kind, edit, message):
    d = copy.deepcopy(next(d for d in docs(manifests) if d["kind"] == kind))
    edit(d)
    errors = [e.message for e in crd_validator(kind).iter_errors(d)]
    assert any(message in e for e in errors), errors


def test_every_pod_passes_pod_security_restricted(manifests):
    specs = [(d["kind"], pod_spec(d)) for d in docs(manifests)]
    specs = [(n, s) for n, s in specs if s is not None]
    assert specs, "no workload rendered"
    for name, spec in specs:
        assert restricted_violations(spec) == [], name


@pytest.mark.parametrize("path,value,violation", [
    (("capabilities",), None, "capabilities.drop must include ALL"),
    (("seccompProfile",), None, None),   # the pod-level RuntimeDefault still covers it
    (("allowPrivilegeEscalation",), True, "allowPrivilegeEscalation must be false"),
    (("runAsUser",), 0, "runAsUser must not be 0"),
    (("privileged",), True, "privileged must not be true"),
])
def test_restricted_checker_catches_each_violation(path, value, violation):
    spec = copy.deepcopy(pod_spec(deploy.deployment(mconfig.DEFAULT)))
    sc = next(c for c in spec["containers"] if c["name"] == "cachemon")["securityContext"]
    if value is None:
        sc.pop(path[0])
    else:
        sc[path[0]] = value
    found = restricted_violations(spec)
    if violation is None:
        assert found == []
        spec["securityContext"].pop("seccompProfile")   # and now neither sets one
        assert restricted_violations(spec) == [
            f"container {c}: seccompProfile must be RuntimeDefault or Localhost (container or pod)"
            for c in ("vllm", "cachemon")]
    else:
        assert found == [f"container cachemon: {violation}"]


def test_restricted_checker_rejects_host_namespaces_and_volumes():
    spec = copy.deepcopy(pod_spec(deploy.deployment(mconfig.DEFAULT)))
    spec["hostNetwork"] = True
    spec["volumes"].append({"name": "logs", "hostPath": {"path": "/var/log"}})
    assert restricted_violations(spec) == ["pod: hostNetwork must not be true", "volume logs: type hostPath not allowed"]


def test_sidecar_is_locked_down_and_probes_the_listener_endpoints(manifests):
    dep = next(d for d in docs(manifests) if d["kind"] == "Deployment")
    sidecar = next(c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "cachemon")
    sc = sidecar["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sidecar["livenessProbe"]["httpGet"] == {"path": "/-/healthy", "port": "cachemon-metrics"}
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/-/ready", "port": "cachemon-metrics"}


@pytest.mark.slow
def test_probe_paths_are_served_by_a_real_cachemon():
    """The paths the manifests probe exist on `cachemon run` (what /-/ready means is the listener's)."""
    dep = deploy.deployment(mconfig.DEFAULT)
    sidecar = next(c for c in pod_spec(dep)["containers"] if c["name"] == "cachemon")
    proc = CachemonProcess("--upstream", "vllm=http://127.0.0.1:9/metrics", "--poll-interval", "250ms")
    try:
        base = proc.url.removesuffix("/metrics")
        for probe in ("livenessProbe", "readinessProbe"):
            r = requests.get(base + sidecar[probe]["httpGet"]["path"], timeout=5)
            assert r.status_code in (200, 503), (probe, r.status_code)   # never 404
        assert requests.get(base + sidecar["livenessProbe"]["httpGet"]["path"], timeout=5).status_code == 200
    finally:
        proc.stop()


def test_site_file_sets_namespace_selector_and_the_labels_the_stack_selects_by(tmp_path):
    out = render_site(tmp_path, SITE)
    all_docs = docs(out)
    assert {d["metadata"]["namespace"] for d in all_docs if d["kind"] != "Kustomization"} == {"llm-serving"}
    for d in all_docs:
        if d["kind"] in ("PodMonitor", "ServiceMonitor"):
            assert d["metadata"]["labels"] == {"release": "monitoring"}
            endpoint = (d["spec"].get("podMetricsEndpoints") or d["spec"]["endpoints"])[0]
            if d["metadata"]["name"] == "cachemon":
                assert {"action": "replace", "targetLabel": "job", "replacement": "llm-cachemon"} in endpoint["relabelings"]
        if d["kind"] == "PrometheusRule":
            assert d["metadata"]["labels"]["release"] == "monitoring"
            rules_ = [r for g in d["spec"]["groups"] for r in g["rules"]]
            assert 'up{job="llm-cachemon", namespace="llm-serving"} == 0' in [r["expr"] for r in rules_]
            assert all(r["annotations"]["runbook_url"].startswith("https://wiki.example/cachemon#")
                       for r in rules_ if "alert" in r)
            assert any("sum by (cluster, namespace, team, job, model_name)" in r["expr"] for r in rules_)
        if d["kind"] == "ConfigMap":
            assert d["metadata"]["labels"] == {"grafana_dashboard": "yes"}
            assert d["metadata"]["annotations"] == {"k8s-sidecar-target-directory": "/tmp/dashboards/LLM"}
        if d["kind"] == "Deployment":
            images = {c["name"]: c["image"] for c in pod_spec(d)["containers"]}
            assert images["cachemon"] == "registry.example/cachemon:1.2.3"
