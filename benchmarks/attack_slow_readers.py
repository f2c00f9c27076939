"""Slow readers (issue 38): connections that pipeline GET /metrics and never read a reply.

Everything on 127.0.0.1, every process stopped at the end:
- the listener (web/workers.py's ``make_server``) in a child process of its own, serving a page
  CONSTRUCTED here (one gauge family of ``rows`` label sets, ~75 B a row: 3 000 rows are ~225 KB,
  the size of `cachemon run`'s page in the soak), so its peak RSS (VmHWM, /proc) is the listener's;
- ``procs`` attacker processes holding ``connections`` connections between them: each writes
  pipelined ``GET /metrics`` requests whenever its socket takes them, never reads, and reopens a
  connection the server closed, for ``seconds`` seconds;
- this process is the victim side: a scraper (keep-alive, like Prometheus, 5 s timeout) GETs
  /metrics every second and a probe (new connection, 1 s timeout, like the kubelet) GETs /-/ready
  every second.

Reported: scrapes that failed, probes that were not 200 (and the longest run of them in a row: 3
make a kubelet mark the pod unready), the listener's RSS before the attack and its peak, its CPU,
and the 1-minute load average over the run. ``--src`` runs the listener from another tree (e.g.
/work/main/src) for a before/after in the same run.

Usage: python benchmarks/attack_slow_readers.py [--connections 1100] [--seconds 20] [--src DIR ...]
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import selectors
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve()
SRC = HERE.parent.parent / "src"
ROWS = 3000
REQUEST = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
SCRAPE_TIMEOUT = 5.0
PROBE_TIMEOUT = 1.0


# --- the listener (child process) ----------------------------------------------------------------

def serve(rows: int) -> None:
    from cachemon.expose.render import Family
    from cachemon.web.workers import Registry, make_server, serve_in_thread

    class ConstructedRows:
        """CONSTRUCTED: one gauge family of `rows` label sets."""

        def collect(self):
            f = Family("attack_constructed_rows", "gauge", "Constructed rows, a page of a realistic size.")
            for i in range(rows):
                f.add(f'model_name="model-{i % 50:02d}",row="{i:06d}"', float(i))
            yield f

    reg = Registry()
    reg.register(ConstructedRows())
    server = make_server("127.0.0.1", 0, reg)
    serve_in_thread(server)
    print(json.dumps({"port": server.server_address[1]}), flush=True)
    sys.stdin.read()          # until the parent closes our stdin
    server.shutdown()
    server.server_close()


# --- the attackers (child processes) ---------------------------------------------------------------

def attack(port: int, connections: int, seconds: float) -> None:
    """Hold `connections` connections writing pipelined requests, never reading, for `seconds`."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < connections + 64:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, connections + 64), hard))
    burst = REQUEST * 256
    sel = selectors.DefaultSelector()
    stats = {"opened": 0, "reopened": 0, "requests_sent": 0, "send_errors": 0}

    def open_one() -> None:
        s = socket.socket()
        s.setblocking(False)
        err = s.connect_ex(("127.0.0.1", port))
        if err not in (0, errno.EINPROGRESS):
            s.close()
            stats["send_errors"] += 1
            return
        sel.register(s, selectors.EVENT_WRITE, [0])       # [bytes of the burst already sent]
        stats["opened"] += 1

    for _ in range(connections):
        open_one()
    print("ready", flush=True)
    stop_at = time.monotonic() + seconds
    while time.monotonic() < stop_at:
        for key, _ in sel.select(0.2):
            s, offset = key.fileobj, key.data
            assert isinstance(s, socket.socket)
            try:
                n = s.send(burst[offset[0]:] if offset[0] else burst)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:                  # closed by the server: reopen, a persistent attacker
                stats["send_errors"] += 1
                sel.unregister(s)
                s.close()
                stats["reopened"] += 1
                open_one()
                continue
            sent = offset[0] + n
            stats["requests_sent"] += sent // len(REQUEST) - offset[0] // len(REQUEST)
            offset[0] = sent % len(burst)
        missing = connections - len(sel.get_map())
        for _ in range(max(0, missing)):
            open_one()
    for key in list(sel.get_map().values()):
        key.fileobj.close()       # type: ignore[union-attr]
    print(json.dumps(stats), flush=True)


# --- the victim side: scraper, probe, RSS --------------------------------------------------------

def _status_kb(pid: int, field: str) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return float(line.split()[1])
    return 0.0


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _loadavg() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def _scraper(base: str, rows: int, stop_at: float, scrapes: list[tuple[bool, float]]) -> None:
    """A keep-alive scraper once a second: (whole page?, seconds) per scrape."""
    import requests
    sess = requests.Session()
    while time.monotonic() < stop_at:
        t0 = time.perf_counter()
        try:
            r = sess.get(f"{base}/metrics", timeout=SCRAPE_TIMEOUT)
            # the whole page: every constructed row (the listener's own counters come and go)
            ok = r.status_code == 200 and r.content.count(b"\nattack_constructed_rows{") == rows
        except requests.RequestException:
            ok = False
        dt = time.perf_counter() - t0
        scrapes.append((ok, dt))
        time.sleep(max(0.0, 1.0 - dt))


