"""The shipped rules and configs under real promtool: check rules / check config / test rules.

Needs the Debian package `prometheus` (promtool). Skipped without it locally; with CI set
a missing binary is a failure, not a skip.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import helpers
from assert_support import nonempty
from cachemon.monitoring import generate, prometheus_rules
from cachemon.monitoring import site as mconfig

ROOT = Path(__file__).resolve().parents[1]
PROMTOOL_TESTS = sorted((ROOT / "tests" / "promtool").glob("*.yaml"))
RULE_FILES = [ROOT / generate.RECORDING_FILE, ROOT / generate.ALERTS_FILE]




def require_binary(name: str, package: str = "prometheus", *aliases: str) -> str:
    """A binary of a Debian Prometheus package (prometheus, promtool; alertmanager, amtool)."""
    return helpers.require_binary(name, package, *aliases)


def promtool(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([require_binary("promtool"), *map(str, args)], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


@pytest.mark.parametrize("ci,outcome", [("true", "fail"), ("", "skip")])
def test_missing_binary_fails_under_ci_and_skips_locally(monkeypatch, ci, outcome):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setenv("CI", ci)
    expected = pytest.fail.Exception if outcome == "fail" else pytest.skip.Exception
    with pytest.raises(expected, match="apt-get install -y prometheus"):
        require_binary("promtool")


@pytest.mark.prometheus
@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_promtool_check_rules_accepts_every_rule_file(path):
    r = promtool("check", "rules", path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


@pytest.mark.prometheus
@pytest.mark.parametrize("name", ["prometheus-static.yml", "prometheus-file-sd.yml"])
def test_promtool_check_config_accepts_example_configs_and_their_rule_files(name):
    r = promtool("check", "config", ROOT / "prometheus" / name)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 rule files found" in r.stdout


@pytest.mark.prometheus
def test_promtool_check_config_accepts_compose_config():
    # Its rule paths are the container's (/etc/prometheus/rules); the files themselves are checked above.
    r = promtool("check", "config", "--syntax-only", ROOT / "deploy" / "compose" / "prometheus.yml")
    assert r.returncode == 0, r.stdout + r.stderr


DEBIAN_NO_K8S_SD = "field kubernetes_sd_configs not found in type config.ScrapeConfig"


@pytest.mark.prometheus
def test_promtool_check_config_on_the_kubernetes_config_as_shipped():
    """With an upstream promtool the file passes as is; Debian's cannot check it at all (said in its header)."""
    path = ROOT / "prometheus" / "prometheus-kubernetes.yml"
    assert DEBIAN_NO_K8S_SD in path.read_text().replace("\n# ", " ")   # the file tells users so
    r = promtool("check", "config", path)
    if r.returncode != 0 and DEBIAN_NO_K8S_SD in r.stdout + r.stderr:
        version = promtool("--version").stdout.splitlines()[0]
        pytest.skip(f"this promtool ({version}) is built without Kubernetes service discovery (Debian's build): it "
                    "cannot check prometheus-kubernetes.yml as shipped; test_kubernetes_config_relabelling_is_valid "
                    "checks its relabelling and rule files with the discovery swapped for static targets")
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.prometheus
def test_kubernetes_config_relabelling_is_valid(tmp_path):
    """Debian builds Prometheus without Kubernetes SD, so promtool rejects the section itself;
    check everything else (relabel rules, rule files) with the discovery swapped for static targets."""
    cfg = yaml.safe_load((ROOT / "prometheus" / "prometheus-kubernetes.yml").read_text())
    for job in cfg["scrape_configs"]:
        assert job.pop("kubernetes_sd_configs") == [{"role": "pod"}]
        job["static_configs"] = [{"targets": ["127.0.0.1:1"]}]
        assert any(r.get("target_label") == "instance" for r in job["relabel_configs"])
    cfg["rule_files"] = [str(p) for p in RULE_FILES]
    p = tmp_path / "k8s.yml"
    p.write_text(yaml.safe_dump(cfg))
    r = promtool("check", "config", p)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.prometheus
def test_promtool_unit_tests_pass():
    assert PROMTOOL_TESTS, "no promtool test files in tests/promtool"
    r = promtool("test", "rules", *PROMTOOL_TESTS)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("SUCCESS") == len(PROMTOOL_TESTS)


