"""The monitoring mixin (mixin/) under real jsonnet: the shipped files with the default `_config`, the
generator's output for the same settings with a site's `_config`, and promtool on what it renders.

Needs the Debian package `jsonnet` (and `prometheus` for promtool). Skipped without it locally; with CI set
a missing binary is a failure, not a skip. The site configs below are CONSTRUCTED for these tests.
"""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

import helpers
from cachemon.monitoring import dashboards, generate, mixin, prometheus_rules
from cachemon.monitoring import site as mconfig

ROOT = Path(__file__).resolve().parents[1]
MIXIN = ROOT / "mixin"

# CONSTRUCTED site settings: another selector (two matchers, one a regex), one kept label, other
# thresholds and `for`, two per-model overrides (one with a quote in its name), another runbook.
SITE = {
    "cachemonSelector": 'job="llm-cache", env=~"prod|stage"',
    "targetLabels": ["cluster"],
    "hitRatioWarning": 0.7,
    "hitRatioCritical": 0.45,
    "hitRatioFor": "10m",
    "hitRatioByModel": {"meta-llama/Llama-3.1-8B-Instruct": {"warning": 0.9},
                        'qwen"mini': {"warning": 0.55, "critical": 0.3}},
    "runbookURLPattern": "https://wiki.example.com/llm/cachemon#%s",
    "alertGroupName": "llm-cache-alerts",
    "recordingGroupName": "llm-cache-recording",
    "dashboardUIDPrefix": "llm",
    "dashboardTitlePrefix": "LLM / ",
    "dashboardTags": ["llm"],
    "costCurrency": "EUR",
}


def jsonnet_bin() -> str:
    return helpers.require_binary("jsonnet", "jsonnet")


def vendor(tmp_path: Path) -> Path:
    """A jsonnet-bundler vendor/ tree as `jb install github.com/cachemon/cachemon/mixin@main` leaves it:
    every test imports the mixin from there, as users do (imports inside it resolve relative to it)."""
    v = tmp_path / "vendor"
    (v / "github.com" / "cachemon" / "cachemon").mkdir(parents=True)
    (v / "github.com" / "cachemon" / "cachemon" / "mixin").symlink_to(MIXIN, target_is_directory=True)
    return v


VENDORED = 'import "github.com/cachemon/cachemon/mixin/mixin.libsonnet"'


def jsonnet(vendor_dir: Path, *args: str) -> str:
    r = subprocess.run([jsonnet_bin(), "-J", str(vendor_dir), *args], capture_output=True, text=True, timeout=120,
                       cwd=vendor_dir.parent)
    assert r.returncode == 0, r.stderr
    return r.stdout


def site_file(tmp_path: Path, config: dict) -> Path:
    """A site's jsonnet as kube-prometheus users write it: the mixin plus their `_config`."""
    p = tmp_path / "site.jsonnet"
    p.write_text(f"({VENDORED}) + {{ _config+:: {json.dumps(config, indent=2)} }}\n")
    return p


def render(tmp_path: Path, config: dict | None = None) -> dict:
    v = vendor(tmp_path)
    expr = f"import '{site_file(tmp_path, config)}'" if config is not None else VENDORED
    return json.loads(jsonnet(v, "-e", f"local m = {expr}; {{alerts: m.prometheusAlerts, rules: m.prometheusRules, "
                                       "dashboards: m.grafanaDashboards}"))


def generator(config: dict) -> dict:
    """What `cachemon monitoring` renders for the generator config equivalent to a mixin `_config`."""
    cfg = mixin.to_monitoring_config(dict(mixin.default_config(mconfig.DEFAULT), **config), mconfig.DEFAULT)
    return {"alerts": {"groups": [prometheus_rules.alert_group(cfg)]},
            "rules": {"groups": [prometheus_rules.recording_group(cfg)]},
            "dashboards": json.loads(json.dumps(dashboards.dashboards(cfg)))}


def shipped() -> dict:
    return {
        "alerts": yaml.safe_load((ROOT / generate.ALERTS_FILE).read_text()),
        "rules": yaml.safe_load((ROOT / generate.RECORDING_FILE).read_text()),
        "dashboards": {p.name: json.loads(p.read_text()) for p in sorted((ROOT / "dashboards").glob("*.json"))},
    }


# --- the default _config is the shipped files --------------------------------------------------
@pytest.mark.slow
def test_default_config_renders_exactly_the_shipped_alerts_rules_and_dashboards(tmp_path):
    got, want = render(tmp_path), shipped()
    assert got["alerts"] == want["alerts"]
    assert got["rules"] == want["rules"]
    assert sorted(got["dashboards"]) == sorted(want["dashboards"])
    for name, dash in want["dashboards"].items():
        assert got["dashboards"][name] == dash, name


