"""Draw a shipped dashboard from a real Prometheus: each panel's own PromQL, no Grafana needed.

    python scripts/render_dashboards.py --prometheus http://127.0.0.1:9090 --minutes 30 \
        --dashboard cachemon-overview --out docs/images/overview.png

Every panel's targets are sent as Grafana sends them with every variable on "All" (each variable's
allValue) to ``/api/v1/query_range``: the step is at least the panel's ``interval`` (Grafana's min
interval), start and end are rounded down to the step (Grafana's AlignTimeRange), ``$__interval`` is
the step, ``$__rate_interval`` max(step + scrape interval, 4 x scrape interval) and ``$__range`` the
range. Each series is named by its ``legendFormat`` as Grafana does (a label it lacks renders empty; an
empty name is "Value") and coloured as Grafana colours it: the panel's colour mode (fixed, the classic
palette by series index, thresholds), then its field overrides matched by name, regular expression,
query or value (``byName``, ``byRegexp``, ``byFrameRefID``, ``byValue``), whose ``color`` and
``custom.hideFrom`` it applies. The answers are drawn as SVG in one self-contained HTML page (no script,
no CDN, no network), laid out on the dashboard's own 24-column grid, and headless Chromium screenshots
it. ``panel_data`` is what the tests read, and ``problems`` what they fail on: a panel with no series
to draw, several series drawn in one colour, a series without a name.
"""
from __future__ import annotations

import argparse
import html
import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Grafana's named colours (dark theme: packages/grafana-data/src/themes, the colour picker's map) ...
NAMED = {
    "super-light-red": "#FFA6B0", "light-red": "#FF7383", "red": "#F2495C", "semi-dark-red": "#E02F44",
    "dark-red": "#C4162A", "super-light-orange": "#FFCB7D", "light-orange": "#FFB357", "orange": "#FF9830",
    "semi-dark-orange": "#FF780A", "dark-orange": "#FA6400", "super-light-yellow": "#FFF899",
    "light-yellow": "#FFEE52", "yellow": "#FADE2A", "semi-dark-yellow": "#F2CC0C", "dark-yellow": "#E0B400",
    "super-light-green": "#C8F2C2", "light-green": "#96D98D", "green": "#73BF69", "semi-dark-green": "#56A64B",
    "dark-green": "#37872D", "super-light-blue": "#C0D8FF", "light-blue": "#8AB8FF", "blue": "#5794F2",
    "semi-dark-blue": "#3274D9", "dark-blue": "#1F60C4", "super-light-purple": "#DEB6F2",
    "light-purple": "#CA95E5", "purple": "#B877D9", "semi-dark-purple": "#A352CC", "dark-purple": "#8F3BB8",
    "text": "#CCCCDC",
}
# ... and its classic palette (palette-classic: series i takes colour i, cycling)
CLASSIC = ("green", "semi-dark-yellow", "light-blue", "semi-dark-orange", "red", "blue", "purple", "#705DA0",
           "dark-green", "yellow", "#447EBC", "#C15C17", "#890F02", "#0A437C", "#6D1F62", "#584477")
CELL_W, CELL_H = 56, 30          # one grid column, one grid row, in pixels


def load(name: str) -> dict:
    return json.loads((ROOT / "dashboards" / f"{name}.json").read_text(encoding="utf-8"))


def substitute(expr: str, dashboard: dict, step: float, scrape: float, span: float = 0.0) -> str:
    values = {v["name"]: v.get("allValue", ".*") for v in dashboard["templating"]["list"] if v["type"] == "query"}
    for var in sorted(values, key=len, reverse=True):
        expr = expr.replace(f"${{{var}}}", values[var]).replace(f"${var}", values[var])
    rate = max(step + scrape, 4 * scrape)
    return (expr.replace("$__rate_interval", f"{int(math.ceil(rate))}s").replace("$__interval", f"{int(step)}s")
            .replace("$__range", f"{int(math.ceil(span or step))}s"))


