"""Grafana's dashboard JSON model (schemaVersion 39), the pieces every cachemon dashboard is made of:
targets, panels and their styles, rows, the layout on the 24-column grid, variables and annotations.
Panels and annotations query ``${datasource}`` (a datasource variable; no datasource uid is baked in)."""
from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

SCHEMA_VERSION = 39
DS = {"type": "prometheus", "uid": "${datasource}"}


def target(expr: str, legend: str = "__auto", ref: str = "A", instant: bool = False, table: bool = False) -> dict[str, Any]:
    out = {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref,
           "range": not instant, "instant": instant}
    if table:
        out["format"] = "table"
    return out


def targets(exprs: Iterable[Any]) -> list[dict[str, Any]]:
    out = []
    for i, e in enumerate(exprs):
        tgt = e if isinstance(e, dict) else target(*e) if isinstance(e, tuple) else target(e)
        tgt = dict(tgt, refId=chr(ord("A") + i))
        out.append(tgt)
    return out


def panel(kind: str, title: str, description: str, unit: str, exprs: Iterable[Any], w: int = 12, h: int = 8,
          steps: list[dict[str, Any]] | None = None, axis: str = "", min_: float | None = None,
          max_: float | None = None, options_extra: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": unit, "color": {"mode": "thresholds" if kind == "stat" else "palette-classic"}}
    if min_ is not None:
        defaults["min"] = min_
    if max_ is not None:
        defaults["max"] = max_
    defaults["thresholds"] = {"mode": "absolute", "steps": steps or [{"color": "green", "value": None}]}
    options: dict[str, Any]
    if kind == "timeseries":
        defaults["custom"] = {"drawStyle": extra.pop("draw", "line"), "lineWidth": 1, "fillOpacity": 10,
                              "showPoints": "never", "spanNulls": False, "axisLabel": axis,
                              "thresholdsStyle": {"mode": "line" if steps else "off"}}
        options = {"legend": {"displayMode": "table", "placement": "bottom", "showLegend": True,
                              "calcs": ["mean", "max", "lastNotNull"]},
                   "tooltip": {"mode": "multi", "sort": "desc"}}
    elif kind == "stat":
        options = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                   "colorMode": "background", "graphMode": "area", "textMode": "auto", "justifyMode": "auto",
                   "orientation": "auto"}
    elif kind == "table":
        options = {"showHeader": True, "cellHeight": "sm"}
    elif kind == "state-timeline":
        options = {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": False}}
    else:   # pragma: no cover - programming error
        raise ValueError(kind)
    options.update(options_extra or {})
    p = {"type": kind, "title": title, "description": description, "datasource": DS,
         "fieldConfig": {"defaults": defaults, "overrides": []}, "options": options,
         "targets": targets(exprs), "gridPos": {"w": w, "h": h}}
    p.update(extra)
    return p


def table(title: str, description: str, expr: str, w: int = 12, h: int = 6) -> dict[str, Any]:
    """An instant table of label sets (info metrics); Time and Value columns hidden."""
    return panel("table", title, description, "none", [target(expr, "", instant=True, table=True)], w=w, h=h,
                 transformations=[{"id": "organize", "options": {"excludeByName": {"Time": True, "Value": True}}}])


NO_TRAFFIC = [{"type": "special", "options": {"match": "null", "result": {"text": "No traffic", "index": 0}}}]


def no_traffic(p: dict[str, Any]) -> dict[str, Any]:
    """An idle ratio has no value (the `> 0` guard): say so instead of "No data"."""
    p["fieldConfig"]["defaults"]["mappings"] = NO_TRAFFIC
    return p


def neutral(p: dict[str, Any]) -> dict[str, Any]:
    """A number that is neither good nor bad (traffic, sizes, money): no thresholds. A stat is one neutral
    blue and names its value (its legend says the unit Grafana has no id for: tokens, tokens/s); a graph
    keeps the palette, one colour per series, unless ``series_colours`` fixes them."""
    d = p["fieldConfig"]["defaults"]
    d["thresholds"] = {"mode": "absolute", "steps": [{"color": "blue", "value": None}]}
    if p["type"] == "stat":
        d["color"] = {"mode": "fixed", "fixedColor": "blue"}
        p["options"].update(colorMode="value", textMode="value_and_name")
    return p


def series_colours(p: dict[str, Any], colours: dict[str, str], pattern: str = "") -> dict[str, Any]:
    """A fixed colour per series (monitoring/palette.py), matched by its legend: the legend itself, or in
    a legend that says more, ``pattern``, a regular expression with ``{}`` where the value stands
    (``"^{} \\("`` for "cause (certainty)")."""
    for value, colour in colours.items():
        if not pattern:
            matcher = {"id": "byName", "options": value}
        else:
            matcher = {"id": "byRegexp", "options": pattern.replace("{}", re.escape(value))}
        p["fieldConfig"]["overrides"].append(
            {"matcher": matcher, "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": colour}}]})
    return p


def hide_all_zero(p: dict[str, Any]) -> dict[str, Any]:
    """Hide series that stay at 0 over the whole range (Grafana's "Fields with values" matcher): of eight
    miss reasons, the one or two that occur are drawn, not seven flat lines beside them."""
    p["fieldConfig"]["overrides"].append(
        {"matcher": {"id": "byValue", "options": {"reducer": "max", "op": "lte", "value": 0}},
         "properties": [{"id": "custom.hideFrom", "value": {"legend": True, "tooltip": True, "viz": True}}]})
    return p


def no_value(p: dict[str, Any], text: str) -> dict[str, Any]:
    """What the panel says instead of "No data" when its queries return nothing (Grafana's noValue)."""
    p["fieldConfig"]["defaults"]["noValue"] = text
    return p


def tokens_per_second(p: dict[str, Any]) -> dict[str, Any]:
    """Tokens per second. Grafana has no token unit and dashboard-linter's panel-units-rule accepts only
    Grafana's own unit ids (a custom "suffix:" unit is not one), so the unit is "short" and the title,
    and on a graph the axis label, say tokens/s; a stat's legend says it beside the value."""
    if p["type"] == "timeseries":
        p["fieldConfig"]["defaults"]["custom"]["axisLabel"] = "tokens/s"
    return neutral(p)


def row(title: str) -> dict[str, Any]:
    return {"type": "row", "title": title, "collapsed": False, "panels": [], "gridPos": {"w": 24, "h": 1}}


def stacked(p: dict[str, Any]) -> dict[str, Any]:
    """Stack the series (parts of one whole: tokens by reason or by cause), filled."""
    p["fieldConfig"]["defaults"]["custom"].update(stacking={"mode": "normal", "group": "A"}, fillOpacity=60)
    return p


def layout(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Left-to-right, top-to-bottom on Grafana's 24-column grid; ids in order (stable diffs)."""
    x = y = row_h = 0
    for i, p in enumerate(panels, start=1):
        w, h = p["gridPos"]["w"], p["gridPos"]["h"]
        if x + w > 24:
            x, y, row_h = 0, y + row_h, 0
        p["gridPos"] = {"h": h, "w": w, "x": x, "y": y}
        p["id"] = i
        x += w
        row_h = max(row_h, h)
    return panels


def query_var(name: str, label: str, query: str, all_value: str = ".+") -> dict[str, Any]:
    return {"name": name, "label": label, "type": "query", "datasource": DS,
            "query": query, "definition": query, "refresh": 2, "multi": True, "includeAll": True,
            "allValue": all_value, "current": {}, "options": [], "sort": 1, "hide": 0, "regex": ""}


def annotation(name: str, expr: str, title: str, text: str, color: str, tags: str) -> dict[str, Any]:
    return {"name": name, "datasource": DS, "enable": True, "hide": False, "iconColor": color,
            "expr": expr, "step": "1m", "titleFormat": title, "textFormat": text, "tagKeys": tags,
            "useValueForTime": False}
