"""The pure parts of scripts/demo_stack.py and scripts/render_dashboards.py: the test mode's scaling
of the rules, and the PromQL a panel sends (as Grafana sends it with every variable on "All")."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_time_scale_shortens_every_window_for_and_offset_of_the_shipped_rules():
    stack = _script("demo_stack")
    text = (ROOT / "alerts" / "cachemon-alerts.yaml").read_text()
    fast = yaml.safe_load(stack.scaled(text, 1 / 15))
    orig = yaml.safe_load(text)
    for a, b in zip(orig["groups"][0]["rules"], fast["groups"][0]["rules"], strict=True):
        if a.get("for") == "5m":
            assert b["for"] == "20s"
        assert ("[5m]" in a["expr"]) == ("[20s]" in b["expr"])
        assert "offset 30m" not in b["expr"]
    assert stack.scaled(text, 1) == text
    am = stack.scaled((ROOT / "examples" / "alertmanager.yml").read_text(), 1 / 15)
    assert "group_wait: 2s" in am and "repeat_interval: 960s" in am


def test_panel_queries_are_sent_with_all_values_and_grafanas_rate_interval():
    render = _script("render_dashboards")
    d = json.loads((ROOT / "dashboards" / "cachemon-overview.json").read_text())
    expr = 'sum(rate(x_total{job=~"$job", instance=~"$vllm_instance", engine=~"$engine"}[$__rate_interval]))'
    # step 15 s, scrape 5 s: max(15 + 5, 4 * 5) = 20 s; $vllm_instance is not cut to $vllm + "_instance"
    assert render.substitute(expr, d, 15, 5) == 'sum(rate(x_total{job=~".+", instance=~".+", engine=~".*"}[20s]))'
    assert render.legend("{{instance}} / {{upstream}}", {"instance": "a:1", "upstream": "demo"}) == "a:1 / demo"
    assert render.fmt(0.866, "percentunit") == "87 %" and render.fmt(59.3e6, "short") == "59.3 M"
