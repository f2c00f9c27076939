"""Dashboard lint (grafana/dashboard-linter's rules) on the committed JSON, and the linter itself."""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

import promql_lint as lint  # tests/promql_lint.py: the bundle's linter, a test tool
from cachemon import thresholds as t
from cachemon.monitoring import dashboards, generate
from cachemon.monitoring import site as mconfig

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted((ROOT / "dashboards").glob("*.json"))
CFG = mconfig.DEFAULT


def load(name: str) -> dict:
    return json.loads((ROOT / "dashboards" / name).read_text())


def test_three_dashboards_are_committed():
    assert [f.name for f in FILES] == ["cachemon-exporter.json", "cachemon-fleet.json", "cachemon-overview.json"]


LINT_FILE = lint.load_lint_file(ROOT / "dashboards")


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_dashboard_passes_lint(path):
    assert lint.lint_dashboard(json.loads(path.read_text()), LINT_FILE) == []


def test_the_lint_file_excludes_only_the_vllm_latency_panels_from_the_job_and_instance_rules():
    # upstream's target-job/instance rules want $job / $instance in every selector; the two panels on
    # vLLM's own scrape job are declared in dashboards/.lint, where dashboard-linter reads exclusions
    overview = load("cachemon-overview.json")
    found = lint.lint_dashboard(overview)            # as the linter reports them without the file
    assert sorted(m.split(": ")[1] + " " + m.split("'")[1] for m in found) == [
        "target-instance-rule Prefill time p95", "target-instance-rule Time to first token p95",
        "target-job-rule Prefill time p95", "target-job-rule Time to first token p95"], found
    assert lint.lint_dashboard(overview, LINT_FILE) == []
    assert (ROOT / "dashboards" / ".lint").read_text() == generate.files(CFG)["dashboards/.lint"]
    entries = {(e["dashboard"], e["panel"]) for rule in LINT_FILE["exclusions"].values() for e in rule["entries"]}
    assert entries == {(overview["title"], "Time to first token p95"), (overview["title"], "Prefill time p95")}


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_dashboard_is_provisioning_safe(path):
    text = path.read_text()
    d = json.loads(text)
    assert "__inputs" not in d and "__requires" not in d and "${DS_" not in text
    assert d["uid"] == f"cachemon-{path.stem.removeprefix('cachemon-')}" and len(d["uid"]) <= 40
    assert d["schemaVersion"] >= 39 and d["id"] is None and d["title"].startswith("cachemon / ")

    def walk(node):
        if isinstance(node, dict):
            ds = node.get("datasource")
            if isinstance(ds, dict):
                assert ds == {"type": "prometheus", "uid": "${datasource}"}, ds   # no baked-in uid
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(d)
    ids = [p["id"] for p in lint.panels(d)]
    assert len(ids) == len(set(ids))
    for p in lint.panels(d):   # inside the 24-column grid
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24


def test_overview_has_the_panels_the_issue_asks_for():
    d = load("cachemon-overview.json")
    titles = {p["title"] for p in lint.panels(d)}
    assert {"Prefix-cache hit ratio", "Hit ratio per instance", "Hit vs miss tokens per second",
            "Hit tokens per day", "Time to first token p95", "Prefill time p95", "KV-cache usage",
            "Preemptions per second", "Estimated cost-saving factor"} <= titles
    stat = next(p for p in lint.panels(d) if p["title"] == "Prefix-cache hit ratio")
    assert stat["type"] == "stat" and stat["fieldConfig"]["defaults"]["unit"] == "percentunit"
    steps = [s["value"] for s in stat["fieldConfig"]["defaults"]["thresholds"]["steps"]]
    assert steps == [None, t.HIT_RATIO_CRITICAL, t.HIT_RATIO_WARNING]
    ttft = next(p for p in lint.panels(d) if p["title"] == "Time to first token p95")
    (sel,) = lint.selectors(ttft["targets"][0]["expr"])
    assert sel.name == "vllm:time_to_first_token_seconds_bucket" and sel.function == "rate"
    names = {a["name"]: a["expr"] for a in d["annotations"]["list"]}
    assert set(names) == {"Upstream restarts", "Model / version / config changes", "Prefix-cache resets",
                          "Prefix-cache resets logged by vLLM"}
    assert 'result="done"' in names["Prefix-cache resets logged by vLLM"]
    assert "cachemon_upstream_restarts_total" in names["Upstream restarts"]
    assert "cachemon_upstream_changes_total" in names["Model / version / config changes"]
    assert "cachemon_prefix_cache_resets_total" in names["Prefix-cache resets"]


