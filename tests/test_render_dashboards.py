"""scripts/render_dashboards.py draws a panel as Grafana would: series names from legendFormat, colours from
the panel's colour mode and its field overrides, series hidden by an override, a panel's min interval.

The series are CONSTRUCTED here (no Prometheus: test_demo_stack.py draws the real demo): for every graph
of the committed dashboards, two series per query, their labels filled with real label values where the
palette names them (miss reasons, causes, cost scenarios, prompt-token sources) and made-up ones elsewhere.
"""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from cachemon.monitoring import palette

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted((ROOT / "dashboards").glob("*.json"))
# label -> real values (two each) the constructed series take
REAL = {"reason": ["first", "capacity"], "cause": ["dynamic_prefix", "restart"],
        "scenario": ["with_cache", "without_cache"], "source": ["local_compute", "local_cache_hit"]}


def _render():
    spec = importlib.util.spec_from_file_location("render_dashboards", ROOT / "scripts" / "render_dashboards.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


render = _render()


def constructed_series(p: dict) -> list[tuple[str, str, list]]:
    """(name, refId, points): two series per target, labels as its legendFormat names them (one for a
    legend without labels: a sum without `by` is one series)."""
    out = []
    for t in p["targets"]:
        labels = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", t["legendFormat"]))
        for k in range(2 if labels else 1):
            values = {name: REAL.get(name, [f"{name}-a", f"{name}-b"])[k] for name in labels}
            pts = [(1000.0 + 10 * i, 1.0 + k + 0.1 * i) for i in range(10)]
            out.append((render.legend(t["legendFormat"], values), t["refId"], pts))
    return out


def drawn(path: Path) -> list[dict]:
    d = json.loads(path.read_text())
    return [render.describe(p, constructed_series(p)) for p in d["panels"] if p["type"] == "timeseries"]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_no_graph_draws_several_series_in_one_colour_or_without_a_name(path):
    found = [m for p in drawn(path) for m in render.problems(p)]
    assert found == [], found


def test_the_renderer_applies_fixed_colours_by_name_and_regex():
    panels = {p["title"]: p for p in drawn(ROOT / "dashboards" / "cachemon-overview.json")}
    hm = panels["Hit vs miss tokens per second"]
    assert dict(zip([n for n, _ in hm["series"]], hm["colours"], strict=True)) == {
        "hit": render.NAMED[palette.HIT], "miss": render.NAMED[palette.MISS]}
    causes = panels["Missed tokens by cause"]
    assert causes["colours"] == [render.NAMED[palette.causes()[c]] for c in ("dynamic_prefix", "restart")]
    assert [n for n, _ in causes["series"]] == ["dynamic_prefix (certainty-a)", "restart (certainty-b)"]


def test_an_all_zero_reason_is_hidden_and_one_colour_for_all_is_caught():
    overview = json.loads((ROOT / "dashboards" / "cachemon-overview.json").read_text())
    misses = next(p for p in overview["panels"] if p["title"] == "Where the misses go")
    flat = [(float(t), 0.0) for t in range(10)]
    busy = [(float(t), 5.0) for t in range(10)]
    out = render.describe(misses, [("first", "A", busy), ("capacity", "A", flat), ("routing", "A", busy)])
    assert [n for n, _ in out["series"]] == ["first", "routing"] and out["hidden"] == ["capacity"]
    # the same panel with every series one fixed blue, as 74d8045 shipped it: a problem
    blue = dict(misses, fieldConfig={"defaults": {"color": {"mode": "fixed", "fixedColor": "blue"}}, "overrides": []})
    assert render.problems(render.describe(blue, [("first", "A", busy), ("routing", "A", busy)])) == [
        "Where the misses go: 2 series drawn in one colour (#5794F2)"]


def test_legends_render_as_grafana_names_series():
    assert render.legend("{{tenant}} / {{adapter}}", {}) == "/"          # a name a reader cannot use ...
    assert render.legend("{{tenant}}", {"tenant": ""}) == "Value"        # ... nor this: Grafana's fallback
    p = {"title": "t", "type": "timeseries", "gridPos": {}, "fieldConfig": {"defaults": {}, "overrides": []}}
    assert render.problems(render.describe(p, [("/", "A", [(0.0, 1.0)]), ("Value", "A", [(0.0, 2.0)])])) == [
        "t: a series without a name: '/'", "t: a series without a name: 'Value'"]


def test_a_min_interval_sets_the_step_and_aligns_the_range_as_grafana_does():
    # a 1d min interval on a 6 h range: one point, at midnight UTC, whatever the hour (the old daily panel)
    start, end = 1_700_000_000 - 6 * 3600, 1_700_000_000
    assert render.time_range({"interval": "1d"}, start, end, 15) == (1_699_920_000, 1_699_920_000, 86400)
    assert render.time_range({"interval": "1m"}, start, end, 15) == (start - start % 60, end - end % 60, 60)
    assert render.substitute("rate(x[$__rate_interval]) [$__range]", {"templating": {"list": []}}, 60, 15, 3600) \
        == "rate(x[75s]) [3600s]"