def seconds(duration: str) -> float:
    """A Grafana interval ("30s", "5m", "1d") in seconds; "" is 0."""
    if not duration:
        return 0.0
    m = re.fullmatch(r"(\d+)(ms|s|m|h|d|w)", duration)
    if not m:
        raise ValueError(f"not a Grafana interval: {duration!r}")
    return int(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[m.group(2)]


def time_range(panel: dict, start: float, end: float, step: float) -> tuple[float, float, float]:
    """Grafana's query range for the panel: the step at least the panel's min interval, start and end
    rounded down to a multiple of it (a 1d step on a 6 h range is one point at midnight: no data today)."""
    step = max(step, seconds(panel.get("interval", "")))
    return math.floor(start / step) * step, math.floor(end / step) * step, step


def query_range(prom: str, expr: str, start: float, end: float, step: float) -> list[dict]:
    q = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"{prom}/api/v1/query_range?{q}", timeout=30) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body}")
    return body["data"]["result"]


def legend(fmt: str, labels: dict) -> str:
    """Grafana's series name: the legendFormat with each {{label}} replaced (a missing label: nothing),
    else the labels; a name that renders empty falls back to the field's, "Value"."""
    if not fmt or fmt == "__auto":
        return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__") + "}" \
            if len(labels) > ("__name__" in labels) else "Value"
    out = re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt)
    return out.strip() or "Value"


def _reduce(values: list[float], reducer: str) -> float:
    return {"max": max, "min": min, "mean": lambda v: sum(v) / len(v), "last": lambda v: v[-1],
            "lastNotNull": lambda v: v[-1], "sum": sum, "first": lambda v: v[0]}[reducer](values)


_OPS = {"eq": lambda a, b: a == b, "neq": lambda a, b: a != b, "lt": lambda a, b: a < b,
        "lte": lambda a, b: a <= b, "gt": lambda a, b: a > b, "gte": lambda a, b: a >= b}


def _matches(matcher: dict, name: str, ref: str, values: list[float]) -> bool:
    kind, opt = matcher.get("id"), matcher.get("options")
    if kind == "byName":
        return name == opt
    if kind == "byRegexp":
        return re.search(opt, name) is not None       # Grafana: RegExp.test, not anchored
    if kind == "byFrameRefID":
        return ref == opt
    if kind == "byValue":
        return bool(values) and _OPS[opt.get("op", "gte")](_reduce(values, opt["reducer"]), opt.get("value", 0))
    raise ValueError(f"field matcher {kind!r} is not one the renderer knows: teach it before using it")


def hex_colour(colour: str) -> str:
    return NAMED.get(colour, colour)


def threshold_colour(steps: list[dict], v: float) -> str:
    """The last threshold step at or below the value."""
    colour = "green"
    for step in steps:
        if step.get("value") is None or v >= step["value"]:
            colour = step["color"]
    return colour


def style_series(p: dict, series: list[tuple[str, str, list]]) -> list[dict]:
    """Each series (name, refId, points) with Grafana's colour and visibility for the panel."""
    defaults = p.get("fieldConfig", {}).get("defaults", {})
    mode = defaults.get("color", {}).get("mode", "palette-classic")
    steps = defaults.get("thresholds", {}).get("steps", [])
    out = []
    for i, (name, ref, pts) in enumerate(series):
        values = [v for _, v in pts]
        if mode == "fixed":
            colour = defaults["color"].get("fixedColor", "green")
        elif mode == "thresholds":
            colour = threshold_colour(steps, values[-1])
        else:
            colour = CLASSIC[i % len(CLASSIC)]
        hide: dict = {}
        for o in p.get("fieldConfig", {}).get("overrides", []):
            if _matches(o["matcher"], name, ref, values):
                for prop in o.get("properties", []):
                    if prop["id"] == "color" and prop["value"].get("mode") == "fixed":
                        colour = prop["value"]["fixedColor"]
                    elif prop["id"] == "custom.hideFrom":
                        hide = prop["value"]
        out.append({"name": name, "points": pts, "colour": hex_colour(colour), "hidden": bool(hide.get("viz"))})
    return out


def panel_data(prom: str, dashboard: dict, start: float, end: float, step: float, scrape: float) -> list[dict]:
    """Every panel with what Grafana would draw: {title, type, unit, gridPos, series: [(name, [(t, v)])]
    (the visible ones), colours (one per visible series), hidden (names hidden by an override), ...}."""
    out = []
    for p in dashboard["panels"]:
        if p["type"] == "row":
            out.append({"title": p["title"], "type": "row", "gridPos": p["gridPos"], "series": []})
            continue
        raw: list[tuple[str, str, list]] = []
        answered = 0        # targets (queries) of the panel that returned data
        q_start, q_end, q_step = time_range(p, start, end, step)
        for t in p.get("targets", []):
            before = len(raw)
            expr = substitute(t["expr"], dashboard, q_step, scrape, end - start)
            for s in query_range(prom, expr, q_start, q_end, q_step):
                pts = [(float(ts), float(v)) for ts, v in s["values"] if not math.isnan(float(v))]
                if pts:
                    # a table (format table) shows each label as a column: its row is the label values
                    name = ("  ".join(v for k, v in sorted(s["metric"].items()) if k != "__name__")
                            if p["type"] == "table" else legend(t.get("legendFormat", ""), s["metric"]))
                    raw.append((name, t.get("refId", ""), pts))
            answered += len(raw) > before
        out.append(describe(p, raw, answered))
    return out


