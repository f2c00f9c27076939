#!/usr/bin/env python3
"""Record vLLM's own router (`vllm-router`, Rust, from PyPI) in front of two real vLLM CPU replicas
with KV events, for the router-vs-engine proofs (issue 36).

    python scripts/e2e/router_record.py SCENARIO --out tests/fixtures/vllm-0.32.0-cpu-router/SCENARIO \
        --vllm-python /root/vllm-venv/bin/python        # VLLM_ROUTER=path (default /root/router-venv/bin/vllm-router)

Everything of kv_record.py (events.jsonl, metrics.jsonl, requests.jsonl, server logs, metadata.json)
plus, from the router:

* ``router-metrics.jsonl`` its Prometheus page polled every second (counter and gauge families
                           only, HELP/TYPE kept), ``{"t", "text"}`` or ``{"t", "unchanged": true}``;
* ``router-metrics-final.txt`` the whole page 2.5 s after the last request;
* ``router.log``           its output (``--log-level debug``: one line per routing decision).

Every request carries its own ``X-Request-Id`` (the router forwards it; vLLM names the request
``chatcmpl-<id>`` in its log), so the replica that served it is read from the two server logs,
under concurrency too. Only processes started here are stopped.
"""
from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import requests  # noqa: E402
from kv_recorder import ROOT, Recorder, chat, record_main, tenant_system  # noqa: E402
from procs import free_port, wait_for  # noqa: E402

ROUTER = "/root/router-venv/bin/vllm-router"
TENANTS = 4
KEEP = ("counter", "gauge")


def router_page(text: str) -> str:
    """The router's counter and gauge families (no histograms), HELP/TYPE kept."""
    out, keep, held = [], False, ""
    for line in text.splitlines():
        if line.startswith("# HELP "):
            held, keep = line, False
            continue
        if line.startswith("# TYPE "):
            keep = line.split()[3] in KEEP
            if keep:
                out += [held, line] if held else [line]
            held = ""
            continue
        if keep and line and not line.startswith("#"):
            out.append(line)
    return "\n".join(out) + "\n"


class RouterProc:
    def __init__(self, rec: Recorder, policy: str, kv_sources: bool, extra: list[str]):
        self.rec, self.policy = rec, policy
        self.port, self.prom_port = free_port(), free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        reps = list(rec.replicas.values())
        self.argv = [rec.args.router, "--host", "127.0.0.1", "--port", str(self.port),
                     "--worker-urls", *[r.api for r in reps], "--policy", policy,
                     "--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.prom_port),
                     "--log-level", "debug"]
        if kv_sources:
            for r in reps:
                self.argv += ["--kv-event-source", f"{r.api}=tcp://127.0.0.1:{r.ev_port}"]
            self.argv += ["--kv-event-block-size", "128", "--kv-event-model", "tiny"]
        self.argv += extra
        self.proc = None
        self.up = False
        self.metrics_f = open(rec.out / "router-metrics.jsonl", "w", encoding="utf-8")

    def start(self) -> None:
        self.proc = self.rec.procs.start("vllm-router", self.argv, self.rec.out / "router.log")
        wait_for(lambda: requests.get(self.base + "/v1/models", timeout=2).status_code == 200, 120, 0.5,
                 "router ready", alive=self.proc.alive)
        self.up = True
        self.rec.phase("router ready")

    def page(self) -> str:
        return requests.get(f"http://127.0.0.1:{self.prom_port}/metrics", timeout=5).text

    def loop(self) -> None:
        last = ""
        while not self.rec.stop_flag.wait(1.0 - (time.time() % 1.0)):
            if not self.up:
                continue
            try:
                text = router_page(self.page())
            except Exception:
                continue
            line = {"t": time.time()}
            if text == last:
                line["unchanged"] = True
            else:
                line["text"] = last = text
            self.metrics_f.write(json.dumps(line) + "\n")
            self.metrics_f.flush()

    def stop(self) -> None:
        self.up = False
        if self.proc is not None:
            self.rec.procs.stop(self.proc)
            self.proc = None
        self.metrics_f.close()


def served_by(rec: Recorder, rid: str) -> str | None:
    pat = re.compile(r"Received request chatcmpl-" + re.escape(rid) + r"\b")
    found = [r.name for r in rec.replicas.values() if r.log.exists() and pat.search(r.log.read_text(errors="replace"))]
    return found[0] if len(found) == 1 else None


def bodies(group: int = 2) -> list[dict]:
    # each tenant's requests in groups (pairs: A A B B ..., five rounds), 40 requests; groups of 5 under
    # round-robin store each tenant again on the replica its group did not start on: routing on both
    rounds = 40 // (TENANTS * group)
    return [chat(tenant_system(k), f"Visit {v}.{j} of tenant {k}") for v in range(rounds) for k in range(TENANTS)
            for j in range(group)]


