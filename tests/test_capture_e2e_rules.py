"""The e2e harness's test copy of the rules (scripts/e2e/prom.py): short windows, shipped files untouched."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "e2e"))
import prom  # noqa: E402

from assert_support import nonempty  # noqa: E402


def test_durations():
    assert prom.short_for("5m") == "10s" and prom.short_for("15m") == "30s" and prom.short_for("10m") == "20s"
    assert prom.short_for("30s") == "5s" and prom.short_for("0s") == "0s"
    assert prom.short_range("5m") == "20s" and prom.short_range("1m") == "10s" and prom.short_range("30m") == "2m"
    assert prom.short_range("1d") == "4m"   # capped: a look-back longer than any run
    assert prom.seconds("1h30m") == 5400
    with pytest.raises(ValueError):
        prom.seconds("5 minutes")


def test_shorten_expr_keeps_names_and_thresholds():
    e = ('model_instance:x:ratio_rate5m < 0.6 and sum by (a) (rate(y_total{job="cachemon"}[5m])) > 1 '
         'and max(z offset 30m) and increase(c_total[30m]) > 0 and max_over_time(w[1h:1m])')
    out = prom.shorten_expr(e)
    assert "ratio_rate5m < 0.6" in out            # recorded-series name and threshold unchanged
    assert "[20s]" in out and "offset 2m" in out and "increase(c_total[2m])" in out and "[4m:1s]" in out
    assert "[5m]" not in out and "[30m]" not in out


@pytest.mark.slow
def test_rewrite_shipped_rules(tmp_path):
    dirs = [ROOT / "alerts", ROOT / "prometheus"]
    if not any(d.glob("*.y*ml") for d in dirs):
        pytest.skip("no rule files generated yet")
    before = {p: p.read_bytes() for d in dirs for p in d.glob("*.y*ml")}
    info = prom.rewrite_rules(dirs, tmp_path)
    assert {p: p.read_bytes() for p in before} == before          # shipped files never edited
    assert info["files"] and info["alerts"]
    for f in info["files"]:
        for g in yaml.safe_load(f.read_text())["groups"]:
            for r in g["rules"]:
                if "for" in r:
                    assert prom.seconds(r["for"]) <= 60
                for d in re.findall(r"\[([0-9a-z]+)(?::[0-9a-z]*)?\]", r["expr"]):
                    assert prom.seconds(d) <= 240, (r, d)
    promtool = shutil.which("promtool")
    if promtool:
        res = subprocess.run([promtool, "check", "rules", *map(str, info["files"])], capture_output=True, text=True)
        assert res.returncode == 0, res.stdout + res.stderr


def test_prometheus_config_jobs(tmp_path):
    p = tmp_path / "prometheus.yml"
    prom.write_config(p, "127.0.0.1:1", str(tmp_path / "rules" / "*.yaml"), "127.0.0.1:2")
    cfg = yaml.safe_load(p.read_text())
    assert cfg["global"]["scrape_interval"] == "1s" and cfg["global"]["evaluation_interval"] == "1s"
    assert [j["job_name"] for j in cfg["scrape_configs"]] == ["cachemon", "vllm"]
    assert all(t.startswith("127.0.0.1:") for j in cfg["scrape_configs"] for t in j["static_configs"][0]["targets"])


def test_grafana_variables_become_match_anything():
    import scenarios
    q = scenarios.grafana_to_promql(
        'sum(rate(x_total{job=~"$job", instance="$instance", model_name=~"${model_name}"}[$__rate_interval]))'
        ' / $__range_s', 600)
    assert q == 'sum(rate(x_total{job=~".*", instance=~".*", model_name=~".*"}[1m])) / 600'


def test_every_shipped_dashboard_has_queries():
    import json as _json

    import scenarios
    files = sorted((ROOT / "dashboards").glob("*.json"))
    if not files:
        pytest.skip("no dashboards generated yet")
    for f in nonempty(files):
        out: list = []
        scenarios._dashboard_exprs(_json.loads(f.read_text()), out)
        assert out, f
        assert all("$" not in scenarios.grafana_to_promql(e, 60) for _, _, e in out)
