"""Checks on the generated bundle: a small PromQL scanner and Grafana's dashboard-linter rules.

A test tool (moved out of the package: nothing the sidecar runs needs it); the tests import it as
``promql_lint``.

The scanner is not a PromQL parser (Prometheus itself parses every expression in the
integration test); it finds vector selectors, their range and the function around them,
which is what the linter rules and the "every queried metric exists" check need.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
            "offset", "bool", "atan2", "inf", "nan"}
LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
RANGE_FUNCTIONS = {"rate", "irate", "increase"}
AGGREGATIONS = {"sum", "avg", "min", "max", "count", "group", "stddev", "stdvar", "topk", "bottomk",
                "quantile", "count_values"}
_GROUPING = re.compile(r"\s*(by|without)\s*\(")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_NUMBER = re.compile(r"[0-9.][0-9A-Za-z_.]*")


@dataclass(frozen=True)
class Selector:
    name: str
    matchers: str        # text between the braces, "" if none
    range: str | None    # text between the brackets, None for an instant selector
    function: str | None  # innermost function call around it, e.g. "rate"


def _skip_string(s: str, i: int) -> int:
    q = s[i]
    i += 1
    while i < len(s) and s[i] != q:
        i += 2 if s[i] == "\\" else 1
    return i + 1


def _closing(s: str, i: int, open_: str, close: str) -> int:
    """Index just after the bracket matching s[i] == open_ (strings skipped)."""
    depth = 0
    while i < len(s):
        ch = s[i]
        if ch in "\"'`":
            i = _skip_string(s, i)
            continue
        if ch == open_:
            depth += 1
        elif ch == close:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ValueError(f"unbalanced {open_!r} in {s!r}")


def selectors(expr: str) -> list[Selector]:
    out: list[Selector] = []
    stack: list[str | None] = []   # function name (or None) of each open parenthesis
    i, n = 0, len(expr)
    while i < n:
        ch = expr[i]
        if ch in "\"'`":
            i = _skip_string(expr, i)
        elif ch == "#":   # comment to end of line
            while i < n and expr[i] != "\n":
                i += 1
        elif ch == "(":
            stack.append(None)
            i += 1
        elif ch == ")":
            if stack:
                stack.pop()
            i += 1
        elif ch == "{":   # selector without a metric name
            end = _closing(expr, i, "{", "}")
            sel, i = _finish(expr, "", expr[i + 1:end - 1], end, stack)
            out.append(sel)
        elif (num := _NUMBER.match(expr, i)) and (ch.isdigit() or ch == "."):
            i = num.end()
        elif ch == "$":   # Grafana variable outside a string, e.g. in a range
            var = _IDENT.match(expr, i + 1)
            i = var.end() if var else i + 1
        elif ident := _IDENT.match(expr, i):
            i = _word(expr, ident, stack, out)
        else:
            i += 1
    return out


def _word(expr: str, ident: re.Match[str], stack: list[str | None], out: list[Selector]) -> int:
    """An identifier: a keyword, a label list, a function call (pushed on the stack) or a selector
    (appended to ``out``); the index after what it consumed."""
    n = len(expr)
    word = ident.group()
    j = ident.end()
    k = j
    while k < n and expr[k] in " \t\n":
        k += 1
    g = _GROUPING.match(expr, j) if word in AGGREGATIONS else None
    if g:   # `sum by (a, b) (...)`: the label list is not a selector
        k = _closing(expr, g.end() - 1, "(", ")")
        while k < n and expr[k] in " \t\n":
            k += 1
    if word in LABEL_LISTS:
        if k < n and expr[k] == "(":
            j = _closing(expr, k, "(", ")")
        return j
    if word in KEYWORDS:
        return j
    if k < n and expr[k] == "(":
        stack.append(word)
        return k + 1
    matchers = ""
    if k < n and expr[k] == "{":
        end = _closing(expr, k, "{", "}")
        matchers, j = expr[k + 1:end - 1], end
    sel, i = _finish(expr, word, matchers, j, stack)
    out.append(sel)
    return i


def _finish(expr: str, name: str, matchers: str, j: int, stack) -> tuple[Selector, int]:
    k = j
    while k < len(expr) and expr[k] in " \t\n":
        k += 1
    rng = None
    if k < len(expr) and expr[k] == "[":
        end = _closing(expr, k, "[", "]")
        rng, j = expr[k + 1:end - 1], end
    return Selector(name, matchers, rng, stack[-1] if stack else None), j


def metric_names(expr: str) -> set[str]:
    return {s.name for s in selectors(expr) if s.name}


# --- dashboards -------------------------------------------------------------------------------
# dashboard-linter's panel-units-rule (grafana/dashboard-linter lint/rule_panel_units.go, commit
# 01598dab): its list of Grafana unit ids, of which cachemon's generator uses these ...
VALID_UNITS = {"none", "short", "percent", "percentunit", "s", "ms", "bytes", "cps", "ops", "reqps",
               "currencyUSD", "currencyGBP", "currencyEUR", "currencyJPY", "currencyCHF", "currencyINR",
               "bool", "dtdurations", "dateTimeFromNow", "dateTimeAsIso"}
# ... and the panel types it checks (others pass).
UNIT_PANEL_TYPES = {"stat", "singlestat", "graph", "table", "timeseries", "gauge"}


def panel_unit_problem(p: dict) -> str | None:
    """panel-units-rule as its code reads: the configured unit is the last unit override, else the
    default unit; it passes if one is configured and the *default* unit is in the list. cachemon also
    requires every override unit to be in the list (the rule's stated intent, which its code does not
    check), so a custom "suffix:" unit fails here even beside a valid default."""
    if p.get("type") not in UNIT_PANEL_TYPES:
        return None
    fc = p.get("fieldConfig") or {}
    default = (fc.get("defaults") or {}).get("unit") or ""
    overrides = [prop.get("value") for o in fc.get("overrides") or () for prop in o.get("properties") or ()
                 if prop.get("id") == "unit"]
    configured = overrides[-1] if overrides else default
    if not configured or default not in VALID_UNITS:
        return f"has no or invalid units defined: {configured!r}"
    bad = [u for u in overrides if u not in VALID_UNITS]
    if bad:
        return f"overrides the unit with one outside Grafana's list: {bad[0]!r}"
    return None


def panels(dashboard: dict) -> list[dict]:
    out = []
    for p in dashboard.get("panels", []):
        out.append(p)
        out.extend(p.get("panels", []))   # collapsed rows
    return out


def dashboard_exprs(dashboard: dict) -> list[tuple[str, str]]:
    """(where, expr) of every PromQL expression: panel targets, annotations, variable queries."""
    out = []
    for p in panels(dashboard):
        for tgt in p.get("targets", []):
            out.append((f"panel {p['title']!r} target {tgt.get('refId')}", tgt["expr"]))
    for a in dashboard.get("annotations", {}).get("list", []):
        if "expr" in a:
            out.append((f"annotation {a['name']!r}", a["expr"]))
    return out


def variable_queries(dashboard: dict) -> list[tuple[str, str, str]]:
    """(variable, metric selector, label) of every label_values() variable."""
    out = []
    for v in dashboard["templating"]["list"]:
        if v["type"] == "query":
            m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", v["query"])
            if not m:
                raise ValueError(f"variable {v['name']}: unsupported query {v['query']!r}")
            out.append((v["name"], m.group(1), m.group(2)))
    return out


def _uses_ds(ds) -> bool:
    return isinstance(ds, dict) and ds.get("uid") == "${datasource}" or ds == "$datasource"


def load_lint_file(directory: Path) -> dict:
    """dashboard-linter's `.lint` beside the dashboards (its lint/configuration.go: exclusions and warnings
    by rule name, each entry matched on the dashboard and panel titles it gives); {} when there is none."""
    path = directory / ".lint"
    return yaml.safe_load(path.read_text(encoding="utf-8")) or {} if path.exists() else {}


def _excluded(config: dict, rule: str, dashboard: str, panel: str | None) -> bool:
    """configuration.go's Apply/IsMatch: a rule listed without entries is excluded everywhere; else an
    entry matches when each field it sets equals the result's."""
    if rule not in (config.get("exclusions") or {}):
        return False
    entries = (config["exclusions"][rule] or {}).get("entries") or []
    return not entries or any(e.get("dashboard", dashboard) == dashboard and e.get("panel", panel) == panel
                              for e in entries)