@pytest.mark.slow
def test_the_readme_commands_render_yaml_rule_files_and_dashboard_files(tmp_path):
    """mixin/README.md: `jsonnet -S -e 'std.manifestYamlDoc(...)'` per rule file, `jsonnet -m DIR` for the
    dashboards, from a vendor/ tree."""
    v = vendor(tmp_path)
    for key, rel in (("prometheusAlerts", generate.ALERTS_FILE), ("prometheusRules", generate.RECORDING_FILE)):
        text = jsonnet(v, "-S", "-e", f"std.manifestYamlDoc(({VENDORED}).{key})")
        assert yaml.safe_load(text) == yaml.safe_load((ROOT / rel).read_text()), key
    out = tmp_path / "dashboards_out"
    out.mkdir()
    written = jsonnet(v, "-m", str(out), "-e", f"({VENDORED}).grafanaDashboards").split()
    assert sorted(Path(p).name for p in written) == sorted(shipped()["dashboards"])
    for p in out.iterdir():
        assert json.loads(p.read_text()) == json.loads((ROOT / "dashboards" / p.name).read_text()), p.name


# --- a site's _config --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def site(tmp_path_factory) -> dict:
    return render(tmp_path_factory.mktemp("site"), SITE)


@pytest.mark.slow
def test_site_config_renders_what_the_generator_renders_for_the_same_settings(site):
    got = site
    assert got == generator(SITE)
    alerts = got["alerts"]["groups"][0]
    assert alerts["name"] == "llm-cache-alerts"
    exprs = {(r["alert"], r["labels"]["severity"]): r for r in alerts["rules"]}
    # the selector everywhere, the default one nowhere
    assert exprs[("CachemonExporterDown", "warning")]["expr"] == 'up{job="llm-cache", env=~"prod|stage"} == 0'
    text = json.dumps(got["alerts"]) + json.dumps(got["rules"])
    assert 'job=\\"cachemon\\"' not in text and "cluster, namespace" not in text
    assert 'job=\\\\\\"llm-cache\\\\\\", env=~\\\\\\"prod|stage\\\\\\"' in text   # escaped in the Go template query
    # thresholds, `for` and the per-model overrides
    low_w = exprs[("CachemonPrefixCacheHitRatioLow", "warning")]
    low_c = exprs[("CachemonPrefixCacheHitRatioLow", "critical")]
    assert low_w["for"] == low_c["for"] == "10m"
    ratio = prometheus_rules.RATIO
    assert f'{ratio}{{model_name!="meta-llama/Llama-3.1-8B-Instruct", model_name!="qwen\\"mini"}} < 0.7' in low_w["expr"]
    assert f'{ratio}{{model_name="meta-llama/Llama-3.1-8B-Instruct"}} < 0.9' in low_w["expr"]
    assert f'{ratio}{{model_name="qwen\\"mini"}} < 0.55' in low_w["expr"]
    assert f'{ratio}{{model_name="meta-llama/Llama-3.1-8B-Instruct"}} < 0.45' in low_c["expr"]   # warning-only override
    assert f'{ratio}{{model_name="qwen\\"mini"}} < 0.3' in low_c["expr"]
    assert '{{ if eq $labels.model_name "meta-llama/Llama-3.1-8B-Instruct" }}90%' in low_w["annotations"]["description"]
    # the runbook pattern
    for r in alerts["rules"]:
        assert r["annotations"]["runbook_url"] == f"https://wiki.example.com/llm/cachemon#{r['alert'].lower()}"
    # dashboards: uid, title, tags, currency, threshold steps
    over = got["dashboards"]["cachemon-overview.json"]
    assert (over["uid"], over["title"], over["tags"]) == ("llm-overview", "LLM / Prefix cache overview", ["llm"])
    assert "currencyEUR" in json.dumps(over)
    assert {"color": "orange", "value": 0.45} in over["panels"][0]["fieldConfig"]["defaults"]["thresholds"]["steps"]


