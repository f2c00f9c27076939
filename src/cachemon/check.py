"""`cachemon check`: one-shot diagnosis of an upstream (and, with --log-file, of a log).

One report builder for both kinds of source (``new_report``, ``series_rows``, ``add_gauge_rows``,
``ratio_findings``); each kind only adds what is its own (era findings of a page, line counts of a log).

JSON schema ``cachemon-check/1`` (stable; documented in the README)::

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
        ...per-kind extras (a log source adds "log": {...}; a metrics source followed with
        --kv-events adds "kv_events": {...}, see ``KvWindow.report``)
     }]}

Exit codes: 0 healthy (info findings only), 1 warning findings, 2 usage or config
error, 3 critical findings (upstream unreachable, prefix caching disabled, hit ratio
below the critical threshold).
"""
from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import click

from cachemon import __version__
from cachemon import catalog as C
from cachemon import thresholds as T
from cachemon.config import ConfigError, KvEventsSettings, Upstream, load_yaml, parse_duration, parse_upstream_spec
from cachemon.normalise.log_stream import LogStream
from cachemon.normalise.logs import log_gauges
from cachemon.normalise.normaliser import Normalised, normalise_text
from cachemon.runconfig import apply_kv_events_flag, from_dict
from cachemon.runtime import attribution as A
from cachemon.runtime.attribution_stage import (
    analyze_hint,
    delta,
    match_ledger,
    model_thresholds,
    model_totals,
    prompt_buckets,
    requests_total,
)
from cachemon.runtime.logsource import LogEntry, LogSource
from cachemon.sources.exposition import ExpositionError
from cachemon.sources.logs.config import LogConfig, LogFileSpec, default_name
from cachemon.sources.logs.vllm_lines import log_time
from cachemon.sources.scrape import FetchError, fetch_text, new_session
from cachemon.sources.vllm_api import VllmApi
from cachemon.state.store import Store
from cachemon.urls import escape_controls, redact_url

SCHEMA = "cachemon-check/1"
YEAR = 365 * 86400.0
EXIT = {"ok": 0, "warning": 1, "usage": 2, "critical": 3}


def finding(code: str, severity: str, message: str) -> dict:
    return {"code": code, "severity": severity, "message": message}


# --- the one report builder: every source kind fills the same skeleton with the same helpers ----

def new_report(kind: str, name: str, *, url: str | None = None, path: str | None = None,
               error: tuple[str, str] | None = None) -> dict:
    """The cachemon-check/1 source skeleton; ``error`` is (reason, message) when the source is unreadable."""
    return {"kind": kind, "name": name, "url": url, "path": path, "up": error is None,
            "error": {"reason": error[0], "message": error[1]} if error else None,
            "era": "", "era_versions": "", "counter_unit": "none", "vllm_version": "",
            "cache_config": {"prefix_caching": "", "block_size": None, "hash_algo": ""},
            "series": [], "reported_hit_ratios": [], "gauges": [], "findings": []}


def series_rows(last: dict, first: dict | None = None, seconds: float | None = None) -> list[dict]:
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


def add_gauge_rows(rep: dict, gauges: dict) -> None:
    """Fill `reported_hit_ratios` and `gauges` of a source report (scrape and log alike)."""
    for (metric, key), value in sorted(gauges.items()):
        if metric == C.REPORTED_HIT_RATIO.name:
            model, engine, cache, basis = key
            rep["reported_hit_ratios"].append({"model_name": model, "engine": engine, "cache": cache,
                                               "basis": basis, "value": value})
        else:
            rep["gauges"].append({"metric": metric, "model_name": key[0], "engine": key[1], "value": value})


BASIS_TEXT = {"recent_requests": "over vLLM's recent-request window",
              "since_start_blocks": "of block lookups since engine start"}