def describe(p: dict, raw: list[tuple[str, str, list]], answered: int | None = None) -> dict:
    """The panel as drawn from its series (name, refId, points)."""
    styled = style_series(p, raw)
    shown = [s for s in styled if not s["hidden"]]
    defaults = p.get("fieldConfig", {}).get("defaults", {})
    return {"title": p["title"], "type": p["type"], "gridPos": p["gridPos"],
            "series": [(s["name"], s["points"]) for s in shown], "colours": [s["colour"] for s in shown],
            "hidden": [s["name"] for s in styled if s["hidden"]],
            "unit": defaults.get("unit", ""), "description": p.get("description", ""),
            "min": defaults.get("min"), "max": defaults.get("max"),
            "no_value": defaults.get("noValue", "No data"),
            # a value mapping's colour wins over the series colour (Grafana's display processor)
            "mapped": {v: hex_colour(r["color"]) for m in defaults.get("mappings", []) if m.get("type") == "value"
                       for v, r in m["options"].items() if r.get("color")},
            "text_mode": p.get("options", {}).get("textMode", "auto"),
            "queries": len(p.get("targets", [])), "answered": len(raw) > 0 if answered is None else answered}


def problems(panel: dict) -> list[str]:
    """What a reader could not read in the panel as Grafana draws it."""
    if panel["type"] == "row":
        return []
    out = []
    if not panel["series"]:
        out.append(f"{panel['title']}: no series to draw ({panel['no_value']})")
    if panel["type"] in ("timeseries", "state-timeline"):
        if panel["type"] == "timeseries" and len(panel["series"]) > 1 and len(set(panel["colours"])) == 1:
            out.append(f"{panel['title']}: {len(panel['series'])} series drawn in one colour ({panel['colours'][0]})")
        for name, _ in panel["series"]:
            if name == "Value" or not re.search(r"[A-Za-z0-9]", name):
                out.append(f"{panel['title']}: a series without a name: {name!r}")
    return out


def fmt(v: float, unit: str) -> str:
    if unit == "percentunit":
        return f"{v * 100:.0f} %"
    if unit == "s":
        return f"{v * 1000:.0f} ms" if abs(v) < 1 else f"{v:.2f} s"
    if unit.startswith("dateTime"):
        return time.strftime("%H:%M:%S", time.gmtime(v / 1000))
    if unit.startswith("currency"):
        return f"{v:.2g} {unit[8:]}"
    a = abs(v)
    for div, suffix in ((1e9, " G"), (1e6, " M"), (1e3, " k")):
        if a >= div:
            return f"{v / div:.3g}{suffix}"
    return f"{v:.3g}"


