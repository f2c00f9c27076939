"""`cachemon check --log-file PATH`: parse a log once, report it in the cachemon-check/1 schema.

Each configured file entry becomes one source dict with ``"kind": "log"`` and a ``"log"``
extras dict (line outcomes, stats lines, the estimated prompt tokens, files read).
No state file is read or written.
"""
from __future__ import annotations

import time

from cachemon import catalog as C
from cachemon import thresholds as T
from cachemon.check import add_gauge_rows, finding
from cachemon.config import ConfigError, load_yaml
from cachemon.sources.logs.config import LogConfig, LogFileSpec, default_name, parse_log_config
from cachemon.runtime.logsource import LogSource
from cachemon.state.store import Store

VERSIONS = {"v0-log": "V0 engine, 0.4-0.10"}


def _config(log_files, from_beginning: bool, config_path) -> LogConfig:
    cfg = LogConfig()
    if config_path:
        raw = load_yaml(config_path).get("logs")
        if raw is not None:
            cfg = parse_log_config(raw, "logs")
    by_path = {f.path: f for f in cfg.files}
    files = []
    for p in log_files:
        files.append(by_path.get(p) or LogFileSpec(path=p, name=default_name(p)))
    names = [f.name for f in files]
    if len(set(names)) != len(names):
        raise ConfigError("--log-file", "two log files share a name; pass them with distinct basenames")
    cfg.files = files
    cfg.from_beginning = from_beginning
    cfg.state_file = ""
    cfg.watch_events = False
    return cfg


def check_logs(log_files, from_beginning: bool = True, config_path=None, interval: float = 0.0,
               sleep=time.sleep) -> list[dict]:
    cfg = _config(log_files, from_beginning, config_path)
    store = Store({"since_start": 3600.0})
    src = LogSource(cfg, store)
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
    return [_report(e, from_beginning, interval) for e in src.entries]


def _report(e, from_beginning: bool, interval: float) -> dict:
    s, fo = e.stream, e.follower
    err = fo.status if (fo.status and not fo.bytes_read and not fo.known) else None
    era = s.era
    rep = {"kind": "log", "name": e.spec.name, "url": None, "path": e.spec.path, "up": err is None,
           "error": {"reason": err[0], "message": err[1]} if err else None,
           "era": era, "era_versions": VERSIONS.get(era, f">= {s.min_version}" if s.min_version else ""),
           "counter_unit": "none", "vllm_version": "",
           "cache_config": {"prefix_caching": "", "block_size": None, "hash_algo": ""},
           "series": [], "reported_hit_ratios": [], "gauges": [], "findings": []}
    q_name, h_name, m_name = C.QUERY_TOKENS.name, C.HIT_TOKENS.name, C.MISS_TOKENS.name
    for (metric, key), q in sorted(s.counters.items()):
        if metric != q_name:
            continue
        h = s.counters.get((h_name, key), 0.0)
        model, engine, cache = key
        rep["series"].append({"model_name": model, "engine": engine, "cache": cache, "query_tokens": q,
                              "hit_tokens": h, "miss_tokens": s.counters.get((m_name, key), q - h),
                              "hit_ratio_since_start": (h / q) if q > 0 else None, "interval": None})
    if rep["series"]:
        rep["counter_unit"] = "tokens"
    add_gauge_rows(rep, s.gauges)
    estimated = [{"model_name": k[0], "engine": k[1], "value": v}
                 for (m, k), v in sorted(s.counters.items()) if m == C.PROMPT_TOKENS_ESTIMATED.name]
    too_long = sum(f.framer.too_long for f in fo.files.values()) + fo.too_long_closed
    rep["log"] = {"lines": dict(s.lines, too_long=too_long), "stats_lines": s.stats_lines,
                  "bytes": fo.bytes_read, "rotations": fo.rotations, "truncations": fo.truncations,
                  "prompt_tokens_estimated": estimated, "vllm_restarts_seen": s.vllm_restarts,
                  "from_beginning": from_beginning}
    rep["findings"] = _findings(rep, s, err, from_beginning, interval)
    lines = rep["log"]["lines"]
    rep["text_extra"] = [
        f"lines: {lines['parsed']} parsed ({s.stats_lines} vLLM stats lines), {lines['unmatched']} unmatched, "
        f"{lines['malformed']} malformed, {too_long} too long; {fo.bytes_read} bytes",
    ] + [f"estimated prompt tokens (throughput x interval; an ESTIMATE) engine={x['engine'] or '-'}: "
         f"{x['value']:.0f}" for x in estimated] + [
        f"{g['metric'].removeprefix(C.PREFIX)} engine={g['engine'] or '-'}: {g['value']:g}" for g in rep["gauges"]]
    return rep


def _findings(rep: dict, s, err, from_beginning: bool, interval: float) -> list[dict]:
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
    for r in rep["reported_hit_ratios"]:
        if r["cache"] != "local":
            continue
        sev = T.severity_for_ratio(r["value"])
        if sev:
            basis = ("over vLLM's recent-request window" if r["basis"] == "recent_requests"
                     else "of block lookups since engine start")
            out.append(finding("low_reported_hit_ratio", sev,
                               f"engine {r['engine'] or '-'}: the last logged prefix cache hit rate is "
                               f"{r['value']:.1%} ({basis}), below the {T.HIT_RATIO_WARNING:.0%} warning / "
                               f"{T.HIT_RATIO_CRITICAL:.0%} critical thresholds."))
    for row in rep["series"]:
        q, h = row["query_tokens"], row["hit_tokens"]
        if row["cache"] != "local" or q <= 0:
            continue
        where = f"model {row['model_name'] or '?'} engine {row['engine'] or '-'}"
        if h == 0:
            out.append(finding("no_hits", "critical", f"{where}: {q:.0f} query tokens and 0 hits in this log."))
        elif T.severity_for_ratio(h / q):
            out.append(finding("low_hit_ratio", T.severity_for_ratio(h / q),
                               f"{where}: hit ratio {h / q:.1%} over this log (exact counts from rules)."))
    if s.vllm_restarts:
        out.append(finding("vllm_restarted", "info",
                           f"vLLM restarted {s.vllm_restarts} time(s) in this log (API-server pid changed); "
                           f"the logged hit rate restarts with it."))
    return out