def ratio_findings(rep: dict, whole_span: str, block_size: int | None = None) -> list[dict]:
    """Hit-ratio findings of a filled report: per series (the interval when there is one, else
    ``whole_span``), then every ratio vLLM itself reports. Same thresholds for every source."""
    out: list[dict] = []
    for row in rep["series"]:
        if row["cache"] != "local" or row["hit_tokens"] is None:
            continue
        where = f"model {row['model_name'] or '?'} engine {row['engine'] or '-'}"
        win = row["interval"]
        q, h = (win["query_tokens"], win["hit_tokens"]) if win else (row["query_tokens"], row["hit_tokens"])
        span = f"in the last {win['seconds']:g}s" if win else whole_span
        if q <= 0:
            continue
        if h == 0:
            out.append(finding(
                "no_hits", "critical" if win else "warning",
                f"{where}: {q:.0f} query tokens but 0 hits {span}. Likely causes: something that changes per "
                f"request at the head of the prompt (a timestamp, request ID or reordered tools in the system "
                f"prompt), or prompts that share less than one full block ({block_size or '?'} tokens). "
                f"Run `cachemon analyze` on a sample of requests to find the segment."))
            continue
        sev = T.severity_for_ratio(h / q)
        if sev and not win:
            # without an interval there is no traffic to judge now: an old shortfall is a warning at
            # most, on every era and every kind of source (the attribution engine's rule, too)
            sev = "warning"
        if sev:
            out.append(finding(
                "low_hit_ratio", sev,
                f"{where}: hit ratio {h / q:.1%} {span}, below the {T.HIT_RATIO_WARNING:.0%} warning / "
                f"{T.HIT_RATIO_CRITICAL:.0%} critical thresholds."))
    for r in rep["reported_hit_ratios"]:
        sev = T.severity_for_ratio(r["value"]) if r["cache"] == "local" else None
        if sev and r["basis"] == "since_start_blocks":
            sev = "warning"          # V0's ratio since engine start: no current traffic in it
        if sev:
            out.append(finding(
                "low_reported_hit_ratio", sev,
                f"model {r['model_name'] or '?'} engine {r['engine'] or '-'}: vLLM reports a hit ratio of "
                f"{r['value']:.1%} ({BASIS_TEXT.get(r['basis'], r['basis'])}), below the "
                f"{T.HIT_RATIO_WARNING:.0%} warning / {T.HIT_RATIO_CRITICAL:.0%} critical thresholds."))
    return out


# --- /metrics sources ---------------------------------------------------------------------------

def diagnose(n: Normalised, rep: dict) -> list[dict]:
    """Plain-language findings from one normalised page and its filled report."""
    out: list[dict] = []
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
    # the hit ratio itself is judged by the attribution engine (attribute_sources), like `cachemon run`
    return out




def snapshots(name: str, first: Normalised, last: Normalised, seconds: float | None, now: float,
              thresholds: dict[str, A.Thresholds] | None = None) -> list[A.ModelSnapshot]:
    """check's adapter from two reads of a page to the attribution engine's snapshots."""
    thresholds = thresholds or {}
    new, old = model_totals(last.counters.items()), model_totals(first.counters.items())
    interval = seconds is not None and first is not last
    events: tuple[A.Event, ...] = ()
    if interval and first.process_start_time != last.process_start_time:
        events = (A.Event("restart", now),)
        old = {}          # the counters restarted from zero: the interval is everything since
    models = set(new) | {key[0] for (m, key) in last.gauges if m == C.REPORTED_HIT_RATIO.name}
    out = []
    for model in sorted(models):
        tot, base = new.get(model, {}), old.get(model, {}) if interval else None
        cfgs = [c for (m, _), c in last.engines.items() if m in (model, "")]
        caching = {c.prefix_caching for c in cfgs if c.prefix_caching}
        bs = next((c.block_size for c in cfgs if c.block_size), None) or last.block_size
        pool = sum((c.num_blocks or 0) * (c.block_size or 0) for c in cfgs) or None
        buckets = prompt_buckets(tot, base)
        reported = [v for (m, key), v in last.gauges.items()
                    if m == C.REPORTED_HIT_RATIO.name and key[0] == model and key[2] == "local"]
        usage = [v for (m, key), v in last.gauges.items() if m == C.KV_CACHE_USAGE.name and key[0] == model]
        # the first read saw this process idle and the second with traffic: its first traffic (a cold cache)
        q0 = (base or {}).get(C.QUERY_TOKENS.name) if interval and not events else None
        first_traffic = now if q0 is not None and q0 <= 0 < tot.get(C.QUERY_TOKENS.name, 0.0) else None

        out.append(A.ModelSnapshot(
            upstream=name, model=model, now=now,
            prefix_caching="false" if "false" in caching else ("true" if caching else ""),
            block_size=bs, since_start_query_tokens=tot.get(C.QUERY_TOKENS.name),
            since_start_hit_tokens=tot.get(C.HIT_TOKENS.name), reported_ratio=min(reported) if reported else None,
            interval_seconds=seconds if interval else None, interval_query_tokens=delta(tot, base, C.QUERY_TOKENS.name),
            interval_hit_tokens=delta(tot, base, C.HIT_TOKENS.name),
            interval_preemptions=delta(tot, base, C.PREEMPTIONS.name),
            interval_evictions=delta(tot, base, C.KV_EVICTED_BLOCKS.name),
            # without an interval the since-start buckets say what prompts look like
            interval_prompt_buckets=buckets, kv_usage=max(usage) if usage else None, pool_tokens=pool,
            events=events, thresholds=thresholds.get(model, A.Thresholds()),
            analyze_hint=analyze_hint(model, bs), first_traffic_at=first_traffic,
            since_start_requests=None if events else requests_total(tot)))
    return out


