"""Text exposition (format 0.0.4) of cachemon's own metrics, fast.

prometheus_client's generate_latest costs ~14 us per sample; cachemon's collectors
yield ``Family`` objects whose label sets are already formatted (and cached per
series), so a scrape is mostly string joins. Any prometheus_client ``Metric``
(e.g. from a third-party collector) is rendered too, through the generic path.
"""
from __future__ import annotations

import math

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Family:
    __slots__ = ("name", "type", "help", "samples")

    def __init__(self, name: str, type_: str, help_: str):
        self.name = name          # without _total / _info
        self.type = type_         # counter | gauge | info
        self.help = help_
        self.samples: list[tuple[str, float]] = []   # (formatted label set, value)

    def add(self, labels: str, value: float) -> None:
        self.samples.append((labels, value))


def escape_label(v: str) -> str:
    if "\\" in v or '"' in v or "\n" in v:
        v = v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return v


def format_labels(names, values) -> str:
    return ",".join(f'{k}="{escape_label(str(v))}"' for k, v in zip(names, values, strict=False))


def format_value(v: float) -> str:
    if v != v:
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


def _escape_help(h: str) -> str:
    return h.replace("\\", "\\\\").replace("\n", "\\n")


def _render_family(f: Family, out: list[str]) -> None:
    if f.type == "counter":
        exposed, ptype = f.name + "_total", "counter"
    elif f.type == "info":
        exposed, ptype = f.name + "_info", "gauge"
    else:
        exposed, ptype = f.name, "gauge"
    out.append(f"# HELP {exposed} {_escape_help(f.help)}\n# TYPE {exposed} {ptype}\n")
    fv = format_value
    for labels, value in f.samples:
        if labels:
            out.append(f"{exposed}{{{labels}}} {fv(value)}\n")
        else:
            out.append(f"{exposed} {fv(value)}\n")


def _render_metric(m, out: list[str]) -> None:
    """A prometheus_client Metric family (generic, slower path)."""
    name = m.name + "_total" if m.type == "counter" else m.name
    if m.type == "info":
        name = m.name + "_info"
    ptype = {"info": "gauge", "stateset": "gauge", "unknown": "untyped"}.get(m.type, m.type)
    out.append(f"# HELP {name} {_escape_help(m.documentation)}\n# TYPE {name} {ptype}\n")
    for s in m.samples:
        if s.name.endswith("_created"):
            continue
        labels = format_labels(s.labels.keys(), s.labels.values())
        out.append(f"{s.name}{{{labels}}} {format_value(s.value)}\n" if labels else f"{s.name} {format_value(s.value)}\n")


def render(collectors) -> bytes:
    out: list[str] = []
    for c in collectors:
        for fam in c.collect():
            if isinstance(fam, Family):
                _render_family(fam, out)
            else:
                _render_metric(fam, out)
    return "".join(out).encode("utf-8")
