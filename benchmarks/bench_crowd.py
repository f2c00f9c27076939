"""A real Prometheus behind a crowd of scrapers (issue 26, load shedding).

`cachemon demo` (real vLLM captures replayed through the whole exporter) is scraped every second
by Debian's `prometheus` binary while a crowd of N keep-alive clients (default 500, one asyncio
child process) asks for /metrics as fast as it is answered. The same run does it for two trees:
this one and BASE (default: main before the render batching, 0791098), one after the other, in
the order base, ours, base, ours (--rounds), so a change in the machine's load hits both.

Reported per tree: the crowd's requests by status and p50/p99 latency, and what Prometheus itself
recorded for the crowd's window: scrapes that succeeded (`up`) and their `scrape_duration_seconds`
(p50/p99/max). Only 127.0.0.1 is contacted; every process is stopped at the end.

Usage: python benchmarks/bench_crowd.py [--crowd 500] [--seconds 20] [--base REF] [--rounds 1]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.parse
import urllib.request
from io import BytesIO
from pathlib import Path

from common import ROOT, result

BASE = "0791098"
SCRAPE_INTERVAL = 1.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def export_tree(ref: str, into: Path) -> Path:
    """The src/ of a git ref, as files (git archive), for PYTHONPATH."""
    data = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "src"], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def get(url: str, timeout: float = 2.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:      # noqa: S310 - loopback only
        return bytes(r.read())


def wait_until(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"not reached within {timeout:g}s: {what}")


# --- the crowd: one child process, N keep-alive connections ---------------------------------------

async def _client(port: int, stop_at: float, out: dict) -> None:
    request = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    reader = writer = None
    while time.monotonic() < stop_at:
        t0 = time.perf_counter()
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            assert reader is not None
            writer.write(request)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            status = int(head.split(b" ", 2)[1])
            length = 0
            close = False
            for line in head.split(b"\r\n")[1:]:
                k, _, v = line.partition(b":")
                if k.lower() == b"content-length":
                    length = int(v)
                elif k.lower() == b"connection" and b"close" in v.lower():
                    close = True
            await asyncio.wait_for(reader.readexactly(length), 30)
            out["status"][status] = out["status"].get(status, 0) + 1
            out["latency"].append(time.perf_counter() - t0)
            if close:
                writer.close()
                writer = None
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError, IndexError):
            out["failed"] += 1
            if writer is not None:
                writer.close()
            writer = None
            await asyncio.sleep(0.05)
    if writer is not None:
        writer.close()


async def _crowd(port: int, n: int, seconds: float) -> dict:
    out: dict = {"status": {}, "latency": [], "failed": 0}
    stop_at = time.monotonic() + seconds
    await asyncio.gather(*(_client(port, stop_at, out) for _ in range(n)))
    lat = sorted(out["latency"])
    return {"status": {str(k): v for k, v in sorted(out["status"].items())}, "failed": out["failed"],
            "requests": len(lat), "p50": quantile(lat, 0.50), "p99": quantile(lat, 0.99)}


def quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


# --- Prometheus ------------------------------------------------------------------------------------

def start_prometheus(workdir: Path, targets: dict[str, int]) -> tuple[subprocess.Popen, int]:
    port = free_port()
    jobs = "".join(f"  - job_name: {job}\n    static_configs: [{{targets: ['127.0.0.1:{p}']}}]\n"
                   for job, p in targets.items())
    cfg = workdir / "prometheus.yml"
    cfg.write_text(f"global:\n  scrape_interval: {SCRAPE_INTERVAL:g}s\n  scrape_timeout: {SCRAPE_INTERVAL:g}s\n"
                   f"scrape_configs:\n{jobs}")
    proc = subprocess.Popen(["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={workdir / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=subprocess.DEVNULL, stderr=open(workdir / "prometheus.log", "wb"))
    wait_until(lambda: get(f"http://127.0.0.1:{port}/-/ready") is not None, 60, "Prometheus ready")
    return proc, port


def samples(prom: int, expr: str, start: float, end: float) -> list[float]:
    """The raw samples of a range selector whose timestamps fall in [start, end]."""
    span = int(end - start) + 2
    q = urllib.parse.urlencode({"query": f"{expr}[{span}s]", "time": f"{end:.3f}"})
    body = json.loads(get(f"http://127.0.0.1:{prom}/api/v1/query?{q}", timeout=10))
    out = []
    for series in body["data"]["result"]:
        out += [float(v) for t, v in series["values"] if start <= float(t) <= end]
    return out


def phase(src: Path, job: str, port: int, prom: int, crowd: int, seconds: float) -> dict:
    env = dict(os.environ, PYTHONPATH=str(src))
    code = ("import sys; from cachemon.cli import main; "
            f"sys.argv = ['cachemon', 'demo', '--listen', '127.0.0.1:{port}', '--poll-interval', '1s', "
            f"'--duration', '{seconds + 40:g}s']; main()")
    demo = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        wait_until(lambda: get(f"http://127.0.0.1:{port}/-/ready") == b"OK\n", 30, f"{job}: cachemon ready")
        time.sleep(3 * SCRAPE_INTERVAL)        # Prometheus finds the target up before the crowd comes
        start = time.time()
        child = subprocess.run([sys.executable, __file__, "--crowd-child", str(port), str(crowd), str(seconds)],
                               capture_output=True, text=True, timeout=seconds + 120)
        end = time.time()
        if child.returncode != 0:
            raise RuntimeError(child.stderr[-2000:])
        time.sleep(2 * SCRAPE_INTERVAL)        # the last scrape of the window is stored
        up = samples(prom, f'up{{job="{job}"}}', start, end)
        dur = sorted(samples(prom, f'scrape_duration_seconds{{job="{job}"}}', start, end))
    finally:
        demo.terminate()
        try:
            demo.wait(15)
        except subprocess.TimeoutExpired:
            demo.kill()
    stats = json.loads(child.stdout)
    stats["prom_scrapes"] = len(up)
    stats["prom_up"] = int(sum(up))
    stats["prom_p50"] = statistics.median(dur) if dur else float("nan")
    stats["prom_p99"] = quantile(dur, 0.99)
    stats["prom_max"] = dur[-1] if dur else float("nan")
    return stats


def run(crowd: int = 500, seconds: float = 20.0, base: str = BASE, rounds: int = 1) -> list[dict]:
    if shutil.which("prometheus") is None:
        raise RuntimeError("no prometheus binary (apt-get install prometheus)")
    work = Path(tempfile.mkdtemp(prefix="cachemon-crowd-"))
    prom = None
    try:
        trees = {"base": export_tree(base, work / "base"), "ours": ROOT / "src"}
        ports = {job: free_port() for job in trees}
        prom, prom_port = start_prometheus(work, ports)
        got: dict[str, list[dict]] = {job: [] for job in trees}
        for _ in range(rounds):
            for job, src in trees.items():
                r = phase(src, job, ports[job], prom_port, crowd, seconds)
                print(job, json.dumps(r), file=sys.stderr, flush=True)
                got[job].append(r)
    finally:
        if prom is not None:
            prom.terminate()
            prom.wait(15)
        shutil.rmtree(work, ignore_errors=True)
    load = os.getloadavg()[0]
    o, b = got["ours"][-1], got["base"][-1]
    what = f"{crowd} keep-alive scrapers for {seconds:g}s + Prometheus every {SCRAPE_INTERVAL:g}s (load {load:.1f})"

    def ok_share(r: dict) -> float:
        return r["status"].get("200", 0) / max(1, r["requests"])

    return [
        result(f"{what}: Prometheus scrapes that succeeded (ours {o['prom_up']}/{o['prom_scrapes']}, "
               f"base {b['prom_up']}/{b['prom_scrapes']})", o["prom_up"] / max(1, o["prom_scrapes"]),
               b["prom_up"] / max(1, b["prom_scrapes"]), f"BASE {base}", "every scrape up", unit="ratio",
               passed=o["prom_up"] == o["prom_scrapes"] > 0),
        result(f"{what}: Prometheus scrape_duration_seconds p99 (max ours {o['prom_max']:.3f}s, "
               f"base {b['prom_max']:.3f}s)", o["prom_p99"], b["prom_p99"], f"BASE {base}",
               f"< scrape_timeout {SCRAPE_INTERVAL:g}s", passed=o["prom_max"] < SCRAPE_INTERVAL),
        result(f"{what}: crowd requests answered 200 (ours {o['status']}, {o['failed']} failed; "
               f"base {b['status']}, {b['failed']} failed)", ok_share(o), ok_share(b), f"BASE {base}",
               "no 503", unit="ratio", passed=o["status"].get("503", 0) == 0),
        result(f"{what}: crowd request p99 (p50 ours {o['p50'] * 1e3:.0f} ms, base {b['p50'] * 1e3:.0f} ms; "
               f"requests ours {o['requests']}, base {b['requests']})", o["p99"], b["p99"], f"BASE {base}"),
    ]


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--crowd-child":
        port, n, secs = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
        print(json.dumps(asyncio.run(_crowd(port, n, secs))))
        sys.exit(0)
    ap = argparse.ArgumentParser()
    ap.add_argument("--crowd", type=int, default=500)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--base", default=BASE)
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args()
    for row in run(a.crowd, a.seconds, a.base, a.rounds):
        print(json.dumps(row))
