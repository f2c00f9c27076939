"""Grafana's dashboard JSON model (schemaVersion 39), the pieces every cachemon dashboard is made of:
targets, panels and their styles, rows, the layout on the 24-column grid, variables and annotations.
Panels and annotations query ``${datasource}`` (a datasource variable; no datasource uid is baked in)."""
from __future__ import annotations

import re
from collections.abc import Iterable

from cachemon.jsontypes import JsonObject, JsonValue, as_list, as_object

SCHEMA_VERSION = 39
DS: JsonObject = {"type": "prometheus", "uid": "${datasource}"}
# What a panel's query list holds: a PromQL expression, target()'s arguments, or a target already built.
Expr = str | tuple[str, str] | JsonObject


def target(expr: str, legend: str = "__auto", ref: str = "A", instant: bool = False, table: bool = False) -> JsonObject:
    out: JsonObject = {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref,
                       "range": not instant, "instant": instant}
    if table:
        out["format"] = "table"
    return out


def targets(exprs: Iterable[Expr]) -> list[JsonValue]:
    out: list[JsonValue] = []
    for i, e in enumerate(exprs):
        tgt = e if isinstance(e, dict) else target(*e) if isinstance(e, tuple) else target(e)
        tgt = dict(tgt, refId=chr(ord("A") + i))
        out.append(tgt)
    return out


def panel(kind: str, title: str, description: str, unit: str, exprs: Iterable[Expr], w: int = 12, h: int = 8,
          steps: list[JsonValue] | None = None, axis: str = "", min_: float | None = None,
          max_: float | None = None, options_extra: JsonObject | None = None, **extra: JsonValue) -> JsonObject:
    defaults: JsonObject = {"unit": unit, "color": {"mode": "thresholds" if kind == "stat" else "palette-classic"}}
    if min_ is not None:
        defaults["min"] = min_
    if max_ is not None:
        defaults["max"] = max_
    defaults["thresholds"] = {"mode": "absolute", "steps": steps or [{"color": "green", "value": None}]}
    options: JsonObject
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
    p: JsonObject = {"type": kind, "title": title, "description": description, "datasource": DS,
                     "fieldConfig": {"defaults": defaults, "overrides": []}, "options": options,
                     "targets": targets(exprs), "gridPos": {"w": w, "h": h}}
    p.update(extra)
    return p


def table(title: str, description: str, expr: str, w: int = 12, h: int = 6) -> JsonObject:
    """An instant table of label sets (info metrics); Time and Value columns hidden."""
    return panel("table", title, description, "none", [target(expr, "", instant=True, table=True)], w=w, h=h,
                 transformations=[{"id": "organize", "options": {"excludeByName": {"Time": True, "Value": True}}}])


NO_TRAFFIC: list[JsonValue] = [{"type": "special", "options": {"match": "null", "result": {"text": "No traffic", "index": 0}}}]


def defaults(p: JsonObject) -> JsonObject:
    """A panel's field defaults (unit, colour, thresholds, mappings), for the styles below to change."""
    return as_object(as_object(p["fieldConfig"])["defaults"])


def no_traffic(p: JsonObject) -> JsonObject:
    """An idle ratio has no value (the `> 0` guard): say so instead of "No data"."""
    defaults(p)["mappings"] = NO_TRAFFIC
    return p


def neutral(p: JsonObject) -> JsonObject:
    """A number that is neither good nor bad (traffic, sizes, money): no thresholds. A stat is one neutral
    blue and names its value (its legend says the unit Grafana has no id for: tokens, tokens/s); a graph
    keeps the palette, one colour per series, unless ``series_colours`` fixes them."""
    d = defaults(p)
    d["thresholds"] = {"mode": "absolute", "steps": [{"color": "blue", "value": None}]}
    if p["type"] == "stat":
        d["color"] = {"mode": "fixed", "fixedColor": "blue"}
        as_object(p["options"]).update(colorMode="value", textMode="value_and_name")
    return p


def series_colours(p: JsonObject, colours: dict[str, str], pattern: str = "") -> JsonObject:
    """A fixed colour per series (monitoring/palette.py), matched by its legend: the legend itself, or in
    a legend that says more, ``pattern``, a regular expression with ``{}`` where the value stands
    (``"^{} \\("`` for "cause (certainty)")."""
    for value, colour in colours.items():
        if not pattern:
            matcher: JsonObject = {"id": "byName", "options": value}
        else:
            matcher = {"id": "byRegexp", "options": pattern.replace("{}", re.escape(value))}
        as_list(as_object(p["fieldConfig"])["overrides"]).append(
            {"matcher": matcher, "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": colour}}]})
    return p


def hide_all_zero(p: JsonObject) -> JsonObject:
    """Hide series that stay at 0 over the whole range (Grafana's "Fields with values" matcher): of eight
    miss reasons, the one or two that occur are drawn, not seven flat lines beside them."""
    as_list(as_object(p["fieldConfig"])["overrides"]).append(
        {"matcher": {"id": "byValue", "options": {"reducer": "max", "op": "lte", "value": 0}},
         "properties": [{"id": "custom.hideFrom", "value": {"legend": True, "tooltip": True, "viz": True}}]})
    return p


def no_value(p: JsonObject, text: str) -> JsonObject:
    """What the panel says instead of "No data" when its queries return nothing (Grafana's noValue)."""
    defaults(p)["noValue"] = text
    return p


def tokens_per_second(p: JsonObject) -> JsonObject:
    """Tokens per second. Grafana has no token unit and dashboard-linter's panel-units-rule accepts only
    Grafana's own unit ids (a custom "suffix:" unit is not one), so the unit is "short" and the title,
    and on a graph the axis label, say tokens/s; a stat's legend says it beside the value."""
    if p["type"] == "timeseries":
        as_object(defaults(p)["custom"])["axisLabel"] = "tokens/s"
    return neutral(p)


def row(title: str) -> JsonObject:
    return {"type": "row", "title": title, "collapsed": False, "panels": [], "gridPos": {"w": 24, "h": 1}}


def stacked(p: JsonObject) -> JsonObject:
    """Stack the series (parts of one whole: tokens by reason or by cause), filled."""
    as_object(defaults(p)["custom"]).update(stacking={"mode": "normal", "group": "A"}, fillOpacity=60)
    return p


def layout(panels: list[JsonObject]) -> list[JsonValue]:
    """Left-to-right, top-to-bottom on Grafana's 24-column grid; ids in order (stable diffs)."""
    x = y = row_h = 0
    for i, p in enumerate(panels, start=1):
        grid = as_object(p["gridPos"])
        w, h = grid["w"], grid["h"]
        assert isinstance(w, int) and isinstance(h, int)
        if x + w > 24:
            x, y, row_h = 0, y + row_h, 0
        p["gridPos"] = {"h": h, "w": w, "x": x, "y": y}
        p["id"] = i
        x += w
        row_h = max(row_h, h)
    return [*panels]


def query_var(name: str, label: str, query: str, all_value: str = ".+") -> JsonObject:
    return {"name": name, "label": label, "type": "query", "datasource": DS,
            "query": query, "definition": query, "refresh": 2, "multi": True, "includeAll": True,
            "allValue": all_value, "current": {}, "options": [], "sort": 1, "hide": 0, "regex": ""}


def annotation(name: str, expr: str, title: str, text: str, color: str, tags: str) -> JsonObject:
    return {"name": name, "datasource": DS, "enable": True, "hide": False, "iconColor": color,
            "expr": expr, "step": "1m", "titleFormat": title, "textFormat": text, "tagKeys": tags,
            "useValueForTime": False}