def with_fleet(snaps: list[A.ModelSnapshot]) -> list[A.ModelSnapshot]:
    """Fill each snapshot's fleet from the same model on the other upstreams of one check."""
    out = []
    for s in snaps:
        others = [o for o in snaps if o.model == s.model and o.upstream != s.upstream
                  and o.interval_query_tokens is not None and o.interval_hit_tokens is not None]
        if others:
            s = replace(s, fleet_query_tokens=sum(o.interval_query_tokens or 0.0 for o in others),
                        fleet_hit_tokens=sum(o.interval_hit_tokens or 0.0 for o in others))
        out.append(s)
    return out


def attribution_findings(a: A.Attribution) -> list[dict]:
    """The engine's verdict as findings: the ratio (or plainly, no traffic), then one per cause."""
    out: list[dict] = []
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
        if c.code == A.PREFIX_CACHING_DISABLED:
            continue      # diagnose() already says it, critical
        out.append(finding(c.code, a.severity or "info", f"{where} ({c.certainty}): {c.message}"))
    return out


def log_reset_events(log_reports: list[dict], now: float, lookback: float = 900.0) -> list[A.Event]:
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


def attribute_sources(sources: list[dict], events: list[A.Event] | None = None) -> None:
    """Judge every metrics source with the attribution engine, fleet-aware across the sources.
    ``events`` (e.g. resets read from a log) apply to every metrics source."""
    snaps = [s for rep in sources for s in rep.pop("_snapshots", [])]
    if events:
        snaps = [replace(s, events=s.events + tuple(events)) for s in snaps]
    snaps = with_fleet(snaps)
    by_up: dict[str, list[A.Attribution]] = {}
    for snap in snaps:
        by_up.setdefault(snap.upstream, []).append(A.attribute(snap))
    for rep in sources:
        results = by_up.get(rep["name"], [])
        rep["attribution"] = [{"model_name": a.model, "basis": a.basis, "traffic": a.traffic, "hit_ratio": a.ratio,
                               "severity": a.severity,
                               "causes": [{"cause": c.code, "certainty": c.certainty, "message": c.message,
                                           "missed_tokens": c.tokens, "tokens_certainty": c.tokens_certainty}
                                          for c in a.causes]} for a in results]
        rep["findings"].extend(f for a in results for f in attribution_findings(a))


def source_report(name: str, url: str, n_first: Normalised | None, n_last: Normalised | None,
                  seconds: float | None, version: str, error: FetchError | ExpositionError | None,
                  thresholds: dict[str, A.Thresholds] | None = None) -> dict:
    url = redact_url(url)
    rep = new_report("metrics", name, url=url, error=(error.reason, str(error)) if error else None)
    rep["vllm_version"] = version
    if error is not None or n_last is None:
        rep["findings"].append(finding("upstream_down", "critical", f"cannot read {url}: {error}"))
        return rep
    rep.update(era=n_last.era.name, era_versions=n_last.era.versions, counter_unit=n_last.era.unit)
    rep["cache_config"] = {"prefix_caching": n_last.prefix_caching, "block_size": n_last.block_size,
                           "hash_algo": n_last.hash_algo}
    rep["series"] = series_rows(n_last.counters, (n_first or n_last).counters, seconds)
    add_gauge_rows(rep, n_last.gauges)
    rep["findings"] = diagnose(n_last, rep)
    rep["_snapshots"] = snapshots(name, n_first or n_last, n_last, seconds, time.time(), thresholds)
    if n_first is not None and n_first is not n_last and n_first.process_start_time != n_last.process_start_time:
        rep["findings"].append(finding("restarted_during_check", "info",
                                       "The upstream restarted between the two reads; the interval figures are unreliable."))
    return rep


