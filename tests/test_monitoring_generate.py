"""The generator: committed files current, one source of truth, naming conventions, deploy embeds."""
from __future__ import annotations

import configparser
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

import promql_lint as lint  # tests/promql_lint.py: the bundle's linter, a test tool
from assert_support import nonempty
from cachemon import catalog as c
from cachemon import thresholds as t
from cachemon.cli import main as cli_main
from cachemon.config import ConfigError
from cachemon.demo.replay import bundled_pages
from cachemon.monitoring import dashboards, generate, prometheus_rules
from cachemon.monitoring import site as mconfig

ROOT = Path(__file__).resolve().parents[1]
CFG = mconfig.DEFAULT


def load_groups(rel: str) -> list[dict]:
    return yaml.safe_load((ROOT / rel).read_text())["groups"]


def alert_rules() -> list[dict]:
    return [r for g in load_groups(generate.ALERTS_FILE) for r in g["rules"]]


def recording_rules() -> list[dict]:
    return [r for g in load_groups(generate.RECORDING_FILE) for r in g["rules"]]


# --- --check ------------------------------------------------------------------------------------
@pytest.mark.slow
def test_committed_files_are_current_via_python_m():
    r = subprocess.run([sys.executable, "-m", "cachemon.monitoring.generate", "--check"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "up to date" in r.stdout


def test_committed_files_are_current_via_cachemon_monitoring():
    r = CliRunner().invoke(cli_main, ["monitoring", "--check", "--out", str(ROOT)])
    assert r.exit_code == 0, r.output


@pytest.mark.slow
def test_check_reports_stale_and_missing_files(tmp_path):
    runner = CliRunner()
    assert runner.invoke(cli_main, ["monitoring", "--out", str(tmp_path)]).exit_code == 0
    assert runner.invoke(cli_main, ["monitoring", "--check", "--out", str(tmp_path)]).exit_code == 0
    alerts = tmp_path / generate.ALERTS_FILE
    alerts.write_text(alerts.read_text().replace("< 0.8", "< 0.7"))     # a hand edit
    (tmp_path / "dashboards" / "cachemon-fleet.json").unlink()
    r = runner.invoke(cli_main, ["monitoring", "--check", "--out", str(tmp_path)])
    assert r.exit_code == 1
    assert f"stale:   {generate.ALERTS_FILE}" in r.output
    assert "missing: dashboards/cachemon-fleet.json" in r.output
    # regenerating repairs exactly those two
    r = runner.invoke(cli_main, ["monitoring", "--out", str(tmp_path)])
    assert "wrote 2 of" in r.output


def test_outside_a_checkout_it_refuses_to_write_without_out(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(cli_main, ["monitoring"])
    assert r.exit_code == 2 and "pass --out DIR" in r.output
    assert list(tmp_path.iterdir()) == []


def test_a_threshold_edit_makes_alerts_dashboards_runbook_and_deploy_stale(monkeypatch):
    monkeypatch.setattr(t, "HIT_RATIO_WARNING", 0.85)
    stale = {line.split()[-1] for line in generate.stale(ROOT, generate.files(CFG))}
    assert stale == {generate.ALERTS_FILE, "dashboards/cachemon-overview.json", "dashboards/cachemon-fleet.json",
                     "docs/runbook.md", "deploy/kubernetes/prometheusrule.yaml",
                     "deploy/kubernetes/grafana-dashboards.yaml",
                     # the Helm chart's copies: generated from the same objects, never hand-copied
                     "deploy/helm/cachemon/files/prometheus-rules.yaml",
                     "deploy/helm/cachemon/files/dashboards/cachemon-overview.json",
                     "deploy/helm/cachemon/files/dashboards/cachemon-fleet.json",
                     "mixin/config.libsonnet"}   # the mixin's default _config; its templates stay as they are
    text = generate.files(CFG)
    assert "< 0.85" in text[generate.ALERTS_FILE]
    assert "85%" in text["docs/runbook.md"]
    assert '"value": 0.85' in text["dashboards/cachemon-overview.json"]


def test_config_file_overrides_runbook_url_and_selector(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text("runbook_base_url: https://wiki.example/cachemon\ncachemon_selector: 'job=\"llm-cache\"'\n"
                    "cachemon_job: llm-cache\n")
    cfg = mconfig.load(str(site))
    rules_ = prometheus_rules.alert_group(cfg)["rules"]
    assert all(r["annotations"]["runbook_url"].startswith("https://wiki.example/cachemon#") for r in rules_)
    assert 'up{job="llm-cache"} == 0' in [r["expr"] for r in rules_]
    assert all('job="llm-cache"' in r["expr"] for r in prometheus_rules.recording_group(cfg)["rules"][:2])
    bad = tmp_path / "bad.yaml"
    bad.write_text("runbook_url: x\n")
    with pytest.raises(ConfigError, match="^runbook_url: unknown key"):
        mconfig.load(str(bad))


# --- naming ------------------------------------------------------------------------------------
def _tenant_rule(r: dict) -> bool:
    return r["record"].split(":")[0] in prometheus_rules.TENANT_LEVELS


def test_recording_rules_are_named_level_metric_operation():
    names = [r["record"] for r in recording_rules() if not _tenant_rule(r)]
    assert len(names) == len(set(names)) == 24
    for n in names:
        level, metric, op = n.split(":")
        assert level in prometheus_rules.LEVELS, n
        assert metric.startswith(c.PREFIX) and not metric.endswith("_total"), n
        assert re.fullmatch(r"(ratio_)?rate(1m|5m)", op), n
    for w in t.RATIO_WINDOWS:
        for level in prometheus_rules.LEVELS:
            assert f"{level}:cachemon_prefix_cache_hit_tokens_per_query_tokens:ratio_rate{w}" in names


def test_tenant_recording_rules_are_named_level_metric_operation():
    tenant = [r for r in recording_rules() if _tenant_rule(r)]
    names = [r["record"] for r in tenant]
    assert len(names) == len(set(names)) == 12
    for r in tenant:
        level, metric, op = r["record"].split(":")
        assert metric.startswith(c.PREFIX + "kv_tenant_") and not metric.endswith("_total"), r
        assert re.fullmatch(rf"((rest_)?ratio_|isolation_)?rate{t.ALERT_RATIO_WINDOW}", op), r
        # a tenant level keeps the model's fleet labels and its own, nothing of a replica
        m = re.match(r"sum by \(([^)]*)\)", r["expr"])
        if m:
            assert m.group(1).startswith("cluster, namespace, job, model_name, tenant"), r
        assert "instance" not in r["expr"] and "upstream" not in r["expr"], r
    assert {prometheus_rules.TENANT_RATIO, prometheus_rules.TENANT_REST_RATIO, prometheus_rules.TENANT_KV} <= set(names)


def test_recording_rules_aggregate_the_labels_their_level_names():
    """Per-replica levels drop only engine / cache (every target label stays); fleet levels
    keep the configured target labels (cluster, namespace) besides their own."""
    recorded = recording_rules()
    assert recorded
    for r in recorded:
        if _tenant_rule(r):
            continue
        level = r["record"].split(":")[0]
        m = re.match(r"sum (by|without) \(([^)]*)\)", r["expr"])
        if m:
            labels = tuple(x.strip() for x in m.group(2).split(","))
            if m.group(1) == "without":
                assert labels == prometheus_rules.REPLICA_LEVELS[level], r
            else:
                assert labels == ("cluster", "namespace", *prometheus_rules.FLEET_LEVELS[level]), r
        else:   # ratios divide the same level's rates, guarded against idle
            assert re.fullmatch(rf"{level}:\S+:rate\dm\n  / \({level}:\S+:rate\dm > 0\)", r["expr"]), r


def test_exported_names_have_no_colons():
    assert all(":" not in s.sample_name for s in c.ALL)


def test_alerts_follow_monitoring_mixin_conventions():
    groups = load_groups(generate.ALERTS_FILE)
    for g in nonempty(groups):
        assert len(g["name"]) <= 40 and len(g["rules"]) <= 20
    for r in nonempty(alert_rules()):
        name, ann = r["alert"], r["annotations"]
        assert re.fullmatch(r"Cachemon[A-Z][A-Za-z0-9]+", name) and len(name) <= 40, name
        assert r["labels"]["severity"] in ("warning", "critical", "info")
        assert set(ann) == {"summary", "description", "runbook_url"}
        assert re.fullmatch(r"[A-Z][^{}]*\.", ann["summary"]), ann["summary"]        # static sentence
        assert "{{" in ann["description"] and "$labels" in ann["description"], name  # templated
        assert ann["runbook_url"] == f"{CFG.runbook_base_url}#{name.lower()}"
        assert re.fullmatch(r"\d+[smh]", r["for"])
    by_name = {r["alert"]: r for r in alert_rules()}
    for ratio_alert in nonempty(("CachemonPrefixCacheHitRatioLow", "CachemonHitRatioDroppedAfterChange",
                        "CachemonHitRatioNotRecovered", "CachemonReplicaHitRatioSkew", "CachemonKVCacheNearlyFull")):
        assert "humanizePercentage" in by_name[ratio_alert]["annotations"]["description"]


def test_hit_ratio_alert_says_which_ratio_it_read():
    # the reported branch carries ratio_source; the description is worded for the branch that fired
    (rule,) = [r for r in prometheus_rules.alert_group(CFG)["rules"]
               if r.get("alert") == "CachemonPrefixCacheHitRatioLow" and r["labels"]["severity"] == "warning"]
    text = rule["annotations"]["description"]
    assert "{{ if $labels.ratio_source }}as vLLM reports it" in text and "{{ else }}over the last 5m{{ end }}" in text
    assert "eras without token counters" not in text


def test_hit_ratio_alerts_render_thresholds_py():
    low = [r for r in alert_rules() if r["alert"] == "CachemonPrefixCacheHitRatioLow"]
    assert {r["labels"]["severity"]: r["for"] for r in low} == {"warning": t.ALERT_FOR, "critical": t.ALERT_FOR}
    exprs = {r["labels"]["severity"]: r["expr"] for r in low}
    assert f"< {t.HIT_RATIO_WARNING:g}\n" in exprs["warning"]
    assert f"< {t.HIT_RATIO_CRITICAL:g}\n" in exprs["critical"]
    for sev, e in exprs.items():
        # the traffic floor on the counter-based ratio ...
        assert f"model_instance:cachemon_prefix_cache_query_tokens:rate5m > {t.TRAFFIC_FLOOR_TOKENS_PER_SECOND:g}\n" in e
        # ... or, on ratio-only eras (V0), vLLM's reported ratio where the replica has no token counters
        thr = t.HIT_RATIO_WARNING if sev == "warning" else t.HIT_RATIO_CRITICAL
        assert f'{c.REPORTED_HIT_RATIO.sample_name}{{job="cachemon", cache="local"}}) < {thr:g}' in e
        assert ("unless on (cluster, namespace, job, instance, upstream, model_name) "
                "model_instance:cachemon_prefix_cache_query_tokens:rate5m\n") in e
        # ... and a tailed log's ratio (its own upstream) only where its cachemon has no counters at all
        assert e.rstrip(")").rstrip().endswith(
            'unless on (cluster, namespace, job, instance, upstream) (cachemon_upstream_info{job="cachemon", '
            'kind="log"} and on (cluster, namespace, job, instance) model_instance:cachemon_prefix_cache_query_tokens:rate5m),\n'
            '  "ratio_source", "vllm_reported", "", ""')
    for r in low:   # the description names the active causes and links their runbook sections
        d = r["annotations"]["description"]
        assert "cachemon_cause_active" in d and f"{CFG.runbook_base_url}#cause-{{{{ .Labels.cause }}}}" in d


def test_alerts_compute_the_ratio_from_counters_not_the_gauge():
    for r in alert_rules() + recording_rules():
        assert c.HIT_RATIO.sample_name + "{" not in r["expr"] and c.HIT_RATIO.sample_name + " " not in r["expr"]
    raw = [s for r in recording_rules() if not _tenant_rule(r)
           for s in lint.selectors(r["expr"]) if s.name.startswith(c.PREFIX)]
    assert {s.name for s in raw} == {c.HIT_TOKENS.sample_name, c.QUERY_TOKENS.sample_name}
    assert all('cache="local"' in s.matchers and s.function == "rate" for s in raw)
    # the tenant ratio: hit tokens of the KV-event ledger (full-report requests) over hits + stored, as rates
    raw = [s for r in recording_rules() if _tenant_rule(r)
           for s in lint.selectors(r["expr"]) if s.name.startswith(c.PREFIX)]
    assert {s.name for s in raw} == {c.KV_TENANT_HIT_TOKENS.sample_name, c.KV_TENANT_STORED_TOKENS.sample_name}
    assert all(s.function == "rate" for s in raw)


# --- every queried metric exists --------------------------------------------------------------
def _vllm_names() -> set[str]:
    names = set()
    for _, page in bundled_pages():
        names |= {m.group(1) for m in re.finditer(r"^(vllm:[a-zA-Z0-9_:]+)", page, re.M)}
    return names


def test_every_queried_metric_exists():
    known = {s.sample_name for s in c.ALL} | {r["record"] for r in recording_rules()} | {"up"} | _vllm_names()
    exprs = [r["expr"] for r in alert_rules() + recording_rules()]
    for d in dashboards.dashboards(CFG).values():
        exprs += [e for _, e in lint.dashboard_exprs(d)]
        exprs += [sel for _, sel, _ in lint.variable_queries(d)]
    unknown = {n for e in exprs for n in lint.metric_names(e)} - known
    assert not unknown
    # and the vLLM histograms the overview plots are really in the captures
    assert {"vllm:time_to_first_token_seconds_bucket", "vllm:request_prefill_time_seconds_bucket",
            "vllm:time_to_first_token_seconds_count"} <= _vllm_names()


# --- runbook ----------------------------------------------------------------------------------
def _anchors(md: str) -> set[str]:
    # GitHub's heading slugs: lower case, punctuation dropped except "-" and "_", spaces to "-"
    return {re.sub(r"[^a-z0-9 _-]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.+)$", md, re.M)}


def test_runbook_has_a_section_for_every_alert_url():
    md = (ROOT / "docs" / "runbook.md").read_text()
    anchors = _anchors(md)
    alerts = alert_rules()
    assert alerts
    for r in alerts:
        assert r["annotations"]["runbook_url"].split("#")[1] in anchors, r["alert"]
    for link in re.findall(r"\]\(#([^)]+)\)", md):   # internal links resolve
        assert link in anchors, link


def test_runbook_states_the_thresholds_of_thresholds_py():
    md = (ROOT / "docs" / "runbook.md").read_text()
    assert f"| Hit ratio, warning | < {t.HIT_RATIO_WARNING:.0%} over {t.ALERT_RATIO_WINDOW} | {t.ALERT_FOR} |" in md
    assert f"| Hit ratio, critical | < {t.HIT_RATIO_CRITICAL:.0%} over {t.ALERT_RATIO_WINDOW} | {t.ALERT_FOR} |" in md
    assert f"> {t.TRAFFIC_FLOOR_TOKENS_PER_SECOND:g} query token/s" in md
    for cause in ("Dynamic content at the head", "Chat template or tokenizer change", "Model upgrade",
                  "Restart or cache reset", "Cache too small", "Replicas without a shared cache",
                  "Decode-dominated cost"):
        assert cause in md
    assert "$" not in md.replace("$$", "")   # no unsubstituted template placeholder


def test_a_new_alert_without_runbook_section_is_refused(monkeypatch):
    from cachemon.monitoring import runbook
    monkeypatch.delitem(runbook.SECTIONS, "CachemonLogSourceStalled")
    with pytest.raises(ValueError, match="CachemonLogSourceStalled"):
        runbook.render(CFG)


# --- deploy and configs -----------------------------------------------------------------------
def _docs(rel: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((ROOT / rel).read_text()) if d]


def test_prometheus_rule_embeds_exactly_the_rule_files():
    (pr,) = _docs("deploy/kubernetes/prometheusrule.yaml")
    assert pr["kind"] == "PrometheusRule" and pr["apiVersion"] == "monitoring.coreos.com/v1"
    assert pr["spec"]["groups"] == load_groups(generate.RECORDING_FILE) + load_groups(generate.ALERTS_FILE)


def test_dashboard_configmaps_embed_exactly_the_dashboards():
    cms = _docs("deploy/kubernetes/grafana-dashboards.yaml")
    files = sorted((ROOT / "dashboards").glob("*.json"))
    assert len(cms) == len(files) == 3
    embedded = {}
    for cm in cms:
        assert cm["kind"] == "ConfigMap" and cm["metadata"]["labels"] == {"grafana_dashboard": "1"}
        embedded.update(cm["data"])
    assert {n: json.loads(v) for n, v in embedded.items()} == {f.name: json.loads(f.read_text()) for f in files}


def test_kubernetes_manifests_wire_the_sidecar():
    docs = {}
    for rel in yaml.safe_load((ROOT / "deploy/kubernetes/kustomization.yaml").read_text())["resources"]:
        for d in _docs(f"deploy/kubernetes/{rel}"):
            docs.setdefault(d["kind"], []).append(d)
    (dep,) = docs["Deployment"]
    containers = {k["name"]: k for k in dep["spec"]["template"]["spec"]["containers"]}
    assert set(containers) == {"vllm", "cachemon"}
    args = containers["cachemon"]["args"]
    assert args[0] == "run" and f"--upstream=vllm=http://127.0.0.1:{CFG.vllm_port}/metrics" in args
    port_names = {p["name"] for k in containers.values() for p in k["ports"]}
    assert {"http", "cachemon-metrics"} <= port_names
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    for pm in docs["PodMonitor"]:
        assert pm["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
        (ep,) = pm["spec"]["podMetricsEndpoints"]
        assert ep["port"] in port_names
        assert {"action": "replace", "targetLabel": "job", "replacement": pm["metadata"]["name"]} in ep["relabelings"]
    assert {pm["metadata"]["name"] for pm in docs["PodMonitor"]} == {CFG.cachemon_job, CFG.vllm_job}
    (svc,) = docs["Service"]
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert {"PrometheusRule", "ConfigMap"} <= set(docs)


@pytest.mark.parametrize("name, services", [
    ("compose.yaml", {"vllm", "cachemon", "prometheus", "alertmanager", "grafana"}),
    ("demo.yaml", {"cachemon", "prometheus", "alertmanager", "grafana"})])
def test_compose_stack_mounts_files_that_exist(name, services):
    compose = yaml.safe_load((ROOT / "deploy/compose" / name).read_text())
    assert set(compose["services"]) == services
    base = ROOT / "deploy" / "compose"
    for svc in compose["services"].values():
        for vol in svc.get("volumes", []):
            if vol.split(":")[0] in compose.get("volumes", {}):   # a named volume, not a host path
                continue
            assert (base / vol.split(":")[0]).exists(), vol
    prom_file = compose["services"]["prometheus"]["volumes"][0].split(":")[0]
    prom = yaml.safe_load((base / prom_file).read_text())
    assert {j["job_name"] for j in prom["scrape_configs"]} == {CFG.cachemon_job, CFG.vllm_job}
    # the alerts go to the Alertmanager of the same stack
    (am,) = prom["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    assert am == f"alertmanager:{CFG.alertmanager_port}"
    mounted = {v.split(":")[1] for v in compose["services"]["prometheus"]["volumes"]}
    assert set(prom["rule_files"]) <= mounted
    provider = yaml.safe_load((base / "grafana/provisioning/dashboards/cachemon.yaml").read_text())
    path = provider["providers"][0]["options"]["path"]
    assert any(v.split(":")[1] == path for v in compose["services"]["grafana"]["volumes"])


def test_systemd_unit_parses_and_runs_cachemon():
    # strict=False: systemd allows a key twice (SystemCallFilter= allow list, then ~deny list).
    cp = configparser.ConfigParser(interpolation=None, strict=False)
    cp.read_string((ROOT / "deploy/systemd/cachemon.service").read_text())
    assert set(cp.sections()) == {"Unit", "Service", "Install"}
    exec_start = cp["Service"]["ExecStart"].split()
    assert exec_start[1] == "run" and any(a.startswith("--upstream=") for a in exec_start)
    # the flags it passes are flags `cachemon run` accepts
    r = CliRunner().invoke(cli_main, ["run", "--help"])
    for flag in (a.split("=")[0] for a in exec_start[2:]):
        assert flag in r.output, flag


def test_every_example_scrape_config_scrapes_cachemon_and_vllm():
    configs = sorted((ROOT / "prometheus").glob("prometheus-*.yml"))
    assert configs
    for p in configs:
        cfg = yaml.safe_load(p.read_text())
        assert {j["job_name"] for j in cfg["scrape_configs"]} == {CFG.cachemon_job, CFG.vllm_job}, p.name
        for rf in cfg["rule_files"]:
            assert (p.parent / rf).is_file(), rf
    fsd = yaml.safe_load((ROOT / "prometheus/prometheus-file-sd.yml").read_text())
    for job in fsd["scrape_configs"]:
        pattern = job["file_sd_configs"][0]["files"][0]
        matches = list((ROOT / "prometheus").glob(pattern))
        assert matches, pattern
        for m in matches:
            assert json.loads(m.read_text())[0]["targets"]


def test_kubernetes_scrape_config_keeps_opted_in_pods_by_port_name():
    cfg = yaml.safe_load((ROOT / "prometheus/prometheus-kubernetes.yml").read_text())
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    (dep,) = [d for d in _docs("deploy/kubernetes/vllm-cachemon.yaml") if d["kind"] == "Deployment"]
    annotations = dep["spec"]["template"]["metadata"]["annotations"]
    for job, port in nonempty(((CFG.cachemon_job, "cachemon-metrics"), (CFG.vllm_job, "http"))):
        keep = {tuple(r["source_labels"]): r["regex"] for r in jobs[job]["relabel_configs"] if r.get("action") == "keep"}
        assert keep[("__meta_kubernetes_pod_container_port_name",)] == port
        assert keep[("__meta_kubernetes_pod_annotation_cachemon_io_scrape",)] == annotations["cachemon.io/scrape"]


# --- the monitoring config file ------------------------------------------------------------
@pytest.mark.parametrize("text,error", [
    ('cachemon_selector: job="x"\n', 'selects job="x" but the rendered scrape configs and PodMonitor set job="cachemon"'),
    ("cachemon_selector: job=cachemon\n", "cachemon_selector: not a list of label matchers"),
    ("hit_ratio_warning: 0.5\n", "hit_ratio_critical: critical (0.6) must be below warning (0.5)"),
    ("hit_ratio_critical: 1.5\n", "hit_ratio_critical: expected a ratio in (0, 1], got 1.5"),
    ("model_hit_ratio: {m: {warn: 0.5}}\n",
     "model_hit_ratio.m.warn: unknown key, did you mean 'warning'? (allowed: critical, warning)"),
    ("model_hit_ratio: {m: {critical: 0.9}}\n", "model_hit_ratio.m: critical (0.9) must be below warning (0.8)"),
    ("target_labels: [namespace, pod]\n", "target_labels[1]: expected a label name other than job / instance / pod"),
    ("operator_labels: [release]\n", "operator_labels: expected a mapping of label name to string value"),
    ("grafana_folder_annotation: {'bad key!': x}\n", "grafana_folder_annotation.bad key!: not a Kubernetes label"),
    ("hit_ratio_for: 5 minutes\n", "hit_ratio_for: expected a Prometheus duration such as 5m"),
    ("namespace: [a\n", "not valid YAML"),
])
def test_bad_monitoring_config_is_one_line_naming_the_key(tmp_path, text, error):
    site = tmp_path / "site.yaml"
    site.write_text(text)
    r = CliRunner().invoke(cli_main, ["monitoring", "--config", str(site), "--out", str(tmp_path / "out")])
    assert r.exit_code == 2
    assert r.output.startswith("cachemon monitoring: config error: ") and error in r.output, r.output
    assert r.output.count("\n") == 1 and not (tmp_path / "out").exists()


def test_per_model_override_inherits_the_site_default_it_does_not_set(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text("hit_ratio_warning: 0.9\nhit_ratio_critical: 0.7\nmodel_hit_ratio: {big: {critical: 0.4}}\n")
    cfg = mconfig.load(str(site))
    assert cfg.hit_ratio("big") == mconfig.HitRatioThresholds(0.9, 0.4)
    assert cfg.hit_ratio("other") == cfg.hit_ratio() == mconfig.HitRatioThresholds(0.9, 0.7)
    low = [r for r in prometheus_rules.alert_group(cfg)["rules"] if r["alert"] == "CachemonPrefixCacheHitRatioLow"]
    ratio = prometheus_rules.RATIO
    # (line 0 opens the counter-based branch; the ratio-only branch for V0 follows the traffic floor)
    assert [(r["labels"]["severity"], r["expr"].split("\n")[2:5]) for r in low] == [
        ("warning", [f'  {ratio}{{model_name!="big"}} < 0.9', "  or", f'  {ratio}{{model_name="big"}} < 0.9']),
        ("critical", [f'  {ratio}{{model_name!="big"}} < 0.7', "  or", f'  {ratio}{{model_name="big"}} < 0.4'])]
    description = low[1]["annotations"]["description"]
    assert '{{ if eq $labels.model_name "big" }}40%{{ else }}70%{{ end }} critical threshold' in description


def test_selector_without_job_and_custom_kept_labels(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text("cachemon_selector: 'namespace=\"ml\", container=\"cachemon\"'\ntarget_labels: [region]\n")
    cfg = mconfig.load(str(site))
    recording = prometheus_rules.recording_group(cfg)["rules"]
    assert 'cachemon_prefix_cache_hit_tokens_total{namespace="ml", container="cachemon", cache="local"}' in recording[0]["expr"]
    assert any(r["expr"].startswith("sum by (region, job, model_name) (") for r in recording)
    absent = next(r for r in prometheus_rules.alert_group(cfg)["rules"] if r["alert"] == "CachemonExporterAbsent")
    assert 'absent(up{namespace="ml", container="cachemon"})' in absent["expr"]
    assert "group by (region, job)" in absent["expr"]
