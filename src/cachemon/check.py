"""`cachemon check`: one-shot diagnosis of an upstream (and, with --log-file, of a log).

One route and one judge for every source, the daemon's: check wires `cachemon run`'s ``Store``,
``UpstreamPoller`` per upstream and ``LogSource`` (``Polls``), reads them once or twice ``--interval``
apart, turns the store into snapshots with the daemon's builder (runtime/snapshots.py) and asks the
daemon's attribution engine (runtime/attribution.py) for the hit-ratio verdict and its causes, fleet-aware
across the upstreams of one check. One report skeleton for both kinds of source (``new_report``,
``series_rows``, ``add_gauge_rows``, ``add_attribution``); each kind only adds what is its own (era
findings of a page, line counts of a log, the KV-event window).

JSON schema ``cachemon-check/1`` (stable; documented in docs/metrics.md, "`cachemon check`")::

    {"schema": "cachemon-check/1", "cachemon_version": str, "exit_code": int,
     "sources": [{
        "kind": "metrics" | "log", "name": str, "url": str | null, "path": str | null,
        "up": bool, "error": {"reason": str, "message": str} | null,
        "era": str, "era_versions": str, "counter_unit": "tokens" | "blocks" | "none",
        "vllm_version": str,
        "cache_config": {"prefix_caching": "true"|"false"|"", "block_size": int|null, "hash_algo": str},
        "series": [{"model_name", "engine", "cache", "query_tokens", "hit_tokens", "miss_tokens",
                    "hit_ratio_since_start": float|null,
                    "interval": {"seconds", "query_tokens", "hit_tokens", "hit_ratio": float|null} | null}],
        "reported_hit_ratios": [{"model_name", "engine", "cache", "basis", "value"}],
        "gauges": [{"metric", "model_name", "engine", "value"}],
        "findings": [{"code", "severity": "info"|"warning"|"critical", "message"}],
        "attribution": [{"model_name", "basis": "interval"|"since_start"|"reported"|"none", "traffic": bool,
                         "hit_ratio": float|null, "severity": "warning"|"critical"|null,
                         "causes": [{"cause", "certainty", "message", "missed_tokens", "tokens_certainty"}]}],
        ...per-kind extras (a log source adds "log": {...}; a metrics source followed with
        --kv-events adds "kv_events": {...}, see ``KvWindow.report``)
     }]}

Exit codes: 0 healthy (info findings only), 1 warning findings, 2 usage or config
error, 3 critical findings (upstream unreachable, prefix caching disabled, hit ratio
below the critical threshold).
"""
from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Literal

import click

from cachemon import __version__
from cachemon import catalog as C
from cachemon.config import (
    ConfigError,
    KvEventsSettings,
    Upstream,
    check_unique_names,
    load_yaml,
    parse_duration,
    parse_upstream_spec,
)
from cachemon.normalise.log_grammar import log_time
from cachemon.normalise.log_stream import LogStream
from cachemon.normalise.logs import log_gauges, log_info
from cachemon.normalise.normaliser import Normalised
from cachemon.runconfig import apply_kv_events_flag, from_dict
from cachemon.runtime import attribution as A
from cachemon.runtime.attribution_stage import AttributionSettings, model_thresholds
from cachemon.runtime.logsource import LogEntry, LogSource
from cachemon.runtime.poller import UpstreamPoller
from cachemon.runtime.snapshots import EventsFn, LedgerViewFn, SnapshotBuilder, UpstreamCopy, read_store
from cachemon.sources.logs.config import LogConfig, LogFileSpec, default_name
from cachemon.sources.scrape import new_session
from cachemon.state.store import SourceKind, Store
from cachemon.urls import escape_controls, redact_url

SCHEMA = "cachemon-check/1"
Report = dict[str, Any]                       # one cachemon-check/1 object (a source, a finding, the whole)
Counters = Mapping[Any, float]                # a page's or a log's (metric, labels) -> value
YEAR = 365 * 86400.0
EXIT = {"ok": 0, "warning": 1, "usage": 2, "critical": 3}


Severity = Literal["info", "warning", "critical"]


def finding(code: str, severity: Severity, message: str) -> Report:
    return {"code": code, "severity": severity, "message": message}


# --- the one report builder: every source kind fills the same skeleton with the same helpers ----

def new_report(kind: SourceKind, name: str, *, url: str | None = None, path: str | None = None,
               error: tuple[str, str] | None = None) -> Report:
    """The cachemon-check/1 source skeleton; ``error`` is (reason, message) when the source is unreadable."""
    return {"kind": kind, "name": name, "url": url, "path": path, "up": error is None,
            "error": {"reason": error[0], "message": error[1]} if error else None,
            "era": "", "era_versions": "", "counter_unit": "none", "vllm_version": "",
            "cache_config": {"prefix_caching": "", "block_size": None, "hash_algo": ""},
            "series": [], "reported_hit_ratios": [], "gauges": [], "findings": []}


