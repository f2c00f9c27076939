"""deploy/: Kubernetes manifests, a systemd unit and a compose stack.

The PrometheusRule embeds the very rule groups written to ``prometheus/`` and ``alerts/``
and the dashboard ConfigMaps embed the very JSON written to ``dashboards/``: the
generator renders both from one object, and a test compares them after parsing.
"""
from __future__ import annotations

from cachemon import __version__
from cachemon.monitoring import render
from cachemon.monitoring.config import MonitoringConfig

APP = "vllm"
LABELS = {"app.kubernetes.io/name": APP, "app.kubernetes.io/instance": "vllm-tiny"}


def _cachemon_args(cfg: MonitoringConfig) -> list[str]:
    return ["run", f"--upstream=vllm=http://127.0.0.1:{cfg.vllm_port}/metrics",
            f"--listen=0.0.0.0:{cfg.cachemon_port}", "--poll-interval=2s"]


# Pod Security Standards "restricted" (https://kubernetes.io/docs/concepts/security/pod-security-standards/):
# non-root, RuntimeDefault seccomp, no privilege escalation, every capability dropped.
POD_SECURITY = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
NOBODY = 65534        # the cachemon image's user
VLLM_UID = 1000       # any non-root uid; vLLM writes only to HOME / the HF cache (an emptyDir)
VLLM_HOME = "/home/vllm"


def _sidecar(cfg: MonitoringConfig) -> dict:
    def probe(path: str, period: int, failures: int) -> dict:
        return {"httpGet": {"path": path, "port": "cachemon-metrics"}, "periodSeconds": period,
                "timeoutSeconds": 5, "failureThreshold": failures}
    return {
        "name": "cachemon", "image": cfg.cachemon_image, "args": _cachemon_args(cfg),
        "ports": [{"name": "cachemon-metrics", "containerPort": cfg.cachemon_port}],
        # /-/ready: listening and the first poll cycle has run, never "vLLM is up": an unready
        # sidecar takes the whole pod, vLLM included, out of the Service.
        "readinessProbe": probe("/-/ready", 10, 3),
        "livenessProbe": probe("/-/healthy", 20, 3),
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"cpu": "500m", "memory": "256Mi"}},
        "securityContext": {**CONTAINER_SECURITY, "runAsNonRoot": True, "runAsUser": NOBODY, "runAsGroup": NOBODY,
                            "readOnlyRootFilesystem": True, "seccompProfile": {"type": "RuntimeDefault"}},
    }


def _vllm(cfg: MonitoringConfig) -> dict:
    return {
        "name": "vllm", "image": cfg.vllm_image,
        "args": ["--model", cfg.model, "--port", str(cfg.vllm_port), "--enable-prefix-caching"],
        "env": [{"name": "HOME", "value": VLLM_HOME}, {"name": "HF_HOME", "value": f"{VLLM_HOME}/.cache/huggingface"}],
        "ports": [{"name": "http", "containerPort": cfg.vllm_port}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10},
        "resources": {"limits": {"nvidia.com/gpu": 1}},
        "volumeMounts": [{"name": "home", "mountPath": VLLM_HOME}, {"name": "dshm", "mountPath": "/dev/shm"}],
        "securityContext": {**CONTAINER_SECURITY, "runAsUser": VLLM_UID, "runAsGroup": VLLM_UID},
    }


def deployment(cfg: MonitoringConfig) -> dict:
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "vllm-tiny", "namespace": cfg.namespace, "labels": LABELS},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": LABELS},
            "template": {
                "metadata": {"labels": LABELS,
                             # Opt-in for the plain pod-discovery scrape config in prometheus/.
                             "annotations": {"cachemon.io/scrape": "true"}},
                "spec": {
                    "securityContext": {**POD_SECURITY, "fsGroup": VLLM_UID},
                    # The sidecar polls vLLM over the pod's loopback: no Service hop, same lifecycle.
                    "containers": [_vllm(cfg), _sidecar(cfg)],
                    "volumes": [{"name": "home", "emptyDir": {}},
                                {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}}],
                },
            },
        },
    }


def service(cfg: MonitoringConfig) -> dict:
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "vllm-tiny", "namespace": cfg.namespace, "labels": LABELS},
        "spec": {"selector": LABELS, "ports": [
            {"name": "http", "port": cfg.vllm_port, "targetPort": "http"},
            {"name": "cachemon-metrics", "port": cfg.cachemon_port, "targetPort": "cachemon-metrics"},
        ]},
    }


def _endpoint(job: str, port: str) -> dict:
    return {
        "port": port, "path": "/metrics", "interval": "15s",
        # The operator's default job is <namespace>/<name>; the alerts select cachemon_selector,
        # whose job config.validate keeps equal to cachemon_job.
        "relabelings": [
            {"action": "replace", "targetLabel": "job", "replacement": job},
            {"action": "replace", "sourceLabels": ["__meta_kubernetes_pod_name"], "targetLabel": "instance"},
        ],
    }


