"""The `cachemon check` report: its JSON schema as types, and the one builder every source fills.

Schema ``cachemon-check/1`` (stable; documented in docs/metrics.md, "`cachemon check`"): a
``CheckReport`` holds one ``SourceReport`` per source, each with the same skeleton
(``new_report``, ``series_rows``, ``add_gauge_rows``, ``add_attribution``); a kind only adds
what is its own (``log`` for a log, ``kv_events`` for a metrics source followed with --kv-events).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypedDict

from cachemon import catalog as C
from cachemon.judge import attribute as A
from cachemon.normalise.normaliser import Normalised
from cachemon.normalise.server_profile import ReportedConfig, ServerProfile
from cachemon.state.store import SourceKind

SCHEMA = "cachemon-check/1"
EXIT = {"ok": 0, "warning": 1, "usage": 2, "critical": 3}

FindingSeverity = Literal["info", "warning", "critical"]
Counters = Mapping[Any, float]                # a page's or a log's (metric, labels) -> value


class Finding(TypedDict):
    code: str
    severity: FindingSeverity
    message: str


class ErrorInfo(TypedDict):
    reason: str
    message: str


class IntervalRow(TypedDict):
    seconds: float
    query_tokens: float
    hit_tokens: float
    hit_ratio: float | None


class SeriesRow(TypedDict):
    model_name: str
    engine: str
    cache: str
    query_tokens: float
    hit_tokens: float | None                  # None: no hit counter (never read as 0 hits)
    miss_tokens: float | None
    hit_ratio_since_start: float | None
    interval: IntervalRow | None


class ReportedRatio(TypedDict):
    model_name: str
    engine: str
    cache: str
    basis: str
    value: float


class GaugeRow(TypedDict):
    metric: str
    model_name: str
    engine: str
    value: float


class CauseRow(TypedDict):
    cause: str
    certainty: str
    message: str
    missed_tokens: float | None
    tokens_certainty: str


class AttributionRow(TypedDict):
    model_name: str
    basis: str                                # "interval" | "since_start" | "reported" | "none"
    traffic: bool
    hit_ratio: float | None
    severity: str | None                      # "warning" | "critical" | None
    causes: list[CauseRow]


class EstimatedRow(TypedDict):
    model_name: str
    engine: str
    value: float


class LogInfo(TypedDict):
    lines: dict[str, int]                     # parsed, unmatched, malformed, too_long
    stats_lines: int
    bytes: int
    rotations: int
    truncations: int
    prompt_tokens_estimated: list[EstimatedRow]
    vllm_restarts_seen: int
    from_beginning: bool
    # vLLM's last logged reset: seconds since the start of the year in the log's local time
    # (vLLM's log lines carry no year)
    last_reset_log_time: float | None


class DynamicPrefixRow(TypedDict):
    depth_blocks: int
    recomputed_tokens: float


class TextSamples(TypedDict):
    prompt_content: bool                      # always True: decoded prompt text, opt-in (--show-text)
    depth_blocks: int | None
    samples: list[str]


class _KvEventsRequired(TypedDict):
    endpoint: str
    replay: str | None
    window_seconds: float
    connected: bool
    messages: int
    recovered: int
    lost_batches: dict[str, int]              # by reason, as cachemon_kv_lost_batches_total
    restarts: int
    events: dict[str, int]
    release: str
    model: str | None
    in_sync: bool | None
    stored_tokens: dict[str, float]           # by reason
    cached_blocks: int
    # the divergence-depth histogram as on /metrics: cumulative count per upper bound ("le"), +Inf last
    divergence_depth_blocks: dict[str, float]
    dynamic_prefix: DynamicPrefixRow | None
    sliding_window: int | None                # tokens: the model's sliding-window group, as the events name it


class KvEventsReport(_KvEventsRequired, total=False):
    text: TextSamples                         # --show-text only


class _SourceRequired(TypedDict):
    kind: SourceKind                          # "metrics" | "log"
    name: str
    url: str | None
    path: str | None
    up: bool
    error: ErrorInfo | None
    era: str
    era_versions: str
    counter_unit: str                         # "tokens" | "blocks" | "none"
    vllm_version: str
    cache_config: ReportedConfig              # ServerProfile.to_report: one merged profile of the source
    series: list[SeriesRow]
    reported_hit_ratios: list[ReportedRatio]
    gauges: list[GaugeRow]
    findings: list[Finding]


class SourceReport(_SourceRequired, total=False):
    attribution: list[AttributionRow]
    log: LogInfo                              # a log source
    kv_events: KvEventsReport                 # a metrics source followed with --kv-events
    text_extra: list[str]                     # text output only (dropped from JSON)
    kv_extra: list[str]                       # text output only (dropped from JSON)


class CheckReport(TypedDict):
    schema: str                               # SCHEMA
    cachemon_version: str
    exit_code: int
    sources: list[SourceReport]


def finding(code: str, severity: FindingSeverity, message: str) -> Finding:
    return {"code": code, "severity": severity, "message": message}


# --- the one report builder: every source kind fills the same skeleton with the same helpers ----

def new_report(kind: SourceKind, name: str, *, url: str | None = None, path: str | None = None,
               error: tuple[str, str] | None = None) -> SourceReport:
    """The cachemon-check/1 source skeleton; ``error`` is (reason, message) when the source is unreadable."""
    return {"kind": kind, "name": name, "url": url, "path": path, "up": error is None,
            "error": {"reason": error[0], "message": error[1]} if error else None,
            "era": "", "era_versions": "", "counter_unit": "none", "vllm_version": "",
            "cache_config": ServerProfile().to_report(),
            "series": [], "reported_hit_ratios": [], "gauges": [], "findings": []}


def series_rows(last: Counters, first: Counters | None = None, seconds: float | None = None) -> list[SeriesRow]:
    """One row per query-token series of ``last`` counters; with ``first`` and ``seconds``, the
    interval between the two reads too. A missing hit counter stays None (never read as 0 hits)."""
    rows: list[SeriesRow] = []
    q_name, h_name, m_name = C.QUERY_TOKENS.name, C.HIT_TOKENS.name, C.MISS_TOKENS.name
    for (metric, key), q in sorted(last.items()):
        if metric != q_name:
            continue
        h = last.get((h_name, key))
        m = last.get((m_name, key), q - h if h is not None else None)
        model, engine, cache = key
        row: SeriesRow = {"model_name": model, "engine": engine, "cache": cache, "query_tokens": q,
               "hit_tokens": h, "miss_tokens": m,
               "hit_ratio_since_start": (h / q) if (h is not None and q > 0) else None, "interval": None}
        if seconds is not None and first is not None and first is not last:
            q0 = first.get((q_name, key))
            h0 = first.get((h_name, key))
            if q0 is not None and h0 is not None and h is not None and q >= q0:
                dq, dh = q - q0, h - h0
                row["interval"] = {"seconds": seconds, "query_tokens": dq, "hit_tokens": dh,
                                   "hit_ratio": (dh / dq) if dq > 0 else None}
        rows.append(row)
    return rows


def add_gauge_rows(rep: SourceReport, gauges: Counters) -> None:
    """Fill `reported_hit_ratios` and `gauges` of a source report (scrape and log alike)."""
    for (metric, key), value in sorted(gauges.items()):
        if metric == C.REPORTED_HIT_RATIO.name:
            model, engine, cache, basis = key
            rep["reported_hit_ratios"].append({"model_name": model, "engine": engine, "cache": cache,
                                               "basis": basis, "value": value})
        else:
            rep["gauges"].append({"metric": metric, "model_name": key[0], "engine": key[1], "value": value})


def multiprocess_findings(n: Normalised) -> list[Finding]:
    """An info finding for a prometheus_client multiprocess page (normalise/multiprocess.py)."""
    if not n.multiprocess.multiprocess:
        return []
    return [finding("multiprocess_page", "info", n.multiprocess.describe())]


def diagnose(n: Normalised) -> list[Finding]:
    """Plain-language findings from one normalised page (the hit ratio is the engine's to judge)."""
    out: list[Finding] = []
    era = n.era
    if era.name == "none":
        out.append(finding(
            "no_prefix_cache_metrics", "warning",
            "No prefix-cache metric on this page. Causes: vLLM <= 0.5.4; a V0 engine on 0.8.3-0.9.0 without "
            "--show-hidden-metrics-for-version (the hit-rate gauges are hidden); V0 on >= 0.9.1 (no metric at all, "
            "use the log source); the server runs with --disable-log-stats; or this is not a vLLM /metrics page. "
            "V0 also creates its series only at its first stats log, so an idle V0 server shows none yet."))
    if n.prefix_caching == "false" or any(c.prefix_caching == "false" for c in n.engines.values()):
        out.append(finding("prefix_caching_disabled", "critical",
                           "Prefix caching is disabled (enable_prefix_caching=False): every prompt is prefilled "
                           "from scratch. Start vLLM with --enable-prefix-caching."))
    if era.unit == "blocks":
        out.append(finding("counters_in_blocks", "info",
                           f"This vLLM ({era.versions}) counts prefix-cache queries and hits in blocks; cachemon "
                           f"multiplied them by block_size={n.block_size}. Queries then cover full blocks only."))
    if era.ratio_gauges and not (era.queries and era.hits):
        out.append(finding("ratio_only", "info",
                           f"This engine ({era.versions}) reports only a hit ratio since engine start, no counters: "
                           "cachemon exports that ratio (cachemon_prefix_cache_reported_hit_ratio) and no token counts."))
    for p in n.problems:
        out.append(finding(p.code, "warning", p.message))
    # the hit ratio itself is judged by the attribution engine (add_attribution), like `cachemon run`
    return out


def attribution_findings(a: A.Attribution) -> list[Finding]:
    """The engine's verdict as findings: the ratio (or plainly, no traffic), then one per cause."""
    out: list[Finding] = []
    where = f"model {a.model or '?'}"
    if not a.traffic and a.basis != "none":
        judged = "since the upstream started" if a.basis == "since_start" else "vLLM reports since start"
        out.append(finding("no_traffic", "info",
                           f"{where}: no prefix-cache traffic in the interval; judging the ratio {judged}."))
    elif a.basis == "none":
        out.append(finding("no_traffic", "info", f"{where}: no prompt has reached the prefix cache yet."))
    if a.severity and a.ratio is not None:
        code = "no_hits" if a.ratio == 0 and a.basis == "interval" else "low_hit_ratio"
        out.append(finding(code, a.severity, a.summary))
    for c in a.causes:
        if c.code == A.CauseCode.PREFIX_CACHING_DISABLED:
            continue      # diagnose() already says it, critical
        out.append(finding(c.code, a.severity or "info", f"{where} ({c.certainty}): {c.message}"))
    return out


def add_attribution(sources: list[SourceReport], results: list[A.Attribution]) -> None:
    """The engine's verdicts in each source's report: ``attribution`` and its findings."""
    by_up: dict[str, list[A.Attribution]] = {}
    for a in results:
        by_up.setdefault(a.upstream, []).append(a)
    for rep in sources:
        mine = by_up.get(rep["name"], [])
        rep["attribution"] = [{"model_name": a.model, "basis": a.basis, "traffic": a.traffic, "hit_ratio": a.ratio,
                               "severity": a.severity,
                               "causes": [{"cause": c.code, "certainty": c.certainty, "message": c.message,
                                           "missed_tokens": c.tokens, "tokens_certainty": c.tokens_certainty}
                                          for c in a.causes]} for a in mine]
        rep["findings"].extend(f for a in mine for f in attribution_findings(a))


def exit_code(sources: list[SourceReport]) -> int:
    sev = {f["severity"] for s in sources for f in s["findings"]}
    if "critical" in sev:
        return EXIT["critical"]
    if "warning" in sev:
        return EXIT["warning"]
    return EXIT["ok"]
