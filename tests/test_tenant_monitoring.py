"""The tenant part of the monitoring bundle: the overview's "Tenants and adapters" row computes what its
titles say (its queries evaluated by promtool on constructed series), and the runbook documents the alert
and the label safety. The alert itself: tests/promtool/tenants_test.yaml."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

import helpers
import promql_lint as lint
from cachemon import catalog as c
from cachemon.monitoring import prometheus_rules, tenant_row

ROOT = Path(__file__).resolve().parents[1]
OVERVIEW = ROOT / "dashboards" / "cachemon-overview.json"


def _row() -> dict[str, dict]:
    d = json.loads(OVERVIEW.read_text())
    titles = [p["title"] for p in d["panels"]]
    start = titles.index(tenant_row.TITLE)
    assert d["panels"][start]["type"] == "row"
    ps = d["panels"][start + 1:start + 1 + len(tenant_row.panels(""))]
    return {p["title"]: p for p in ps}


def test_the_row_queries_only_the_tenant_counters_of_the_selection():
    ps = _row()
    assert list(ps) == [s.title for s in tenant_row.panels("")]
    for p in ps.values():
        for tgt in p["targets"]:
            sels = lint.selectors(tgt["expr"])
            assert {s.name for s in sels} <= {c.KV_TENANT_STORED_TOKENS.sample_name, c.KV_TENANT_HIT_TOKENS.sample_name}
            assert all('job=~"$job"' in s.matchers and 'model_name=~"$model_name"' in s.matchers for s in sels)
    assert ps["Hit ratio by tenant (full-report requests)"]["fieldConfig"]["defaults"]["unit"] == "percentunit"


# constructed series (per minute): tenant alpha (base model) and beta (adapter ad-1) with full-report hits,
# beta's stores partly isolation; a tenant "quiet" with stores only (no full report: no ratio line); requests
# without a salt: on the base model (the server's plain traffic: no panel of the row draws it) and on adapter
# ad-2, isolated from ad-1 (its legend names the missing salt)
SERIES = {
    ("alpha", "", "first"): 120, ("beta", "ad-1", "isolation"): 180, ("beta", "ad-1", "first"): 60,
    ("beta", "ad-1", "recompute_last_block"): 600, ("quiet", "", "first"): 300,
    ("", "", "first"): 900, ("", "", "isolation"): 0, ("", "ad-2", "isolation"): 60,
}
HITS = {("alpha", ""): 1080, ("beta", "ad-1"): 360, ("", ""): 0}


def _promtool_case(expr: str, samples: list[tuple[dict, float]]) -> dict:
    for var, value in (("$__rate_interval", "5m"), ('=~"$job"', '=~".+"'), ('=~"$instance"', '=~".+"'),
                       ('=~"$upstream"', '=~".+"'), ('=~"$model_name"', '=~".+"')):
        expr = expr.replace(var, value)
    return {"expr": expr, "eval_time": "20m",
            "exp_samples": [{"labels": "{" + ", ".join(f'{k}="{v}"' for k, v in lab.items() if v) + "}", "value": v}
                            for lab, v in samples]}


@pytest.mark.prometheus
def test_the_row_computes_misses_isolation_and_ratio(tmp_path):
    promtool = helpers.require_binary("promtool", "prometheus")
    ps = _row()
    base = 'job="cachemon", instance="pod-a", upstream="vllm", model_name="m"'
    series = [{"series": f'{c.KV_TENANT_STORED_TOKENS.sample_name}{{{base}, tenant="{t}", adapter="{a}", reason="{r}"}}',
               "values": f"0+{v}x30"} for (t, a, r), v in SERIES.items()]
    series += [{"series": f'{c.KV_TENANT_HIT_TOKENS.sample_name}{{{base}, tenant="{t}", adapter="{a}"}}',
                "values": f"0+{v}x30"} for (t, a), v in HITS.items()]

    def expr(title: str) -> str:
        return ps[title]["targets"][0]["expr"]
    cases = [
        # misses exclude recompute_last_block: alpha 2/s, beta (180 + 60) / 60 = 4/s, quiet 5/s
        _promtool_case(expr("Missed tokens by tenant"),
                       [({"tenant": "alpha"}, 2), ({"tenant": "beta"}, 4), ({"tenant": "quiet"}, 5)]),
        _promtool_case(expr("Missed tokens by adapter"), [({"adapter": "ad-1"}, 4), ({"adapter": "ad-2"}, 1)]),
        _promtool_case(expr("Isolation cost by tenant and adapter"), [({"tenant": "beta", "adapter": "ad-1"}, 3),
                                                                      ({"tenant": "no salt", "adapter": "ad-2"}, 1)]),
        # alpha 1080 / (1080 + 120) = 0.9; beta 360 / (360 + 840) = 0.3; quiet: no hits, no line
        _promtool_case(expr("Hit ratio by tenant (full-report requests)"),
                       [({"tenant": "alpha"}, 0.9), ({"tenant": "beta"}, 0.3)]),
    ]
    path = tmp_path / "row_test.yaml"
    path.write_text(yaml.safe_dump({"evaluation_interval": "1m", "tests": [
        {"interval": "1m", "input_series": series, "promql_expr_test": cases}]}, sort_keys=False))
    r = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def test_the_runbook_documents_the_alert_and_the_label_safety():
    text = (ROOT / "docs" / "runbook.md").read_text()
    section = text[text.index("## CachemonTenantHitRatioCollapsed"):]
    section = section[:section.index("\n## ", 5)]
    for needle in ("never exported", "sha256", "HMAC-SHA256", "`other`", "isolation", "first",
                   "--by-tenant", "kv_cache_report_mode"):
        assert needle in section, needle
    alerts = yaml.safe_load((ROOT / "alerts" / "cachemon-alerts.yaml").read_text())["groups"][0]["rules"]
    (rule,) = [r for r in alerts if r.get("alert") == "CachemonTenantHitRatioCollapsed"]
    assert rule["annotations"]["runbook_url"].endswith("#cachemontenanthitratiocollapsed")
    assert rule["labels"] == {"severity": "warning"} and "{{" not in rule["annotations"]["summary"]
    assert "$labels.tenant" in rule["annotations"]["description"]


@pytest.mark.prometheus
def test_the_recording_rules_on_the_ledgers_real_counters(tmp_path):
    """Real: the tenants_lora capture through the live ledger, its per-tenant counters sampled every 15 s
    of the recording as Prometheus would scrape them, and the shipped recording rules evaluated by promtool.
    The tenant hit ratio equals hits / (hits + stored) of the exact counters (both rates share one
    extrapolation), and the isolation cost is there exactly for the tenants that paid it."""
    from cachemon.normalise.tenant_label import salt_digest
    from cachemon.state.ledger.fleet import FleetLedger
    from cachemon.state.ledger.tenants import TenantLabels
    from kv_support import scenario
    from tenant_support import sampled_tenant_series
    promtool = helpers.require_binary("promtool", "prometheus")
    d = scenario("tenants_lora")
    if not (d / "events.jsonl").is_file():
        pytest.skip(f"recording {d} not in this tree")
    fleet = FleetLedger(tenants=TenantLabels({salt_digest("test-salt-t1-constructed"): "t1"},
                                             b"cachemon-test-key-0123456789abcdef", 100),
                        full_reports=True)      # rounds in full report mode (kv_events.full_reports: true)
    series, final = sampled_tenant_series(d, fleet)
    hits: dict[str, float] = {}
    kv: dict[str, float] = {}
    iso: dict[str, float] = {}
    for name, v in final.items():
        tenant = name.split('tenant="')[1].split('"')[0]
        kv[tenant] = kv.get(tenant, 0) + v
        if name.startswith(c.KV_TENANT_HIT_TOKENS.sample_name):
            hits[tenant] = hits.get(tenant, 0) + v
        elif 'reason="isolation"' in name:
            iso[tenant] = iso.get(tenant, 0) + v
    assert sum(iso.values()) > 0 and sum(hits.values()) > 0

    def labels(tenant: str) -> str:
        return '{job="cachemon", model_name="tiny"' + (f', tenant="{tenant}"' if tenant else "") + "}"
    cases = [{"expr": f'abs({prometheus_rules.TENANT_RATIO}{{tenant="{t}"}} - {hits[t] / kv[t]!r}) < bool 1e-9',
              "eval_time": "4m30s", "exp_samples": [{"labels": labels(t), "value": 1}]} for t in hits]
    cases.append({"expr": "model_tenant:cachemon_kv_tenant_stored_tokens:isolation_rate5m > bool 0", "eval_time": "4m30s",
                  "exp_samples": [{"labels": labels(t), "value": int(v > 0)} for t, v in iso.items()]})
    path = tmp_path / "real_test.yaml"
    path.write_text(yaml.safe_dump({"rule_files": [str(ROOT / "prometheus" / "recording_rules.yaml")],
                                    "evaluation_interval": "15s",
                                    "tests": [{"interval": "15s", "input_series": series, "promql_expr_test": cases}]},
                                   sort_keys=False))
    r = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr
    # the figures the rules reproduce: the salted tenants that came after the first paid isolation
    assert {t for t, v in iso.items() if v} >= {t for t in kv if t.startswith("h-")}
