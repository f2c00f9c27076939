"""Draw a shipped dashboard from a real Prometheus: each panel's own PromQL, no Grafana needed.

    python scripts/render_dashboards.py --prometheus http://127.0.0.1:9090 --minutes 30 \
        --dashboard cachemon-overview --out docs/images/overview.png

Every panel's targets are sent as Grafana sends them with every variable on "All" (each variable's
allValue; ``$__rate_interval`` = max(step + scrape interval, 4 x scrape interval)) to
``/api/v1/query_range``; the answers are drawn as SVG in one self-contained HTML page (no script,
no CDN, no network), laid out on the dashboard's own 24-column grid, and headless Chromium
screenshots it. ``panel_data`` is what the tests use to fail on a panel with no data.
"""
from __future__ import annotations

import argparse
import html
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COLORS = ("#73bf69", "#f2cc0c", "#5794f2", "#ff9830", "#f2495c", "#b877d9", "#8ab8ff", "#fade2a")
CELL_W, CELL_H = 56, 30          # one grid column, one grid row, in pixels


def load(name: str) -> dict:
    return json.loads((ROOT / "dashboards" / f"{name}.json").read_text(encoding="utf-8"))


def substitute(expr: str, dashboard: dict, step: float, scrape: float) -> str:
    values = {v["name"]: v.get("allValue", ".*") for v in dashboard["templating"]["list"] if v["type"] == "query"}
    for var in sorted(values, key=len, reverse=True):
        expr = expr.replace(f"${{{var}}}", values[var]).replace(f"${var}", values[var])
    rate = max(step + scrape, 4 * scrape)
    return expr.replace("$__rate_interval", f"{int(math.ceil(rate))}s").replace("$__interval", f"{int(step)}s")


def query_range(prom: str, expr: str, start: float, end: float, step: float) -> list[dict]:
    q = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"{prom}/api/v1/query_range?{q}", timeout=30) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body}")
    return body["data"]["result"]


def legend(fmt: str, labels: dict) -> str:
    if not fmt or fmt == "__auto":
        return ", ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "__name__") or "value"
    out = fmt
    for k, v in labels.items():
        out = out.replace("{{" + k + "}}", v).replace("{{ " + k + " }}", v)
    while "{{" in out and "}}" in out:
        a, b = out.index("{{"), out.index("}}")
        out = out[:a] + out[b + 2:]
    return out.strip(" /") or "value"


def panel_data(prom: str, dashboard: dict, start: float, end: float, step: float, scrape: float) -> list[dict]:
    """Every non-row panel with its series: {title, type, unit, gridPos, series: [(legend, [(t, v)])]}."""
    out = []
    for p in dashboard["panels"]:
        if p["type"] == "row":
            out.append({"title": p["title"], "type": "row", "gridPos": p["gridPos"], "series": []})
            continue
        series = []
        answered = 0        # targets (queries) of the panel that returned data
        for t in p.get("targets", []):
            before = len(series)
            for s in query_range(prom, substitute(t["expr"], dashboard, step, scrape), start, end, step):
                pts = [(float(ts), float(v)) for ts, v in s["values"] if not math.isnan(float(v))]
                if pts:
                    series.append((legend(t.get("legendFormat", ""), s["metric"]), pts))
            answered += len(series) > before
        defaults = p.get("fieldConfig", {}).get("defaults", {})
        out.append({"title": p["title"], "type": p["type"], "gridPos": p["gridPos"], "series": series,
                    "unit": defaults.get("unit", ""), "description": p.get("description", ""),
                    "steps": defaults.get("thresholds", {}).get("steps", []),
                    "queries": len(p.get("targets", [])), "answered": answered,
                    "fixed": defaults.get("color", {}).get("fixedColor") if
                    defaults.get("color", {}).get("mode") == "fixed" else None})
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


NAMED = {"red": "#f2495c", "orange": "#ff9830", "green": "#73bf69", "blue": "#5794f2", "text": "#ccccdc"}


def stat_color(p: dict, v: float) -> str:
    """Grafana's: the fixed colour, else the last threshold step at or below the value."""
    if p.get("fixed"):
        return NAMED.get(p["fixed"], p["fixed"])
    color = "green"
    for step in p.get("steps", []):
        if step.get("value") is None or v >= step["value"]:
            color = step["color"]
    return NAMED.get(color, color)


def svg_lines(p: dict, w: int, h: int, start: float, end: float) -> str:
    pad_l, pad_b, pad_t = 58, 18, 6
    pts = [v for _, s in p["series"] for _, v in s]
    lo, hi = (0.0, 1.0) if p["unit"] == "percentunit" else (min(0.0, min(pts)), max(pts) or 1.0)
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
    for i, (_, s) in enumerate(p["series"][:8]):
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
                           f'fill="{COLORS[i % len(COLORS)]}"/>')
            else:
                out.append(f'<polyline fill="none" stroke="{COLORS[i % len(COLORS)]}" stroke-width="1.6" '
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
        color = COLORS[i % len(COLORS)]
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
            inner = '<div class="empty">No data</div>'
        elif p["type"] == "stat":
            last = p["series"][0][1][-1][1]
            inner = f'<div class="stat" style="color:{stat_color(p, last)}">{html.escape(fmt(last, p["unit"]))}</div>'
        elif p["type"] == "table":
            rows = "".join(f"<tr><td>{html.escape(name)}</td><td>{html.escape(fmt(s[-1][1], p['unit']))}</td></tr>"
                           for name, s in p["series"][:6])
            inner = f"<table>{rows}</table>"
        elif p["type"] == "state-timeline":
            inner = svg_states(p, w - 12, h - 40, start, end)
        else:
            inner = svg_lines(p, w - 12, h - 58, start, end)
            inner += '<div class="legend">' + " ".join(
                f'<span style="color:{COLORS[i % len(COLORS)]}">&#9644;</span> {html.escape(name)}'
                for i, (name, _) in enumerate(p["series"][:8])) + "</div>"
        body.append(f'<div class="panel" style="left:{x}px;top:{y}px;width:{w}px;height:{h}px">'
                    f'<div class="title">{html.escape(p["title"])}</div>{inner}</div>')
    width = 24 * CELL_W + 20
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title><style>
body{{margin:0;background:#111217;font-family:sans-serif;color:#ccccdc}}
h1{{font-size:16px;margin:8px 10px}} #grid{{position:relative;margin:0 10px;height:{bottom}px}}
.panel{{position:absolute;background:#181b1f;border:1px solid #2c3235;border-radius:3px;overflow:hidden}}
.title{{font-size:12px;font-weight:600;padding:5px 8px}} .row{{position:absolute;font-size:14px;font-weight:600}}
.stat{{font-size:40px;font-weight:600;color:#73bf69;text-align:center;margin-top:30px}}
.empty{{color:#6e7580;text-align:center;margin-top:40px;font-size:13px}}
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
