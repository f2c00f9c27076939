"""`cachemon report`: what the prefix cache did over a period, read from a Prometheus that scraped cachemon.

Every figure comes from the raw samples of cachemon's counters in (end - since, end], via the
Prometheus HTTP API (``/api/v1/query`` with a range selector), not from ``increase()``: the
increase of a series is the sum of its sample-to-sample rises (a drop counts as a counter reset,
the new value being the rise), so the report adds up exactly what the scraped series show, with
no extrapolation to the period's edges. Tokens counted before the first sample in the period are
not in it (at most one scrape interval).
"""
from __future__ import annotations

import json
import math
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict

import click
import requests

from cachemon import catalog as C
from cachemon.cli_options import config_option, format_option, timeout_option, usage_error
from cachemon.config import DAY, ConfigError, load_yaml, parse_duration
from cachemon.tools.cost_report_tenants import Labels, ModelTenants, Samples, tenant_lines, tenant_section
from cachemon.urls import redact_url, scrub

if TYPE_CHECKING:
    from cachemon.config.cost import CostModel


class ReportError(Exception):
    pass


class _Series(TypedDict, total=False):
    """One series of a Prometheus query's result (/api/v1/query): a range vector's has values."""
    metric: Labels
    values: list[tuple[float, str]]      # [unix time, sample value as text]


class UpstreamEvents(TypedDict):
    """An upstream's restarts, changes, cache resets and warm-ups over the period, with their times."""
    restarts: float
    restart_times: list[float]
    changes: dict[str, float]            # by kind
    change_times: dict[str, list[float]]
    cache_resets: float
    cache_reset_times: list[float]
    warmups: dict[str, float]            # by "trigger/result"


class ModelTotals(TypedDict):
    upstreams: list[str]
    average_hit_ratio: float | None
    query_tokens: float
    hit_tokens: float
    miss_tokens: float
    output_tokens: float
    cost_with_cache: float | None
    cost_without_cache: float | None
    saving_factor: float | None
    cost_source: str | None
    output_cost_share: float | None
    output_dominates: bool


class ModelRow(ModelTotals):
    events: dict[str, UpstreamEvents]    # of the upstreams that serve the model
    tenants: ModelTenants | None


class Report(TypedDict):
    """`cachemon report --format json`."""
    prometheus: str                      # the URL, redacted
    start: float
    end: float
    since_seconds: float
    currency: str | None
    models: dict[str, ModelRow]
    events: dict[str, UpstreamEvents]


class Prometheus:
    def __init__(self, url: str, timeout: float = 30.0, session: requests.Session | None = None):
        self.url = url.rstrip("/")
        self.shown = redact_url(self.url)            # the one form of the URL in output
        self.timeout = timeout
        self.session = session or requests.Session()

    def query(self, promql: str, at: float) -> list[_Series]:
        try:
            r = self.session.get(self.url + "/api/v1/query", params={"query": promql, "time": f"{at:.3f}"},
                                 timeout=self.timeout)
        except requests.RequestException as e:
            raise ReportError(f"cannot reach Prometheus at {self.shown}: {scrub(str(e), self.url)}") from None
        try:
            data = r.json()
        except ValueError:
            raise ReportError(f"{self.shown}/api/v1/query answered HTTP {r.status_code} with no JSON: "
                              f"is this a Prometheus server?") from None
        if data.get("status") != "success":
            raise ReportError(f"Prometheus rejected {promql!r}: {data.get('errorType')}: {data.get('error')}")
        result: list[_Series] = data["data"]["result"]
        return result

    def raw(self, metric: str, since: float, end: float,
            matchers: str = "") -> list[tuple[Labels, Samples]]:
        """Every raw sample of ``metric`` in (end - since, end], per series."""
        rng = f"{max(1, int(math.ceil(since)))}s"
        res = self.query(f"{metric}{{{matchers}}}[{rng}]", end)
        out: list[tuple[Labels, Samples]] = []
        for s in res:
            pts = [(float(t), float(v)) for t, v in s.get("values", [])]
            out.append((s["metric"], pts))
        return out


def counter_increase(points: list[tuple[float, float]]) -> float:
    """Sum of sample-to-sample rises; a drop is a counter reset (the new value is the rise)."""
    total = 0.0
    for (_, a), (_, b) in zip(points, points[1:], strict=False):
        total += b - a if b >= a else b
    return total


def gauge_values(points: list[tuple[float, float]], start: float) -> list[float]:
    """Distinct values of a last-event timestamp gauge that fall inside the period: one per event."""
    return sorted({v for _, v in points if v > start and not math.isnan(v)})


