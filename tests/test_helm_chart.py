"""deploy/helm/cachemon, linted and rendered by Helm's own SDK, and the sidecar it puts in vLLM pods.

Helm: `helm-python-sdk` (PyPI; Helm's Go SDK v4 through its C ABI, no helm binary): `lint` (strict) and
`Chart.render` (what `helm template` renders). The output: core kinds under `kubernetes-validate --strict`,
the operator kinds against the prometheus-operator CRD schemas (tests/test_deploy_integrations.validate_all).

- the chart alone: its PrometheusRule holds the rule groups of prometheus/ and alerts/, its ConfigMaps the
  JSON of dashboards/ (the chart's files are generated from the same objects; compared after parsing);
- a chart of the user's (constructed below: a minimal vLLM Deployment chart listing cachemon as a
  dependency) includes ``cachemon.sidecar`` and ``cachemon.podLabels``: the container is the one the
  kustomize component adds, and the PodMonitor selects the pod;
- vLLM production-stack's real chart (vllm-project/production-stack, helm/), when a copy is at hand
  (PRODUCTION_STACK_CHART=DIR, or the git mirror the session's fetch tool writes; never committed here),
  rendered with deploy/kubernetes/production-stack/values-cachemon-gpu.yaml and through the
  post-renderer, beside this chart with podMonitor.enabled=false.
"""
from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from cachemon.monitoring import deploy_kubernetes
from cachemon.monitoring import site as mconfig
from helpers import in_ci
from pod_security import pod_spec, restricted_violations
from test_deploy_integrations import post_render, validate_all

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "helm" / "cachemon"
CFG = mconfig.DEFAULT
MIRROR = Path("/work/.mirror/vllm-project+production-stack/repo")


@pytest.fixture(scope="module")
def helm():
    try:
        import helm_python
    except ImportError:
        msg = "helm-python-sdk not installed (pip install -e '.[dev]')"
        if in_ci():
            pytest.fail(f"{msg}; CI is set, so this is an error, not a skip")
        pytest.skip(msg)
    return helm_python


def template(helm, chart: Path, values: dict | None = None, name: str = "cachemon", namespace: str = "vllm") -> list[dict]:
    with helm.Chart.load(str(chart)) as c:
        out = c.render(values or {}, name=name, namespace=namespace, is_install=True)
    return [d for path, text in sorted(out.items()) if not path.endswith("NOTES.txt")
            for d in yaml.safe_load_all(text) if d]