def test_fleet_and_exporter_dashboards_cover_their_topics():
    fleet = {p["title"] for p in lint.panels(load("cachemon-fleet.json"))}
    assert {"Hit ratio per replica", "Replica skew vs model fleet", "Hit ratio per engine"} <= fleet
    skew = next(p for p in lint.panels(load("cachemon-fleet.json")) if p["title"] == "Replica skew vs model fleet")
    assert [s["value"] for s in skew["fieldConfig"]["defaults"]["thresholds"]["steps"]] == [None, -t.SKEW_DROP]
    exporter = {p["title"] for p in lint.panels(load("cachemon-exporter.json"))}
    assert {"cachemon targets up", "Upstreams up", "Upstream polls and errors per second",
            "Detected vLLM era and version", "Cache config", "Age of the last stats line"} <= exporter


def test_every_dashboard_has_the_required_variables_and_annotations():
    assert FILES
    for f in FILES:
        d = json.loads(f.read_text())
        by_name = {v["name"]: v for v in d["templating"]["list"]}
        assert list(by_name) == ["datasource", "job", "instance", "upstream", "model_name", "engine",
                                "vllm_job", "vllm_instance"], f.name
        # dashboard-linter's label case
        assert [by_name[n]["label"] for n in ("datasource", "job", "instance")] == ["Data source", "Job", "Instance"]
        assert by_name["engine"]["allValue"] == ".*"       # V0 / log sources have engine=""
        assert {a["name"] for a in d["annotations"]["list"]} >= {"Upstream restarts", "Prefix-cache resets logged by vLLM"}


def test_overview_why_row_and_exported_panels():
    d = load("cachemon-overview.json")
    ps = {p["title"]: p for p in lint.panels(d)}
    titles = [p["title"] for p in d["panels"]]
    # the ratio over time, where its misses go (KV events), then the causes named
    assert titles[4:7] == ["Hit ratio per instance", "Hit vs miss tokens per second",
                           "Where the misses go (KV-cache events)"]
    why = titles.index("Why")
    assert titles[why:why + 3] == ["Why", "Why: active causes", "Active causes since"]
    assert "cachemon_cause_active" in ps["Why: active causes"]["targets"][0]["expr"]
    assert "cachemon_cause_since_timestamp_seconds" in ps["Active causes since"]["targets"][0]["expr"]
    for title in ("External (KV-connector) cache hit ratio", "Prompt tokens by source", "Cached prompt tokens per second",
                  "KV block size", "Hit ratio as vLLM reports it (V0, logs)"):
        assert title in ps, title
    stat = ps["Prefix-cache hit ratio"]
    assert stat["fieldConfig"]["defaults"]["mappings"][0]["options"]["result"]["text"] == "No traffic"
    assert "cachemon_prefix_cache_reported_hit_ratio" in stat["targets"][0]["expr"]      # V0 fallback
    qps = ps["Query tokens per second"]
    assert qps["fieldConfig"]["defaults"]["color"] == {"mode": "fixed", "fixedColor": "blue"}
    assert qps["fieldConfig"]["defaults"]["unit"] == "short" and qps["fieldConfig"]["overrides"] == []
    hm = ps["Hit vs miss tokens per second"]["fieldConfig"]
    assert hm["defaults"]["custom"]["axisLabel"] == "tokens/s"
    assert {o["matcher"]["options"]: o["properties"][0]["value"]["fixedColor"] for o in hm["overrides"]} == \
        {"hit": "green", "miss": "red"}
    assert ps["Estimated cost per second, with and without cache"]["fieldConfig"]["defaults"]["unit"] == "currencyUSD"
    legend = ps["Hit ratio per instance"]["options"]["legend"]
    assert legend["displayMode"] == "table" and legend["calcs"] == ["mean", "max", "lastNotNull"]
    for p in ("Time to first token p95", "Prefill time p95"):
        (sel,) = lint.selectors(ps[p]["targets"][0]["expr"])
        assert 'job=~"$vllm_job"' in sel.matchers and 'instance=~"$vllm_instance"' in sel.matchers


