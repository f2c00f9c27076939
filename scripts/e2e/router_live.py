#!/usr/bin/env python3
"""`cachemon run` with `routers:` against a LIVE vllm-router before two real vLLM replicas (issue 36's proof in run).

    PYTHONPATH=src python scripts/e2e/router_live.py cache_aware_blind_seq --out /tmp/router-live \
        --vllm-python /root/vllm-venv/bin/python

Starts what scripts/e2e/router_record.py starts for the scenario (two replicas with KV events, the router),
then `cachemon run` polling both replicas (with their KV events) and the router every second, sends the
scenario's traffic, and prints what cachemon's /metrics then says: the router's families and every active
cause per upstream, as JSON. Only processes started here are stopped.
"""
from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import requests  # noqa: E402
from kv_recorder import ROOT, Recorder, record_main  # noqa: E402
from procs import free_port, wait_for  # noqa: E402
from router_record import PLANS, ROUTER, RouterProc, traffic  # noqa: E402


def _cachemon(rec: Recorder, router: RouterProc) -> tuple[str, object]:
    port = free_port()
    cfg = {"upstreams": [{"name": n, "url": r.api + "/metrics", "kv_events": f"tcp://127.0.0.1:{r.ev_port}"}
                         for n, r in rec.replicas.items()],
           "poll_interval": "1s", "listen": {"address": "127.0.0.1", "port": port},
           "attribution": {"window": "1m"},
           "routers": [{"name": "front", "url": f"http://127.0.0.1:{router.prom_port}/metrics", "kind": "vllm-router"}]}
    path = rec.out / "cachemon.json"
    path.write_text(json.dumps(cfg))
    proc = rec.procs.start("cachemon", [sys.executable, "-m", "cachemon.cli", "run", "--config", str(path)],
                           rec.out / "cachemon.log", env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: requests.get(base + "/-/ready", timeout=2).status_code == 200, 60, 0.5, "cachemon ready",
             alive=proc.alive)
    return base, proc


def _families(text: str) -> list[str]:
    keep = ("cachemon_router_", "cachemon_cause_active")
    return [line for line in text.splitlines() if line.startswith(keep)]


def run(args) -> None:
    plan = PLANS[args.scenario]
    rec = Recorder(args, {"pool": 160, "replicas": 2, "extra_args": ["--enable-scale-out"] if plan["scale_out"] else []})
    for n in ("replica0", "replica1"):
        rec.add_replica(n, 160)
    rec.start_loops()
    try:
        starters = [threading.Thread(target=r.start) for r in rec.replicas.values()]
        for th in starters:
            th.start()
        for th in starters:
            th.join()
        router = RouterProc(rec, plan["policy"], plan.get("kv_sources", False), plan.get("router_args", []))
        router.start()
        base, _proc = _cachemon(rec, router)
        traffic(rec, router, plan["clients"], plan.get("group", 2))
        time.sleep(6)        # a few polls and evaluations after the last request (hold: 2)
        lines = _families(requests.get(base + "/metrics", timeout=10).text)
        print(json.dumps({"scenario": args.scenario, "cachemon": lines}, indent=1))
        (rec.out / "cachemon-metrics.txt").write_text("\n".join(lines) + "\n")
    finally:
        rec.procs.stop_all()
        rec.stop_flag.set()


def main() -> int:
    def with_router(args) -> None:
        args.router = ROUTER
        run(args)
    return record_main(__doc__, PLANS, with_router)


if __name__ == "__main__":
    sys.exit(main())
