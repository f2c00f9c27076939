"""CachemonTenantHitRatioCollapsed on REAL data: the tenants_alert capture (a real vLLM 0.32.0, CPU build,
scripts/e2e/kv_more.py sc_tenants_alert; the salts are constructed test salts, so they may appear here):
t1, t2, t3 with salts sharing one system prompt, t0 without a salt, ts with its own salt and a timestamp at
the head of its prompt, every request in full report mode, a round of the five every 26 s for ~8.7 minutes.

The capture's events are re-published over ZMQ (tests/kv_publisher.py) to a real `cachemon run` following
them with a tenants config (t1 and ts named, t2 and t3 HMAC labels), scraped by a real Prometheus (the
Debian binary, 1 s scrape and evaluation) loading the shipped recording rules unchanged and the shipped
alerts rendered by the same generator with one documented override: `for:` is FOR_OVERRIDE instead of the
shipped 10m (the capture is shorter than 5m of rate window + 10m of `for:`).

Time is compressed: the events are sent at SPEED times their recorded pace (~65 s instead of ~8.7 min).
The rules' 5m windows are not changed, so each 5m rate covers the whole replay so far instead of its last
5 recorded minutes: the ratios are those of the traffic since the start (cold first requests included),
which moves the moment the alert's conditions hold, not which tenant meets them.

Asserted: the alert fires for tenant ts, and no other tenant's alert is ever pending or firing; at the end
(one 5m window holds the whole replay) each tenant's recorded hit ratio equals the exact one, hits / (hits +
stored) of an independent reading of the capture's events (tenant_support.reference_tenant_split): 0.95 for
t0-t3, 0 for ts. That needs each tenant's series served at 0 before its first store
(``kv_events.new_series_hold``, expose/new_series.py; here 3s, three scrape intervals): without it the
series appear at their first store's value, which rate() cannot see, and t0-t3 read 1.0.

At the recorded pace, without a server: the same capture through the ledger in process, its counters sampled
every 15 s of the recording, and promtool with the shipped rules and alerts unchanged (`for: 10m`): ts only,
first firing between 10m and the end of the traffic + 5m. And the same sampling, promtool and shipped
recording rules for the healthy tenants' ratio at the recorded pace: equal to the exact cumulative ratio
while one 5m window holds all of a tenant's traffic (with the shipped 90s hold), and above it without the
hold (the first stores lost).
"""
from __future__ import annotations

import re
import subprocess
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
import requests
import yaml

from cachemon.demo.replay import ReplayServer
from cachemon.monitoring import generate, serialise
from cachemon.monitoring import site as mconfig
from cachemon.normalise.tenant_label import TenantNamer, salt_digest
from helpers import CachemonProcess, eventually, require_binary
from kv_publisher import Republisher, load_events
from kv_support import requests as capture_requests
from kv_support import scenario
from test_prometheus_integration import start_prometheus

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
ALERT = "CachemonTenantHitRatioCollapsed"
SPEED = 8.0                    # the recorded pace x 8
FOR_OVERRIDE = "10s"           # the shipped alert says 10m; everything else in the rules is as shipped
HOLD = "3s"                    # kv_events.new_series_hold: above the test's 1 s scrape interval (shipped: 90s)
TOLERANCE = 1e-9               # recorded vs exact ratio: a tenant's series share their samples, so the rates'
                               # extrapolation cancels in the ratio and only float rounding is left
REST_TOLERANCE = 1e-3          # the rest ratio (other tenants together): see its assertion
KEY = "tenants-alert-test-key-16+"
SALTS = {"t1": "test-salt-t1-constructed", "t2": "test-salt-t2-constructed", "t3": "test-salt-t3-constructed",
         "ts": "test-salt-ts-constructed"}
NAMED = {"t1", "ts"}
RATIO = "model_tenant:cachemon_kv_tenant_hit_tokens_per_hit_or_stored_tokens:ratio_rate5m"
REST = "model_tenant:cachemon_kv_tenant_hit_tokens_per_hit_or_stored_tokens:rest_ratio_rate5m"