def check_upstream(spec: str, interval: float, timeout: float, session: Any = None,
                   sleep: Callable[[float], None] = time.sleep, thresholds: dict[str, A.Thresholds] | None = None,
                   attribute: bool = True) -> dict:
    """Read one upstream (twice, ``interval`` apart) and judge it. ``attribute=False`` leaves the
    engine's findings to ``attribute_sources`` (a multi-upstream check, fleet-aware)."""
    rep = _read_upstream(spec, interval, timeout, session, sleep, thresholds)
    if attribute:
        attribute_sources([rep])
    return rep


def _read_upstream(spec: str, interval: float, timeout: float, session: Any,
                   sleep: Callable[[float], None], thresholds: dict[str, A.Thresholds] | None) -> dict:
    up = parse_upstream_spec(spec, "--upstream")
    session = session or new_session()
    version = ""

    def read() -> Normalised:
        body = fetch_text(session, up.url, timeout, up.max_body_bytes)
        return normalise_text(body)

    try:
        first = read()
    except (FetchError, ExpositionError) as e:
        return source_report(up.name, up.url, None, None, None, "", e)
    version = VllmApi(up.base_url, session).version(timeout) or ""
    last, seconds = first, None
    if interval > 0:
        t0 = time.monotonic()
        sleep(interval)
        try:
            last = read()
            seconds = round(time.monotonic() - t0, 3)
        except (FetchError, ExpositionError) as e:
            return source_report(up.name, up.url, None, None, None, version, e)
    return source_report(up.name, up.url, first, last, seconds, version, None, thresholds)


# --- log sources --------------------------------------------------------------------------------

LOG_ERA_VERSIONS = {"v0-log": "V0 engine, 0.4-0.10"}


def _log_config(log_files: Sequence[str], from_beginning: bool, config_path: str | None) -> LogConfig:
    # The same loader as `cachemon run`: the whole file is checked, its `logs:` section used.
    configured = from_dict(load_yaml(config_path)).logs if config_path else None
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


def check_logs(log_files: Sequence[str], from_beginning: bool = True, config_path: str | None = None,
               interval: float = 0.0, sleep: Callable[[float], None] = time.sleep) -> list[dict]:
    """Parse each log once (and, with --from-end, what is appended during ``interval``)."""
    cfg = _log_config(log_files, from_beginning, config_path)
    src = LogSource(cfg, Store({"since_start": 3600.0}))
    try:
        while src.poll():
            pass
        if not from_beginning and interval > 0:
            sleep(interval)
            while src.poll():
                pass
    finally:
        for e in src.entries:
            e.follower.close()
    return [log_report(e, from_beginning, interval) for e in src.entries]


def log_report(e: LogEntry, from_beginning: bool, interval: float) -> dict:
    s, fo = e.stream, e.follower
    err = fo.status if (fo.status and not fo.bytes_read and not fo.known) else None
    rep = new_report("log", e.spec.name, path=e.spec.path, error=err)
    rep.update(era=s.era, era_versions=LOG_ERA_VERSIONS.get(s.era, f">= {s.min_version}" if s.min_version else ""))
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


def _log_findings(rep: dict, s: LogStream, err: tuple[str, str] | None, from_beginning: bool,
                  interval: float) -> list[dict]:
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
    out += ratio_findings(rep, "over this log (exact counts from rules)")
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

    def report(self, name: str) -> tuple[dict, list[dict], list[str]] | None:
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
        findings: list[dict] = []
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


def kv_upstreams(upstreams: Sequence[str], kv_specs: Sequence[str]) -> list[Upstream]:
    """The upstreams named by --upstream, with --kv-events applied as `cachemon run` does (NAME= or the only one)."""
    ups = [parse_upstream_spec(u, f"--upstream[{i}]") for i, u in enumerate(upstreams)]
    for i, spec in enumerate(kv_specs):
        apply_kv_events_flag(ups, spec, f"--kv-events[{i}]")
    return [u for u in ups if u.kv_events is not None]


def model_of(up: Upstream, timeout: float, session: Any) -> Normalised | None:
    """One read of the page before the window opens, so the stream's model is known from its first batch."""
    try:
        return normalise_text(fetch_text(session, up.url, timeout, up.max_body_bytes))
    except (FetchError, ExpositionError):
        return None