def _cases():
    firing, silent = {}, {}
    for f in PROMTOOL_TESTS:
        for test in yaml.safe_load(f.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                target = firing if case.get("exp_alerts") else silent
                target.setdefault(case["alertname"], []).append(f.name)
    return firing, silent


def test_every_alert_has_a_firing_and_a_silent_promtool_case():
    firing, silent = _cases()
    for name in nonempty(prometheus_rules.alert_names(mconfig.DEFAULT)):
        assert name in firing, f"{name}: no promtool case where it fires"
        assert name in silent, f"{name}: no promtool case where it must not fire"
    # and both severities of the hit-ratio pair are asserted
    texts = "".join(f.read_text() for f in PROMTOOL_TESTS)
    for sev in nonempty(("warning", "critical")):
        assert f"severity: {sev}, job: cachemon, instance: pod-a, upstream: vllm, model_name: m}}" in texts


def _mutated_run(tmp_path, alertname: str, severity: str, key: str, old: str, new: str) -> subprocess.CompletedProcess:
    """Run the promtool tests against a copy of the alerts with one rule edited."""
    data = yaml.safe_load((ROOT / generate.ALERTS_FILE).read_text())
    hits = [r for g in data["groups"] for r in g["rules"]
            if r["alert"] == alertname and r["labels"]["severity"] == severity]
    assert len(hits) == 1 and old in hits[0][key], (alertname, severity, key, old)
    hits[0][key] = hits[0][key].replace(old, new)
    (tmp_path / "alerts.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    copies = []
    for f in PROMTOOL_TESTS:
        test = yaml.safe_load(f.read_text())
        test["rule_files"] = [str(ROOT / generate.RECORDING_FILE), str(tmp_path / "alerts.yaml")]
        out = tmp_path / f.name
        out.write_text(yaml.safe_dump(test, sort_keys=False))
        copies.append(out)
    return promtool("test", "rules", *copies)


FLOOR = "\n  and model_instance:cachemon_prefix_cache_query_tokens:rate5m > 1"


@pytest.mark.prometheus
@pytest.mark.parametrize("alertname,severity,key,old,new", [
    ("CachemonPrefixCacheHitRatioLow", "warning", "expr", "< 0.8", "< 0.5"),          # threshold moved
    ("CachemonPrefixCacheHitRatioLow", "critical", "expr", FLOOR, ""),               # traffic floor removed
    ("CachemonPrefixCacheHitRatioLow", "critical", "expr", 'cache="local"}) < 0.6', 'cache="local"}) < 0.1'),  # V0 branch
    ("CachemonKVCacheNearlyFull", "warning", "for", "15m", "1m"),                    # bursts no longer filtered
    ("CachemonHitRatioDroppedAfterChange", "warning", "expr", ")) > 0)", ")) >= 0)"),  # change condition dropped
    ("CachemonHitRatioNotRecovered", "warning", "expr", ">= 0.8", ">= 0"),            # "healthy before" dropped
    ("CachemonReplicaHitRatioSkew", "warning", "expr", "- 0.2", "- 0.05"),            # skew margin shrunk
    ("CachemonLogSourceStalled", "warning", "expr", "> 1)", "> -1)"),                 # traffic condition dropped
    ("CachemonUpstreamDown", "warning", "for", "5m", "1m"),                          # blips no longer filtered
    ("CachemonExporterAbsent", "warning", "expr", "[1d]", "[1m]"),                   # forgets vanished targets
    ("CachemonExporterAbsent", "warning", "expr", "or on () absent", "and on () absent"),  # never-seen case dropped
    ("CachemonKVCapacityDominatesMisses", "warning", "expr", "> 0.5", "> 0.1"),       # share threshold moved
    ("CachemonKVCapacityDominatesMisses", "warning", "expr", 'reason!~"cache_opt_out|recompute_last_block"',
     'reason!="x"'),                                                                 # not-misses counted
    ("CachemonKVCapacityDominatesMisses", "warning", "expr", 'reason!~"cache_opt_out|recompute_last_block"',
     'reason!="recompute_last_block"'),                                              # opt-outs counted
    ("CachemonKVCapacityDominatesMisses", "warning", "expr", "ratio_rate5m < 0.8", "ratio_rate5m < 1"),  # fires above 80 %
    ("CachemonDynamicPrefixFound", "warning", "expr", 'cause="dynamic_prefix"', 'cause=~"dynamic_prefix.*"'),
    ("CachemonDynamicPrefixFound", "warning", "expr", "ratio_rate5m < 0.8", "ratio_rate5m < 1"),  # fires above 80 %
])
def test_promtool_tests_catch_a_broken_rule(tmp_path, alertname, severity, key, old, new):
    r = _mutated_run(tmp_path, alertname, severity, key, old, new)
    assert r.returncode != 0, f"promtool tests still pass with {alertname}/{severity} {key}: {old!r} -> {new!r}\n{r.stdout}"
    assert "FAILED" in r.stdout + r.stderr


SITE_DIR = ROOT / "tests" / "promtool_site"


def _site_rules(tmp_path, site: Path) -> Path:
    """The promtool tests of tests/promtool_site next to rules rendered with `site`."""
    r = subprocess.run([sys.executable, "-m", "cachemon.cli", "monitoring", "--config", str(site), "--out",
                        str(tmp_path / "out")], check=False, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    shutil.copy(tmp_path / "out" / generate.RECORDING_FILE, tmp_path)
    shutil.copy(tmp_path / "out" / generate.ALERTS_FILE, tmp_path)
    shutil.copy(SITE_DIR / "model_thresholds_test.yaml", tmp_path)
    return tmp_path / "model_thresholds_test.yaml"


@pytest.mark.prometheus
def test_per_model_thresholds_apply_once_per_model_and_severity(tmp_path):
    test_file = _site_rules(tmp_path, SITE_DIR / "site.yaml")
    r = promtool("test", "rules", test_file)
    assert r.returncode == 0, r.stdout + r.stderr
    # one rule per (alertname, severity): no duplicate-rule lint
    r = promtool("check", "rules", tmp_path / "cachemon-alerts.yaml")
    assert r.returncode == 0 and "duplicate" not in r.stdout + r.stderr, r.stdout + r.stderr


@pytest.mark.prometheus
def test_per_model_promtool_test_fails_without_the_override(tmp_path):
    """Rendered without the override, the big model alerts at the defaults: the test must notice."""
    site = tmp_path / "site.yaml"
    site.write_text("hit_ratio_warning: 0.8\n")
    r = promtool("test", "rules", _site_rules(tmp_path, site))
    assert r.returncode != 0 and "FAILED" in r.stdout + r.stderr
