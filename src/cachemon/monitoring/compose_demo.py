"""deploy/compose/demo.yaml: `make demo-stack` for Docker / Podman users, with Grafana.

The cachemon image runs `cachemon demo` (its fake vLLM and the exporter, one container, and the
receiver of Alertmanager's webhook, which prints each notification in the container's log), and
beside it Prometheus with the shipped rules, Alertmanager with examples/alertmanager.yml (whose webhook
posts to this `cachemon` service) and Grafana with the dashboards provisioned:
`docker compose -f deploy/compose/demo.yaml up`, then http://127.0.0.1:3000 (anonymous viewer), :9090/alerts, :9093.
"""
from __future__ import annotations

from cachemon.jsontypes import JsonObject
from cachemon.monitoring import scrape_configs, serialise
from cachemon.monitoring.site import MonitoringConfig

# The demo's Alertmanager receiver (`cachemon demo --alert-webhook`): examples/alertmanager.yml's
# webhook URL, http://cachemon:5001/alerts, names this service and port.
WEBHOOK_PORT = 5001


def _healthcheck(url: str, probe: list[str] | None = None) -> JsonObject:
    return {"test": [*probe] if probe else ["CMD", "wget", "-q", "-O", "/dev/null", url],
            "interval": "15s", "timeout": "5s", "retries": 3, "start_period": "20s"}


def alertmanager_service(cfg: MonitoringConfig) -> JsonObject:
    """Alertmanager with the example config (its webhook posts to the demo's `cachemon` service)."""
    return {
        "image": cfg.alertmanager_image,
        "command": ["--config.file=/etc/alertmanager/alertmanager.yml", "--storage.path=/alertmanager"],
        "volumes": ["../../examples/alertmanager.yml:/etc/alertmanager/alertmanager.yml:ro"],
        "ports": [f"{cfg.alertmanager_port}:{cfg.alertmanager_port}"],
        "healthcheck": _healthcheck(f"http://127.0.0.1:{cfg.alertmanager_port}/-/ready"),
    }


def demo_compose(cfg: MonitoringConfig) -> JsonObject:
    port = cfg.cachemon_port
    probe = ["CMD", "python3", "-c",
             f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{port}/-/healthy', timeout=4)"]
    return {
        "name": "cachemon-demo",
        "services": {
            "cachemon": {
                "build": {"context": "../..", "dockerfile": "Containerfile"},
                "image": cfg.cachemon_image,
                "command": ["demo", f"--listen=0.0.0.0:{port}", f"--vllm-listen=0.0.0.0:{cfg.demo_vllm_port}",
                            f"--alert-webhook=0.0.0.0:{WEBHOOK_PORT}"],
                "ports": [f"{port}:{port}", f"{cfg.demo_vllm_port}:{cfg.demo_vllm_port}"],
                "user": "65534:65534", "read_only": True, "tmpfs": ["/tmp"], "cap_drop": ["ALL"],
                "security_opt": ["no-new-privileges:true"],
                "healthcheck": _healthcheck("", probe),
            },
            "prometheus": {
                "image": cfg.prometheus_image,
                "volumes": ["./prometheus-demo.yml:/etc/prometheus/prometheus.yml:ro",
                            "../../prometheus/recording_rules.yaml:/etc/prometheus/rules/recording_rules.yaml:ro",
                            "../../alerts/cachemon-alerts.yaml:/etc/prometheus/rules/cachemon-alerts.yaml:ro"],
                "ports": ["9090:9090"],
                "healthcheck": _healthcheck("http://127.0.0.1:9090/-/ready"),
                "depends_on": {"cachemon": {"condition": "service_healthy"}},
            },
            "alertmanager": alertmanager_service(cfg),
            "grafana": {
                "image": cfg.grafana_image,
                # a demo on the local machine: anonymous viewing on
                "environment": {"GF_AUTH_ANONYMOUS_ENABLED": "true", "GF_AUTH_ANONYMOUS_ORG_ROLE": "Viewer"},
                "volumes": ["./grafana/provisioning:/etc/grafana/provisioning:ro",
                            "../../dashboards:/var/lib/grafana/dashboards/cachemon:ro"],
                "ports": ["3000:3000"],
                "healthcheck": _healthcheck("http://127.0.0.1:3000/api/health"),
                "depends_on": {"prometheus": {"condition": "service_healthy"}},
            },
        },
    }


def files(cfg: MonitoringConfig) -> dict[str, str]:
    return {
        "deploy/compose/demo.yaml": serialise.to_yaml(demo_compose(cfg), serialise.GENERATED),
        "deploy/compose/prometheus-demo.yml": serialise.to_yaml(
            scrape_configs.compose(cfg, vllm_target=f"cachemon:{cfg.demo_vllm_port}", interval="5s"), serialise.GENERATED),
    }