def with_ledger(snaps: list[A.ModelSnapshot], view: Any) -> list[A.ModelSnapshot]:
    """Give the engine the ledger's view as the daemon does (attribution_stage.match_ledger): the window is
    check's one step, so the split, in-sync and the dynamic prefix are the window's."""
    found = match_ledger(view, sorted(s.model for s in snaps))
    if found is None:
        return snaps
    model, v = found
    dp = v.dynamic_prefix
    return [replace(s, kv_stored_tokens=dict(v.stored_tokens), kv_in_sync=v.in_sync, dynamic_prefix=dp,
                    step_dynamic_prefix_tokens=dp.recomputed_tokens if dp is not None else None)
            if s.model == model else s for s in snaps]


def load_text_decoder(tokenizer: str) -> Callable[[Sequence[int]], str]:
    """--show-text: the model's tokenizer, loaded as `cachemon analyze` loads it (diagnostics/tokenize.py)."""
    from cachemon.diagnostics.tokenize import MissingExtraError, ModelTokenizer, TokenizerDirError
    try:
        tok = ModelTokenizer(tokenizer).tok
    except (TokenizerDirError, MissingExtraError) as e:
        raise ConfigError("--tokenizer", str(e)) from None
    return lambda ids: tok.decode(list(ids), skip_special_tokens=False)


def text_report(samples: list[tuple[int, ...]], decode: Callable[[Sequence[int]], str],
                depth: int | None) -> tuple[dict, list[str]]:
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


def exit_code(sources: list[dict]) -> int:
    sev = {f["severity"] for s in sources for f in s["findings"]}
    if "critical" in sev:
        return EXIT["critical"]
    if "warning" in sev:
        return EXIT["warning"]
    return EXIT["ok"]


def render_text(report: dict) -> str:
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
@click.option("--log-file", "log_files", multiple=True, metavar="PATH", help="Parse a vLLM log file too.")
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
    window: KvWindow | None = None
    try:
        seconds = 0.0 if str(interval).strip() in ("0", "0s") else parse_duration(interval, "--interval")
        tmo = parse_duration(timeout, "--timeout")
        if not upstreams and not log_files:
            upstreams = ("http://127.0.0.1:8000/metrics",)
        cfg = from_dict(load_yaml(config_path)) if config_path else None
        thresholds = model_thresholds(cfg.models) if cfg is not None else {}
        decode = None
        if show_text and not kv_events:
            raise ConfigError("--show-text", "needs --kv-events (the text comes from the events' token ids)")
        if show_text and not tokenizer:
            raise ConfigError("--show-text", "needs --tokenizer DIR (the model's tokenizer, to decode the token ids)")
        if kv_events:
            if seconds <= 0:
                raise ConfigError("--kv-events", "needs an --interval above 0: events are followed during it")
            kv_ups = kv_upstreams(upstreams, kv_events)
            decode = load_text_decoder(tokenizer) if show_text and tokenizer else None
            session = new_session()
            window = KvWindow(kv_ups, cfg.kv_events if cfg is not None else KvEventsSettings(), keep_text=show_text)
            for u in kv_ups:
                window.set_model(u.name, model_of(u, tmo, session))
            window.start()
        try:
            sources = [check_upstream(u, seconds, tmo, thresholds=thresholds, attribute=False) for u in upstreams]
        finally:
            if window is not None:
                window.stop()
        if window is not None:
            add_kv_reports(sources, window, decode)
        logs: list[dict] = []
        if log_files:
            logs = check_logs(log_files, from_beginning=from_beginning, config_path=config_path, interval=seconds)
        # a log given beside exactly one upstream is that upstream's log: its resets explain its drops
        attribute_sources(sources, log_reset_events(logs, time.time()) if len(sources) == 1 else None)
        sources.extend(logs)
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


def add_kv_reports(sources: list[dict], window: KvWindow, decode: Callable[[Sequence[int]], str] | None) -> None:
    """Each followed upstream's window in its source report, and its ledger view in the engine's snapshots."""
    for rep in sources:
        got = window.report(rep["name"])
        if got is None:
            continue
        kv, findings, lines = got
        rep["kv_events"] = kv
        rep["findings"].extend(findings)
        rep["kv_extra"] = lines
        view = window.ledger.view(rep["name"])
        if view is not None and view.in_sync is not None:
            rep["_snapshots"] = with_ledger(rep.get("_snapshots", []), view)
        if decode is not None:
            dp = kv["dynamic_prefix"]
            kv["text"], text_lines = text_report(window.samples(rep["name"]), decode,
                                                 dp["depth_blocks"] if dp else None)
            rep["kv_extra"] = lines + text_lines
