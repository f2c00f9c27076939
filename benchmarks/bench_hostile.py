"""A hostile page (issue 17, item 6): 13 MB of /metrics with ~93 000 (model_name, engine) label
sets, under the 16 MB body cap, CONSTRUCTED here. A real upstream is polled by `UpstreamPoller`
in a child process (so its peak RSS is the poller's alone; the page is served by this process).

- time per poll: cachemon (label-set budget, deadline over parsing) vs the same poller without
  the budget, the way every poll ran before issue 17 (baseline). Target: each poll inside the
  3 s poll timeout with room to spare (<= 1 s) and >= 3x faster than the baseline.
- peak RSS of the polling process, same two runs. Target <= 128 MB (the soak's limit).
- a hostile router page (red team round 7, issue 38): 1 000 worker URLs a page, read until the router
  book holds its MAX_READINGS readings, against the real vllm-router page (tests/fixtures/), each in a
  child process. Target: peak RSS <= 128 MB (before the bound: 0.64 MB more per poll, without end).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from common import ROOT, result

LABEL_SETS = 93_000
POLLS = 5

CHILD = r"""
import json, resource, statistics, sys, time
from cachemon.config import Upstream
from cachemon.runtime import poller as P
from cachemon.state.store import Store
url, unbounded, polls = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3])
if unbounded:
    P.BUDGET_FACTOR = None
store = Store({"1m": 60})
p = P.UpstreamPoller(Upstream(url, "u", 3.0), store)
p._need_version = False
times = []
for _ in range(polls):
    t0 = time.perf_counter()
    ok = p.poll_once() is not None
    times.append(time.perf_counter() - t0)
st = store.upstreams["u"]
print(json.dumps({"median": statistics.median(times), "ok": ok, "errors": dict(st.errors),
                  "overflow": st.overflow_total, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def hostile_page(n: int = LABEL_SETS) -> str:
    """CONSTRUCTED: queries and hits of n churn model names, then a real model's."""
    out = ["# TYPE vllm:prefix_cache_queries counter", "# TYPE vllm:prefix_cache_hits counter"]
    for stem in ("queries", "hits"):
        out += [f'vllm:prefix_cache_{stem}_total{{engine="0",model_name="churn-{i:06d}"}} 1.0' for i in range(n)]
    out += ['vllm:prefix_cache_queries_total{engine="0",model_name="real"} 1000.0',
            'vllm:prefix_cache_hits_total{engine="0",model_name="real"} 900.0']
    return "\n".join(out) + "\n"


def _poll(url: str, unbounded: bool) -> dict:
    env_path = str(ROOT / "src")
    proc = subprocess.run([sys.executable, "-c", CHILD, url, "1" if unbounded else "0", str(POLLS)],
                          capture_output=True, text=True, timeout=600,
                          env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"})
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run():
    from cachemon.demo.replay import ReplayServer

    page = hostile_page()
    size_mb = len(page.encode()) / 1e6
    with ReplayServer([("hostile", page)]) as srv:
        ours = _poll(srv.url, unbounded=False)
        base = _poll(srv.url, unbounded=True)
    work = f"poll a {size_mb:.1f} MB page of {LABEL_SETS} label sets, 3 s timeout"
    rows = [
        result(f"{work}: time per poll (median of {POLLS}; ours up={ours['ok']}, baseline up={base['ok']})",
               ours["median"], base["median"], "no label-set budget, as before issue 17", "<= 1 s and >= 3x",
               passed=ours["median"] <= 1.0 and base["median"] / ours["median"] >= 3),
        result(f"{work}: peak RSS of the polling process", ours["rss_mb"], base["rss_mb"],
               "no label-set budget, as before issue 17", "<= 128 MB", unit="MB", passed=ours["rss_mb"] <= 128),
        run_router(),
    ]
    return rows


ROUTER_CHILD = r"""
import json, resource, sys
from pathlib import Path
from cachemon.config.routers import RouterEntry
from cachemon.runtime.router_stage import RouterStage
from cachemon.state.routers import MAX_READINGS, RouterBook
real = (Path(sys.argv[1]) / "tests/fixtures/vllm-0.32.0-cpu-router/cache_aware_blind_seq/router-metrics-final.txt").read_text()
workers = int(sys.argv[2])
hostile = "\n".join(f'vllm_router_processed_requests_total{{worker="http://worker-{i}.example:8000"}} {{v}}'
                    for i in range(workers))
e = RouterEntry(url="http://127.0.0.1:9/metrics", kind="vllm-router", name="r")
book = RouterBook()
stage = RouterStage([e], [], book, 1.0)
for poll in range(MAX_READINGS + 8):
    stage.feed(e, float(poll), real + hostile.replace("{v}", str(poll)))
print(json.dumps({"rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "readings": len(book._routers["r"].readings)}))
"""


def _router(workers: int) -> dict:
    out = subprocess.run([sys.executable, "-c", ROUTER_CHILD, str(ROOT), str(workers)], capture_output=True,
                         text=True, check=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def run_router() -> dict:
    ours, base = _router(1000), _router(0)
    return result(f"a hostile router page (1 000 workers) read {ours['readings']} times: peak RSS", ours["rss_mb"],
                  base["rss_mb"], "the real vllm-router page, as many times", "<= 128 MB", unit="MB",
                  passed=ours["rss_mb"] <= 128)


if __name__ == "__main__":
    for r in run():
        print(r)
