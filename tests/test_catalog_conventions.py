"""Exporter conventions held on the catalog and on everything the generator ships.

- timestamps, not ages: no gauge named *_age_seconds;
- bounded labels only: no free-text label (message, error, text, detail);
- build_info carries version, revision and the Python runtime;
- ratios cachemon computes itself (catalog.CONVENIENCE) are documented as convenience series and
  no shipped rule, alert or dashboard queries them;
- OpenMetrics units: a family gets a # UNIT line exactly when its name ends with its catalog unit;
- dashboards: grafana/dashboard-linter's panel-units-rule as its code (lint/rule_panel_units.go) reads.
"""
from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest
import yaml

import promql_lint as lint  # tests/promql_lint.py: the bundle's linter, a test tool
from cachemon import catalog as C
from cachemon.expose.render import Family, render_openmetrics
from cachemon.monitoring import generate

ROOT = Path(__file__).resolve().parents[1]
FREE_TEXT = {"message", "error", "text", "detail", "description"}

sys.path.insert(0, str(ROOT / "scripts"))
import readme  # noqa: E402  (scripts/readme.py: the docs tables, a development tool)


def _shipped_exprs() -> list[tuple[str, str]]:
    out = []
    for rel in (generate.RECORDING_FILE, generate.ALERTS_FILE):
        for g in yaml.safe_load((ROOT / rel).read_text())["groups"]:
            for r in g["rules"]:
                out.append((f"{rel}: {r.get('record') or r.get('alert')}", r["expr"]))
    for path in sorted((ROOT / "dashboards").glob("*.json")):
        out += [(f"{path.name}: {w}", e) for w, e in lint.dashboard_exprs(json.loads(path.read_text()))]
    return out


def test_no_age_gauges_timestamps_instead():
    assert not [s.name for s in C.ALL if s.name.endswith("_age_seconds")]
    for s in C.ALL:
        if "timestamp" in s.name:
            assert s.name.endswith("_timestamp_seconds") and s.type == "gauge" and s.unit == "seconds", s.name
    assert C.LOG_STATS_AGE.name == "cachemon_log_last_stats_line_timestamp_seconds"


def test_no_free_text_labels():
    assert {s.name: set(s.labels) & FREE_TEXT for s in C.ALL if set(s.labels) & FREE_TEXT} == {}
    assert C.LAST_ERROR.labels == (C.UPSTREAM, "reason")


def test_build_info_has_revision_and_runtime():
    assert C.BUILD_INFO.labels == ("version", "revision", "python_version")


def test_histograms_are_histograms_and_no_counter_carries_le():
    assert not [s.name for s in C.ALL if "le" in s.labels]
    assert C.PROMPT_LENGTH_REQUESTS.type == "histogram"
    assert C.PROMPT_LENGTH_REQUESTS.sample_name == "cachemon_request_prompt_tokens_bucket"


def test_convenience_ratios_are_documented_and_never_queried_by_what_ships():
    assert set(C.CONVENIENCE) == {C.HIT_RATIO, C.COST_SAVING_FACTOR}
    table = readme.metrics_table()
    for s in C.CONVENIENCE:
        assert "convenience series" in s.help
        assert f"| `{s.sample_name}` | {s.type} (convenience) |" in table
    names = {s.sample_name for s in C.CONVENIENCE}
    used = [(where, n) for where, e in _shipped_exprs() for n in lint.metric_names(e) if n in names]
    assert used == []


def test_openmetrics_unit_is_the_name_suffix_or_none():
    for s in C.ALL:
        u = s.openmetrics_unit
        assert u in ("", s.unit)
        assert (u != "") == (bool(s.unit) and s.name.endswith("_" + s.unit)), s.name
    assert C.QUERY_TOKENS.openmetrics_unit == "tokens"
    assert C.PREEMPTIONS.openmetrics_unit == ""              # "events": what it counts, not a suffix
    assert C.LAST_SUCCESS.openmetrics_unit == "seconds"


def test_openmetrics_render_has_unit_lines_and_histograms_without_sum():
    """CONSTRUCTED families through the renderer: a UNIT line after TYPE where the spec has a unit;
    a histogram without a sum renders buckets only (OpenMetrics allows it; _count needs _sum)."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    q = Family.of(C.QUERY_TOKENS)
    q.put(C.QUERY_TOKENS, ("u", "m", "0", "local"), 5.0)
    h = Family.of(C.PROMPT_LENGTH_REQUESTS)
    h.add_histogram('upstream="u",model_name="m",engine="0"', [(128.0, 1.0)], None, 2.0)

    class _C:
        def collect(self):
            return [q, h]

    text = render_openmetrics([_C()]).decode()
    assert "# TYPE cachemon_prefix_cache_query_tokens counter\n# UNIT cachemon_prefix_cache_query_tokens tokens\n" in text
    assert "_tokens_sum" not in text and "_tokens_count" not in text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert fams["cachemon_request_prompt_tokens"].unit == "tokens"
    assert [s.labels["le"] for s in fams["cachemon_request_prompt_tokens"].samples] == ["128.0", "+Inf"]


# --- dashboard-linter's panel-units-rule, as lint/rule_panel_units.go reads -------------------------
def _panel(kind="timeseries", unit="short", overrides=()):
    """A CONSTRUCTED panel: type, default unit, unit overrides."""
    return {"type": kind, "title": "p", "fieldConfig": {"defaults": {"unit": unit}, "overrides": [
        {"matcher": {"id": "byRegexp", "options": ".*"}, "properties": [{"id": "unit", "value": u}]}
        for u in overrides]}}


@pytest.mark.parametrize("panel,ok", [
    (_panel(), True),
    (_panel(unit="suffix: tok/s"), False),                          # not a Grafana unit id
    (_panel(unit=""), False),                                       # no unit
    (_panel(overrides=["suffix: tok/s"]), False),                   # passes upstream's code; cachemon's stricter check
    (_panel(overrides=["percentunit"]), True),
    (_panel(unit="", overrides=["short"]), False),                  # upstream tests the default unit
    (_panel(kind="state-timeline", unit=""), True),                 # a type the rule does not check
    (_panel(kind="stat", unit="currencyUSD"), True),
])
def test_panel_units_rule_follows_its_code(panel, ok):
    assert (lint.panel_unit_problem(panel) is None) == ok


def test_shipped_dashboards_use_only_grafana_units():
    paths = sorted((ROOT / "dashboards").glob("*.json"))
    assert paths
    for path in paths:
        d = json.loads(path.read_text())
        assert lint.panels(d), path.name
        for p in lint.panels(d):
            assert lint.panel_unit_problem(p) is None, (path.name, p["title"])
            fc = p.get("fieldConfig", {})
            units = [fc.get("defaults", {}).get("unit")] + [
                prop["value"] for o in fc.get("overrides", []) for prop in o["properties"] if prop["id"] == "unit"]
            assert not [u for u in units if u and u.startswith("suffix:")], (path.name, p["title"])
        broken = copy.deepcopy(d)
        lint.panels(broken)[1]["fieldConfig"]["overrides"].append(
            {"matcher": {"id": "byRegexp", "options": ".*"}, "properties": [{"id": "unit", "value": "suffix: tok/s"}]})
        assert any("panel-units-rule" in p for p in lint.lint_dashboard(broken))


def test_the_collector_folds_bucket_and_sum_counters_into_one_histogram():
    """CONSTRUCTED state rows (upstream, labels, value) as the store keeps vLLM's histogram: buckets
    sorted by bound whatever their order, _count = +Inf, the sum where there is one; a label set
    without a +Inf bucket is not a histogram and is left out."""
    from cachemon.expose.collector import histogram_family

    rows = [("u", ("m", "0", "+Inf"), 5.0), ("u", ("m", "0", "1000.0"), 4.0), ("u", ("m", "0", "128.0"), 1.0),
            ("u", ("m", "0"), 2100.0),
            ("u", ("m", "1", "128.0"), 3.0)]          # engine 1: no +Inf bucket
    fam = histogram_family(C.PROMPT_LENGTH_REQUESTS, rows)
    assert fam.histograms == [('upstream="u",model_name="m",engine="0"',
                               [(128.0, 1.0), (1000.0, 4.0), (float("inf"), 5.0)], 2100.0, 5.0)]
