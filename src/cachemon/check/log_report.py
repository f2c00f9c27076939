"""`cachemon check --log-file`: the log config of a one-shot read, a log's report and findings, and
vLLM's logged resets for the attribution engine."""
from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from cachemon import catalog as C
from cachemon.check.report import EstimatedRow, Finding, SourceReport, add_gauge_rows, finding, new_report, series_rows
from cachemon.config import ConfigError
from cachemon.judge import attribute as A
from cachemon.normalise.log_grammar import log_time
from cachemon.normalise.log_stream import LogStream
from cachemon.normalise.log_updates import log_gauges, log_profile
from cachemon.runtime.logsource import LogEntry
from cachemon.sources.logs.settings import LogConfig, LogFileSpec, default_name
from cachemon.state.events import EventKind

YEAR = 365 * 86400.0

LOG_ERA_VERSIONS = {"v0-log": "V0 engine, 0.4-0.10"}


def log_config(log_files: Sequence[str], from_beginning: bool, run_cfg: Any) -> LogConfig:
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


def log_report(e: LogEntry, from_beginning: bool, interval: float) -> SourceReport:
    s, fo = e.stream, e.follower
    err = fo.status if (fo.status and not fo.bytes_read and not fo.known) else None
    rep = new_report("log", e.spec.name, path=e.spec.path, error=err)
    rep["era"] = s.era
    rep["era_versions"] = LOG_ERA_VERSIONS.get(s.era, f">= {s.min_version}" if s.min_version else "")
    said = log_profile(s)       # the start-up lines (the Rust frontend's page says none of it)
    rep["vllm_version"] = said.version
    rep["cache_config"] = said.to_report()
    rep["series"] = series_rows(s.counters)
    if rep["series"]:
        rep["counter_unit"] = "tokens"
    add_gauge_rows(rep, log_gauges(s))
    estimated: list[EstimatedRow] = [{"model_name": k[0], "engine": k[1], "value": v}
                 for (m, k), v in sorted(s.counters.items()) if m == C.PROMPT_TOKENS_ESTIMATED.name]
    too_long = sum(f.framer.too_long for f in fo.files.values()) + fo.too_long_closed
    rep["log"] = {"lines": dict(s.lines, too_long=too_long), "stats_lines": s.stats_lines,
                  "bytes": fo.bytes_read, "rotations": fo.rotations, "truncations": fo.truncations,
                  "prompt_tokens_estimated": estimated, "vllm_restarts_seen": s.vllm_restarts,
                  "from_beginning": from_beginning, "last_reset_log_time": s.last_reset_log_time}
    rep["findings"] = _log_findings(rep, s, err, from_beginning, interval)
    lines = rep["log"]["lines"]
    rep["text_extra"] = [
        f"lines: {lines['parsed']} parsed ({s.stats_lines} vLLM stats lines), {lines['unmatched']} unmatched, "
        f"{lines['malformed']} malformed, {too_long} too long; {fo.bytes_read} bytes",
    ] + [f"estimated prompt tokens (throughput x interval; an ESTIMATE) engine={x['engine'] or '-'}: "
         f"{x['value']:.0f}" for x in estimated] + [
        f"{g['metric'].removeprefix(C.PREFIX)} engine={g['engine'] or '-'}: {g['value']:g}" for g in rep["gauges"]]
    return rep


def _log_findings(rep: SourceReport, s: LogStream, err: tuple[str, str] | None, from_beginning: bool,
                  interval: float) -> list[Finding]:
    out: list[Finding] = []
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


def log_reset_events(log_reports: list[SourceReport], now: float, lookback: float = 900.0) -> list[A.Event]:
    """vLLM's logged resets ('Successfully reset prefix cache') of the last ``lookback`` seconds.
    Log lines carry local MM-DD HH:MM:SS without a year: compared with now in the same form."""
    now_soy = log_time(time.strftime("%m-%d %H:%M:%S ", time.localtime(now)))
    out = []
    for rep in log_reports:
        info = rep.get("log")
        t = info["last_reset_log_time"] if info is not None else None
        if t is None or now_soy is None:
            continue
        age = now_soy - t
        if age < -YEAR / 2:        # Dec 31 -> Jan 1
            age += YEAR
        if 0 <= age <= lookback:
            out.append(A.Event(EventKind.CACHE_RESET, now - age, "vLLM log"))
    return out