def _monitors(cfg: MonitoringConfig, kind: str, endpoints_key: str) -> list[dict]:
    return [{
        "apiVersion": "monitoring.coreos.com/v1", "kind": kind,
        "metadata": {"name": name, "namespace": cfg.namespace, "labels": dict(cfg.operator_labels)},
        "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": APP}},
                 endpoints_key: [_endpoint(job, port)]},
    } for name, job, port in (("cachemon", cfg.cachemon_job, "cachemon-metrics"), ("vllm", cfg.vllm_job, "http"))]


def pod_monitors(cfg: MonitoringConfig) -> list[dict]:
    return _monitors(cfg, "PodMonitor", "podMetricsEndpoints")


def service_monitors(cfg: MonitoringConfig) -> list[dict]:
    """The same scrape through the Service, for Prometheus setups that select only ServiceMonitors."""
    return _monitors(cfg, "ServiceMonitor", "endpoints")


def prometheus_rule(cfg: MonitoringConfig, groups: list[dict]) -> dict:
    return {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
        "metadata": {"name": "cachemon", "namespace": cfg.namespace,
                     "labels": {**cfg.operator_labels, "role": "alert-rules"}},
        "spec": {"groups": groups},
    }


def dashboard_configmaps(cfg: MonitoringConfig, dashboards: dict[str, str]) -> list[dict]:
    return [{
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": f"grafana-dashboard-{name.removesuffix('.json')}", "namespace": cfg.namespace,
                     # Picked up by Grafana's dashboard sidecar (kube-prometheus-stack default label),
                     # filed in the folder the annotation names (sidecar folderAnnotation).
                     "labels": dict(cfg.grafana_dashboard_label),
                     "annotations": dict(cfg.grafana_folder_annotation)},
        "data": {name: text},
    } for name, text in sorted(dashboards.items())]


def kustomization() -> dict:
    return {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "resources": ["vllm-cachemon.yaml", "podmonitor.yaml", "prometheusrule.yaml", "grafana-dashboards.yaml"]}


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


def _healthcheck(test: list[str]) -> dict:
    return {"test": test, "interval": "15s", "timeout": "5s", "retries": 3, "start_period": "20s"}


def _http_ok(url: str) -> list[str]:
    """A healthcheck for images with Python but no curl/wget (vLLM's, cachemon's)."""
    return ["CMD", "python3", "-c", f"import urllib.request; urllib.request.urlopen({url!r}, timeout=4)"]


def compose(cfg: MonitoringConfig) -> dict:
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


def grafana_datasource() -> dict:
    return {"apiVersion": 1, "datasources": [
        {"name": "Prometheus", "type": "prometheus", "access": "proxy", "url": "http://prometheus:9090",
         "isDefault": True, "jsonData": {"timeInterval": "15s"}}]}


def grafana_dashboard_provider(path: str) -> dict:
    return {"apiVersion": 1, "providers": [
        {"name": "cachemon", "folder": "cachemon", "type": "file", "disableDeletion": False,
         "allowUiUpdates": False, "updateIntervalSeconds": 60, "options": {"path": path, "foldersFromFilesStructure": False}}]}


def files(cfg: MonitoringConfig, rule_groups: list[dict], dashboards: dict[str, str]) -> dict[str, str]:
    y = render.to_yaml
    return {
        "deploy/kubernetes/vllm-cachemon.yaml": render.to_yaml_docs([deployment(cfg), service(cfg)], render.GENERATED),
        "deploy/kubernetes/podmonitor.yaml": render.to_yaml_docs(pod_monitors(cfg), render.GENERATED),
        # Not in kustomization.yaml: an alternative to podmonitor.yaml, never both (double scrape).
        "deploy/kubernetes/servicemonitor.yaml": render.to_yaml_docs(
            service_monitors(cfg),
            render.GENERATED + "# Use INSTEAD of podmonitor.yaml when your Prometheus selects only ServiceMonitors.\n"),
        "deploy/kubernetes/prometheusrule.yaml": y(prometheus_rule(cfg, rule_groups), render.GENERATED),
        "deploy/kubernetes/grafana-dashboards.yaml": render.to_yaml_docs(dashboard_configmaps(cfg, dashboards), render.GENERATED),
        "deploy/kubernetes/kustomization.yaml": y(kustomization(), render.GENERATED),
        "deploy/systemd/cachemon.service": systemd_unit(cfg),
        "deploy/compose/compose.yaml": y(compose(cfg), render.GENERATED),
        "deploy/compose/grafana/provisioning/datasources/prometheus.yaml": y(grafana_datasource(), render.GENERATED),
        "deploy/compose/grafana/provisioning/dashboards/cachemon.yaml":
            y(grafana_dashboard_provider("/var/lib/grafana/dashboards/cachemon"), render.GENERATED),
    }
