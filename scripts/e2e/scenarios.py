"""The scenarios the e2e harness drives, in order, and what it asserts after each.

Request bursts are sized for the test rules' short windows (prom.py: ``[5m]`` -> ``[20s]``,
``for: 5m`` -> ``10s``), not for the production 5-minute ones: a "collapse" phase sends
zero-hit traffic until the critical alert is firing (bounded), a "recovery" phase sends
hitting traffic until the ratio is back above the warning threshold and nothing fires.
Requests are sent one at a time, PACE seconds apart, so vLLM's cache state (and so
every request's cached_tokens) is deterministic and `cachemon analyze` can predict it.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import prom
from procs import pick, wait_for

SHORT_WINDOW = "20s"         # cachemon --window matching the test rules' 5m -> 20s
PACE = 0.08                  # seconds between requests (~8-10 requests/s with the tiny model)
ALERT = "CachemonPrefixCacheHitRatioLow"
DOWN_ALERT = "CachemonUpstreamDown"
# Alerts this traffic may legitimately fire; any other firing alert is a FAIL.
EXPECTED_TO_FIRE = {ALERT, DOWN_ALERT}


def cachemon_config() -> str | None:
    """Extra cachemon config for the run: a cost model, so the dashboards' cost panels have data
    (prices of the docs' worked example; the figures are not asserted here)."""
    try:
        from cachemon.config.cost import parse_cost_config  # noqa: F401  (an older tree has no cost model)
    except ImportError:
        return None
    return ("cost:\n  currency: USD\n  per_million_tokens:\n"
            "    uncached_input: 3.0\n    cached_input: 0.3\n    output: 15.0\n")


def _ratio_series() -> str | None:
    try:
        from cachemon.monitoring.prometheus_rules import RATIO
        return RATIO
    except Exception:
        return None


def _thresholds():
    from cachemon import thresholds as t
    return t.HIT_RATIO_WARNING, t.HIT_RATIO_CRITICAL


class Watch:
    """What the phases ask about the run: alert states, Prometheus' recorded ratio, cachemon's
    own short-window ratio, against the shipped thresholds."""

    def __init__(self, h):
        self.h = h
        self.have_alerts = h.features["alert rules"] and ALERT in h.rules_info.get("alerts", {})
        self.warn, self.crit = _thresholds()
        self.ratio_q = _ratio_series()

    def firing(self, sev=None) -> bool:
        st = self.h.alert_states(ALERT)
        return any(v == "firing" for k, v in st.items() if sev is None or k == sev)

    def quiet(self) -> bool:
        return not self.h.alert_states(ALERT)

    def prom_ratio(self) -> float | None:
        if not self.ratio_q:
            return None
        res = self.h.promapi.query(f'{self.ratio_q}{{upstream="vllm"}}')
        return float(res[0]["value"][1]) if res else None

    def recovered(self) -> bool:
        v = self.prom_ratio()
        return v is not None and v >= self.warn and self.quiet()

    def cm_window_ratio(self, window=SHORT_WINDOW) -> float | None:
        vals = [v for _, v in pick(self.h.cm_samples(), "cachemon_prefix_cache_hit_ratio", upstream="vllm",
                                   cache="local", window=window)]
        return vals[0] if vals else None


def run_scenarios(h) -> None:
    """Every phase in order, then the checks over the whole run."""
    w = Watch(h)
    phase_stable(h, w)
    phase_timestamp_head(h, w)
    phase_timestamp_user(h, w)
    phase_request_id(h, w)
    phase_restart(h, w)
    phase_warmup(h, w)
    phase_capture(h)
    # -- analyze, dashboards, Prometheus health --------------------------------------------
    check_log_lines(h)
    check_analyze(h)
    check_prometheus_view(h)
    check_dashboards(h)
    check_alerts_over_run(h)


def phase_stable(h, w: Watch) -> None:
    """1. A stable system prompt: every request after the first hits; nothing fires."""
    r = h.report
    print("phase 1: stable system prompt", flush=True)
    recs, _, _ = h.drive("static-system-prompt", "1 stable system prompt", min_requests=24, min_seconds=25,
                         pace=PACE)
    cached = [_cached(x) for x in recs]
    r.check("stable.per-request-hits", cached[0] == 0 and all(c == 768 for c in cached[1:]),
            f"request 0: {cached[0]} cached, requests 1-{len(cached) - 1}: "
            f"{sorted(set(cached[1:]))} cached of {recs[1]['usage']['prompt_tokens']} (6 full blocks of 128)")
    ratio = w.cm_window_ratio()
    r.check("stable.cachemon-ratio-high", ratio is not None and ratio >= w.warn,
            f"cachemon_prefix_cache_hit_ratio{{window=\"{SHORT_WINDOW}\"}} = {_pct(ratio)} (>= {_pct(w.warn)})")
    if w.have_alerts:
        prom.wait_scrape_after(h.promapi, time.time())
        v = w.prom_ratio()
        r.check("stable.prometheus-ratio-high", v is not None and v >= w.warn, f"recorded ratio {_pct(v)}")
        r.check("stable.alert-not-firing", w.quiet(), f"{ALERT}: {h.alert_states(ALERT) or 'inactive'}")
    else:
        r.skip("stable.alert-not-firing", "no alert rules in alerts/ yet")
    h.check_counters("after-stable")
    h.check_log_ratio("after-stable")
    check_oneshot(h)
    check_detection(h)


def phase_timestamp_head(h, w: Watch) -> None:
    """2. A timestamp at the head of the system prompt: no hits; the critical alert fires."""
    r = h.report
    print("phase 2: timestamp at the head of the system prompt", flush=True)
    until = (lambda: w.firing("critical") and (w.cm_window_ratio() or 0.0) < w.crit) if w.have_alerts else None
    recs, met, took = h.drive("timestamp-in-system-prompt", "2 timestamp at head", min_requests=24,
                              min_seconds=0 if w.have_alerts else 25, max_seconds=150, until=until, pace=PACE)
    r.check("timestamp-head.no-hits", all(_cached(x) == 0 for x in recs),
            f"{sum(1 for x in recs if _cached(x) == 0)}/{len(recs)} requests with 0 cached tokens")
    ratio = w.cm_window_ratio()
    r.check("timestamp-head.cachemon-ratio-collapsed", ratio is not None and ratio < w.crit,
            f"cachemon {SHORT_WINDOW} ratio {_pct(ratio)} (< {_pct(w.crit)})")
    if w.have_alerts:
        r.check("timestamp-head.critical-alert-fires", met,
                f"{ALERT}{{severity=\"critical\"}} firing after {took:.0f} s / {len(recs)} zero-hit requests"
                if met else f"not firing after {took:.0f} s: {h.alert_states(ALERT)}")
    else:
        r.skip("timestamp-head.critical-alert-fires", "no alert rules in alerts/ yet")
    h.check_counters("after-timestamp-head")


def phase_timestamp_user(h, w: Watch) -> None:
    """3. The timestamp moved into the user message: hits again; the alert resolves."""
    r = h.report
    print("phase 3: timestamp moved into the user message", flush=True)
    # Recovered = a full window of hitting traffic: Prometheus' recorded ratio and cachemon's own
    # SHORT_WINDOW ratio both back above the warning threshold, and the alert inactive.
    until = (lambda: w.recovered() and (w.cm_window_ratio() or 0.0) >= w.warn) if w.have_alerts else None
    recs, met, took = h.drive("timestamp-in-user-message", "3 timestamp in user msg", min_requests=24,
                              min_seconds=0 if w.have_alerts else 25, max_seconds=150, until=until, pace=PACE)
    r.check("timestamp-user.hits", all(_cached(x) == 768 for x in recs),
            f"{sum(1 for x in recs if _cached(x) == 768)}/{len(recs)} requests with 768 cached tokens")
    ratio = w.cm_window_ratio()
    r.check("timestamp-user.cachemon-ratio-recovered", ratio is not None and ratio >= w.warn,
            f"cachemon {SHORT_WINDOW} ratio {_pct(ratio)} (>= {_pct(w.warn)})")
    if w.have_alerts:
        r.check("timestamp-user.alert-resolved", met,
                f"recorded ratio {_pct(w.prom_ratio())} and {ALERT} inactive after {took:.0f} s of the fix" if met
                else f"after {took:.0f} s: ratio {_pct(w.prom_ratio())}, {ALERT} {h.alert_states(ALERT)}")
    else:
        r.skip("timestamp-user.alert-resolved", "no alert rules in alerts/ yet")
    h.check_counters("after-timestamp-user")
    h.check_log_ratio("after-timestamp-user")


def phase_request_id(h, w: Watch) -> None:
    """4. A request ID at the head: no hits; the critical alert fires."""
    r = h.report
    print("phase 4: request ID at the head", flush=True)
    until = (lambda: w.firing("critical")) if w.have_alerts else None
    recs, met, took = h.drive("request-id-at-head", "4 request ID at head", min_requests=24,
                              min_seconds=0 if w.have_alerts else 25, max_seconds=150, until=until, pace=PACE)
    r.check("request-id.no-hits", all(_cached(x) == 0 for x in recs),
            f"{sum(1 for x in recs if _cached(x) == 0)}/{len(recs)} requests with 0 cached tokens")
    if w.have_alerts:
        r.check("request-id.critical-alert-fires", met,
                f"{ALERT}{{severity=\"critical\"}} firing after {took:.0f} s / {len(recs)} requests" if met
                else f"not firing after {took:.0f} s: {h.alert_states(ALERT)}")
    h.check_counters("before-restart")
    h.check_log_ratio("before-restart")


def _watch_down(h, t_down: float) -> tuple[threading.Thread, dict]:
    """A thread that records when UpstreamDown first fires (seconds after `t_down`)."""
    down_seen: dict = {"v": None}

    def watch_down():
        end = time.monotonic() + 120
        while time.monotonic() < end and down_seen["v"] is None:
            try:
                if h.alert_states(DOWN_ALERT).get("warning") == "firing":
                    down_seen["v"] = time.time() - t_down
            except Exception:
                pass
            time.sleep(1)

    return threading.Thread(target=watch_down, daemon=True), down_seen


def phase_restart(h, w: Watch) -> None:
    """5. A vLLM restart: UpstreamDown fires while it boots, cachemon sees the restart and its
    counters never drop."""
    r = h.report
    print("phase 5: vLLM restart", flush=True)
    before = h.cm_counters()
    vl = h.vllm_counters()
    h.offset = {k: h.offset[k] + vl[k] for k in vl}
    restarts0 = _restarts(h)
    took_stop = h.procs.stop(h.vllm)
    # The new server starts right away; UpstreamDown (for: 5m -> 10s) must fire while it boots.
    watcher, down_seen = _watch_down(h, time.time())
    if w.have_alerts:
        watcher.start()
    h.segments.append([])
    h.analyze_extra.append([])
    took_start = h.start_vllm(append=True)
    r.figures["vLLM restart"] = f"stop {took_stop:.1f} s (SIGINT to its process group), start {took_start:.0f} s"
    if w.have_alerts:
        watcher.join(timeout=130)
        r.check("restart.upstream-down-alert-fires", down_seen["v"] is not None,
                f"{DOWN_ALERT} firing {down_seen['v']:.0f} s after vLLM went down" if down_seen["v"] is not None
                else f"{DOWN_ALERT} did not fire while vLLM was down")
    try:
        wait_for(lambda: _restarts(h) > restarts0, 30, 0.5, "restart detected")
        ok = True
    except TimeoutError:
        ok = False
    r.check("restart.detected", ok, f"cachemon_upstream_restarts_total {restarts0:.0f} -> {_restarts(h):.0f}")
    after = h.cm_counters()
    r.check("restart.counters-do-not-drop", all(after[k] >= before[k] for k in before),
            f"hit/query tokens {before['hit']:.0f}/{before['query']:.0f} -> {after['hit']:.0f}/{after['query']:.0f} "
            f"while vLLM's own counters restarted from 0")
    h.check_counters("after-restart")


def phase_warmup(h, w: Watch) -> None:
    """6. `cachemon warmup` after the restart: the next real requests hit."""
    r = h.report
    print("phase 6: cachemon warmup, then real requests", flush=True)
    if h.features["warmup"]:
        _warmup_then_requests(h, w)
    else:
        r.skip("warmup.next-requests-hit", "cachemon warmup not present")
        h.drive("static-system-prompt", "6 after restart", min_requests=16, min_seconds=20, pace=PACE)
    if w.have_alerts:
        prom.wait_scrape_after(h.promapi, time.time())
        st = {n: h.alert_states(n) for n in (ALERT, "CachemonHitRatioNotRecovered")}
        r.check("after-warmup.no-ratio-alert", not any(st.values()),
                ", ".join(f"{k}: {v or 'inactive'}" for k, v in st.items()))
    h.check_counters("after-warmup")
    h.check_log_ratio("after-warmup")


def _warmup_then_requests(h, w: Watch) -> None:
    r = h.report
    prompts = h.work / "warmup-prompts.jsonl"
    # The stable prefix as users send it: the static system prompt (+ any user message).
    from cachemon.tools.capture import build_request
    body = build_request("static-system-prompt", 10_000, "tiny")
    prompts.write_text(json.dumps(body) + "\n", encoding="utf-8")
    t0 = time.monotonic()
    res = _cachemon(h, ["warmup", "--api", h.api, "--prompts", str(prompts), "--json"], timeout=180)
    wtook = time.monotonic() - t0
    ok = res.returncode == 0
    r.check("warmup.runs", ok, f"`cachemon warmup` exit {res.returncode} in {wtook:.1f} s"
            + ("" if ok else f": {res.stderr.strip()[-300:]}"))
    if ok:
        b = dict(body)
        b["max_tokens"] = WARMUP_MAX_TOKENS
        h.segments[-1].append({"scenario": "warmup", "phase": "6 warmup", "i": 0, "request": b, "usage": None})
    recs, _, _ = h.drive("static-system-prompt", "6 after restart+warmup", min_requests=16, min_seconds=20,
                         pace=PACE)
    cached = [_cached(x) for x in recs]
    ratio = sum(cached) / sum(x["usage"]["prompt_tokens"] for x in recs)
    r.check("warmup.next-requests-hit", cached[0] > 0 and ratio >= w.warn,
            f"first real request after warm-up: {cached[0]} cached; next {len(recs)} requests: "
            f"hit ratio {ratio:.1%}")


def phase_capture(h) -> None:
    """7. `cachemon capture` against the real server records a complete fixture set."""
    r = h.report
    print("phase 7: cachemon capture against the real server", flush=True)
    cap = h.work / "capture"
    res = _cachemon(h, ["capture", "--api", h.api, "--out", str(cap), "--requests", "4", "--settle", "3",
                        "--log-file", str(h.log), "--model-dir", str(h.model_dir), "--redact", str(h.work)],
                    timeout=180)
    files = sorted(p.name for p in cap.iterdir()) if cap.is_dir() else []
    want = {"metrics-start.txt", "metrics-static-system-prompt.txt", "metrics-timestamp-in-system-prompt.txt",
            "metrics-request-id-at-head.txt", "requests-static-system-prompt.jsonl", "server.log", "manifest.json",
            "requests-timestamp-in-system-prompt.jsonl", "requests-request-id-at-head.jsonl", "model", "README.md"}
    man = json.loads((cap / "manifest.json").read_text()) if (cap / "manifest.json").is_file() else {}
    ok = res.returncode == 0 and want <= set(files) and man.get("vllm_version") and \
        man.get("cache_config", {}).get("block_size") == str(128)
    r.check("capture.records-fixtures", bool(ok),
            f"exit {res.returncode}; {len(files)} files; vLLM {man.get('vllm_version')}, block_size "
            f"{man.get('cache_config', {}).get('block_size')}; hits per scenario "
            f"{[s['requests_with_hits'] for s in man.get('scenarios', [])]}"
            + ("" if res.returncode == 0 else f": {res.stderr.strip()[-300:]}"))
    for s in ("static-system-prompt", "timestamp-in-system-prompt", "request-id-at-head"):
        p = cap / f"requests-{s}.jsonl"
        if p.is_file():
            for line in p.read_text().splitlines():
                rec = json.loads(line)
                rec["phase"] = "7 capture"
                h.segments[-1].append(rec)
    h.check_counters("final")


def check_detection(h) -> None:
    """What cachemon detected about the live server (cachemon_upstream_info)."""
    info = [lab for lab, _ in pick(h.cm_samples(), "cachemon_upstream_info", upstream="vllm")]
    want = {"era": "v1-prefix-cache", "vllm_version": "0.32.0", "prefix_caching": "true", "block_size": "128",
            "counter_unit": "tokens"}
    got = {k: (info[0].get(k) if info else None) for k in want}
    h.report.check("cachemon.detects-upstream", got == want, ", ".join(f"{k}={v}" for k, v in got.items()))


def check_log_lines(h) -> None:
    """Every vLLM stats line the log source read parsed (none 'malformed')."""
    r = h.report
    if not h.features["log source"]:
        r.skip("log.no-malformed-lines", "log source not present")
        return
    # vLLM may have just logged a line the tailer has not read yet: allow it a few polls.
    deadline = time.monotonic() + 15
    while True:
        by = {}
        for lab, v in pick(h.cm_samples(), "cachemon_log_lines_total"):
            by[lab.get("outcome")] = by.get(lab.get("outcome"), 0) + v
        stats = len(re.findall(r"Prefix cache hit rate: ", h.log.read_text(errors="replace")))
        if by.get("parsed", 0) >= stats or time.monotonic() > deadline:
            break
        time.sleep(1)
    r.check("log.no-malformed-lines", by.get("parsed", 0) >= stats > 0 and not by.get("malformed"),
            f"log lines by outcome {dict(sorted((k, int(v)) for k, v in by.items()))}; "
            f"{stats} stats lines in the file")


def check_oneshot(h) -> None:
    """`cachemon check` (the one-shot diagnosis) against the live server and its log."""
    res = _cachemon(h, ["check", "--upstream", f"vllm={h.api}/metrics", "--interval", "0", "--log-file", str(h.log),
                        "--format", "json"], timeout=60)
    try:
        out = json.loads(res.stdout)
        src = next(s for s in out["sources"] if s.get("era"))
        era, bs = src.get("era"), (src.get("cache_config") or {}).get("block_size")
        codes = sorted({f["code"] for s in out["sources"] for f in s.get("findings") or []})
    except (ValueError, KeyError, StopIteration, TypeError):
        era, bs, codes = None, None, []
    h.report.check("check.real-vllm", res.returncode == 0 and era == "v1-prefix-cache" and str(bs) == "128",
                   f"`cachemon check` exit {res.returncode}, era {era}, block_size {bs}, findings {codes or 'none'}"
                   + ("" if res.returncode in (0, 1, 3) else f": {res.stderr.strip()[-200:]}"))


def _cached(rec) -> int:
    return int(rec["usage"]["prompt_tokens_details"]["cached_tokens"])


def _pct(v) -> str:
    return "absent" if v is None else f"{v:.1%}"


def _restarts(h) -> float:
    return sum(v for _, v in pick(h.cm_samples(), "cachemon_upstream_restarts_total", upstream="vllm"))


WARMUP_MAX_TOKENS = 1   # `cachemon warmup` default --max-tokens


def _cachemon(h, args: list[str], timeout: float) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([sys.executable, "-m", "cachemon.cli", *args], capture_output=True, text=True,
                              timeout=timeout, cwd=h.work)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(args, 124, "", f"timed out after {timeout:g}s")


def check_analyze(h) -> None:
    r = h.report
    if not h.features["analyze"]:
        r.skip("analyze.predicts-cached-tokens", "cachemon analyze not present")
        return
    total, mismatches, details = 0, 0, []
    for n, seg in enumerate(h.segments):
        if not seg:
            continue
        path = h.work / f"analyze-input-{n + 1}.jsonl"
        with open(path, "w", encoding="utf-8") as f:
            for rec in seg:
                line = {"request": rec["request"]}
                if rec.get("usage"):
                    line["usage"] = rec["usage"]
                f.write(json.dumps(line) + "\n")
        res = _cachemon(h, ["analyze", str(path), "--tokenizer", str(h.model_dir), "--block-size", "128",
                            "--format", "json", "--redact"], timeout=600)
        if res.returncode != 0:
            r.fail("analyze.predicts-cached-tokens", f"`cachemon analyze` exit {res.returncode}: {res.stderr.strip()[-300:]}")
            return
        out = json.loads(res.stdout)
        per = out.get("per_request") or []
        if len(per) != len(seg):
            r.fail("analyze.predicts-cached-tokens", f"lifetime {n + 1}: {len(per)} predictions for {len(seg)} requests"
                   f" (skipped: {out.get('skipped')})")
            return
        for rec, p in zip(seg, per, strict=True):
            if not rec.get("usage"):
                continue
            total += 1
            want_p, want_c = rec["usage"]["prompt_tokens"], _cached(rec)
            if p["prompt_tokens"] != want_p or p["cached_tokens"] != want_c:
                mismatches += 1
                if len(details) < 5:
                    details.append(f"{rec['phase']} #{rec['i']}: predicted {p['prompt_tokens']}/{p['cached_tokens']},"
                                   f" vLLM {want_p}/{want_c}")
    r.check("analyze.predicts-cached-tokens", mismatches == 0 and total > 0,
            f"{total - mismatches}/{total} requests: predicted prompt_tokens and cached_tokens equal vLLM's "
            f"(one analyze run per vLLM process lifetime, warm-up prompt included)"
            + ("; " + "; ".join(details) if details else ""))


def check_prometheus_view(h) -> None:
    r = h.report
    prom.wait_scrape_after(h.promapi, time.time())
    res = h.promapi.query('sum(cachemon_prefix_cache_hit_tokens_total{job="cachemon",cache="local"})')
    got = float(res[0]["value"][1]) if res else None
    want = h.cm_counters()["hit"]
    r.check("prometheus.sees-cachemon-counters", got is not None and abs(got - want) < 0.5,
            f"Prometheus {got} vs cachemon {want:.0f} hit tokens")
    span = int(time.time() - h.report.started) + 60
    res = h.promapi.query(f'sum(resets(cachemon_prefix_cache_query_tokens_total{{job="cachemon"}}[{span}s]))')
    n = float(res[0]["value"][1]) if res else None
    r.check("prometheus.counters-never-reset", n == 0,
            f"resets() of the unified query counter over the whole run (incl. the vLLM restart) = {n}")
    if h.rules_info.get("files"):
        bad = h.promapi.rule_health()
        r.check("prometheus.rules-healthy", not bad,
                f"{len(h.rules_info['alerts'])} alerts, {h.rules_info['records']} recording rules evaluated without error"
                if not bad else "; ".join(f"{n}: {e}" for n, _, e in bad[:3]))


def _dashboard_exprs(obj, out: list, title: str = "") -> None:
    if isinstance(obj, dict):
        t = obj.get("title", title) if "targets" in obj or "panels" in obj else title
        for tgt in obj.get("targets") or []:
            if isinstance(tgt, dict) and tgt.get("expr"):
                out.append((t, tgt.get("refId", ""), tgt["expr"]))
        for k, v in obj.items():
            if k != "targets":
                _dashboard_exprs(v, out, t)
    elif isinstance(obj, list):
        for v in obj:
            _dashboard_exprs(v, out, title)


def grafana_to_promql(expr: str, span: int) -> str:
    """Replace Grafana variables: every template variable matches anything, built-ins get fixed values."""
    import re
    builtins = {"__rate_interval": "1m", "__interval": "15s", "__range": f"{span}s", "__range_s": str(span),
                "__range_ms": str(span * 1000), "__interval_ms": "15000"}
    for k, v in builtins.items():
        expr = re.sub(r"\$\{" + k + r"(?::\w+)?\}|\$" + k + r"\b", v, expr)
    expr = re.sub(r'(\w+)\s*(=|!=)\s*"\$\{?\w+(?::\w+)?\}?"',
                  lambda m: f'{m.group(1)}{"=~" if m.group(2) == "=" else "!~"}".*"', expr)
    expr = re.sub(r"\$\{\w+(?::\w+)?\}|\$\w+|\[\[\w+\]\]", ".*", expr)
    return expr


# Panels that rightly stay empty on this server, each with a witness query that must return data
# instead: the series the panel reads exist, at the value that explains the emptiness. The overview's
# external-cache panel (issue 12) divides by `query rate > 0`, and without a KV connector vLLM 0.32.0
# exports its external counters at 0, so the ratio is absent by design, not broken.
EMPTY_BY_DESIGN = {
    ("cachemon-overview.json", "External (KV-connector) cache hit ratio"): (
        'max(cachemon_prefix_cache_query_tokens_total{job="cachemon", cache="external"}) == 0',
        "no KV connector: external query tokens exported, all 0"),
}


def check_dashboards(h) -> None:
    r = h.report
    files = sorted(Path(__file__).resolve().parents[2].joinpath("dashboards").glob("*.json"))
    if not files:
        r.skip("dashboards.every-query-returns-data", "no dashboards in dashboards/ yet")
        return
    span = int(time.time() - h.report.started)
    total, empty, errors, by_design = 0, [], [], []
    for f in files:
        exprs: list = []
        _dashboard_exprs(json.loads(f.read_text(encoding="utf-8")), exprs)
        for title, ref, expr in exprs:
            total += 1
            q = grafana_to_promql(expr, span)
            try:
                res = h.promapi.query(q)
            except Exception as e:
                errors.append(f"{f.name} / {title} / {ref}: {str(e)[:150]}")
                continue
            if not res:
                # A panel of a range query: data somewhere in the run counts.
                try:
                    res = h.promapi.query(f"max_over_time(({q})[{span}s:5s])")
                except Exception:
                    res = []
            if not res and (f.name, title) in EMPTY_BY_DESIGN:
                witness, why = EMPTY_BY_DESIGN[(f.name, title)]
                try:
                    ok = bool(h.promapi.query(witness))
                except Exception:
                    ok = False
                if ok:
                    by_design.append(f"{title} ({why})")
                    continue
            if not res:
                empty.append(f"{f.name} / {title} / {ref}")
    r.check("dashboards.every-query-returns-data", total > 0 and not empty and not errors,
            f"{total - len(empty) - len(errors) - len(by_design)}/{total} queries in {len(files)} dashboards return data"
            + (f"; empty by design: {'; '.join(by_design)}" if by_design else "")
            + (f"; empty: {'; '.join(empty[:8])}" if empty else "") + (f"; errors: {'; '.join(errors[:4])}" if errors else ""))


def check_alerts_over_run(h) -> None:
    r = h.report
    if not h.rules_info.get("alerts"):
        r.skip("alerts.no-unexpected", "no alert rules in alerts/ yet")
        return
    span = int(time.time() - h.report.started) + 60
    res = h.promapi.query(f'max_over_time(ALERTS{{alertstate="firing"}}[{span}s])')
    fired = sorted({(x["metric"].get("alertname"), x["metric"].get("severity", "")) for x in res})
    unexpected = [f"{n}/{s}" for n, s in fired if n not in EXPECTED_TO_FIRE]
    h.report.figures["alerts that fired during the run"] = ", ".join(f"{n}/{s}" for n, s in fired) or "none"
    try:   # information only: the run never resets the cache, but phases 2 and 4 collapse the hits
        res = h.promapi.query('max(cachemon_prefix_cache_resets_total{job="cachemon"})')
        h.report.figures["cache resets cachemon inferred"] = res[0]["value"][1] if res else "series absent"
    except Exception:
        pass
    r.check("alerts.no-unexpected", not unexpected,
            "only " + ", ".join(sorted(EXPECTED_TO_FIRE)) + " fired" if not unexpected
            else "unexpected: " + ", ".join(unexpected))
