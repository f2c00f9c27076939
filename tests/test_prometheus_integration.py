"""A real Prometheus scraping a real `cachemon run` that polls a server replaying vLLM 0.32.0 pages.

One stack per module (start-up costs seconds): ReplayServer (in process) -> `cachemon run`
(subprocess, --poll-interval 250ms, also tailing the captured server.log) -> Prometheus
(subprocess, 1 s scrape and evaluation, tmp TSDB, 127.0.0.1 on a free port) scraping both
cachemon (job="cachemon") and the replay server (job="vllm", for vLLM's TTFT / prefill
histograms). The shipped recording rules are loaded as they are; the alerts with `for:`
shortened to 2s (the only difference from alerts/).

The replay walks the captured traffic: idle -> static system prompt (87 % hits) ->
timestamp at the head -> request id at the head (0 % hits each), then a poll fault (upstream
down), then back to the idle page on another vLLM version (a restart and a version change:
counters drop to 0) and the static page, then a prefix-cache reset built from the captures'
real per-scenario deltas (static, static, static, timestamp, static, ...).

cachemon runs with a `cost:` model and a 1 s metadata interval, and follows the KV-cache events of a
real vLLM 0.32.0 recording (tiny_pool) re-published over ZMQ, so every panel can have data.
Every panel must return data, always (there is no switch to relax it); a failure names the
feature whose metric cachemon did not produce.
"""
from __future__ import annotations

import math
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest
import requests
import yaml

import promql_lint as lint  # tests/promql_lint.py: the bundle's linter, a test tool
from cachemon import catalog as c
from cachemon.demo.replay import ReplayServer, bundled_pages
from cachemon.monitoring import dashboards, generate, scrape_configs, serialise
from cachemon.monitoring import site as mconfig
from helpers import eventually
from kv_publisher import Republisher, load_events
from test_monitoring_promtool import require_binary

pytestmark = pytest.mark.prometheus

ROOT = Path(__file__).resolve().parents[1]
SERVER_LOG = ROOT / "tests" / "fixtures" / "vllm-0.32.0-cpu" / "server.log"
KV_CAPTURE = ROOT / "tests" / "fixtures" / "vllm-0.32.0-cpu-kv-events" / "tiny_pool"
CFG = mconfig.DEFAULT
SHORT_FOR = "2s"
DASHBOARD_RANGE = "1h"  # $__range: the dashboard's time range (a join over what existed within it)
RATE_INTERVAL = "5s"   # what Grafana's $__rate_interval is with a 1 s scrape interval (4 x scrape, rounded up)

# Which feature produces which metric: named in a failure, to say where to look.
FEATURE_OF = {
    c.COST_SAVING_FACTOR.sample_name: "cost model (`cost:` in the config)",
    c.ESTIMATED_COST.sample_name: "cost model (`cost:` in the config)",
    c.CHANGES.sample_name: "change detection (issue 6)",
    c.LAST_CHANGE.sample_name: "change detection (issue 6)",
    c.CACHE_RESETS.sample_name: "cache-reset detection (issue 6)",
    c.LAST_CACHE_RESET.sample_name: "cache-reset detection (issue 6)",
    c.LOG_LINES.sample_name: "log source",
    c.LOG_STATS_AGE.sample_name: "log source",
    c.LOG_FILES_OPEN.sample_name: "log source",
    c.LOG_ROTATIONS.sample_name: "log source",
    c.LOG_TRUNCATIONS.sample_name: "log source",
    c.SERIES_OVERFLOW.sample_name: "cardinality guard",
}