def series_rows(last: Counters, first: Counters | None = None, seconds: float | None = None) -> list[Report]:
    """One row per query-token series of ``last`` counters; with ``first`` and ``seconds``, the
    interval between the two reads too. A missing hit counter stays None (never read as 0 hits)."""
    rows = []
    q_name, h_name, m_name = C.QUERY_TOKENS.name, C.HIT_TOKENS.name, C.MISS_TOKENS.name
    for (metric, key), q in sorted(last.items()):
        if metric != q_name:
            continue
        h = last.get((h_name, key))
        m = last.get((m_name, key), q - h if h is not None else None)
        model, engine, cache = key
        row = {"model_name": model, "engine": engine, "cache": cache, "query_tokens": q,
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


def add_gauge_rows(rep: Report, gauges: Counters) -> None:
    """Fill `reported_hit_ratios` and `gauges` of a source report (scrape and log alike)."""
    for (metric, key), value in sorted(gauges.items()):
        if metric == C.REPORTED_HIT_RATIO.name:
            model, engine, cache, basis = key
            rep["reported_hit_ratios"].append({"model_name": model, "engine": engine, "cache": cache,
                                               "basis": basis, "value": value})
        else:
            rep["gauges"].append({"metric": metric, "model_name": key[0], "engine": key[1], "value": value})


# --- /metrics sources ---------------------------------------------------------------------------

def multiprocess_findings(n: Normalised) -> list[Report]:
    """An info finding for a prometheus_client multiprocess page (normalise/multiprocess.py)."""
    if not n.multiprocess.multiprocess:
        return []
    return [finding("multiprocess_page", "info", n.multiprocess.describe())]


def diagnose(n: Normalised) -> list[Report]:
    """Plain-language findings from one normalised page (the hit ratio is the engine's to judge)."""
    out: list[Report] = []
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
    if era.ratio_gauges:
        out.append(finding("ratio_only", "info",
                           "This V0 engine reports only a block-level hit ratio since engine start, no counters: "
                           "cachemon exports that ratio (cachemon_prefix_cache_reported_hit_ratio) and no token counts."))
    for p in n.problems:
        out.append(finding(p.code, "warning", p.message))
    # the hit ratio itself is judged by the attribution engine (add_attribution), like `cachemon run`
    return out


def attribution_findings(a: A.Attribution) -> list[Report]:
    """The engine's verdict as findings: the ratio (or plainly, no traffic), then one per cause."""
    out: list[Report] = []
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


def log_reset_events(log_reports: list[Report], now: float, lookback: float = 900.0) -> list[A.Event]:
    """vLLM's logged resets ('Successfully reset prefix cache') of the last ``lookback`` seconds.
    Log lines carry local MM-DD HH:MM:SS without a year: compared with now in the same form."""
    now_soy = log_time(time.strftime("%m-%d %H:%M:%S ", time.localtime(now)))
    out = []
    for rep in log_reports:
        t = (rep.get("log") or {}).get("last_reset_log_time")
        if t is None or now_soy is None:
            continue
        age = now_soy - t
        if age < -YEAR / 2:        # Dec 31 -> Jan 1
            age += YEAR
        if 0 <= age <= lookback:
            out.append(A.Event("cache_reset", now - age, "vLLM log"))
    return out


# --- the polls: `cachemon run`'s Store, pollers and log source, then the one snapshot builder ----------

JUDGED_KINDS: tuple[SourceKind, ...] = ("metrics", "log")      # check judges every source; the daemon's Attributor metrics only


class Polls:
    """check's reads: one ``Store``, one ``UpstreamPoller`` per upstream and the ``LogSource`` of the logs,
    wired as `cachemon run` wires them and read once, or twice ``interval`` apart. After each read the
    shared snapshot builder (runtime/snapshots.py) records its point, so the attribution engine judges
    check's interval as it judges the daemon's window. ``session`` and ``clock`` are injected by tests."""

    def __init__(self, ups: Sequence[Upstream], logs: LogConfig | None, thresholds: dict[str, A.Thresholds],
                 session: Any = None, clock: Callable[[], float] = time.time):
        self.store = Store({"check": 3600.0})
        self.clock = clock
        session = session or new_session()
        self.pollers = [UpstreamPoller(u, self.store, session=session, clock=clock) for u in ups]
        self.logs = LogSource(logs, self.store, clock=clock) if logs is not None else None
        self.builder = SnapshotBuilder(AttributionSettings(thresholds=thresholds), kinds=JUDGED_KINDS)
        self.pages: dict[str, list[Normalised]] = {u.name: [] for u in ups}
        self.times: list[float] = []

    def read(self) -> None:
        """One read of every source. An upstream down at the first read is not read again: that error
        is its report, as it always was."""
        for p in self.pollers:
            pages = self.pages[p.upstream.name]
            if self.times and not pages:
                continue
            n = p.poll_once()
            if n is not None:
                pages.append(n)
        if self.logs is not None:
            while self.logs.poll():
                pass
        self.times.append(round(self.clock(), 3))

    def wants_interval(self, from_beginning: bool) -> bool:
        """A second read can say something: an upstream answered, or a log is followed from its end."""
        return any(self.pages.values()) or (self.logs is not None and not from_beginning)

    @property
    def seconds(self) -> float | None:
        return round(self.times[-1] - self.times[0], 3) if len(self.times) > 1 else None

    def record(self) -> None:
        """The builder's point of the first read; its snapshots have no interval yet and are not judged.
        No ledger view here: the KV window's split covers the whole window, from before the first read."""
        self.builder.build(read_store(self.store), self.times[-1])

    def judge(self, events: EventsFn | None, ledger_view: LedgerViewFn | None) -> list[A.Attribution]:
        """The engine's verdict on every (source, model) after the last read (fleet-aware across them)."""
        snaps = self.builder.build(read_store(self.store), self.times[-1], events=events, ledger_view=ledger_view)
        return [A.attribute(snap, self.builder.settings.lookback) for snap in snaps]

    def close(self) -> None:
        if self.logs is not None:
            for e in self.logs.entries:
                e.follower.close()


def metrics_report(p: UpstreamPoller, view: UpstreamCopy | None, pages: list[Normalised],
                   seconds: float | None) -> Report:
    """The report of one upstream from the pages its poller read (as vLLM wrote them) and its state."""
    url = redact_url(p.upstream.url)
    error = view.last_error if view is not None and not view.up else None
    rep = new_report("metrics", p.upstream.name, url=url, error=error)
    rep["vllm_version"] = p.vllm_version
    if error is not None or not pages:
        rep["findings"].append(finding("upstream_down", "critical",
                                       f"cannot read {url}: {error[1] if error else 'no page read'}"))
        return rep
    first, last = pages[0], pages[-1]
    rep.update(era=last.era.name, era_versions=last.era.versions, counter_unit=last.era.unit)
    rep["cache_config"] = {"prefix_caching": last.prefix_caching, "block_size": last.block_size,
                           "hash_algo": last.hash_algo}
    rep["series"] = series_rows(last.counters, first.counters, seconds if first is not last else None)
    add_gauge_rows(rep, last.gauges)
    rep["findings"] = diagnose(last) + multiprocess_findings(last)
    if first is not last and first.process_start_time != last.process_start_time:
        rep["findings"].append(finding("restarted_during_check", "info",
                                       "The upstream restarted between the two reads; the interval figures are unreliable."))
    return rep


def add_attribution(sources: list[Report], results: list[A.Attribution]) -> None:
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


def run_checks(ups: Sequence[Upstream], seconds: float, thresholds: dict[str, A.Thresholds], *,
               logs: LogConfig | None = None, window: KvWindow | None = None,
               decode: Callable[[Sequence[int]], str] | None = None, session: Any = None,
               sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.time) -> list[Report]:
    """Read every source (twice, ``seconds`` apart, when a second read can say something), follow the
    KV events in between, and judge them all at once: one report per upstream, then one per log."""
    polls = Polls(ups, logs, thresholds, session, clock)
    try:
        polls.read()
        if window is not None:
            for u in ups:         # the stream's model: the one its first page names
                window.set_model(u.name, next(iter(polls.pages[u.name]), None))
            window.start()
        try:
            if seconds > 0 and polls.wants_interval(logs is None or logs.from_beginning):
                polls.record()
                sleep(seconds)
                polls.read()
        finally:
            if window is not None:
                window.stop()
        views = read_store(polls.store)
        sources = [metrics_report(p, views.get(p.upstream.name), polls.pages[p.upstream.name], polls.seconds)
                   for p in polls.pollers]
        if window is not None:
            add_kv_reports(sources, window, decode)
        log_reps = [log_report(e, logs.from_beginning, seconds) for e in polls.logs.entries] \
            if polls.logs is not None and logs is not None else []
        # a log given beside exactly one upstream is that upstream's log: its resets explain its drops
        only = sources[0]["name"] if len(sources) == 1 else None
        resets = log_reset_events(log_reps, polls.times[-1]) if only is not None else []
        add_attribution(sources + log_reps, polls.judge(lambda name: resets if name == only else (),
                                                        window.ledger.view if window is not None else None))
        return sources + log_reps
    finally:
        polls.close()


def check_upstreams(specs: Sequence[str], interval: float, timeout: float, session: Any = None,
                    sleep: Callable[[float], None] = time.sleep, thresholds: dict[str, A.Thresholds] | None = None,
                    clock: Callable[[], float] = time.time) -> list[Report]:
    """Read upstreams (twice, ``interval`` apart) and judge them together, as `cachemon check` does."""
    ups = parse_upstreams(specs, (), timeout)
    return run_checks(ups, interval, thresholds or {}, session=session, sleep=sleep, clock=clock)


def check_upstream(spec: str, interval: float, timeout: float, session: Any = None,
                   sleep: Callable[[float], None] = time.sleep, thresholds: dict[str, A.Thresholds] | None = None,
                   clock: Callable[[], float] = time.time) -> Report:
    """Read one upstream (twice, ``interval`` apart) and judge it."""
    return check_upstreams([spec], interval, timeout, session, sleep, thresholds, clock)[0]


def parse_upstreams(specs: Sequence[str], kv_specs: Sequence[str], timeout: float) -> list[Upstream]:
    """--upstream with --timeout, and --kv-events applied as `cachemon run` does (NAME= or the only one)."""
    ups = [parse_upstream_spec(u, "--upstream") for u in specs]
    for u in ups:
        u.timeout = timeout
    check_unique_names(ups, "--upstream")
    for i, spec in enumerate(kv_specs):
        apply_kv_events_flag(ups, spec, f"--kv-events[{i}]")
    return ups

# --- log sources --------------------------------------------------------------------------------

LOG_ERA_VERSIONS = {"v0-log": "V0 engine, 0.4-0.10"}


def _log_config(log_files: Sequence[str], from_beginning: bool, run_cfg: Any) -> LogConfig:
    # The same loader as `cachemon run` (``run_cfg``): the whole file is checked, its `logs:` section used.
    configured = run_cfg.logs if run_cfg is not None else None
    cfg = configured or LogConfig()
    by_path = {f.path: f for f in cfg.files}
    files = [by_path.get(p) or LogFileSpec(path=p, name=default_name(p)) for p in log_files]
    names = [f.name for f in files]
    if len(set(names)) != len(names):
        raise ConfigError("--log-file", "two log files share a name; pass them with distinct basenames")
    cfg.files = files
    cfg.from_beginning = from_beginning
    cfg.state_file = ""          # a one-shot check never reads or writes the daemon's state file
    cfg.watch_events = False
    return cfg


def log_report(e: LogEntry, from_beginning: bool, interval: float) -> Report:
    s, fo = e.stream, e.follower
    err = fo.status if (fo.status and not fo.bytes_read and not fo.known) else None
    rep = new_report("log", e.spec.name, path=e.spec.path, error=err)
    rep.update(era=s.era, era_versions=LOG_ERA_VERSIONS.get(s.era, f">= {s.min_version}" if s.min_version else ""))
    info = log_info(s)      # what the start-up lines said (the Rust frontend's page says none of it)
    rep["vllm_version"] = info.vllm_version
    rep["cache_config"] = {"prefix_caching": info.prefix_caching,
                           "block_size": int(info.block_size) if info.block_size else None, "hash_algo": ""}
    rep["series"] = series_rows(s.counters)
    if rep["series"]:
        rep["counter_unit"] = "tokens"
    add_gauge_rows(rep, log_gauges(s))
    estimated = [{"model_name": k[0], "engine": k[1], "value": v}
                 for (m, k), v in sorted(s.counters.items()) if m == C.PROMPT_TOKENS_ESTIMATED.name]
    too_long = sum(f.framer.too_long for f in fo.files.values()) + fo.too_long_closed
    rep["log"] = {"lines": dict(s.lines, too_long=too_long), "stats_lines": s.stats_lines,
                  "bytes": fo.bytes_read, "rotations": fo.rotations, "truncations": fo.truncations,
                  "prompt_tokens_estimated": estimated, "vllm_restarts_seen": s.vllm_restarts,
                  "from_beginning": from_beginning,
                  # vLLM's last logged reset, for the attribution engine (seconds since the start of the
                  # year in the log's local time: vLLM's log lines carry no year)
                  "last_reset_log_time": s.last_reset_log_time}
    rep["findings"] = _log_findings(rep, s, err, from_beginning, interval)
    lines = rep["log"]["lines"]
    rep["text_extra"] = [
        f"lines: {lines['parsed']} parsed ({s.stats_lines} vLLM stats lines), {lines['unmatched']} unmatched, "
        f"{lines['malformed']} malformed, {too_long} too long; {fo.bytes_read} bytes",
    ] + [f"estimated prompt tokens (throughput x interval; an ESTIMATE) engine={x['engine'] or '-'}: "
         f"{x['value']:.0f}" for x in estimated] + [
        f"{g['metric'].removeprefix(C.PREFIX)} engine={g['engine'] or '-'}: {g['value']:g}" for g in rep["gauges"]]
    return rep


def _log_findings(rep: Report, s: LogStream, err: tuple[str, str] | None, from_beginning: bool,
                  interval: float) -> list[Report]:
    out = []
    if err is not None:
        out.append(finding("log_unreadable", "critical", f"{err[1]}"))
        return out
    lines = rep["log"]["lines"]
    if not s.stats_lines and not rep["series"]:
        if not from_beginning and interval <= 0:
            out.append(finding("nothing_read", "info", "--from-end with --interval 0 reads nothing: "
                                                       "use --from-beginning or an interval"))
        else:
            out.append(finding(
                "no_stats_lines", "warning",
                "No vLLM stats line (and no rule match) in this log. Causes: the server runs with "
                "--disable-log-stats or a log level above INFO; it was idle (vLLM logs idle intervals at "
                "DEBUG); --api-server-count > 1 (0.10.2+ disables the stats logger); or this is not the "
                "API server's output (V1 logs stats from the API-server process)."))
    if lines["malformed"]:
        out.append(finding("malformed_lines", "warning",
                           f"{lines['malformed']} line(s) looked like stats lines or matched a rule but "
                           f"could not be used (fields missing or out of range); they changed no number."))
    if lines["too_long"]:
        out.append(finding("long_lines", "info", f"{lines['too_long']} line(s) over max_line_bytes were skipped."))
    # the hit ratio itself is judged by the attribution engine (add_attribution), as for a page
    resets = {labels[0]: int(v) for (m, labels), v in s.counters.items() if m == C.LOG_CACHE_RESETS.name}
    if resets:
        out.append(finding("prefix_cache_reset", "info",
                           f"vLLM logged {resets.get('done', 0)} prefix-cache reset(s) ('Successfully reset prefix "
                           f"cache'; {resets.get('requested', 0)} requested, {resets.get('failed', 0)} failed): the "
                           f"cache starts empty after each, so the hit rate dips until it refills."))
    if s.vllm_restarts:
        out.append(finding("vllm_restarted", "info",
                           f"vLLM restarted {s.vllm_restarts} time(s) in this log (API-server pid changed); "
                           f"the logged hit rate restarts with it."))
    return out


# --- KV-cache events (docs/kv-events.md): the ledger over check's window --------------------------

TEXT_SAMPLES_SHOWN = 4          # --show-text: example blocks printed
TEXT_CONTEXT_CHARS = 48         # ... of the shared start, shown before the first difference
TEXT_SHOWN_CHARS = 160          # ... of each block from the first difference on


class KvWindow:
    """`check --kv-events`: one KvStream per followed upstream, feeding one FleetLedger while check's
    window runs: the daemon's own StreamFeed and ledger (runtime/kv_stage.py), without the daemon.
    Every stream's model is the one model its upstream's /metrics report (``set_model``), so replicas
    of one model share the fleet index (the routing reason) as they do in `cachemon run`."""

    def __init__(self, upstreams: Sequence[Upstream], settings: KvEventsSettings, keep_text: bool = False):
        from cachemon.runtime.kv_stage import StreamFeed
        from cachemon.sources.kv_events.stream import KvStream, StreamSettings
        from cachemon.state.kv_ledger import FleetLedger
        self.ledger = FleetLedger(max_blocks=settings.max_blocks, history_blocks=settings.history_blocks,
                                  keep_text=keep_text)
        self.stop_event = threading.Event()
        self.streams: dict[str, tuple[KvStream, StreamFeed]] = {}
        for u in upstreams:
            kv = u.kv_events
            if kv is None:
                continue
            feed = StreamFeed(u, self.ledger)
            ss = StreamSettings(endpoint=kv.endpoint, replay=kv.replay, topic=kv.topic,
                                max_frame_bytes=kv.max_frame_bytes or settings.max_frame_bytes,
                                queue_messages=settings.queue_messages, replay_timeout=settings.replay_timeout)
            self.streams[u.name] = (KvStream(u.name, ss, feed, clock=time.time), feed)
        self.t0 = self.t1 = 0.0

    def set_model(self, name: str, n: Normalised | None) -> None:
        """The stream's model: the one model_name the upstream's page reports (else its name)."""
        entry = self.streams.get(name)
        if entry is None or n is None or entry[1].configured_model:
            return
        models = {key[0] for (metric, key) in n.counters if metric == C.QUERY_TOKENS.name and key[0]}
        if len(models) == 1:
            entry[1].configured_model = models.pop()

    def start(self) -> None:
        self.t0 = time.monotonic()
        for stream, _ in self.streams.values():
            stream.start(self.stop_event)

    def stop(self) -> None:
        self.stop_event.set()
        self.t1 = time.monotonic()
        for stream, _ in self.streams.values():
            stream.join(2.0)

    @property
    def seconds(self) -> float:
        return round((self.t1 or time.monotonic()) - self.t0, 3)

    def report(self, name: str) -> tuple[Report, list[Report], list[str]] | None:
        """(``kv_events`` of the source report, findings, text lines) of one followed upstream."""
        entry = self.streams.get(name)
        if entry is None:
            return None
        stream, feed = entry
        st = stream.stats
        view = self.ledger.view(name)
        snap = next((x for x in self.ledger.snapshot() if x.replica == name), None)
        secs = self.seconds
        dp = view.dynamic_prefix if view is not None else None
        lost = dict(feed.lost)         # gap, decode_error (also malformed frames), oversized
        rep: dict[str, Any] = {
            "endpoint": stream.s.endpoint, "replay": stream.s.replay, "window_seconds": secs,
            "connected": st.connects > 0, "messages": st.messages, "recovered": st.recovered,
            "lost_batches": lost, "restarts": st.restarts, "events": dict(feed.events),
            "release": feed.release, "model": view.model if view is not None else None,
            "in_sync": view.in_sync if view is not None else None,
            "stored_tokens": view.stored_tokens if view is not None else {},
            "cached_blocks": view.cached_blocks if view is not None else 0,
            # the divergence-depth histogram as on /metrics: cumulative count per upper bound ("le"), +Inf last
            "divergence_depth_blocks": {("+Inf" if le == float("inf") else f"{le:g}"): n
                                        for le, n in snap.depth.cumulative()} if snap is not None else {},
            "dynamic_prefix": None if dp is None else {"depth_blocks": dp.depth_blocks,
                                                       "recomputed_tokens": dp.recomputed_tokens},
        }
        where = f"KV events of {name} ({stream.s.endpoint})"
        findings: list[Report] = []
        lines: list[str] = []
        if not st.connects:
            findings.append(finding("kv_events_unreachable", "warning",
                                    f"{where}: no connection in the {secs:g}s window. Is vLLM started with "
                                    f"--kv-events-config (publisher zmq, this endpoint's port) and the port reachable?"))
            return rep, findings, lines
        if not st.messages:
            findings.append(finding("kv_events_none", "info",
                                    f"{where}: connected, but no event in the {secs:g}s window: an idle server "
                                    f"publishes nothing, and neither does a request that hits every block."))
            return rep, findings, lines
        bad = sum(lost.values())
        if bad:
            findings.append(finding("kv_events_lost", "warning",
                                    f"{where}: {bad} batch(es) lost or undecodable in the window "
                                    f"({', '.join(f'{k} {v}' for k, v in lost.items() if v)}); the split below is a "
                                    f"lower bound of the reasons other than first."))
        if view is not None and not view.in_sync:
            findings.append(finding("kv_ledger_out_of_sync", "info",
                                    f"{where}: the ledger is not sure what is cached (joined a running server "
                                    f"whose replay buffer did not reach its start, a gap, or a full ledger)."))
        split = rep["stored_tokens"]
        total = sum(split.values())
        enc = f", vLLM {feed.release} encoding" if feed.release else ""
        lines.append(f"KV events ({secs:g}s window, {st.messages} batches, {st.recovered} of them from the replay "
                     f"socket{enc}): {total:.0f} tokens stored = " + ", ".join(
                         f"{r} {v:.0f}" for r, v in split.items()) +
                     f"; ledger {'in sync' if rep['in_sync'] else 'NOT in sync'}, {rep['cached_blocks']} blocks cached")
        if dp is not None:
            lines.append(f"KV events: dynamic prefix at block depth {dp.depth_blocks}: one cached parent with many "
                         f"distinct children each stored once; {dp.recomputed_tokens:.0f} shared tokens recomputed "
                         f"below it")
        return rep, findings, lines

    def samples(self, name: str) -> list[tuple[int, ...]]:
        return self.ledger.text_samples(name)


def load_text_decoder(tokenizer: str) -> Callable[[Sequence[int]], str]:
    """--show-text: the model's tokenizer, loaded as `cachemon analyze` loads it (diagnostics/tokenize.py)."""
    from cachemon.diagnostics.tokenize import MissingExtraError, ModelTokenizer, TokenizerDirError
    try:
        tok = ModelTokenizer(tokenizer).tok
    except (TokenizerDirError, MissingExtraError) as e:
        raise ConfigError("--tokenizer", str(e)) from None
    return lambda ids: tok.decode(list(ids), skip_special_tokens=False)


def text_report(samples: list[tuple[int, ...]], decode: Callable[[Sequence[int]], str],
                depth: int | None) -> tuple[Report, list[str]]:
    """--show-text: the decoded example blocks where requests diverge (PROMPT CONTENT, opt-in), the full
    text for JSON and, for the terminal, each block from its first difference with the others on."""
    texts = [decode(t) for t in samples[-TEXT_SAMPLES_SHOWN:]]
    at = f"block depth {depth} (the dynamic prefix)" if depth is not None else \
        "the most recent divergence point (no dynamic prefix named)"
    data = {"prompt_content": True, "depth_blocks": depth, "samples": texts}
    if not texts:
        return data, ["--show-text: no divergence sample in the window (no store looked like a per-request value)"]
    common = 0
    if len(texts) > 1:
        shortest = min(len(t) for t in texts)
        while common < shortest and len({t[common] for t in texts}) == 1:
            common += 1
    lines = [f"!! PROMPT CONTENT (--show-text): decoded tokens of {len(texts)} example block(s) at {at}",
             f"   shared start: ...{texts[0][max(0, common - TEXT_CONTEXT_CHARS):common]!r}"]
    lines += [f"   [{i + 1}] {t[common:common + TEXT_SHOWN_CHARS]!r}" for i, t in enumerate(texts)]
    return data, lines


def exit_code(sources: list[Report]) -> int:
    sev = {f["severity"] for s in sources for f in s["findings"]}
    if "critical" in sev:
        return EXIT["critical"]
    if "warning" in sev:
        return EXIT["warning"]
    return EXIT["ok"]


def render_text(report: Report) -> str:
    lines = []
    for s in report["sources"]:
        where = s.get("url") or s.get("path")
        lines.append(f"{s['kind']} source {s['name']} ({where}): {'up' if s['up'] else 'DOWN'}")
        if s["up"]:
            cc = s["cache_config"]
            lines.append(f"  era: {s['era']} ({s['era_versions']}), counters in {s['counter_unit']}"
                         + (f", vLLM {s['vllm_version']}" if s["vllm_version"] else ""))
            lines.append(f"  cache config: prefix caching {cc['prefix_caching'] or 'unknown'}, "
                         f"block size {cc['block_size'] or 'unknown'}, hash {cc['hash_algo'] or 'unknown'}")
            for r in s["series"]:
                ratio = r["hit_ratio_since_start"]
                lines.append(f"  {r['model_name'] or '?'} engine={r['engine'] or '-'} cache={r['cache']}: "
                             f"queries {r['query_tokens']:.0f} tokens, hits {r['hit_tokens'] or 0:.0f}, "
                             f"misses {r['miss_tokens'] or 0:.0f}, ratio since start "
                             f"{'n/a' if ratio is None else f'{ratio:.1%}'}")
                if r["interval"]:
                    w = r["interval"]
                    wr = w["hit_ratio"]
                    lines.append(f"    last {w['seconds']:g}s: {w['query_tokens']:.0f} query tokens, "
                                 f"{w['hit_tokens']:.0f} hits, ratio {'n/a (no traffic)' if wr is None else f'{wr:.1%}'}")
            for r in s["reported_hit_ratios"]:
                lines.append(f"  reported hit ratio ({r['basis']}, {r['cache']}): {r['value']:.1%}")
            for extra in s.get("text_extra", []):
                lines.append("  " + extra)
        for extra in s.get("kv_extra", []):
            lines.append("  " + extra)
        for f in s["findings"]:
            lines.append(f"  [{f['severity']}] {f['code']}: {f['message']}")
    lines.append(f"exit code {report['exit_code']}")
    # Upstream-provided text (model names, messages) may hold CR, LF or terminal escapes: one
    # report line stays one terminal line, and nothing reaches the terminal as a control.
    return "\n".join(escape_controls(line) for line in lines)


@click.command("check")
@click.option("--upstream", "upstreams", multiple=True, metavar="[NAME=]URL", help="vLLM /metrics URL; repeatable.")
@click.option("--interval", default="5s", show_default=True, metavar="DURATION",
              help="Read each upstream twice this far apart to get a current rate; 0 reads once.")
@click.option("--timeout", default="5s", show_default=True, metavar="DURATION")
@click.option("--log-file", "log_files", multiple=True, metavar="PATH",
              help="Parse a vLLM log file too (a path, glob or directory).")
@click.option("--from-beginning/--from-end", default=True, show_default=True,
              help="For --log-file: read the whole file (default) or only what is appended during --interval.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="YAML config with log rules.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--kv-events", "kv_events", multiple=True, metavar="[NAME=]ENDPOINT",
              help="Also follow upstream NAME's vLLM KV-cache events (tcp://HOST:PORT) during --interval: the "
                   "stored tokens by reason, divergence, exact causes. NAME defaults to the only upstream; "
                   "repeatable. Needs the kv-events extra.")
@click.option("--show-text", is_flag=True, default=False,
              help="With --kv-events and --tokenizer: PRINT THE DECODED PROMPT TEXT of a few blocks where "
                   "requests diverge (prompt content; opt-in, never in metrics or logs).")
@click.option("--tokenizer", "tokenizer", metavar="DIR", help="The model's tokenizer directory (for --show-text).")
def check_command(upstreams: tuple[str, ...], interval: str, timeout: str, log_files: tuple[str, ...],
                  from_beginning: bool, config_path: str | None, fmt: str, kv_events: tuple[str, ...] = (),
                  show_text: bool = False, tokenizer: str | None = None) -> None:
    """One-shot diagnosis: detected era, unified numbers and plain-language findings.

    Exit codes: 0 healthy, 1 warnings, 2 usage/config error, 3 critical findings.
    """
    try:
        with quiet_logs():
            sources = _check(upstreams, interval, timeout, log_files, from_beginning, config_path, kv_events,
                             show_text, tokenizer)
    except ConfigError as e:
        click.echo(f"cachemon: config error: {e}", err=True)
        sys.exit(2)
    code = exit_code(sources)
    report = {"schema": SCHEMA, "cachemon_version": __version__, "exit_code": code, "sources": sources}
    if fmt == "json":
        for s in sources:
            s.pop("text_extra", None)
            s.pop("kv_extra", None)
        click.echo(json.dumps(report, indent=2, sort_keys=True))
    else:
        click.echo(render_text(report))
    sys.exit(code)


@contextmanager
def quiet_logs() -> Iterator[None]:
    """The daemon's stages log what a report of check says (an upstream down, a restart): only the report speaks."""
    logger = logging.getLogger("cachemon")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _check(upstreams: tuple[str, ...], interval: str, timeout: str, log_files: tuple[str, ...],
           from_beginning: bool, config_path: str | None, kv_events: tuple[str, ...], show_text: bool,
           tokenizer: str | None) -> list[Report]:
    seconds = 0.0 if str(interval).strip() in ("0", "0s") else parse_duration(interval, "--interval")
    tmo = parse_duration(timeout, "--timeout")
    if not upstreams and not log_files:
        upstreams = ("http://127.0.0.1:8000/metrics",)
    cfg = from_dict(load_yaml(config_path)) if config_path else None
    thresholds = model_thresholds(cfg.models) if cfg is not None else {}
    if show_text and not kv_events:
        raise ConfigError("--show-text", "needs --kv-events (the text comes from the events' token ids)")
    if show_text and not tokenizer:
        raise ConfigError("--show-text", "needs --tokenizer DIR (the model's tokenizer, to decode the token ids)")
    if kv_events and seconds <= 0:
        raise ConfigError("--kv-events", "needs an --interval above 0: events are followed during it")
    ups = parse_upstreams(upstreams, kv_events, tmo)
    logs = _log_config(log_files, from_beginning, cfg) if log_files else None
    if logs is not None:
        check_unique_names(logs.files, "--log-file", {u.name for u in ups})
    window = decode = None
    if kv_events:
        decode = load_text_decoder(tokenizer) if show_text and tokenizer else None
        window = KvWindow(ups, cfg.kv_events if cfg is not None else KvEventsSettings(), keep_text=show_text)
    return run_checks(ups, seconds, thresholds, logs=logs, window=window, decode=decode)


def add_kv_reports(sources: list[Report], window: KvWindow, decode: Callable[[Sequence[int]], str] | None) -> None:
    """Each followed upstream's window in its source report (the engine reads the ledger's view through
    the snapshot builder, as the daemon does)."""
    for rep in sources:
        got = window.report(rep["name"])
        if got is None:
            continue
        kv, findings, lines = got
        rep["kv_events"] = kv
        rep["findings"].extend(findings)
        rep["kv_extra"] = lines
        if decode is not None:
            dp = kv["dynamic_prefix"]
            kv["text"], text_lines = text_report(window.samples(rep["name"]), decode,
                                                 dp["depth_blocks"] if dp else None)
            rep["kv_extra"] = lines + text_lines
