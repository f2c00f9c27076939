"""`cachemon report`'s per-tenant part on CONSTRUCTED raw samples (a stand-in for Prometheus' answer; the
report's Prometheus path itself is tested against a real Prometheus in tests/test_report.py)."""
from __future__ import annotations

from cachemon import catalog as C
from cachemon.tools.cost_report import build_report, format_text

BASE = {"job": "cachemon", "instance": "pod-a", C.UPSTREAM: "vllm", C.MODEL: "m"}


class FakeProm:
    shown = "http://prometheus.example"

    def __init__(self) -> None:
        s, h = C.KV_TENANT_STORED_TOKENS.sample_name, C.KV_TENANT_HIT_TOKENS.sample_name
        self.series: dict[str, list] = {
            C.QUERY_TOKENS.sample_name: [({**BASE, C.CACHE: "local"}, [(0, 0), (60, 5000)])],
            C.HIT_TOKENS.sample_name: [({**BASE, C.CACHE: "local"}, [(0, 0), (60, 3000)])],
            # alpha: 900 hits, 100 first; beta (adapter ad-1): 300 hits, isolation 600 then a counter reset
            # (+100) and 100 recompute_last_block; quiet: stores only (no full-report requests)
            s: [({**BASE, C.TENANT: "alpha", C.ADAPTER: "", C.REASON: "first"}, [(0, 0), (60, 100)]),
                ({**BASE, C.TENANT: "beta", C.ADAPTER: "ad-1", C.REASON: "isolation"}, [(0, 0), (30, 600), (60, 100)]),
                ({**BASE, C.TENANT: "beta", C.ADAPTER: "ad-1", C.REASON: "recompute_last_block"}, [(0, 0), (60, 100)]),
                ({**BASE, C.TENANT: "quiet", C.ADAPTER: "", C.REASON: "first"}, [(0, 0), (60, 500)])],
            h: [({**BASE, C.TENANT: "alpha", C.ADAPTER: ""}, [(0, 0), (60, 900)]),
                ({**BASE, C.TENANT: "beta", C.ADAPTER: "ad-1"}, [(0, 0), (60, 300)])],
        }

    def raw(self, metric: str, since: float, end: float, matchers: str = "") -> list:
        return self.series.get(metric, [])


def test_per_tenant_and_adapter_over_the_period():
    rep = build_report(FakeProm(), 3600, 3600)     # type: ignore[arg-type]
    t = rep["models"]["m"]["tenants"]
    alpha, beta, quiet = (t["tenants"][x] for x in ("alpha", "beta", "quiet"))
    assert alpha["missed_tokens"] == 100 and alpha["hit_ratio"] == 0.9
    # the reset counts its new value as the rise: 600 + 100 isolation tokens
    assert beta["stored_tokens"] == {"isolation": 700, "recompute_last_block": 100} and beta["missed_tokens"] == 700
    assert beta["hit_ratio"] == 300 / (300 + 800)
    assert quiet["hit_tokens"] is None and quiet["hit_ratio"] is None and quiet["missed_tokens"] == 500
    # the base model's ratio counts only the pairs with full-report requests (alpha, not quiet)
    assert t["adapters"][""]["hit_ratio"] == 0.9 and t["adapters"][""]["missed_tokens"] == 600
    assert t["adapters"]["ad-1"]["stored_tokens"]["isolation"] == 700
    text = format_text(rep)
    assert "tenant  beta" in text and "isolation 700" in text and "hit ratio     n/a  missed 500" in text