def test_variables_are_scoped_to_cachemon_and_vllm_series_never_up():
    boards = dashboards.dashboards(CFG)
    assert boards
    for d in boards.values():
        queries = {v["name"]: v["query"] for v in d["templating"]["list"] if v["type"] == "query"}
        assert not any("label_values(up" in q for q in queries.values()), queries
        assert queries["job"] == "label_values(cachemon_upstream_up, job)"
        assert queries["vllm_job"] == "label_values(vllm:num_requests_running, job)"


def test_the_kv_row_follows_the_ratio_it_explains():
    titles = [p["title"] for p in dashboards.overview(CFG)["panels"]]
    assert titles.index("Hit ratio per instance") < titles.index("Where the misses go (KV-cache events)") \
        < titles.index("Why")


# --- the linter can fail ------------------------------------------------------------------------
def _first_target(d):
    return next(p for p in lint.panels(d) if p["title"] == "Hit ratio per instance")["targets"][0]


@pytest.mark.parametrize("breakage,rule", [
    (lambda d: _first_target(d).update(expr=_first_target(d)["expr"].replace("$__rate_interval", "5m")),
     "target-rate-interval-rule"),
    (lambda d: _first_target(d).update(
        expr="sum(cachemon_prefix_cache_hit_tokens_total{job=~\"$job\", instance=~\"$instance\"})"),
     "target-counter-agg-rule"),
    (lambda d: _first_target(d).update(expr=_first_target(d)["expr"].replace(" > 0)", ")")), "ratio guard"),
    (lambda d: _first_target(d).update(expr=_first_target(d)["expr"].replace('instance=~"$instance", ', "")),
     "target-instance-rule"),
    (lambda d: lint.panels(d)[0].update(datasource={"type": "prometheus", "uid": "edx8memhpd9tsa"}),
     "panel-datasource-rule"),
    (lambda d: lint.panels(d)[1]["fieldConfig"]["defaults"].pop("unit"), "panel-units-rule"),
    (lambda d: lint.panels(d)[2].update(description=""), "panel-title-description-rule"),
    (lambda d: d["templating"]["list"].append(dict(d["templating"]["list"][0], name="ds2")), "template-datasource-rule"),
    (lambda d: d["templating"]["list"].pop(4), "template-model_name-rule"),
    (lambda d: d["templating"]["list"][0].update(label="Data Source"), "template-datasource-rule"),
    (lambda d: d["templating"]["list"][1].update(label="job"), "template-job-rule"),
    (lambda d: d["templating"]["list"][2].update(allValue=".*"), "template-instance-rule"),
    # vLLM's matchers on a panel the .lint file does not name: reported
    (lambda d: _first_target(d).update(expr=_first_target(d)["expr"].replace('job=~"$job"', 'job=~"$vllm_job"')),
     "target-job-rule"),
    (lambda d: d.update(schemaVersion=27), "schemaVersion"),
])
def test_linter_reports_each_rule(breakage, rule):
    d = copy.deepcopy(load("cachemon-overview.json"))
    breakage(d)
    problems = lint.lint_dashboard(d, LINT_FILE)
    assert any(rule in p for p in problems), problems


def test_selector_scanner():
    e = ('histogram_quantile(0.95, sum by (le) (rate(vllm:x_bucket{job=~"$vllm_job"}[$__rate_interval])))\n'
         '/ on (model_name) group_left() (sum without (engine) (increase(a_total{b="c/d"}[5m] offset 1h)) > 0)'
         ' and up == 0')
    sels = lint.selectors(e)
    assert [(s.name, s.range, s.function) for s in sels] == [
        ("vllm:x_bucket", "$__rate_interval", "rate"), ("a_total", "5m", "increase"), ("up", None, None)]
    assert sels[1].matchers == 'b="c/d"'
    assert lint.divisions_guarded("a / (b > 0)") and lint.divisions_guarded('a{x="/"} / on (m) group_left() (b > 0)')
    assert not lint.divisions_guarded("a / b") and not lint.divisions_guarded("a / (b) > 0")


# --- colours: one table (monitoring/palette.py), the same colour for a thing in every panel ----------
def _colours(p):
    """legend name or regex -> fixed colour, from the panel's colour overrides."""
    return {o["matcher"]["options"]: prop["value"]["fixedColor"] for o in p["fieldConfig"]["overrides"]
            for prop in o["properties"] if prop["id"] == "color"}