def _prober(base: str, stop_at: float, probes: list[bool]) -> None:
    """A readiness probe once a second, each on a new connection."""
    import requests
    while time.monotonic() < stop_at:
        t0 = time.perf_counter()
        try:
            ok = requests.get(f"{base}/-/ready", timeout=PROBE_TIMEOUT).status_code == 200
        except requests.RequestException:
            ok = False
        probes.append(ok)
        time.sleep(max(0.0, 1.0 - (time.perf_counter() - t0)))


def _worst_run(probes: list[bool]) -> int:
    """The longest run of failed probes in a row (the pod goes unready after a few)."""
    worst = run = 0
    for ok in probes:
        run = 0 if ok else run + 1
        worst = max(worst, run)
    return worst


def run_attack(connections: int = 1100, seconds: float = 20.0, procs: int = 2, rows: int = ROWS,
               src: str | Path = SRC, settle: float = 2.0) -> dict:
    """One run: the listener from `src`, `connections` slow readers in `procs` processes for
    `seconds`, a scraper and a probe meanwhile. Returns the figures (see the module docstring)."""
    import requests

    env = dict(os.environ, PYTHONPATH=str(src))
    server = subprocess.Popen([sys.executable, str(HERE), "--serve", str(rows)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env)
    attackers: list[subprocess.Popen] = []
    try:
        port = json.loads(server.stdout.readline())["port"]       # type: ignore[union-attr]
        base = f"http://127.0.0.1:{port}"
        page = requests.get(f"{base}/metrics", timeout=SCRAPE_TIMEOUT)
        page.raise_for_status()
        rss_before = _status_kb(server.pid, "VmRSS") / 1024
        cpu0 = _cpu_s(server.pid)
        share = [connections // procs + (i < connections % procs) for i in range(procs)]
        for n in share:
            attackers.append(subprocess.Popen([sys.executable, str(HERE), "--attack", str(port), str(n),
                                               str(seconds)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                              text=True))
        for a in attackers:
            if a.stdout.readline().strip() != "ready":        # type: ignore[union-attr]
                raise RuntimeError("an attacker did not start")
        time.sleep(settle)           # let the attack take hold before measuring
        stop_at = time.monotonic() + max(1.0, seconds - settle - 1.0)
        scrapes: list[tuple[bool, float]] = []
        probes: list[bool] = []
        loads: list[float] = []

        threads = [threading.Thread(target=_scraper, args=(base, rows, stop_at, scrapes)),
                   threading.Thread(target=_prober, args=(base, stop_at, probes))]
        for t in threads:
            t.start()
        while time.monotonic() < stop_at:
            loads.append(_loadavg())
            time.sleep(1.0)
        for t in threads:
            t.join()
        rss_peak = _status_kb(server.pid, "VmHWM") / 1024
        cpu = _cpu_s(server.pid) - cpu0
        attack_stats = [json.loads(a.stdout.readline() or "{}") for a in attackers]    # type: ignore[union-attr]
        alive = server.poll() is None
        worst_run = _worst_run(probes)
        lat = sorted(dt for ok, dt in scrapes if ok)
        return {"src": str(src), "connections": connections, "procs": procs, "seconds": seconds, "rows": rows,
                "page_bytes": len(page.content), "scrapes": len(scrapes),
                "scrapes_failed": sum(not ok for ok, _ in scrapes),
                "scrape_p50": lat[len(lat) // 2] if lat else None, "scrape_max": lat[-1] if lat else None,
                "probes": len(probes), "probes_failed": sum(not ok for ok in probes),
                "probes_failed_in_a_row": worst_run, "rss_before_mb": round(rss_before, 1),
                "rss_peak_mb": round(rss_peak, 1), "cpu_s": round(cpu, 1), "listener_alive": alive,
                "load_1m": [min(loads, default=_loadavg()), max(loads, default=_loadavg())],
                "attackers": attack_stats}
    finally:
        for a in attackers:
            if a.poll() is None:
                a.kill()
            a.wait(10)
        if server.stdin is not None:
            server.stdin.close()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(5)


def main() -> int:
    ap = argparse.ArgumentParser(description="slow readers: pipelining GET /metrics, never reading")
    ap.add_argument("--connections", type=int, default=1100)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--procs", type=int, default=2, help="attacker processes")
    ap.add_argument("--rows", type=int, default=ROWS, help="rows on the served page (constructed)")
    ap.add_argument("--src", action="append", help="the tree(s) to run the listener from (default: this one)")
    a = ap.parse_args()
    for src in a.src or [str(SRC)]:
        print(json.dumps(run_attack(a.connections, a.seconds, a.procs, a.rows, src)), flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve(int(sys.argv[2]))
        sys.exit(0)
    if len(sys.argv) > 1 and sys.argv[1] == "--attack":
        attack(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
        sys.exit(0)
    sys.exit(main())