@pytest.mark.slow
def test_site_config_rules_pass_promtool(site, tmp_path):
    got = site
    files = []
    for key in ("rules", "alerts"):
        p = tmp_path / f"{key}.yaml"
        p.write_text(yaml.safe_dump(got[key], sort_keys=False))
        files.append(str(p))
    promtool = helpers.require_binary("promtool", "prometheus")
    r = subprocess.run([promtool, "check", "rules", *files], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("SUCCESS") == 2, r.stdout


@pytest.mark.parametrize("config", [
    {"targetLabels": []},                                           # no kept labels at all
    {"hitRatioWarning": 0.825, "hitRatioCritical": 0.125},          # rounding ties in "83%" / "12%"
    {"hitRatioByModel": {"m": {"critical": 0.1}}, "runbookURLPattern": "https://x.example/r%%20b#%s"},
], ids=["no-target-labels", "rounding", "critical-only-override"])
@pytest.mark.slow
def test_edge_configs_render_what_the_generator_renders(tmp_path, config):
    assert render(tmp_path, config) == generator(config)


@pytest.mark.slow
def test_the_readme_site_example_renders_what_the_generator_renders_for_its_settings(tmp_path):
    text = (MIXIN / "README.md").read_text()
    block = re.search(r"```jsonnet\n(// site\.jsonnet\n.*?)```", text, re.S)
    assert block, "mixin/README.md has no ```jsonnet block starting with // site.jsonnet"
    site_jsonnet = tmp_path / "site.jsonnet"
    site_jsonnet.write_text(block.group(1))
    v = vendor(tmp_path)
    config = json.loads(jsonnet(v, "-e", f"(import '{site_jsonnet}')._config"))
    assert config["hitRatioByModel"]     # the example shows an override
    got = json.loads(jsonnet(v, "-e", f"local m = import '{site_jsonnet}'; "
                             "{alerts: m.prometheusAlerts, rules: m.prometheusRules, dashboards: m.grafanaDashboards}"))
    assert got == generator(config)


@pytest.mark.slow
def test_a_site_bundle_ships_a_mixin_whose_defaults_are_that_site(tmp_path):
    """`cachemon monitoring --config site.yaml --out DIR`: DIR/mixin's default _config is the site's, so the
    mixin renders DIR's own rule files and dashboards. The site file is CONSTRUCTED."""
    site_yaml = tmp_path / "site.yaml"
    site_yaml.write_text('cachemon_selector: \'job="llm-cache"\'\ncachemon_job: llm-cache\ntarget_labels: [cluster]\n'
                         "hit_ratio_warning: 0.75\nmodel_hit_ratio: {big-model: {critical: 0.4}}\n"
                         "runbook_base_url: https://wiki.example/cachemon\n")
    out = tmp_path / "bundle"
    cfg = mconfig.load(str(site_yaml))
    generate.write(out, generate.files(cfg))
    v = tmp_path / "vendor"
    (v / "github.com" / "cachemon" / "cachemon").mkdir(parents=True)
    (v / "github.com" / "cachemon" / "cachemon" / "mixin").symlink_to(out / "mixin", target_is_directory=True)
    got = json.loads(jsonnet(v, "-e", f"local m = {VENDORED}; {{alerts: m.prometheusAlerts, rules: m.prometheusRules}}"))
    assert got["alerts"] == yaml.safe_load((out / generate.ALERTS_FILE).read_text())
    assert got["rules"] == yaml.safe_load((out / generate.RECORDING_FILE).read_text())
    assert any('model_name="big-model"} < 0.4' in r["expr"] for r in got["alerts"]["groups"][0]["rules"])


@pytest.mark.slow
def test_datasource_regex_filters_the_data_source_variable_of_every_dashboard(tmp_path):
    """A mixin-only setting (the shipped dashboards have no filter): kube-prometheus sites with several
    Prometheus data sources pin the dashboards to one."""
    got = render(tmp_path, {"dashboardDatasourceRegex": "/^prometheus$/"})
    assert got["dashboards"]
    for name, dash in got["dashboards"].items():
        var = next(v for v in dash["templating"]["list"] if v["name"] == "datasource")
        assert var["regex"] == "/^prometheus$/", name


@pytest.mark.slow
def test_the_generated_jsonnet_is_formatted_as_jsonnetfmt_formats_it():
    """Mixin repositories lint with jsonnetfmt (mixtool lint, `make fmt`): vendored code passes it as is."""
    fmt = helpers.require_binary("jsonnetfmt", "jsonnet")
    paths = sorted(MIXIN.rglob("*.libsonnet"))
    assert paths
    for path in paths:
        r = subprocess.run([fmt, "--test", str(path)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, f"{path.relative_to(ROOT)} differs from `jsonnetfmt` output {r.stderr}"


# --- the generator side (no jsonnet needed) ------------------------------------------------------
def test_a_config_value_printed_in_an_untemplated_form_fails_generation():
    with pytest.raises(ValueError, match="does not template"):
        mixin.template(f"sum by (job, {mixin.TARGET}) (up)", mixin.tokens(), "")   # only "<label>, " is templated


def test_the_mixin_is_part_of_the_generated_files():
    wanted = generate.files(mconfig.DEFAULT)
    for rel in ("mixin/mixin.libsonnet", "mixin/config.libsonnet", "mixin/alerts/alerts.libsonnet",
                "mixin/rules/rules.libsonnet", "mixin/dashboards/dashboards.libsonnet", "mixin/lib/cachemon.libsonnet",
                "mixin/jsonnetfile.json"):
        assert rel in wanted and (ROOT / rel).read_text() == wanted[rel], rel
    assert '"hitRatioWarning": 0.8' in json.dumps(mixin.default_config(mconfig.DEFAULT))