@dataclass
class ModelReport:
    model: str
    upstreams: set[str] = field(default_factory=set)
    query_tokens: float = 0.0
    hit_tokens: float = 0.0
    miss_tokens: float = 0.0
    output_tokens: float = 0.0
    cost_with: float | None = None
    cost_without: float | None = None
    cost_source: str = ""
    output_share: float | None = None

    @property
    def hit_ratio(self) -> float | None:
        return self.hit_tokens / self.query_tokens if self.query_tokens > 0 else None

    @property
    def saving_factor(self) -> float | None:
        if self.cost_with and self.cost_without is not None and self.cost_with > 0:
            return self.cost_without / self.cost_with
        return None

    def to_json(self) -> ModelTotals:
        return {"upstreams": sorted(self.upstreams), "average_hit_ratio": self.hit_ratio,
                "query_tokens": self.query_tokens, "hit_tokens": self.hit_tokens, "miss_tokens": self.miss_tokens,
                "output_tokens": self.output_tokens, "cost_with_cache": self.cost_with,
                "cost_without_cache": self.cost_without, "saving_factor": self.saving_factor,
                "cost_source": self.cost_source or None, "output_cost_share": self.output_share,
                "output_dominates": self.output_share is not None and self.output_share >= 0.5}


def build_report(prom: Prometheus, since: float, end: float, cost_model: CostModel | None = None,
                 currency: str | None = None) -> Report:
    start = end - since
    models = _model_tokens(prom, since, end)
    _add_costs(models, prom, since, end, cost_model)
    events = _upstream_events(prom, since, end)
    tenants = tenant_section(lambda metric: prom.raw(metric, since, end), counter_increase)
    out_models: dict[str, ModelRow] = {}
    for k, v in sorted(models.items()):
        out_models[k] = {**v.to_json(), "events": {up: events[up] for up in sorted(v.upstreams) if up in events},
                         "tenants": tenants.get(k)}
    return {"prometheus": prom.shown, "start": start, "end": end, "since_seconds": since,
            "currency": currency, "models": out_models,
            "events": {k: v for k, v in sorted(events.items())}}


def _model_tokens(prom: Prometheus, since: float, end: float) -> dict[str, ModelReport]:
    """Per model: the local cache's query, hit and miss tokens and the output tokens over the period."""
    models: dict[str, ModelReport] = {}

    def model(name: str) -> ModelReport:
        m = models.get(name)
        if m is None:
            m = models[name] = ModelReport(name)
        return m

    local = f'{C.CACHE}="local"'
    for spec, attr in ((C.QUERY_TOKENS, "query_tokens"), (C.HIT_TOKENS, "hit_tokens"), (C.MISS_TOKENS, "miss_tokens")):
        for labels, pts in prom.raw(spec.sample_name, since, end, local):
            m = model(labels.get(C.MODEL, ""))
            m.upstreams.add(labels.get(C.UPSTREAM, ""))
            setattr(m, attr, getattr(m, attr) + counter_increase(pts))
    for labels, pts in prom.raw(C.GENERATION_TOKENS.sample_name, since, end):
        model(labels.get(C.MODEL, "")).output_tokens += counter_increase(pts)
    return models


def _add_costs(models: dict[str, ModelReport], prom: Prometheus, since: float, end: float,
               cost_model: CostModel | None) -> None:
    """The cost with and without the cache: cachemon's own exported estimate where it has one, else
    the --config's cost model over the period's tokens."""
    exported: defaultdict[tuple[str, str], float] = defaultdict(float)
    for labels, pts in prom.raw(C.ESTIMATED_COST.sample_name, since, end):
        exported[(labels.get(C.MODEL, ""), labels.get("scenario", ""))] += counter_increase(pts)
    for m in models.values():
        e = None
        if cost_model is not None:
            from cachemon.runtime.cost import estimate
            e = estimate(cost_model, m.hit_tokens, m.miss_tokens, m.output_tokens)
            m.output_share = e.output_share
        if (m.model, "with_cache") in exported:
            m.cost_with = exported[(m.model, "with_cache")]
            m.cost_without = exported.get((m.model, "without_cache"))
            m.cost_source = "cachemon_estimated_cost_total"
        elif e is not None:
            m.cost_with, m.cost_without = e.with_cache, e.without_cache
            m.cost_source = "cost: section of --config"


def _upstream_events(prom: Prometheus, since: float, end: float) -> dict[str, UpstreamEvents]:
    """Per upstream: restarts, changes, cache resets and warm-ups over the period, with their times."""
    start = end - since
    events: dict[str, UpstreamEvents] = defaultdict(lambda: {"restarts": 0.0, "restart_times": [], "changes": {},
                                                   "change_times": {}, "cache_resets": 0.0, "cache_reset_times": [],
                                                   "warmups": {}})

    def raw(spec: C.MetricSpec) -> list[tuple[Labels, Samples]]:
        return prom.raw(spec.sample_name, since, end)

    for labels, pts in raw(C.RESTARTS):
        events[labels.get(C.UPSTREAM, "")]["restarts"] += counter_increase(pts)
    for labels, pts in raw(C.LAST_RESTART):
        events[labels.get(C.UPSTREAM, "")]["restart_times"] += gauge_values(pts, start)
    for labels, pts in raw(C.CHANGES):
        ev = events[labels.get(C.UPSTREAM, "")]["changes"]
        ev[labels.get(C.KIND, "")] = ev.get(labels.get(C.KIND, ""), 0.0) + counter_increase(pts)
    for labels, pts in raw(C.LAST_CHANGE):
        events[labels.get(C.UPSTREAM, "")]["change_times"][labels.get(C.KIND, "")] = gauge_values(pts, start)
    for labels, pts in raw(C.CACHE_RESETS):
        events[labels.get(C.UPSTREAM, "")]["cache_resets"] += counter_increase(pts)
    for labels, pts in raw(C.LAST_CACHE_RESET):
        events[labels.get(C.UPSTREAM, "")]["cache_reset_times"] += gauge_values(pts, start)
    for labels, pts in raw(C.WARMUPS):
        n = counter_increase(pts)
        if n:
            k = f'{labels.get("trigger", "")}/{labels.get("result", "")}'
            w = events[labels.get(C.UPSTREAM, "")]["warmups"]
            w[k] = w.get(k, 0.0) + n
    return events