# Panels whose data this replay (real V1 0.32.0 pages, no log, no KV connector) cannot have:
# title -> (a metric that must be absent, a sample that must read 0).
EMPTY_IN_V1_REPLAY = {
    # the real page carries the external counters, at 0: no KV connector
    "External (KV-connector) cache hit ratio": (
        "", f'{c.QUERY_TOKENS.sample_name}{{upstream="vllm0",model_name="tiny",engine="0",cache="external"}}'),
    # the fleet's router row reads a router's page (`routers:`): the replay runs no router
    "Router prefix decisions": (c.ROUTER_PREFIX_DECISIONS.sample_name, None),
    "Requests per upstream by router": (c.ROUTER_REQUESTS.sample_name, None),
    "Routing misses by router policy": (c.ROUTER_ROUTING_TOKENS.sample_name, None),
    "Router causes": (c.ROUTER_PREFIX_DECISIONS.sample_name, None),
}
# The tenant row draws named tenants and adapters only; the replay's requests carry no cache_salt or LoRA
# adapter (checked: no tenant or adapter label has a value on cachemon's page).
EMPTY_WITHOUT_TENANTS = {"Missed tokens by tenant", "Missed tokens by adapter", "Isolation cost by tenant and adapter",
                         "Missed tokens by tenant and reason", "Hit ratio by tenant (full-report requests)"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(pred, timeout: float, what: str):
    return eventually(pred, timeout, what, interval=0.25, ignore=(requests.RequestException, ValueError, KeyError))


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


class Prom:
    def __init__(self, url: str):
        self.url = url

    def get(self, path: str, **params) -> dict:
        r = requests.get(self.url + path, params=params, timeout=10)
        body = r.json()
        if body.get("status") != "success":
            raise ValueError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list:
        return self.get("/api/v1/query", query=expr)["result"]

    def query_range(self, expr: str, start: float, end: float, step: str = "1s") -> list:
        return self.get("/api/v1/query_range", query=expr, start=start, end=end, step=step)["result"]

    def firing(self, alertname: str, **labels) -> list[dict]:
        out = []
        for a in self.get("/api/v1/alerts")["alerts"]:
            if a["labels"]["alertname"] == alertname and a["state"] == "firing" \
                    and all(a["labels"].get(k) == v for k, v in labels.items()):
                out.append(a)
        return out

    def value_at(self, expr: str, t: float) -> float | None:
        res = self.get("/api/v1/query", query=expr, time=t)["result"]
        return float(res[0]["value"][1]) if res else None


def start_prometheus(prometheus_bin: str, tmp: Path, request, recording: dict, alerting: dict,
                     cachemon_target: str, vllm_url: str) -> Prom:
    """A real Prometheus (1 s scrape and evaluation, TSDB in ``tmp``, stopped by ``request``'s finalizer)
    with these two rule groups, scraping cachemon and the vLLM (replay) server; returned once ready."""
    (tmp / "recording.yaml").write_text(serialise.to_yaml({"groups": [recording]}))
    (tmp / "alerts.yaml").write_text(serialise.to_yaml({"groups": [alerting]}))
    prom_cfg = scrape_configs.for_test(CFG, cachemon_target, vllm_url.removeprefix("http://"),
                               [str(tmp / "recording.yaml"), str(tmp / "alerts.yaml")])
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(prom_cfg))
    prom_port = free_port()
    prom_log = open(tmp / "prometheus.log", "w")
    request.addfinalizer(prom_log.close)
    prometheus = subprocess.Popen(
        [prometheus_bin, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
        stdout=prom_log, stderr=subprocess.STDOUT)
    request.addfinalizer(lambda: _stop(prometheus))
    prom = Prom(f"http://127.0.0.1:{prom_port}")
    wait_for(lambda: requests.get(prom.url + "/-/ready", timeout=2).ok, 60, "Prometheus to be ready")
    return prom


@pytest.fixture(scope="module")
def stack(tmp_path_factory, request):
    prometheus_bin = require_binary("prometheus")
    tmp = tmp_path_factory.mktemp("prom-integration")
    replay = ReplayServer(bundled_pages()).start()
    request.addfinalizer(replay.stop)

    log_copy = tmp / "server.log"
    shutil.copy(SERVER_LOG, log_copy)
    # The cost model and a 1 s metadata poll (version / models / cache config changes).
    cm_config = tmp / "cachemon.yaml"
    cm_config.write_text(yaml.safe_dump({
        "cost": {"per_million_tokens": {"uncached_input": 3.0, "cached_input": 0.3, "output": 15.0}},
        "events": {"interval": "1s"},
        # New ledger series (a replica's, a tenant's) are served at 0 this long (shipped 90s, for scrapes up
        # to 1m): here three of this Prometheus' 1 s scrapes, so the replay reaches the KV rules in time.
        "kv_events": {"new_series_hold": "3s"},
    }))
    # KV-cache events: a real vLLM 0.32.0 recording (tiny pool: evictions) re-published over ZMQ at its
    # recorded pace, so the ledger's panels have data while the metrics replay runs.
    kv_pub = Republisher(load_events(KV_CAPTURE / "events.jsonl"), replay=None)
    request.addfinalizer(kv_pub.close)
    cm_port = free_port()
    cm_log = open(tmp / "cachemon.log", "w")
    request.addfinalizer(cm_log.close)
    cachemon = subprocess.Popen(
        [sys.executable, "-m", "cachemon.cli", "run", "--config", str(cm_config), "--upstream", f"vllm0={replay.url}",
         "--listen", f"127.0.0.1:{cm_port}", "--poll-interval", "250ms",
         "--log-file", str(log_copy), "--from-beginning", "--state-file", "none", "--log-level", "warning",
         "--kv-events", f"vllm0={kv_pub.pub_endpoint}"],
        stdout=cm_log, stderr=subprocess.STDOUT)
    request.addfinalizer(lambda: _stop(cachemon))
    cm_url = f"http://127.0.0.1:{cm_port}/metrics"
    wait_for(lambda: requests.get(cm_url, timeout=2).ok, 30, "cachemon to serve")
    assert kv_pub.wait_subscribed(10), "cachemon did not subscribe to the KV-event publisher"
    threading.Thread(target=kv_pub.publish, kwargs={"speed": 1.0}, daemon=True).start()

    recording, alerting = generate.rule_groups(CFG, for_override=SHORT_FOR)
    prom = start_prometheus(prometheus_bin, tmp, request, recording, alerting, f"127.0.0.1:{cm_port}", replay.base_url)

    marks: dict[str, float] = {}
    # idle: both jobs up and a few samples of the idle counters
    wait_for(lambda: len(prom.query('up{job=~"cachemon|vllm"} == 1')) == 2, 30, "both scrape targets up")
    wait_for(lambda: prom.query(f'count_over_time({c.QUERY_TOKENS.sample_name}{{cache="local"}}[1m]) >= 3'),
             30, "idle samples")
    marks["start"] = time.time() - 5

    def show(i: int, scrapes: int = 4):
        """The replay shows page i; back once Prometheus has scraped cachemon ``scrapes`` times since
        (1 s apart; cachemon polls the replay every 250 ms)."""
        replay.show(i)
        t0 = time.time()
        wait_for(lambda: prom.query(f'count_over_time(up{{job="cachemon"}}[{int((time.time() - t0) * 1000) + 1}ms]) '
                                    f'>= {scrapes}'), 30, f"{scrapes} scrapes of page {i}")

    show(1)                                          # static system prompt
    marks["static"] = time.time()
    # 5m ratio is 87 % (above 80 %): the hit-ratio alert must not fire. Record it now.
    marks["static_firing"] = len(prom.firing("CachemonPrefixCacheHitRatioLow"))
    show(2)                                          # timestamp at the head
    marks["timestamp"] = time.time()
    marks["critical"] = wait_for(lambda: prom.firing("CachemonPrefixCacheHitRatioLow", severity="critical"), 30,
                                 "the critical hit-ratio alert after the timestamp traffic")
    marks["warning"] = prom.firing("CachemonPrefixCacheHitRatioLow", severity="warning")
    show(3)                                          # request id at the head
    replay.set_fault("http500")                      # vLLM's /metrics fails: upstream down
    wait_for(lambda: prom.firing("CachemonUpstreamDown"), 30, "CachemonUpstreamDown during the fault")
    replay.set_fault(None)
    replay.version = "0.32.1"                        # restarted on another vLLM version
    show(0, scrapes=3)                               # counters back to 0: a vLLM restart
    show(1)                                          # static traffic after the restart
    marks["end"] = time.time()
    wait_for(lambda: prom.query(f"{c.RESTARTS.sample_name} > 0"), 20, "the restart to be scraped")
    wait_for(lambda: prom.query(f'{c.CHANGES.sample_name}{{kind="version"}} > 0'), 20, "the version change")
    marks["reset_detected"] = replay_cache_reset(replay, prom)
    cm_text = requests.get(cm_url, timeout=5).text
    return {"prom": prom, "marks": marks, "cm_text": cm_text, "replay": replay, "tmp": tmp}


def with_counters(page: str, queries: int, hits: int) -> str:
    """The real page with vLLM's two prefix-cache counters set to other cumulative values."""
    page = re.sub(r"^(vllm:prefix_cache_queries_total\{[^}]*\}) \S+$", rf"\g<1> {queries}.0", page, flags=re.M)
    return re.sub(r"^(vllm:prefix_cache_hits_total\{[^}]*\}) \S+$", rf"\g<1> {hits}.0", page, flags=re.M)


def replay_cache_reset(replay: ReplayServer, prom: Prom) -> bool:
    """More of the static scenario's traffic (+13296 queries / +11520 hits per step, its real
    deltas), one step of the timestamp scenario's (+13584 / +0: the cache "forgot" the prefix),
    then the static traffic hitting again: what POST /reset_prefix_cache looks like in the
    counters. Returns whether cachemon's reset heuristic confirmed it."""
    static = replay.pages[1][1]
    q, h = 13296, 11520
    steps = [(13296, 11520)] * 3 + [(13584, 0)] + [(13296, 11520)] * 3
    for dq, dh in steps:
        q, h = q + dq, h + dh
        replay.pages.append((f"constructed-{q}", with_counters(static, q, h)))
        replay.show(len(replay.pages) - 1)
        time.sleep(2.5)   # > the change detector's sampling interval: one active interval per step
    try:
        wait_for(lambda: prom.query(f"{c.CACHE_RESETS.sample_name} > 0"), 10, "a cache reset")
        return True
    except AssertionError:
        return False


def produced(cm_text: str) -> set[str]:
    """Sample names cachemon exposed with at least one sample."""
    return {m.group(1) for m in re.finditer(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", cm_text, re.M)}


def substitute(expr: str) -> str:
    # What Grafana sends with every variable on "All" (each variable's allValue) and a 1 s scrape interval.
    all_values = {v["name"]: v["allValue"] for v in dashboards.variables() if v["type"] == "query"}
    for var in sorted(all_values, key=len, reverse=True):
        expr = expr.replace(f"${var}", all_values[var])
    return expr.replace("$__rate_interval", RATE_INTERVAL).replace("$__range", DASHBOARD_RANGE)


def has_data(result: list) -> bool:
    return any(not math.isnan(float(v)) for s in result for _, v in s.get("values", [s.get("value", [0, "NaN"])]))


def all_rule_exprs() -> list[tuple[str, str]]:
    out = []
    for rel in (generate.RECORDING_FILE, generate.ALERTS_FILE):
        for g in yaml.safe_load((ROOT / rel).read_text())["groups"]:
            for r in g["rules"]:
                out.append((f"{rel}: {r.get('record') or r.get('alert')}", r["expr"]))
    return out


def test_every_rule_expression_parses_in_prometheus(stack):
    prom = stack["prom"]
    exprs = all_rule_exprs()
    assert len(exprs) == 36 + 17   # recording rules (12 per tenant) + alert rules (CachemonRouterBlind the 17th)
    for _where, expr in exprs:
        prom.query(expr)   # raises with Prometheus' parse error


def test_every_recording_rule_has_data_from_the_replayed_captures(stack):
    prom, m = stack["prom"], stack["marks"]
    missing = []
    for g in yaml.safe_load((ROOT / generate.RECORDING_FILE).read_text())["groups"]:
        for r in g["rules"]:
            if not has_data(prom.query_range(r["record"], m["start"], time.time())):
                missing.append(r["record"])
    # The rest-of-the-model tenant ratio needs two tenants with full-report hits; the replayed tiny_pool
    # capture has one (unsalted) tenant. The tenant alert's promtool unit tests (constructed series)
    # evaluate it.
    one_tenant = {r for r in missing if r.endswith(":rest_ratio_rate5m")}
    assert set(missing) == one_tenant, f"recording rules without data: {missing}"


def test_recorded_ratio_matches_the_captured_counters(stack):
    """vLLM's own counters: 11520 hits / 13296 queries after the static scenario, 11520 / 26880 after
    the timestamp one; after the restart cachemon's reset-corrected counters carry on."""
    prom, m = stack["prom"], stack["marks"]
    ratio = 'model_instance:cachemon_prefix_cache_hit_tokens_per_query_tokens:ratio_rate5m{upstream="vllm0"}'
    assert prom.value_at(ratio, m["static"]) == pytest.approx(11520 / 13296, abs=1e-6)
    assert prom.value_at(ratio, m["timestamp"]) == pytest.approx(11520 / 26880, abs=1e-6)
    assert prom.value_at(ratio, m["end"]) == pytest.approx(2 * 11520 / (40627 + 13296), abs=1e-6)
    fleet = "job:cachemon_prefix_cache_hit_tokens_per_query_tokens:ratio_rate5m"
    assert prom.value_at(fleet, m["timestamp"]) is not None


def test_hit_ratio_alert_silent_at_87_percent_and_critical_after_dynamic_heads(stack):
    prom, m = stack["prom"], stack["marks"]
    assert m["static_firing"] == 0
    crit = [a for a in m["critical"] if a["labels"]["upstream"] == "vllm0"]
    assert len(crit) == 1
    a = crit[0]
    assert a["labels"]["model_name"] == "tiny" and a["labels"]["job"] == "cachemon"
    assert a["annotations"]["runbook_url"] == CFG.runbook_url("CachemonPrefixCacheHitRatioLow")
    assert re.fullmatch(r"Prefix-cache hit ratio of model tiny on 127\.0\.0\.1:\d+ \(upstream vllm0\) is "
                        r"\d+(\.\d+)?% over the last 5m, "
                        r"below the 60% critical threshold\. (Active cause\(s\): (\w+ \(https://\S+#cause-\w+\) )+|"
                        r"No cause identified by cachemon yet: `cachemon check` explains what it sees\.)",
                        a["annotations"]["description"]), a["annotations"]["description"]
    assert [a for a in m["warning"] if a["labels"]["upstream"] == "vllm0"]
    # nothing about exporters or caching being off
    assert not prom.firing("CachemonExporterDown")
    assert not prom.firing("CachemonPrefixCachingDisabled")


def test_upstream_down_fired_during_the_fault_and_resolved_after(stack):
    prom = stack["prom"]
    # it fired (the fixture waited for it); now the upstream is back
    assert prom.query(f'{c.UPSTREAM_UP.sample_name}{{upstream="vllm0"}} == 1')
    wait_for(lambda: not prom.firing("CachemonUpstreamDown"), 20, "CachemonUpstreamDown to resolve")
    errors = prom.query(f'{c.SCRAPE_ERRORS.sample_name}{{upstream="vllm0", reason="http_status"}}')
    assert errors and float(errors[0]["value"][1]) >= 1


def _dashboard_targets():
    for name, d in dashboards.dashboards(CFG).items():
        for where, expr in lint.dashboard_exprs(d):
            yield name, where, expr


def test_every_dashboard_query_returns_data(stack):
    prom, m, cm_text = stack["prom"], stack["marks"], stack["cm_text"]
    have = produced(cm_text)
    failures, pending = [], []
    count = 0
    for name, where, expr in _dashboard_targets():
        count += 1
        result = prom.query_range(substitute(expr), m["start"], time.time())
        if has_data(result):
            continue
        names = lint.metric_names(expr)
        if where.startswith("annotation") and expr.rstrip().endswith("> 0"):
            # An event marker is empty until the event happens. The replay has no cache-reset
            # pattern: check the same counter without the `> 0` instead, and list it.
            if has_data(prom.query_range(substitute(expr.rstrip()[:-3]), m["start"], time.time())):
                pending.append(f"{name} {where}: no event of this kind was detected in the replayed traffic "
                               f"(the counter itself has data)")
                continue
        title = where.split(" target")[0].removeprefix("panel ").strip("'")
        if title in EMPTY_WITHOUT_TENANTS:
            assert not re.search(r'^cachemon_kv_tenant_\w+\{[^}]*(tenant|adapter)="[^"]', cm_text, re.M), \
                f"{where}: a tenant is exported, the panel must show it"
            assert re.search(r'^cachemon_kv_tenant_stored_tokens_total\{', cm_text, re.M), where   # the row's series
            pending.append(f"{name} {where}: empty, as it must be without tenants or adapters")
            continue
        why_empty = EMPTY_IN_V1_REPLAY.get(title)
        if why_empty is not None:
            # right to be empty here, and checked: the replay's own numbers say so
            absent_metric, zero_sample = why_empty
            if absent_metric:
                assert absent_metric not in have, f"{where}: {absent_metric} is produced, the panel must show it"
            if zero_sample:
                assert re.search(rf"^{re.escape(zero_sample)} 0(\.0)?$", cm_text, re.M), (where, zero_sample)
            pending.append(f"{name} {where}: empty, as it must be on this V1 replay")
            continue
        waiting = sorted(n for n in names if n in FEATURE_OF and n not in have)
        needs = f" (not produced: {', '.join(waiting)}; from {', '.join(sorted({FEATURE_OF[n] for n in waiting}))})" \
            if waiting else ""
        failures.append(f"{name} {where}: no data{needs}\n    {expr}")
    assert count >= 40
    report = stack["tmp"] / "pending-panels.txt"
    report.write_text("\n".join(pending) + "\n")
    for p in pending:
        warnings.warn(p, stacklevel=1)
    print("\npanels waiting for features:\n  " + "\n  ".join(pending) if pending else "\nall panels have data")
    assert not failures, "dashboard queries with no data:\n" + "\n".join(failures)


def test_dashboard_variables_list_the_live_targets(stack):
    prom = stack["prom"]
    checked = set()
    for name, d in dashboards.dashboards(CFG).items():
        for var, selector, label in lint.variable_queries(d):
            checked.add(var)
            values = prom.get(f"/api/v1/label/{label}/values", **{"match[]": substitute(selector)})
            assert values, f"{name}: variable {var} ({selector}, {label}) lists nothing"
            if var == "job":      # cachemon's own targets only, never every scrape job
                assert values == ["cachemon"]
            if var == "vllm_job":   # vLLM's latency histograms: the vLLM scrape job
                assert values == ["vllm"]
            if var == "model_name":
                assert "tiny" in values
    assert {"job", "model_name"} <= checked


def test_cache_reset_annotation_marks_the_replayed_reset(stack):
    # no expected-failure escape: the replayed reset must be detected and marked
    assert stack["marks"]["reset_detected"], "cachemon's cache-reset heuristic did not confirm the replayed reset"
    prom, m = stack["prom"], stack["marks"]
    ann = next(a for a in dashboards.overview(CFG)["annotations"]["list"] if a["name"] == "Prefix-cache resets")
    result = prom.query_range(substitute(ann["expr"]), m["start"], time.time())
    assert has_data(result) and result[0]["metric"]["upstream"] == "vllm0"


def test_restart_annotation_marks_the_replayed_restart(stack):
    prom, m = stack["prom"], stack["marks"]
    d = dashboards.overview(CFG)
    ann = next(a for a in d["annotations"]["list"] if a["name"] == "Upstream restarts")
    result = prom.query_range(substitute(ann["expr"]), m["start"], time.time())
    assert has_data(result)
    assert result[0]["metric"]["upstream"] == "vllm0"