def _folder() -> Path:
    d = scenario("tenants_alert")
    if not (d / "metadata.json").is_file():
        pytest.skip(f"recording {d} not in this tree")
    return d


def _labels() -> dict[str, str]:
    """Capture tenant -> the `tenant` label cachemon gives it under this test's config."""
    namer = TenantNamer({salt_digest(SALTS[t]): t for t in NAMED}, KEY.encode())
    return {t: namer(SALTS.get(t)) for t in ("t0", "t1", "t2", "t3", "ts")}


def _query(url: str, expr: str, **params) -> list:
    r = requests.get(url + "/api/v1/query" + ("_range" if "start" in params else ""),
                     params={"query": expr, **params}, timeout=10).json()
    assert r["status"] == "success", r
    return r["data"]["result"]


def _unix(rfc3339: str) -> float:
    """Prometheus' RFC 3339 time (nanoseconds, Z) as unix seconds."""
    m = re.fullmatch(r"(.+?)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", rfc3339)
    assert m, rfc3339
    base = datetime.fromisoformat(m[1] + ("+00:00" if m[3] == "Z" else m[3]))
    return base.timestamp() + (float("0." + m[2]) if m[2] else 0.0)


def _evaluated_after(prom: str, t: float) -> bool:
    """A scrape of cachemon after ``t``, and every rule group evaluated after that scrape."""
    scraped = float(_query(prom, 'timestamp(up{job="cachemon"})')[0]["value"][1])
    groups = requests.get(prom + "/api/v1/rules", timeout=10).json()["data"]["groups"]
    last = min(_unix(g["lastEvaluation"]) for g in groups)
    return scraped > t and last > scraped