def by_kind(docs: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for d in docs:
        out.setdefault(d["kind"], []).append(d)
    return out


def test_helm_lint_strict_finds_nothing_above_info(helm):
    report = helm.lint(str(CHART), strict=True)
    assert report["total_charts_linted"] == 1 and report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report["messages"]


def test_helm_lint_fails_on_a_broken_chart(helm, tmp_path):
    """So the test above could fail: a template that does not parse."""
    broken = tmp_path / "cachemon"
    shutil.copytree(CHART, broken)
    (broken / "templates" / "podmonitor.yaml").write_text("{{- if .Values.podMonitor.enabled }}\nkind: PodMonitor\n")
    report = helm.lint(str(broken), strict=True)
    assert report["errors"] or any(m["severity"] == 3 for m in report["messages"]), report


@pytest.mark.slow     # kubernetes-validate is a process of its own
def test_the_chart_renders_the_shipped_rules_and_dashboards_and_passes_the_schemas(helm, tmp_path):
    docs = template(helm, CHART)
    kinds = by_kind(docs)
    assert sorted(kinds) == ["ConfigMap", "PodMonitor", "PrometheusRule"]
    assert all(d["metadata"]["namespace"] == "vllm" for d in docs)
    rule = kinds["PrometheusRule"][0]
    shipped = [yaml.safe_load((ROOT / p).read_text())["groups"][0]
               for p in ("prometheus/recording_rules.yaml", "alerts/cachemon-alerts.yaml")]
    assert rule["spec"]["groups"] == shipped
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    shown = {name: json.loads(text) for cm in kinds["ConfigMap"] for name, text in cm["data"].items()}
    assert shown == {p.name: json.loads(p.read_text()) for p in (ROOT / "dashboards").glob("*.json")}
    for cm in kinds["ConfigMap"]:      # what Grafana's dashboard sidecar (kube-prometheus-stack) picks up
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["annotations"] == {"grafana_folder": "cachemon"}
    pm = kinds["PodMonitor"][0]
    assert pm["spec"]["selector"] == {"matchLabels": {deploy_kubernetes.SIDECAR_LABEL: "true"}}
    assert pm["spec"]["podMetricsEndpoints"][0]["relabelings"][0]["replacement"] == CFG.cachemon_job
    out = validate_all(docs, tmp_path)
    assert "passed for resource configmap/cachemon-cachemon-overview" in out, out


@pytest.mark.slow     # kubernetes-validate is a process of its own
def test_the_service_monitor_replaces_the_pod_monitor_and_selects_its_service(helm, tmp_path):
    docs = template(helm, CHART, {"podMonitor": {"enabled": False}, "serviceMonitor": {"enabled": True},
                                  "prometheusRule": {"enabled": False}, "dashboards": {"enabled": False}})
    kinds = by_kind(docs)
    assert sorted(kinds) == ["Service", "ServiceMonitor"]
    svc, sm = kinds["Service"][0], kinds["ServiceMonitor"][0]
    assert svc["spec"]["selector"] == {deploy_kubernetes.SIDECAR_LABEL: "true"} and svc["spec"]["clusterIP"] == "None"
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"] == "cachemon-metrics"
    validate_all(docs, tmp_path)


# A chart of the user's (constructed): a minimal vLLM Deployment that lists cachemon as a dependency.
USER_CHART = {"apiVersion": "v2", "name": "my-vllm", "version": "1.0.0",
              "dependencies": [{"name": "cachemon", "version": "*", "repository": "file://../cachemon"}]}
USER_DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .Release.Name }}-vllm
spec:
  replicas: 1
  selector:
    matchLabels: {app.kubernetes.io/name: my-vllm}
  template:
    metadata:
      labels:
        app.kubernetes.io/name: my-vllm
        {{- include "cachemon.podLabels" . | nindent 8 }}
    spec:
      automountServiceAccountToken: false
      securityContext: {runAsNonRoot: true, seccompProfile: {type: RuntimeDefault}}
      containers:
      - name: vllm
        image: vllm/vllm-openai:v0.32.0
        ports: [{name: http, containerPort: {{ .Values.cachemon.vllm.port }}}]
      - {{- include "cachemon.sidecar" (dict "Values" .Values.cachemon) | nindent 8 }}
"""


def user_chart(tmp_path: Path) -> Path:
    chart = tmp_path / "my-vllm"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text(yaml.safe_dump(USER_CHART))
    (chart / "values.yaml").write_text("cachemon: {}\n")
    (chart / "templates" / "vllm.yaml").write_text(USER_DEPLOYMENT)
    shutil.copytree(CHART, chart / "charts" / "cachemon")      # what `helm dependency build` puts there
    return chart


@pytest.mark.slow     # kubernetes-validate is a process of its own
def test_a_users_chart_gets_the_components_sidecar_and_the_podmonitor_selects_its_pods(helm, tmp_path):
    chart = user_chart(tmp_path)
    assert helm.lint(str(chart), strict=True)["errors"] == []
    docs = template(helm, chart, name="serve")
    kinds = by_kind(docs)
    assert sorted(kinds) == ["ConfigMap", "Deployment", "PodMonitor", "PrometheusRule"]
    dep = kinds["Deployment"][0]
    containers = {c["name"]: c for c in pod_spec(dep)["containers"]}
    assert list(containers) == ["vllm", "cachemon"]
    # the very container the kustomize component and the post-renderer add
    assert containers["cachemon"] == deploy_kubernetes._sidecar(CFG)
    selector = kinds["PodMonitor"][0]["spec"]["selector"]["matchLabels"]
    assert selector.items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    spec = copy.deepcopy(pod_spec(dep))
    spec["containers"] = [containers["cachemon"]]
    assert restricted_violations(spec) == []
    validate_all(docs, tmp_path)
    # its values: another image, vLLM's port, an extra argument
    docs = template(helm, chart, {"cachemon": {"image": {"tag": "0.2.0"}, "vllm": {"port": 8200},
                                               "extraArgs": ["--poll-interval=5s"]}}, name="serve")
    side = next(c for c in pod_spec(by_kind(docs)["Deployment"][0])["containers"] if c["name"] == "cachemon")
    assert side["image"] == "ghcr.io/cachemon/cachemon:0.2.0"
    assert side["args"] == ["run", "--upstream=vllm=http://127.0.0.1:8200/metrics", "--listen=0.0.0.0:9867",
                            "--poll-interval=5s"]


def production_stack_chart(tmp_path: Path) -> Path | None:
    """vLLM production-stack's chart (helm/), from PRODUCTION_STACK_CHART or the fetched git mirror."""
    given = os.environ.get("PRODUCTION_STACK_CHART")
    if given:
        return Path(given)
    if not (MIRROR / "HEAD").is_file() or not shutil.which("git"):
        return None
    archive = tmp_path / "helm.tar"
    subprocess.run(["git", "--git-dir", str(MIRROR), "archive", "-o", str(archive), "HEAD", "helm"], check=True, timeout=60)
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "production-stack", filter="data")
    chart = tmp_path / "production-stack" / "helm"
    # Its subcharts (kube-prometheus-stack, prometheus-adapter) are off by default and come from OCI
    # registries unreachable here: the copy renders without them.
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    meta.pop("dependencies", None)
    (chart / "Chart.yaml").write_text(yaml.safe_dump(meta))
    (chart / "Chart.lock").unlink(missing_ok=True)
    return chart


@pytest.mark.slow
def test_the_sidecar_in_a_rendered_production_stack_release(helm, tmp_path):
    chart = production_stack_chart(tmp_path)
    if chart is None:
        pytest.skip("no copy of vllm-project/production-stack's chart (set PRODUCTION_STACK_CHART=.../helm)")
    values = yaml.safe_load((ROOT / "deploy/kubernetes/production-stack/values-cachemon-gpu.yaml").read_text())
    with helm.Chart.load(str(chart)) as c:
        rendered = c.render(values, name="vllm", namespace="vllm", is_install=True)
    text = "---\n".join(t for p, t in sorted(rendered.items()) if not p.endswith("NOTES.txt") and t.strip())
    (tmp_path / "rendered.yaml").write_text(text)
    docs = post_render(tmp_path / "rendered.yaml")
    engines = [d for d in docs if d["kind"] == "Deployment"
               and any(c["name"] == "vllm" for c in pod_spec(d)["containers"])]
    assert engines, [d["metadata"]["name"] for d in docs]
    for dep in engines:
        containers = {c["name"]: c for c in pod_spec(dep)["containers"]}
        assert containers["cachemon"] == deploy_kubernetes._sidecar(CFG)
        assert dep["spec"]["template"]["metadata"]["labels"][deploy_kubernetes.SIDECAR_LABEL] == "true"
    others = [d for d in docs if d["kind"] == "Deployment" and d not in engines]
    assert all("cachemon" not in {c["name"] for c in pod_spec(d)["containers"]} for d in others)
    # this chart beside it: rules and dashboards; the post-renderer brought the PodMonitor
    ours = template(helm, CHART, {"podMonitor": {"enabled": False}})
    assert sorted(by_kind(ours)) == ["ConfigMap", "PrometheusRule"]
    assert [d["kind"] for d in docs].count("PodMonitor") == 1
    checked = [d for d in docs + ours if d["kind"] in ("Deployment", "PodMonitor", "PrometheusRule", "ConfigMap")]
    validate_all(checked, tmp_path)
