"""Render the monitoring bundle, or check that the committed copy is current.

    cachemon monitoring            # (re)write the files under the repository root
    cachemon monitoring --check    # exit 1 listing stale / missing files (CI)
    python -m cachemon.monitoring.generate --check

Like vLLM's generated dashboards: the files are committed (users copy them without
running Python) and CI fails when someone edits a threshold without regenerating.
"""
from __future__ import annotations

import sys
from pathlib import Path

import click

from cachemon.cli_options import config_option, usage_error
from cachemon.config import ConfigError
from cachemon.jsontypes import JsonObject
from cachemon.monitoring import compose_demo, dashboards, deploy, mixin, prometheus_rules, runbook, scrape_configs, serialise
from cachemon.monitoring import site as mconfig

ALERTS_FILE = "alerts/cachemon-alerts.yaml"
RECORDING_FILE = "prometheus/recording_rules.yaml"


def rule_groups(cfg: mconfig.MonitoringConfig, for_override: str | None = None) -> tuple[JsonObject, JsonObject]:
    return prometheus_rules.recording_group(cfg), prometheus_rules.alert_group(cfg, for_override)


def files(cfg: mconfig.MonitoringConfig = mconfig.DEFAULT) -> dict[str, str]:
    """Repository-relative path -> file content."""
    recording, alerting = rule_groups(cfg)
    out = {
        RECORDING_FILE: serialise.to_yaml({"groups": [recording]}, serialise.GENERATED),
        ALERTS_FILE: serialise.to_yaml({"groups": [alerting]}, serialise.GENERATED),
        "prometheus/prometheus-static.yml": serialise.to_yaml(scrape_configs.static(cfg), serialise.GENERATED),
        "prometheus/prometheus-file-sd.yml": serialise.to_yaml(scrape_configs.file_sd(cfg), serialise.GENERATED),
        "prometheus/prometheus-kubernetes.yml":
            serialise.to_yaml(scrape_configs.kubernetes(cfg), serialise.GENERATED + scrape_configs.KUBERNETES_NOTE),
        "deploy/compose/prometheus.yml": serialise.to_yaml(scrape_configs.compose(cfg), serialise.GENERATED),
        "prometheus/prometheus-demo.yml": serialise.to_yaml(scrape_configs.demo(cfg), serialise.GENERATED),
        "docs/runbook.md": runbook.render(cfg),
        "dashboards/provisioning/cachemon.yaml":
            serialise.to_yaml(deploy.grafana_dashboard_provider("/var/lib/grafana/dashboards/cachemon"), serialise.GENERATED),
    }
    for name, targets in scrape_configs.file_sd_targets(cfg).items():
        out[f"prometheus/targets/{name}"] = serialise.to_json(targets)
    dash = {name: serialise.to_json(d) for name, d in dashboards.dashboards(cfg).items()}
    for name, text in dash.items():
        out[f"dashboards/{name}"] = text
    out["dashboards/.lint"] = serialise.to_yaml(dashboards.lint_exclusions(cfg), serialise.GENERATED)
    out.update(deploy.files(cfg, [recording, alerting], dash))
    out.update(compose_demo.files(cfg))
    out.update(mixin.files(cfg))   # the same rules, alerts and dashboards as a jsonnet mixin
    return out


def find_root(start: Path | None = None) -> Path | None:
    """The repository root: the nearest parent with pyproject.toml and src/cachemon."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / "pyproject.toml").is_file() and (d / "src" / "cachemon").is_dir():
            return d
    return None


def stale(root: Path, wanted: dict[str, str]) -> list[str]:
    out = []
    for rel, text in sorted(wanted.items()):
        p = root / rel
        if not p.is_file():
            out.append(f"missing: {rel}")
        elif p.read_text(encoding="utf-8") != text:
            out.append(f"stale:   {rel}")
    return out


def write(root: Path, wanted: dict[str, str]) -> list[str]:
    changed = []
    for rel, text in sorted(wanted.items()):
        p = root / rel
        if p.is_file() and p.read_text(encoding="utf-8") == text:
            continue
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
        changed.append(rel)
    return changed


@click.command("monitoring")
@click.option("--check", is_flag=True, help="Do not write; exit 1 if any generated file is missing or stale.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), help="Output root (default: the repository root).")
@config_option("Monitoring config (YAML): selectors, target_labels, thresholds and per-model overrides, "
               "runbook_base_url, images, namespace, operator_labels, Grafana sidecar label and folder.", exists=True)
def monitoring_command(check: bool, out_dir: str | None, config_path: str | None) -> None:
    """Render Prometheus rules and configs, alerts, Grafana dashboards, deploy files and the runbook.

    With --config FILE --out DIR: the bundle for one site (namespace, selector, kept labels,
    thresholds, images, the labels kube-prometheus-stack and Grafana select by) under DIR.
    """
    try:
        cfg = mconfig.load(config_path)
    except ConfigError as e:   # one line naming the file and key, never a traceback
        usage_error(f"config error: {e}", "monitoring")
    root = Path(out_dir) if out_dir else find_root()
    if root is None:   # never scatter 20-odd files into an arbitrary working directory
        usage_error("not inside a cachemon checkout; pass --out DIR", "monitoring")
    wanted = files(cfg)
    if check:
        problems = stale(root, wanted)
        for line in problems:
            click.echo(line, err=True)
        if problems:
            click.echo(f"{len(problems)} generated file(s) out of date under {root}; run `cachemon monitoring`.", err=True)
            sys.exit(1)
        click.echo(f"{len(wanted)} generated files up to date under {root}.")
        return
    changed = write(root, wanted)
    click.echo(f"wrote {len(changed)} of {len(wanted)} files under {root}" + "".join(f"\n  {c}" for c in changed))


if __name__ == "__main__":
    monitoring_command()