def test_the_capture_is_the_traffic_the_alert_needs():
    """The capture itself: the four steady tenants hit on every request after their first, ts never does."""
    reqs = capture_requests(_folder())
    cached: dict[str, list[int]] = {}
    for r in reqs:
        assert r["report_mode"] == "full"
        cached.setdefault(r["tenant"], []).append((r["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    assert set(cached) == {"t0", "t1", "t2", "t3", "ts"}
    assert all(v[0] == 0 and min(v[1:]) > 0 for t, v in cached.items() if t != "ts")
    assert set(cached["ts"]) == {0} and len(cached["ts"]) >= 15
    span = reqs[-1]["t_send"] - reqs[0]["t_send"]
    assert span > 420, span            # more than a 5m rate window of traffic


def test_the_alert_fires_for_the_timestamp_tenant_only(tmp_path, request):
    prometheus_bin = require_binary("prometheus", "prometheus")
    d = _folder()
    labels = _labels()
    assert len(set(labels.values())) == 5 and labels["t0"] == ""

    # the upstream /metrics: the capture's final vLLM page (the model name "tiny"); the ledger is fed by events
    upstream = ReplayServer([("final", (d / "metrics-final.txt").read_text())]).start()
    request.addfinalizer(upstream.stop)
    pub = Republisher(load_events(d / "events.jsonl"))
    request.addfinalizer(pub.close)
    cfg = tmp_path / "cachemon.yaml"
    cfg.write_text(yaml.safe_dump({"kv_events": {
        "tenants": {salt_digest(SALTS[t]): t for t in NAMED}, "tenant_key": KEY, "new_series_hold": HOLD,
        "full_reports": True}}))     # every request of the capture in full report mode
    cachemon = CachemonProcess("--config", str(cfg), "--upstream", f"vllm0={upstream.url}", "--poll-interval", "1s",
                               "--log-level", "warning", "--kv-events", f"vllm0={pub.pub_endpoint}")
    request.addfinalizer(cachemon.stop)
    assert pub.wait_subscribed(10), "cachemon did not subscribe to the KV-event publisher"

    # the shipped rules, rendered by the generator that writes prometheus/ and alerts/, `for:` overridden
    recording, alerting = generate.rule_groups(mconfig.DEFAULT, for_override=FOR_OVERRIDE)
    shipped = yaml.safe_load((ROOT / "prometheus" / "recording_rules.yaml").read_text())
    assert yaml.safe_load(serialise.to_yaml({"groups": [recording]})) == shipped
    shipped_alerts = yaml.safe_load((ROOT / "alerts" / "cachemon-alerts.yaml").read_text())["groups"][0]["rules"]
    (ours,) = [r for r in alerting["rules"] if r["alert"] == ALERT]
    (theirs,) = [r for r in shipped_alerts if r["alert"] == ALERT]
    assert {**ours, "for": theirs["for"]} == theirs and ours["for"] == FOR_OVERRIDE
    prom = start_prometheus(prometheus_bin, tmp_path, request, recording, alerting, f"127.0.0.1:{cachemon.port}",
                            upstream.base_url).url
    eventually(lambda: _query(prom, 'up{job="cachemon"} == 1'), 60, "Prometheus scraping cachemon", interval=0.25,
               ignore=(requests.RequestException, ValueError, KeyError))

    start = time.time()
    done = threading.Event()

    def _publish() -> None:
        pub.publish(speed=SPEED)
        done.set()
    threading.Thread(target=_publish, daemon=True).start()

    def firing() -> set[str]:
        r = requests.get(prom + "/api/v1/alerts", timeout=10).json()["data"]["alerts"]
        return {a["labels"].get("tenant", "?") for a in r if a["labels"]["alertname"] == ALERT and a["state"] == "firing"}
    fired = eventually(firing, 600 / SPEED + 60, f"{ALERT} firing", interval=0.5, ignore=(requests.RequestException,))
    fired_at = time.time()
    eventually(done.is_set, 600 / SPEED + 30, "the replay to end", interval=0.5)
    # every rule evaluated after a scrape that follows the replay's last message
    t_done = time.time()
    eventually(lambda: _evaluated_after(prom, t_done + 1), 30, "an evaluation after the replay", interval=0.5,
               ignore=(requests.RequestException, KeyError, IndexError))

    assert fired == {labels["ts"]}
    # never for any other tenant: ALERTS (pending and firing) over the whole run, every evaluation
    ever = _query(prom, f'ALERTS{{alertname="{ALERT}"}}', start=start - 5, end=time.time(), step="1s")
    assert {s["metric"].get("tenant") for s in ever} == {labels["ts"]}
    # the ratios the alert read at the end: ts 0, the rest and each other tenant at or above 80 %
    ratio = {s["metric"].get("tenant", ""): float(s["value"][1]) for s in _query(prom, RATIO)}
    rest = {s["metric"].get("tenant", ""): float(s["value"][1]) for s in _query(prom, REST)}
    assert set(ratio) == set(labels.values())
    assert ratio[labels["ts"]] == 0 and rest[labels["ts"]] >= 0.8
    assert all(ratio[labels[t]] >= 0.8 for t in ("t0", "t1", "t2", "t3"))
    # the other tenants' rest includes ts: below 80 %, so theirs could not fire even on a drop of their own
    assert all(rest[labels[t]] < 0.8 for t in ("t0", "t1", "t2", "t3"))
    # the whole replay is in the 5m windows: each tenant's ratio is the exact one of the whole capture
    exact, exact_rest = _exact_ratios(d)
    assert {labels[t] for t in labels} == set(exact)
    assert all(exact[labels[t]] < 1 for t in ("t0", "t1", "t2", "t3"))       # the first cold stores count
    assert all(abs(ratio[t] - exact[t]) <= TOLERANCE for t in exact), (ratio, exact)
    # the rest sums tenants whose series started at different scrapes: their rates' extrapolation differs a
    # little, so the rest is exact to REST_TOLERANCE only
    assert all(abs(rest[t] - exact_rest[t]) <= REST_TOLERANCE for t in exact), (rest, exact_rest)
    print(f"\n{ALERT} firing for {sorted(fired)} {fired_at - start:.1f} s after the replay started "
          f"(x{SPEED:g}: {SPEED * (fired_at - start):.0f} s of recorded traffic; for: {FOR_OVERRIDE}); "
          f"ratio at the end {({t: round(ratio[labels[t]], 4) for t in labels})}, "
          f"exact {({t: round(exact[labels[t]], 4) for t in labels})}, "
          f"rest {({t: round(rest[labels[t]], 6) for t in labels})}, "
          f"exact rest {({t: round(exact_rest[labels[t]], 6) for t in labels})}")


def _exact_ratios(d: Path) -> tuple[dict[str, float], dict[str, float]]:
    """tenant label -> hits / (hits + stored) of the whole capture, from its events alone; and the same of
    all the other tenants together (the rest)."""
    from kv_support import load_messages
    from tenant_support import HITS, reference_tenant_split
    namer = TenantNamer({salt_digest(SALTS[t]): t for t in NAMED}, KEY.encode())
    hits: dict[str, float] = {}
    kv: dict[str, float] = {}
    for (tenant, _adapter), row in reference_tenant_split(load_messages(d), namer).items():
        hits[tenant] = hits.get(tenant, 0) + row.get(HITS, 0)
        kv[tenant] = kv.get(tenant, 0) + sum(row.values())
    rest = {t: (sum(hits.values()) - hits[t]) / (sum(kv.values()) - kv[t]) for t in kv}
    return {t: hits[t] / kv[t] for t in kv}, rest


def _promtool(tmp_path: Path, series: list[dict], cases: list[dict]) -> subprocess.CompletedProcess:
    promtool = require_binary("promtool", "prometheus")
    path = tmp_path / "real_test.yaml"
    path.write_text(yaml.safe_dump({
        "rule_files": [str(ROOT / "prometheus" / "recording_rules.yaml"), str(ROOT / "alerts" / "cachemon-alerts.yaml")],
        "evaluation_interval": "15s",
        "tests": [{"interval": "15s", "input_series": series, "promql_expr_test": cases}]}, sort_keys=False))
    return subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=300)


def test_at_the_recorded_pace_the_shipped_alert_fires_for_ts_only(tmp_path):
    """The same capture through the live ledger in process, its per-tenant counters sampled every 15 s of
    the recording as Prometheus would scrape them (and held after the traffic: cachemon keeps serving them),
    evaluated by promtool with the shipped recording rules and alerts UNCHANGED (`for: 10m`): at the
    recorded pace, no compression. ALERTS over the whole run names ts only, pending and then firing."""
    from cachemon.state.ledger.fleet import FleetLedger
    from cachemon.state.ledger.tenants import TenantLabels
    from tenant_support import sampled_tenant_series
    d = _folder()
    labels = _labels()
    fleet = FleetLedger(tenants=TenantLabels({salt_digest(SALTS[t]): t for t in NAMED}, KEY.encode(), 100),
                        full_reports=True)      # every request in full report mode (kv_events.full_reports: true)
    series, _final = sampled_tenant_series(d, fleet, hold=80)        # 20 minutes after the traffic
    ts = labels["ts"]
    # promtool's time 0 is the first sample, 1 s before the first message; the alert cannot fire before its
    # `for:` has run, nor after the traffic has left the 5m windows
    events = load_events(d / "events.jsonl")
    last = max(m.t for m in events) - (min(m.t for m in events) - 1)
    bounds = (600, last + 300)

    def tenant(t: str) -> str:
        return '{job="cachemon", model_name="tiny"' + (f', tenant="{t}"' if t else "") + "}"
    ever = f'count by (job, model_name, tenant) (count_over_time(ALERTS{{alertname="{ALERT}"}}[40m]))'
    firing = f'count by (job, model_name, tenant) (count_over_time(ALERTS{{alertname="{ALERT}", alertstate="firing"}}[40m]))'
    first = (f'min by (job, model_name, tenant) (min_over_time(timestamp(ALERTS{{alertname="{ALERT}", '
             f'alertstate="firing"}})[40m:15s]))')
    cases = [
        # ts only: its pending and its firing series, no other tenant's in any state
        {"expr": ever, "eval_time": "29m", "exp_samples": [{"labels": tenant(ts), "value": 2}]},
        {"expr": firing, "eval_time": "29m", "exp_samples": [{"labels": tenant(ts), "value": 1}]},
        # first firing: 10m after the conditions first held, within the traffic's 5m windows
        {"expr": f"({first} >= bool {bounds[0]}) * ({first} <= bool {bounds[1]:.0f})", "eval_time": "29m",
         "exp_samples": [{"labels": tenant(ts), "value": 1}]},
    ]
    r = _promtool(tmp_path, series, cases)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def _tenant_totals(sample: dict[str, float], tenant: str) -> tuple[float, float]:
    """(hits, hits + stored) of one tenant in one sample of tenant_support.tenant_samples."""
    from cachemon import catalog as c
    mine = {n: v for n, v in sample.items() if f'tenant="{tenant}"' in n}
    hits = sum(v for n, v in mine.items() if n.startswith(c.KV_TENANT_HIT_TOKENS.sample_name))
    return hits, sum(mine.values())


@pytest.mark.parametrize("new_series_hold", [None, 0.0], ids=["shipped-hold", "no-hold"])
def test_at_the_recorded_pace_the_healthy_tenants_ratio_is_the_exact_one(tmp_path, new_series_hold):
    """The capture through the live ledger, /metrics as served (the real collector, its new-series hold on the
    recording's clock) sampled every 15 s, the shipped recording rules in promtool. For each healthy tenant
    (t0-t3), at every evaluation from its values' release until its first sample leaves the 5m window (so
    the window holds all its traffic so far): the recorded ratio is the exact one, hits / (hits + stored) of
    the ledger's counters at that instant, within TOLERANCE. Without the hold (``no-hold``, the exposition
    before it) the same evaluations read the first stores away: every one of them is above the exact ratio by
    at least 1 point."""
    from cachemon.monitoring import prometheus_rules
    from cachemon.state.ledger.fleet import FleetLedger
    from cachemon.state.ledger.tenants import TenantLabels
    from tenant_support import tenant_samples
    d = _folder()
    labels = _labels()
    fleet = FleetLedger(tenants=TenantLabels({salt_digest(SALTS[t]): t for t in NAMED}, KEY.encode(), 100),
                        full_reports=True)      # every request in full report mode (kv_events.full_reports: true)
    shown, true = tenant_samples(d, fleet, after=40, new_series_hold=new_series_hold)
    series = [{"series": n, "values": " ".join(f"{s[n]:g}" if n in s else "_" for s in shown)} for n in shown[-1]]
    cases = []
    for t in ("t0", "t1", "t2", "t3"):
        label = labels[t]
        first = next(k for k, s in enumerate(shown) if any(f'tenant="{label}"' in n for n in s))
        released = next(k for k, (s, e) in enumerate(zip(shown, true, strict=True))
                        if k > first and _tenant_totals(s, label)[1] and _tenant_totals(s, label) == _tenant_totals(e, label))
        # from two steps after the first sample (a round every 26 s: the window holds a request more), until
        # 20 steps of 15 s after it (the 5m window still holds it)
        window = range(max(released, first + 2), first + 20)
        assert len(window) >= 8, (t, first, released)
        for k in window:
            hits, total = _tenant_totals(true[k], label)
            assert 0 < hits / total < 1
            sel = f'{prometheus_rules.TENANT_RATIO}{{tenant="{label}"}}'
            expr = (f"abs({sel} - {hits / total!r}) <= bool {TOLERANCE}" if new_series_hold is None
                    else f"{sel} - {hits / total!r} >= bool 0.01")
            cases.append({"expr": expr, "eval_time": f"{15 * k}s",
                          "exp_samples": [{"labels": '{job="cachemon", model_name="tiny"'
                                                     + (f', tenant="{label}"' if label else "") + "}", "value": 1}]})
    path = tmp_path / "ratio_test.yaml"
    path.write_text(yaml.safe_dump({
        "rule_files": [str(ROOT / "prometheus" / "recording_rules.yaml")], "evaluation_interval": "15s",
        "tests": [{"interval": "15s", "input_series": series, "promql_expr_test": cases}]}, sort_keys=False))
    promtool = require_binary("promtool", "prometheus")
    r = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr
