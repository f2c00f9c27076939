"""Listener under many scrapers (issue 11): listen backlog 1024 vs the old 5.

20 scraper threads hit cachemon's /metrics on loopback for a bounded time, each opening a new
connection per scrape (the worst case for accept(): no keep-alive). The same listener code runs
twice in a child process, once with the old backlog of 5 (the baseline) and once with today's
default; only 127.0.0.1 is contacted and every loop stops by itself. Reported: p50 / p99 scrape
latency and the kernel's ListenOverflows (TcpExt, /proc/net/netstat) counted during each phase.

Usage: python benchmarks/bench_listener.py [--seconds 10] [--scrapers 20]
"""
from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import threading
import time

from common import FIXTURES, result

SCRAPERS = 20
SECONDS = 10.0

# The child: cachemon's real collector over a store fed with a real vLLM 0.32.0 page, served by
# cachemon's listener with the given backlog.
_CHILD = r"""
import sys, time
from prometheus_client import ProcessCollector
from cachemon.expose.collector import CachemonCollector
from cachemon.web.workers import Limits, Registry, make_server
from cachemon.normalise.normaliser import normalise_text
from cachemon.runtime.poller import to_update
from cachemon.state.store import Store

store = Store({"1m": 60.0, "5m": 300.0})
store.upstream("vllm").apply(to_update(normalise_text(open(sys.argv[2]).read())), time.time())
reg = Registry()
reg.register(CachemonCollector(store))
reg.register(ProcessCollector(registry=None))
server = make_server("127.0.0.1", 0, reg, limits=Limits(backlog=int(sys.argv[1])))
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def listen_overflows() -> int:
    with open("/proc/net/netstat") as f:
        lines = f.read().splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:"):
            return int(dict(zip(names.split()[1:], values.split()[1:], strict=False))["ListenOverflows"])
    raise RuntimeError("no TcpExt line in /proc/net/netstat")


def _scrape(port: int) -> float:
    t0 = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        while s.recv(65536):
            pass
    return time.perf_counter() - t0


def load(backlog: int, seconds: float, scrapers: int) -> dict:
    page = FIXTURES / "vllm-0.32.0-cpu" / "metrics-static-system-prompt.txt"
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(backlog), str(page)], stdout=subprocess.PIPE, text=True)
    try:
        port = int(child.stdout.readline())
        _scrape(port)   # warm up
        latencies: list[float] = []
        errors = [0]
        lock = threading.Lock()
        stop_at = time.monotonic() + seconds

        def scraper() -> None:
            mine, failed = [], 0
            while time.monotonic() < stop_at:
                try:
                    mine.append(_scrape(port))
                except OSError:
                    failed += 1
            with lock:
                latencies.extend(mine)
                errors[0] += failed

        before = listen_overflows()
        threads = [threading.Thread(target=scraper) for _ in range(scrapers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        overflows = listen_overflows() - before
    finally:
        child.terminate()
        child.wait(10)
    latencies.sort()
    return {"backlog": backlog, "scrapes": len(latencies), "errors": errors[0], "overflows": overflows,
            "p50": statistics.median(latencies), "p99": latencies[int(0.99 * (len(latencies) - 1))]}


def run(seconds: float = SECONDS, scrapers: int = SCRAPERS) -> list[dict]:
    from cachemon.web.workers import Limits

    old = load(5, seconds, scrapers)
    new = load(Limits().backlog, seconds, scrapers)

    def describe(r: dict) -> str:
        return (f"backlog {r['backlog']}: {r['scrapes']} scrapes, {r['errors']} errors, p50 {r['p50'] * 1e3:.1f} ms, "
                f"p99 {r['p99'] * 1e3:.1f} ms, {r['overflows']} listen overflows")

    note = f"{describe(new)}; baseline {describe(old)}"
    work = f"{scrapers} concurrent scrapers, new connection per scrape, {seconds:g} s each"
    return [
        result(f"p99 scrape latency, {work}", new["p99"], old["p99"], "same listener with the old backlog 5",
               "<= 200 ms (no 1 s SYN retransmit)", passed=new["p99"] <= 0.2, note=note),
        result(f"listen overflows (kernel TcpExt ListenOverflows), {work}", float(new["overflows"]),
               float(old["overflows"]), "same listener with the old backlog 5", "0", unit="overflows",
               passed=new["overflows"] == 0),
    ]


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=SECONDS)
    ap.add_argument("--scrapers", type=int, default=SCRAPERS)
    a = ap.parse_args()
    for row in run(a.seconds, a.scrapers):
        print(row["work"], "->", row["note"] or "")