def lint_dashboard(d: dict, config: dict | None = None) -> list[str]:
    """Problems under the rules of grafana/dashboard-linter (plus our ratio guard), less what ``config``
    (a `.lint` file, ``load_lint_file``) excludes."""
    title = d.get("title", "?")
    msgs = _dashboard_problems(d) + _variable_problems(d.get("templating", {}).get("list", []))
    if d.get("editable") is not False:
        msgs.append("template-uneditable-rule: editable must be false")
    for a in d.get("annotations", {}).get("list", []):
        if "expr" in a and not _uses_ds(a.get("datasource")):
            msgs.append(f"annotation {a.get('name')!r} does not use $datasource")
    for p in panels(d):
        if p.get("type") != "row":
            msgs += _panel_problems(p)
    for where, expr in dashboard_exprs(d):
        panel = re.match(r"panel '(.*)' target", where)
        for s in selectors(expr):
            msgs += [m for m in _selector_problems(where, s)
                     if not _excluded(config or {}, m.split(":")[0], title, panel and panel.group(1))]
        if not divisions_guarded(expr):
            msgs.append(f"ratio guard: {where}: a division whose denominator is not `(... > 0)`")
    return [f"{title}: {m}" for m in msgs]


def _dashboard_problems(d: dict) -> list[str]:
    out = []
    if not d.get("uid") or not d.get("title"):
        out.append("uid and title must be set")
    if d.get("schemaVersion", 0) < 39:
        out.append(f"schemaVersion {d.get('schemaVersion')} < 39")
    if d.get("id") is not None:
        out.append("id must be null (provisioning assigns it)")
    return out


def _variable_problems(variables: list[dict]) -> list[str]:
    """template-datasource-rule, template-{job,instance,model_name}-rule, template-on-time-change-reload-rule."""
    out = []
    ds_vars = [v for v in variables if v.get("type") == "datasource"]
    if len(ds_vars) != 1 or ds_vars[0]["name"] != "datasource" or ds_vars[0].get("label") != "Data source" \
            or ds_vars[0].get("query") != "prometheus":
        out.append("template-datasource-rule: exactly one Prometheus datasource variable named 'datasource', "
                   "labelled 'Data source'")
    if ds_vars and ds_vars[0].get("current"):
        out.append("the datasource variable must not bake in a current datasource")
    by_name = {v["name"]: v for v in variables}
    for name in ("job", "instance", "model_name"):
        v = by_name.get(name)
        if v is None:
            out.append(f"template-{name}-rule: no '{name}' variable")
            continue
        if not _uses_ds(v.get("datasource")) or v.get("type") != "query" or not v.get("multi") \
                or not v.get("includeAll"):
            out.append(f"template-{name}-rule: '{name}' must be a multi-select query variable on $datasource")
        if v.get("refresh") != 2:
            out.append(f"template-on-time-change-reload-rule: '{name}' must have refresh 2")
        if name in ("job", "instance"):
            # template-job-rule / template-instance-rule: Title-case label, allValue ".+"
            if v.get("label") != name.title():
                out.append(f"template-{name}-rule: '{name}' must be labelled '{name.title()}', is {v.get('label')!r}")
            if v.get("allValue") != ".+":
                out.append(f"template-{name}-rule: '{name}' allValue must be '.+'")
    return out


def _panel_problems(p: dict) -> list[str]:
    """panel-title-description-rule, panel-units-rule, panel-datasource-rule, panel-no-targets-rule."""
    out = []
    pt = p.get("title", "")
    if not pt or not p.get("description"):
        out.append(f"panel-title-description-rule: panel {pt!r} needs a title and a description")
    unit_problem = panel_unit_problem(p)
    if unit_problem:
        out.append(f"panel-units-rule: panel {pt!r} {unit_problem}")
    if not _uses_ds(p.get("datasource")):
        out.append(f"panel-datasource-rule: panel {pt!r} does not use $datasource")
    if not p.get("targets"):
        out.append(f"panel-no-targets-rule: panel {pt!r} has no targets")
    for tgt in p.get("targets", []):
        if not _uses_ds(tgt.get("datasource")):
            out.append(f"panel-datasource-rule: panel {pt!r} target {tgt.get('refId')} does not use $datasource")
    return out


def _selector_problems(where: str, s: Selector) -> list[str]:
    """target-rate-interval-rule, target-counter-agg-rule, target-job-rule, target-instance-rule."""
    out = []
    # upstream flags only rate() and irate() (lint/rule_target_rate_interval.go): increase() over a fixed
    # range is a total over that range (a rolling daily total), not a rate that must follow the step
    if s.range is not None and s.function in ("rate", "irate") and s.range != "$__rate_interval":
        out.append(f"target-rate-interval-rule: {where}: {s.function}() over [{s.range}], want [$__rate_interval]")
    if s.name.endswith(("_total", "_bucket")) and (s.range is None or s.function not in RANGE_FUNCTIONS):
        out.append(f"target-counter-agg-rule: {where}: counter {s.name} outside rate/irate/increase")
    # target-job-rule / target-instance-rule (lint/rule_target_job_instance.go): every selector, vLLM's own
    # included, has the regex matchers job=~"$job" and instance=~"$instance"; dashboards/.lint excludes the
    # panels on vLLM's own scrape job (its $vllm_job / $vllm_instance).
    job, inst = "$job", "$instance"
    if s.name != "ALERTS" and f'job=~"{job}"' not in s.matchers:
        out.append(f"target-job-rule: {where}: {s.name or '{...}'} has no job=~\"{job}\" matcher")
    if s.name != "ALERTS" and f'instance=~"{inst}"' not in s.matchers:
        out.append(f"target-instance-rule: {where}: {s.name or '{...}'} has no instance=~\"{inst}\" matcher")
    return out


def divisions_guarded(expr: str) -> bool:
    """Every `/` divides by a parenthesised `(... > 0)`, so idle series vanish instead of NaN."""
    bare = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    for m in re.finditer("/", bare):
        rest = re.sub(r"^\s*on\s*\([^)]*\)\s*group_(?:left|right)\s*\([^)]*\)", "", bare[m.end():]).lstrip()
        if not rest.startswith("("):
            return False
        if not re.search(r">\s*0\s*\)$", rest[:_closing(rest, 0, "(", ")")]):
            return False
    return True