def run(args) -> None:
    plan = PLANS[args.scenario]
    extra = ["--enable-scale-out"] if plan["scale_out"] else []
    rec = Recorder(args, {"pool": 160, "replicas": 2, "extra_args": extra})
    meta: dict = {"command": "python scripts/e2e/router_record.py " + " ".join(sys.argv[1:]).replace(str(ROOT) + "/", "")}
    for n in ("replica0", "replica1"):
        rec.add_replica(n, 160)
    rec.start_loops()
    router = None
    try:
        starters = [threading.Thread(target=r.start) for r in rec.replicas.values()]
        for th in starters:
            th.start()
        for th in starters:
            th.join()
        if not all(r.up for r in rec.replicas.values()):
            raise RuntimeError("a replica did not start")
        first = rec.replicas["replica0"]
        rec.version = first.session.get(first.api + "/version", timeout=5).json().get("version", "")
        router = RouterProc(rec, plan["policy"], plan.get("kv_sources", False), plan.get("router_args", []))
        router.start()
        threading.Thread(target=router.loop, daemon=True).start()
        rec.phase(args.scenario)
        lines = traffic(rec, router, plan["clients"], plan.get("group", 2))
        time.sleep(2.5)
        (rec.out / "router-metrics-final.txt").write_text(router.page(), encoding="utf-8")
        for line in lines:
            line["replica"] = served_by(rec, line["x_request_id"])
            rec.write_request(line)
        meta["router"] = {"version": "vllm-router 0.1.17", "policy": plan["policy"], "scale_out": plan["scale_out"],
                          "clients": plan["clients"], "group": plan.get("group", 2), "argv": " ".join(router.argv[1:]),
                          "per_replica": {n: sum(1 for x in lines if x["replica"] == n) for n in rec.replicas},
                          "unresolved": sum(1 for x in lines if x["replica"] is None)}
        router.stop()
        rec.finish(meta)
    finally:
        if router is not None and router.proc is not None:
            router.stop()
        rec.procs.stop_all()
        rec.stop_flag.set()
    print(json.dumps({k: meta.get(k) for k in ("router", "final_counters")}, indent=1))


def traffic(rec: Recorder, router: RouterProc, clients: str, group: int) -> list[dict]:
    todo = bodies(group)
    sc = rec.args.scenario

    def one(i: int, body: dict) -> dict:
        rid = f"{sc.replace('_', '')}{i:03d}"
        line = send(router.base, sc, i, body, rid)
        line["x_request_id"] = rid
        return line

    if clients == "sequential":
        out = []
        for i, b in enumerate(todo):
            out.append(one(i, b))
            time.sleep(rec.args.gap)
        return out
    out = []
    with ThreadPoolExecutor(8) as ex:   # 5 bursts of 8 concurrent requests (each tenant twice)
        for start in range(0, len(todo), 8):
            futs = [ex.submit(one, start + k, b) for k, b in enumerate(todo[start:start + 8])]
            out += [f.result() for f in futs]
            time.sleep(1.5)
    return out


def send(base: str, scenario: str, i: int, body: dict, rid: str) -> dict:
    t_send = time.time()
    r = requests.post(base + "/v1/chat/completions", json=dict(body, return_token_ids=True),
                      headers={"X-Request-Id": rid}, timeout=600)
    t_recv = time.time()
    if r.status_code != 200:
        raise RuntimeError(f"HTTP {r.status_code}: {r.text[:300]}")
    d = r.json()
    ch = d["choices"][0]
    line = {"scenario": scenario, "i": i, "time": t_send, "t_send": t_send, "t_recv": t_recv,
            "replica": None, "request": body, "usage": d["usage"]}
    if isinstance(ch.get("token_ids"), list):
        line["completion_token_ids"] = ch["token_ids"]
    return line


PLANS = {
    "round_robin_seq": {"policy": "round_robin", "scale_out": False, "clients": "sequential"},
    "cache_aware_blind_seq": {"policy": "cache_aware", "scale_out": False, "clients": "sequential"},
    "cache_aware_seq": {"policy": "cache_aware", "scale_out": True, "clients": "sequential"},
    "cache_aware_concurrent": {"policy": "cache_aware", "scale_out": True, "clients": "concurrent"},
    "kv_aware_seq": {"policy": "kv_aware", "scale_out": True, "clients": "sequential", "kv_sources": True},
    "round_robin_concurrent": {"policy": "round_robin", "scale_out": False, "clients": "concurrent"},
    # any load difference counts as imbalance: the router may choose the less loaded worker over the cached one
    "cache_aware_balance_concurrent": {"policy": "cache_aware", "scale_out": True, "clients": "concurrent",
                                       "router_args": ["--balance-abs-threshold", "0", "--balance-rel-threshold", "1.0"]},
    "round_robin_groups_seq": {"policy": "round_robin", "scale_out": False, "clients": "sequential", "group": 5},
}


def main() -> int:
    return record_main(__doc__, PLANS, run_with_router)


def run_with_router(args) -> None:
    args.router = os.environ.get("VLLM_ROUTER", ROUTER)
    run(args)


if __name__ == "__main__":
    sys.exit(main())
