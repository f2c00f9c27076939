#!/usr/bin/env python3
"""The table of tests/fixtures/vllm-0.32.0-cpu-router/README.md: per capture and replica, vLLM's own counters,
the routing tokens (from usage alone, and from cachemon's ledger), what one cache holding both replicas'
content would have hit, and what the router's page says.

    PYTHONPATH=src:tests python scripts/e2e/router_summary.py [tests/fixtures/vllm-0.32.0-cpu-router]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

from cachemon.normalise.routers import KINDS, read_page  # noqa: E402
from cachemon.state.ledger.fleet import FleetLedger  # noqa: E402
from kv_support import replay  # noqa: E402
from test_router_captures import _final, _requests, usage_truth  # noqa: E402


def rows(folder: Path) -> list[str]:
    meta = json.loads((folder / "metadata.json").read_text())
    r = meta["router"]
    fleet = FleetLedger()
    replay(folder, fleet)
    truth = usage_truth(folder) if r["clients"] == "sequential" else {}
    page = read_page(KINDS["vllm-router"], (folder / "router-metrics-final.txt").read_text())
    said = ", ".join(f"{k} {v:g}" for k, v in sorted(page.decisions.items()))
    said += "; lookups " + ", ".join(f"{k} {v:g}" for k, v in sorted(page.lookups.items())) if page.lookups else ""
    reqs = _requests(folder)
    out, q_all, h_all, routed_all = [], 0.0, 0.0, 0.0
    for rep in ("replica0", "replica1"):
        q = _final(folder, rep, "vllm:prefix_cache_queries_total")
        h = _final(folder, rep, "vllm:prefix_cache_hits_total")
        v = fleet.view(rep)
        routed = v.stored_tokens.get("routing", 0.0) if v is not None else 0.0
        q_all, h_all, routed_all = q_all + q, h_all + h, routed_all + routed
        n = sum(1 for x in reqs if x["replica"] == rep)
        t = f"{truth.get(rep, 0.0):g}" if truth else "-"
        out.append(f"| {folder.name} | {r['policy']}{' +scale-out' if r['scale_out'] else ''} | {r['clients']} | "
                   f"{rep} | {n} | {q:g} / {h:g} | {t} | {routed:g} | {said} |")
    one = (h_all + routed_all) / q_all if q_all else 0.0
    out.append(f"| {folder.name} | | | both | {len(reqs)} | {q_all:g} / {h_all:g} ({h_all / q_all:.1%}) | | "
               f"{routed_all:g} | one cache: {one:.1%} |")
    return out


def main() -> int:
    base = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "tests" / "fixtures" / "vllm-0.32.0-cpu-router"
    print("| capture | policy | clients | replica | requests | queries / hits (vLLM) | routing (usage) | "
          "routing (ledger) | router's page |")
    print("|---|---|---|---|---|---|---|---|---|")
    for folder in sorted(p for p in base.iterdir() if (p / "metadata.json").exists()):
        print("\n".join(rows(folder)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