def svg_lines(p: dict, w: int, h: int, start: float, end: float) -> str:
    pad_l, pad_b, pad_t = 58, 18, 6
    pts = [v for _, s in p["series"] for _, v in s]
    # the axis as Grafana scales it: the field's min / max where set, else the data's (with 0 in view)
    lo = p["min"] if p.get("min") is not None else min(0.0, min(pts))
    hi = p["max"] if p.get("max") is not None else max(max(pts), 0.0) or 1.0
    if hi == lo:
        hi = lo + 1
    pw, ph = w - pad_l - 6, h - pad_b - pad_t

    def xy(t: float, v: float) -> str:
        return f"{pad_l + (t - start) / (end - start) * pw:.1f},{pad_t + (1 - (v - lo) / (hi - lo)) * ph:.1f}"
    out = [f'<svg width="{w}" height="{h}" xmlns="http://www.w3.org/2000/svg">']
    for i in range(5):
        v = lo + (hi - lo) * i / 4
        y = pad_t + (1 - i / 4) * ph
        out.append(f'<line x1="{pad_l}" x2="{w - 6}" y1="{y:.1f}" y2="{y:.1f}" stroke="#2c3235"/>'
                   f'<text x="{pad_l - 4}" y="{y + 4:.1f}" fill="#9fa7b3" font-size="10" text-anchor="end">'
                   f"{html.escape(fmt(v, p['unit']))}</text>")
    span = end - start
    for i in range(5):
        x = pad_l + pw * i / 4
        ago = span * (1 - i / 4)
        label = "now" if i == 4 else (f"-{ago / 60:.0f}m" if span >= 600 else f"-{ago:.0f}s")
        anchor = "end" if i == 4 else "middle"
        out.append(f'<text x="{x:.0f}" y="{h - 4}" fill="#9fa7b3" font-size="10" text-anchor="{anchor}">'
                   f"{label}</text>")
    for i, (_, s) in enumerate(p["series"][:12]):
        colour = p["colours"][i]
        # break the line where samples are missing (more than 2.5 steps apart)
        gap = 2.5 * (s[1][0] - s[0][0]) if len(s) > 1 else 0
        segs, cur, prev = [], [], None
        for t, v in s:
            if prev is not None and t - prev > gap:
                segs.append(cur)
                cur = []
            cur.append(xy(t, v))
            prev = t
        segs.append(cur)
        for seg in segs:
            if len(seg) == 1:
                out.append(f'<circle cx="{seg[0].split(",")[0]}" cy="{seg[0].split(",")[1]}" r="2" '
                           f'fill="{colour}"/>')
            else:
                out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.6" '
                           f'points="{" ".join(seg)}"/>')
    out.append("</svg>")
    return "".join(out)