def _ts(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f} %"


def format_text(rep: Report) -> str:
    cur = rep.get("currency") or ""
    lines = [f"cachemon report from {rep['prometheus']}: {_ts(rep['start'])} to {_ts(rep['end'])} "
             f"(raw samples, no extrapolation)"]
    if not rep["models"]:
        lines.append("no cachemon prefix-cache series in this period (is this Prometheus scraping cachemon?)")
    for name, m in rep["models"].items():
        lines.append(f"\nmodel {name or '(unnamed)'} (upstreams: {', '.join(m['upstreams']) or '-'})")
        lines.append(f"  average hit ratio   {_pct(m['average_hit_ratio'])}  (hit tokens / query tokens in the period)")
        lines.append(f"  hit tokens          {m['hit_tokens']:.0f}")
        lines.append(f"  miss tokens         {m['miss_tokens']:.0f}")
        lines.append(f"  output tokens       {m['output_tokens']:.0f}")
        if m["cost_with_cache"] is None:
            lines.append("  estimated cost      n/a (no cachemon_estimated_cost_total series and no cost: in --config)")
        else:
            f = m["saving_factor"]
            unit = f" {cur}" if cur else ""
            lines.append(f"  estimated cost      with cache {m['cost_with_cache']:.4f}{unit}, without cache "
                         f"{m['cost_without_cache']:.4f}{unit}" + (f", saving factor {f:.2f}x" if f is not None else ""))
        if m["output_dominates"]:
            lines.append(f"  note: output tokens are {_pct(m['output_cost_share'])} of the estimated cost with cache; "
                         "the prefix cache cannot reduce that part")
        lines += tenant_lines(m.get("tenants"))
    lines.append("\nevents per upstream (restarts, changes, cache resets, warm-ups)")
    if not rep["events"]:
        lines.append("  none recorded")
    for up, ev in rep["events"].items():
        models = [n or "(unnamed)" for n, m in rep["models"].items() if up in m["upstreams"]]
        lines.append(f"  {up}" + (f" (serving {', '.join(models)})" if models else "") + ": " + _events_line(ev))
    return "\n".join(lines)


def _events_line(ev: UpstreamEvents) -> str:
    parts = [f"{ev['restarts']:.0f} restart(s)"]
    if ev["restart_times"]:
        parts[-1] += " at " + ", ".join(_ts(t) for t in ev["restart_times"])
    for kind, n in sorted(ev["changes"].items()):
        if n:
            times = ev["change_times"].get(kind) or []
            parts.append(f"{n:.0f} {kind} change(s)" + (" at " + ", ".join(_ts(t) for t in times) if times else ""))
    parts.append(f"{ev['cache_resets']:.0f} cache reset(s)" +
                 (" at " + ", ".join(_ts(t) for t in ev["cache_reset_times"]) if ev["cache_reset_times"] else ""))
    for k, n in sorted(ev["warmups"].items()):
        parts.append(f"{n:.0f} warm-up(s) {k}")
    return "; ".join(parts)

@click.command("report")
@click.option("--prometheus", "prom_url", required=True, metavar="URL", help="Prometheus that scrapes cachemon.")
@click.option("--since", default="24h", show_default=True, metavar="DURATION", help="Length of the period.")
@click.option("--until", "until", type=float, metavar="UNIX_TIME", help="End of the period (default: now).")
@format_option()
@config_option("cachemon config whose cost: section prices tokens when cachemon exported no cost series, "
               "and tells how much of the cost is output tokens.")
@timeout_option("30s")
def report_command(prom_url: str, since: str, until: float | None, fmt: str, config_path: str | None,
                   timeout: str) -> None:
    """Per model over a period: hit ratio, hit and miss tokens, cost with and without cache, and the events."""
    try:
        period = parse_duration(since, "--since", hi=365 * DAY)
        t = parse_duration(timeout, "--timeout")
        cost_model = None
        if config_path:
            from cachemon.config.cost import parse_cost_config
            cost_model = parse_cost_config(load_yaml(config_path).get("cost"))
    except ConfigError as e:
        usage_error(e, "report")
    try:
        rep = build_report(Prometheus(prom_url, t), period, until if until is not None else time.time(), cost_model,
                           cost_model.currency if cost_model else None)
    except ReportError as e:
        click.echo(f"cachemon report: {e}", err=True)
        sys.exit(1)
    click.echo(json.dumps(rep, indent=2) if fmt == "json" else format_text(rep))