def test_every_reason_and_cause_has_its_own_colour_in_every_panel_that_shows_it():
    from cachemon.judge.causes import CAUSES
    from cachemon.monitoring import palette
    from cachemon.state.ledger.reasons import REASONS
    assert set(palette.reasons()) == set(REASONS) and set(palette.causes()) == {str(c) for c in CAUSES}
    assert len(set(palette.reasons().values())) == len(REASONS)       # each reason its own colour
    assert len(set(palette.causes().values())) == len(CAUSES)
    ps = {p["title"]: p for p in lint.panels(load("cachemon-overview.json"))}
    assert _colours(ps["Where the misses go"]) == palette.reasons()
    assert _colours(ps["Missed tokens by cause"]) == {f"^{c} \\(": col for c, col in palette.causes().items()}
    assert _colours(ps["Why: active causes"]) == {f": {c}$": col for c, col in palette.causes().items()}
    assert _colours(ps["Estimated cost per second, with and without cache"]) == {"with_cache": "green",
                                                                               "without_cache": "red"}
    # no panel paints several series one fixed colour (the old neutral(): every series blue)
    for f in FILES:
        for p in lint.panels(json.loads(f.read_text())):
            if p["type"] == "timeseries":
                assert p["fieldConfig"]["defaults"]["color"]["mode"] != "fixed", (f.name, p["title"])


def test_where_the_misses_go_hides_reasons_at_zero():
    p = next(p for p in lint.panels(load("cachemon-overview.json")) if p["title"] == "Where the misses go")
    (hide,) = [o for o in p["fieldConfig"]["overrides"] if o["matcher"]["id"] == "byValue"]
    assert hide["matcher"]["options"] == {"reducer": "max", "op": "lte", "value": 0}
    assert hide["properties"] == [{"id": "custom.hideFrom", "value": {"legend": True, "tooltip": True, "viz": True}}]


def test_each_row_owns_only_its_own_panels():
    # a row owns every panel up to the next row: the tenant row must end before latency and cost
    d = load("cachemon-overview.json")
    owner, owned = None, {}
    for p in d["panels"]:
        if p["type"] == "row":
            owner = p["title"]
        else:
            owned.setdefault(owner, []).append(p["title"])
    tenants = next(t for t in owned if t and t.startswith("Tenants"))
    assert all("tenant" in t.lower() or "adapter" in t.lower() for t in owned[tenants]), owned[tenants]
    assert "Time to first token p95" in owned[dashboards.LATENCY_ROW]


def test_the_tenant_row_draws_no_unnamed_series_and_says_why_when_empty():
    d = load("cachemon-overview.json")
    ps = [p for p in lint.panels(d) if p["type"] != "row" and
          ("tenant" in p["title"].lower() or "adapter" in p["title"].lower())]
    assert len(ps) == 5
    for p in ps:
        expr = p["targets"][0]["expr"]
        assert 'tenant!=""' in expr or 'adapter!=""' in expr, (p["title"], expr)
        assert p["fieldConfig"]["defaults"]["noValue"].startswith("No tenants or adapters")
        assert re.search(r"[Ee]mpty|Needs", p["description"]), p["title"]
        assert "/ {{" not in p["targets"][0]["legendFormat"]       # no bare "/" legend when a side is empty


def test_stats_name_their_unit_and_cachemon_targets_up_is_joined_to_cachemon():
    for f in FILES:
        for p in lint.panels(json.loads(f.read_text())):
            if p["type"] == "stat" and p["fieldConfig"]["defaults"]["unit"] in ("short", "none"):
                # Grafana has no token unit: the stat shows its name, which says it
                assert p["options"]["textMode"] == "value_and_name", p["title"]
                assert re.search(r"tokens|cheaper", p["targets"][0]["legendFormat"]), p["title"]
    up = next(p for p in lint.panels(load("cachemon-exporter.json")) if p["title"] == "cachemon targets up")
    assert "and on (job) group by (job) (last_over_time(cachemon_build_info{" in up["targets"][0]["expr"]


def test_the_daily_total_does_not_depend_on_a_day_long_step():
    p = next(p for p in lint.panels(load("cachemon-overview.json")) if p["title"].startswith("Hit tokens over"))
    assert "[1d]" in p["targets"][0]["expr"] and p["interval"] == dashboards.DAILY_STEP != "1d"