def svg_states(p: dict, w: int, h: int, start: float, end: float) -> str:
    """A state timeline: one lane per series, filled where the value is 1 (a cause active)."""
    lanes = p["series"][:6]
    pad_l, pad_b = 150, 18
    lane_h = max(12, min(40, (h - pad_b) // max(1, len(lanes))))
    pw = w - pad_l - 6
    out = [f'<svg width="{w}" height="{h}" xmlns="http://www.w3.org/2000/svg">']
    for i, (name, pts) in enumerate(lanes):
        y = i * lane_h + 4
        color = p.get("mapped", {}).get("1", p["colours"][i])
        out.append(f'<text x="{pad_l - 6}" y="{y + lane_h / 2 + 3:.0f}" fill="#ccccdc" font-size="11" '
                   f'text-anchor="end">{html.escape(name[-30:])}</text>')
        step = (pts[1][0] - pts[0][0]) if len(pts) > 1 else (end - start) / 240
        for t, v in pts:
            if v >= 1:
                x = pad_l + (t - start) / (end - start) * pw
                out.append(f'<rect x="{x:.1f}" y="{y}" width="{max(1.0, step / (end - start) * pw) + 0.5:.1f}" '
                           f'height="{lane_h - 6}" fill="{color}"/>')
    for i in range(5):
        x = pad_l + pw * i / 4
        ago = (end - start) * (1 - i / 4)
        label = "now" if i == 4 else (f"-{ago / 60:.0f}m" if end - start >= 600 else f"-{ago:.0f}s")
        anchor = "end" if i == 4 else "middle"
        out.append(f'<text x="{x:.0f}" y="{h - 4}" fill="#9fa7b3" font-size="10" text-anchor="{anchor}">{label}</text>')
    out.append("</svg>")
    return "".join(out)


def render_html(title: str, panels: list[dict], start: float, end: float) -> tuple[str, int, int]:
    body, bottom = [], 0
    for p in panels:
        g = p["gridPos"]
        x, y, w, h = g["x"] * CELL_W, g["y"] * CELL_H, g["w"] * CELL_W - 6, g["h"] * CELL_H - 6
        bottom = max(bottom, y + h + 6)
        if p["type"] == "row":
            body.append(f'<div class="row" style="left:{x}px;top:{y}px;width:{24 * CELL_W - 6}px">'
                        f"{html.escape(p['title'])}</div>")
            continue
        inner = ""
        if not p["series"]:
            inner = f'<div class="empty">{html.escape(p["no_value"])}</div>'
        elif p["type"] == "stat":
            (name, pts), colour = p["series"][0], p["colours"][0]
            label = f'<div class="statname">{html.escape(name)}</div>' if p["text_mode"] == "value_and_name" else ""
            inner = f'{label}<div class="stat" style="color:{colour}">{html.escape(fmt(pts[-1][1], p["unit"]))}</div>'
        elif p["type"] == "table":
            rows = "".join(f"<tr><td>{html.escape(name)}</td><td>{html.escape(fmt(s[-1][1], p['unit']))}</td></tr>"
                           for name, s in p["series"][:6])
            inner = f"<table>{rows}</table>"
        elif p["type"] == "state-timeline":
            inner = svg_states(p, w - 12, h - 40, start, end)
        else:
            inner = svg_lines(p, w - 12, h - 58, start, end)
            inner += '<div class="legend">' + " ".join(
                f'<span style="color:{p["colours"][i]}">&#9644;</span> {html.escape(name)}'
                for i, (name, _) in enumerate(p["series"][:12])) + "</div>"
        body.append(f'<div class="panel" style="left:{x}px;top:{y}px;width:{w}px;height:{h}px">'
                    f'<div class="title">{html.escape(p["title"])}</div>{inner}</div>')
    width = 24 * CELL_W + 20
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title><style>
body{{margin:0;background:#111217;font-family:sans-serif;color:#ccccdc}}
h1{{font-size:16px;margin:8px 10px}} #grid{{position:relative;margin:0 10px;height:{bottom}px}}
.panel{{position:absolute;background:#181b1f;border:1px solid #2c3235;border-radius:3px;overflow:hidden}}
.title{{font-size:12px;font-weight:600;padding:5px 8px}} .row{{position:absolute;font-size:14px;font-weight:600}}
.stat{{font-size:40px;font-weight:600;color:#73bf69;text-align:center;margin-top:30px}}
.empty{{color:#6e7580;text-align:center;margin:40px 10px 0;font-size:13px}}
.statname{{font-size:12px;color:#9fa7b3;text-align:center;margin-top:14px}}
.legend{{font-size:10px;padding:0 8px;white-space:nowrap;overflow:hidden}}
table{{font-size:11px;margin:0 8px}} td{{padding:1px 8px 1px 0}}
</style></head><body><h1>{html.escape(title)}</h1><div id="grid">{''.join(body)}</div></body></html>"""
    return page, width, bottom + 50


def chromium() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


def screenshot(page: str, width: int, height: int, out: Path) -> None:
    exe = chromium()
    if exe is None:
        raise RuntimeError("headless Chromium not found (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "dashboard.html"
        src.write_text(page, encoding="utf-8")
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                        "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
                        f"--user-data-dir={tmp}/profile", f"--window-size={width},{height}",
                        f"--screenshot={out.resolve()}", src.as_uri()],
                       check=True, capture_output=True, timeout=120)


def render(prom: str, name: str, out: Path, minutes: float, scrape: float, panels_only: list[str] | None = None,
           end: float | None = None) -> list[dict]:
    d = load(name)
    end = end or time.time()
    start = end - minutes * 60
    step = max(1.0, minutes * 60 / 240)
    data = panel_data(prom, d, start, end, step, scrape)
    shown = data if panels_only is None else _only(data, panels_only)
    page, w, h = render_html(d["title"], shown, start, end)
    screenshot(page, w, h, out)
    return data


def _only(data: list[dict], titles: list[str]) -> list[dict]:
    """The named panels, in their order, laid out again left to right, top to bottom (a README picture)."""
    keep = [dict(p) for p in data if p["title"] in titles]
    x = y = row_h = 0
    for p in keep:
        w, h = p["gridPos"]["w"], p["gridPos"]["h"]
        if x + w > 24:
            x, y, row_h = 0, y + row_h, 0
        p["gridPos"] = {"x": x, "y": y, "w": w, "h": h}
        x, row_h = x + w, max(row_h, h)
    return keep


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prometheus", default="http://127.0.0.1:9090")
    ap.add_argument("--dashboard", default="cachemon-overview")
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--scrape-interval", type=float, default=5, help="seconds, the Prometheus scrape interval")
    ap.add_argument("--out", default="docs/images/overview.png")
    args = ap.parse_args(argv)
    data = render(args.prometheus, args.dashboard, Path(args.out), args.minutes, args.scrape_interval)
    empty = [p["title"] for p in data if p["type"] != "row" and not p["series"]]
    print(f"{args.out}: {sum(p['type'] != 'row' for p in data) - len(empty)} panels with data, "
          f"{len(empty)} empty: {', '.join(empty) or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
