"""The soak (issue 26, section 5): `cachemon run` under every load at once, for 10 minutes.

Setup, all on 127.0.0.1:
- 8 fake vLLM upstreams (one child process) serve pages CONSTRUCTED from the real vLLM 0.32.0 CPU
  capture tests/fixtures/vllm-0.32.0-cpu/metrics-static-system-prompt.txt: the whole page, with
  the model-labelled families cachemon reads (eras.wanted_stems) repeated for more model names
  until each page carries >= 300 such series; counters grow with time (same factor for hits and
  queries, so every page is a valid next poll). /version and /v1/models answer too.
- 8 KV-event publishers (benchmarks/soak_kv.py, one child process): pyzmq PUB + replay ROUTER per
  replica, vLLM 0.32.0's wire, real captured events re-encoded with fresh hashes (CONSTRUCTED, see
  there), 2 000 block events/s each.
- `cachemon run` (a subprocess) polls the upstreams every 1 s and follows the 8 event streams, with
  basic auth from a web config holding a real bcrypt hash (cost 10, exporter-toolkit's documented
  example cost).
- A scraper with the right password GETs /metrics every second (keep-alive, like Prometheus) and a
  probe GETs /-/ready every second (new connection, 1 s timeout, like the kubelet).
- Phase 1 (baseline, same run): polls only. Phase 2 (the soak): an attacker child holds 300 idle TCP
  connections (reopening any the server closes) and runs 100 clients sending wrong passwords
  (a new random one each time, so no cache helps) as fast as they are answered, and the publishers
  send their events. Then the publishers stop, drain every block they left cached, and cachemon's
  own /metrics says what its ledger applied.

Reported, each against phase 1 and beside the machine's load in that phase (the 1-minute loadavg
sampled every 5 s, which counts the soak's own processes, and the CPU the rest of the machine took,
from /proc/stat minus the soak's processes, with nproc): scraper p99 (target <= 100 ms with the
machine otherwise idle) and p50, cachemon's peak RSS from /proc (target <= 128 MB), readiness probes
that were not 200 (target 0), cachemon's CPU, and KV block events applied by the ledger vs sent.

Usage: python benchmarks/bench_soak.py --full          (= `make soak`: the full 10-minute soak)
       python benchmarks/bench_soak.py --minutes 1 --baseline-minutes 0.5   (= `make soak-short`)
       ... --src OTHER/src   runs cachemon from another tree (a before/after with the same harness)
       `make bench` runs it for CACHEMON_SOAK_MINUTES (default 2) minutes; the row says which.
"""
from __future__ import annotations

import argparse
import base64
import json
import math
import os
import re
import secrets
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from common import FIXTURES, ROOT, MachineSampler, loadavg_1m, result

PAGE = FIXTURES / "vllm-0.32.0-cpu" / "metrics-static-system-prompt.txt"
UPSTREAMS, SERIES, IDLE, BAD = 8, 300, 300, 100
FULL_MINUTES = 10.0
POLL_INTERVAL = "1s"
KV_RATE = 2000.0             # block events/s per replica (benchmarks/soak_kv.py)
USER, PASSWORD = "prometheus", "soak-right-password"
SCRAPE_TIMEOUT = 10.0
PROBE_TIMEOUT = 1.0          # the kubelet's default timeoutSeconds


# --- the fake upstreams (child process) --------------------------------------------------------

_SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$")
_SUFFIXES = ("_total", "_created", "_bucket", "_sum", "_count")


def _base(name: str) -> str:
    name = name.removeprefix("vllm:")
    for s in _SUFFIXES:
        if name.endswith(s):
            return name[: -len(s)]
    return name


def build_page_template(series: int) -> tuple[list[tuple[str, float | None, float]], int, int]:
    """[(text before the value, value or None for a comment line, growth factor)], the number of
    series cachemon reads, and the number of model names. Constructed from the real page."""
    sys.path.insert(0, str(ROOT / "src"))
    from cachemon.normalise.eras import wanted_stems

    wanted = {_base(s) for s in wanted_stems()}
    lines = PAGE.read_text().splitlines()
    # families: a HELP/TYPE header and its samples
    families: list[list[str]] = []
    for line in lines:
        if line.startswith("# HELP") or not families:
            families.append([])
        families[-1].append(line)
    per_model = sum(1 for line in lines if not line.startswith("#") and 'model_name="tiny"' in line
                    and _base(line.split("{")[0]) in wanted)
    models = ["tiny"] + [f"tiny-{i:03d}" for i in range(1, math.ceil(series / per_model))]
    out: list[tuple[str, float | None, float]] = []
    for fam in families:
        samples = [ln for ln in fam if not ln.startswith("#")]
        replicate = any('model_name="tiny"' in ln and _base(ln.split("{")[0]) in wanted for ln in samples)
        for ln in fam:
            if ln.startswith("#"):
                out.append((ln, None, 0.0))
        for k, model in enumerate(models if replicate else models[:1]):
            for ln in samples:
                m = _SAMPLE_RE.match(ln.replace('model_name="tiny"', f'model_name="{model}"'))
                if m is None:
                    continue
                name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
                grows = not name.endswith("_created") and name.endswith(("_total", "_bucket", "_sum", "_count"))
                out.append((f"{name}{labels} ", value, (1.0 + 0.1 * k) if grows else 0.0))
    return out, per_model * len(models), len(models)


def serve_upstreams(n: int, series: int) -> None:
    template, wanted, models = build_page_template(series)
    started = time.time()

    def render() -> bytes:
        # counters grow 1 %/s of their captured value (x a per-model factor): monotonic, ratios kept
        g = time.time() - started
        parts = []
        for prefix, value, factor in template:
            if value is None:
                parts.append(prefix)
            else:
                v = value * (1.0 + 0.01 * g * factor) if factor else value
                parts.append(f"{prefix}{v!r}" if factor else f"{prefix}{value!r}")
        return ("\n".join(parts) + "\n").encode()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):   # quiet
            pass

        def do_GET(self):
            if self.path.startswith("/metrics"):
                body, ctype = render(), "text/plain; version=0.0.4; charset=utf-8"
            elif self.path == "/version":
                body, ctype = b'{"version": "0.32.0"}', "application/json"
            elif self.path == "/v1/models":
                body = json.dumps({"object": "list", "data": [
                    {"id": "tiny", "object": "model", "root": "tiny", "max_model_len": 2048}]}).encode()
                ctype = "application/json"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    servers = [ThreadingHTTPServer(("127.0.0.1", 0), Handler) for _ in range(n)]
    for s in servers:
        s.daemon_threads = True
        threading.Thread(target=s.serve_forever, daemon=True).start()
    print(json.dumps({"ports": [s.server_address[1] for s in servers], "series": wanted, "models": models,
                      "page_samples": sum(1 for _, v, _ in template if v is not None)}), flush=True)
    sys.stdin.read()       # until the parent closes our stdin


# --- the attackers (child process) -------------------------------------------------------------

class _Attackers:
    """The attacker process's threads: ``idle`` connections held open (reopened when the server closes
    them: a persistent attacker) and ``bad`` clients sending wrong passwords, with their counts."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.stop = threading.Event()
        self.stats = {"idle_opened": 0, "idle_reopened": 0, "bad_requests": 0, "bad_401": 0, "bad_other": 0,
                      "bad_errors": 0}
        self.lock = threading.Lock()

    def count(self, k: str) -> None:
        with self.lock:
            self.stats[k] += 1

    def connect(self) -> socket.socket | None:
        try:
            return socket.create_connection(("127.0.0.1", self.port), timeout=5)
        except OSError:
            return None

    @staticmethod
    def _dead(s: socket.socket | None) -> bool:
        if s is None:
            return True
        try:
            r, _, _ = select.select([s], [], [], 0)
            return bool(r) and s.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def idle_holder(self, idle: int) -> None:
        socks: list[socket.socket | None] = []
        for _ in range(idle):
            socks.append(self.connect())
            self.count("idle_opened")
        print("ready", flush=True)
        while not self.stop.wait(0.5):
            for i, s in enumerate(socks):
                if self._dead(s):
                    if s is not None:
                        s.close()
                    socks[i] = self.connect()
                    self.count("idle_reopened")
        for s in socks:
            if s is not None:
                s.close()

    def bad_client(self) -> None:
        while not self.stop.is_set():
            token = base64.b64encode(f"{USER}:{secrets.token_hex(8)}".encode()).decode()
            req = (f"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Basic {token}\r\n"
                   "Connection: close\r\n\r\n").encode()
            self.count("bad_requests")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=30) as s:
                    s.sendall(req)
                    head = s.recv(64)
                    while s.recv(65536):
                        pass
                self.count("bad_401" if head.startswith(b"HTTP/1.1 401") or head.startswith(b"HTTP/1.0 401")
                           else "bad_other")
            except OSError:
                self.count("bad_errors")
                self.stop.wait(0.1)


def attack(port: int, idle: int, bad: int) -> None:
    a = _Attackers(port)
    threads = [threading.Thread(target=a.idle_holder, args=(idle,), daemon=True)]
    threads += [threading.Thread(target=a.bad_client, daemon=True) for _ in range(bad)]
    for t in threads:
        t.start()
    sys.stdin.read()       # until the parent closes our stdin
    a.stop.set()
    time.sleep(0.5)
    with a.lock:
        print(json.dumps(a.stats), flush=True)


# --- the measured run ------------------------------------------------------------------------

def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(port: int, pid: int, seconds: float, ours: dict[str, int]) -> dict:
    """The scraper, the probe, the RSS sampler and the machine's load for `seconds`. `ours`: the pids
    of the soak's own processes (the rest of the machine's CPU is other users')."""
    import requests

    started = time.monotonic()
    stop_at = started + seconds
    lat: list[float] = []
    when: list[tuple[float, float]] = []         # (seconds into the phase, latency): where the tail is
    scrape_fail = [0]
    probes = {"ok": 0, "bad": 0}
    rss: list[float] = []
    machine = MachineSampler(list(ours.values()))

    def scraper() -> None:
        sess = requests.Session()
        sess.auth = (USER, PASSWORD)
        while time.monotonic() < stop_at:
            t0 = time.perf_counter()
            try:
                r = sess.get(f"http://127.0.0.1:{port}/metrics", timeout=SCRAPE_TIMEOUT)
                ok = r.status_code == 200 and b"cachemon_upstream_up" in r.content
            except requests.RequestException:
                ok = False
            dt = time.perf_counter() - t0
            lat.append(dt if ok else max(dt, SCRAPE_TIMEOUT))     # a failed scrape counts as a timeout
            when.append((round(time.monotonic() - started - dt, 1), round(lat[-1], 4)))
            scrape_fail[0] += not ok
            time.sleep(max(0.0, 1.0 - dt))

    def prober() -> None:
        while time.monotonic() < stop_at:
            t0 = time.perf_counter()
            try:
                ok = requests.get(f"http://127.0.0.1:{port}/-/ready", timeout=PROBE_TIMEOUT).status_code == 200
            except requests.RequestException:
                ok = False
            probes["ok" if ok else "bad"] += 1
            time.sleep(max(0.0, 1.0 - (time.perf_counter() - t0)))

    threads = [threading.Thread(target=scraper), threading.Thread(target=prober)]
    for t in threads:
        t.start()
    while time.monotonic() < stop_at:
        try:
            rss.append(_rss_mb(pid))
        except OSError:
            break
        machine.tick()
        time.sleep(1.0)
    for t in threads:
        t.join()
    lat.sort()
    pct = (lambda q: lat[min(len(lat) - 1, int(q * (len(lat) - 1) + 0.5))]) if lat else (lambda _q: float("nan"))
    m = machine.summary()
    m["cores_by_process"] = {name: m["cpu_ours"].get(p, 0.0) / m["seconds"] for name, p in ours.items()}
    return {"scrapes": len(lat), "scrape_failed": scrape_fail[0], "p50": pct(0.5), "p99": pct(0.99),
            "max": lat[-1] if lat else float("nan"), "slowest": sorted(when, key=lambda w: -w[1])[:5],
            "probes_ok": probes["ok"], "probes_bad": probes["bad"],
            "rss_max": max(rss) if rss else float("nan"), "cpu_s": m["cpu_ours"].get(pid, 0.0), "machine": m}


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$", re.M)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def page_sum(page: str, name: str, **want: str) -> float:
    """The sum of `name`'s samples on a /metrics page whose labels include `want`."""
    total = 0.0
    for m in _SAMPLE.finditer(page):
        if m.group(1) == name:
            labels = dict(_LABEL.findall(m.group(2) or ""))
            if all(labels.get(k) == v for k, v in want.items()):
                total += float(m.group(3))
    return total


def kv_applied(page: str, block_size: int) -> dict:
    """What cachemon's ledger applied, from its own /metrics."""
    stored_tokens = page_sum(page, "cachemon_kv_stored_tokens_total")
    removed_events = page_sum(page, "cachemon_kv_events_total", type="removed")
    unknown = page_sum(page, "cachemon_kv_ledger_anomalies_total", kind="unknown_removed")
    return {"stored_events": page_sum(page, "cachemon_kv_events_total", type="stored"),
            "removed_events": removed_events,
            "stored_blocks": stored_tokens / block_size,
            # every removal published here names one hash (0.32.0's shape): applied = received - unplaced
            "removed_blocks": removed_events - unknown,
            "reused_tokens": page_sum(page, "cachemon_kv_reused_tokens_total"),
            "cached_blocks": page_sum(page, "cachemon_kv_cached_blocks"),
            "lost_batches": page_sum(page, "cachemon_kv_lost_batches_total"),
            "recovered_batches": page_sum(page, "cachemon_kv_recovered_batches_total"),
            "anomalies": page_sum(page, "cachemon_kv_ledger_anomalies_total"),
            "in_sync": page_sum(page, "cachemon_kv_ledger_in_sync"),
            "streams_up": page_sum(page, "cachemon_kv_stream_up")}


def wait_applied(port: int, sent: dict, block_size: int, timeout: float = 60.0) -> dict:
    """cachemon's figures once it has received every event sent (or `timeout` seconds later)."""
    import requests

    t0 = time.monotonic()
    want = sent["total"]["stored_events"] + sent["total"]["removed_events"]
    while True:
        page = requests.get(f"http://127.0.0.1:{port}/metrics", auth=(USER, PASSWORD), timeout=SCRAPE_TIMEOUT).text
        got = kv_applied(page, block_size)
        if got["stored_events"] + got["removed_events"] >= want or time.monotonic() - t0 > timeout:
            got["drain_seconds"] = time.monotonic() - t0
            return got
        time.sleep(0.5)


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in reversed(procs):
        if p.poll() is None:
            if p.stdin is not None and not p.stdin.closed:
                try:
                    p.stdin.close()
                except OSError:
                    pass
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


def soak(minutes: float, baseline_minutes: float | None = None, upstreams: int = UPSTREAMS, series: int = SERIES,
         idle: int = IDLE, bad: int = BAD, kv_rate: float = KV_RATE, src: Path = ROOT / "src") -> dict:
    import bcrypt
    import requests

    baseline_minutes = baseline_minutes if baseline_minutes is not None else max(0.5, minutes / 4)
    me = str(Path(__file__).resolve())
    work = Path(tempfile.mkdtemp(prefix="cachemon-soak-"))
    load_before = loadavg_1m()
    ups = subprocess.Popen([sys.executable, me, "--serve-upstreams", str(upstreams), str(series)],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    procs: list[subprocess.Popen] = [ups]
    try:
        info = json.loads(ups.stdout.readline())
        kvp = subprocess.Popen([sys.executable, str(Path(me).with_name("soak_kv.py")), str(upstreams), str(kv_rate)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        procs.append(kvp)
        kinfo = json.loads(kvp.stdout.readline())
        hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode().replace("$2b$", "$2y$")
        (work / "web.yml").write_text(f"basic_auth_users:\n  {USER}: '{hashed}'\n")
        (work / "cachemon.yaml").write_text("upstreams:\n" + "".join(
            f"  - name: vllm-{i}\n    url: 'http://127.0.0.1:{p}/metrics'\n"
            f"    kv_events: {{endpoint: 'tcp://127.0.0.1:{e}', replay: 'tcp://127.0.0.1:{r}', topic: kv-events, "
            f"model: tiny}}\n"
            for i, (p, e, r) in enumerate(zip(info["ports"], kinfo["pub"], kinfo["replay"], strict=True)))
            + f"poll_interval: {POLL_INTERVAL}\n")
        port = _free_port()
        log = open(work / "cachemon.log", "wb")
        env = dict(os.environ, PYTHONPATH=str(src) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        cm = subprocess.Popen([sys.executable, "-m", "cachemon.cli", "run", "--config", str(work / "cachemon.yaml"),
                               "--web-config-file", str(work / "web.yml"), "--listen", f"127.0.0.1:{port}"],
                              stdout=log, stderr=subprocess.STDOUT, env=env)
        procs.append(cm)
        deadline = time.monotonic() + 60
        while True:         # ready: the first poll of every upstream is done
            try:
                if requests.get(f"http://127.0.0.1:{port}/-/ready", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline or cm.poll() is not None:
                raise RuntimeError(f"cachemon never became ready: {(work / 'cachemon.log').read_text()[-2000:]}")
            time.sleep(0.2)
        page = requests.get(f"http://127.0.0.1:{port}/metrics", auth=(USER, PASSWORD), timeout=10).text
        up = len(re.findall(r'^cachemon_upstream_up\{[^}]*\} 1\.0$', page, re.M))
        if up != upstreams:
            raise RuntimeError(f"only {up} of {upstreams} upstreams up before the soak")
        exported = sum(1 for ln in page.splitlines() if ln and not ln.startswith("#"))
        ours = {"cachemon": cm.pid, "upstreams": ups.pid, "publishers": kvp.pid, "scraper+probe": os.getpid()}
        base = measure(port, cm.pid, baseline_minutes * 60, ours)
        att = subprocess.Popen([sys.executable, me, "--attack", str(port), str(idle), str(bad)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        procs.append(att)
        if att.stdout.readline().strip() != "ready":
            raise RuntimeError("the attacker did not start")
        kvp.stdin.write("go\n")
        kvp.stdin.flush()
        under = measure(port, cm.pid, minutes * 60, {**ours, "attacker": att.pid})
        kvp.stdin.write("stop\n")
        kvp.stdin.flush()
        sent = json.loads(kvp.stdout.readline())
        applied = wait_applied(port, sent, kinfo["block_size"])
        att.stdin.close()
        attack_stats = json.loads(att.stdout.readline() or "{}")
        att.wait(30)
        alive = cm.poll() is None
        return {"minutes": minutes, "baseline_minutes": baseline_minutes, "upstreams": upstreams,
                "series": info["series"], "models": info["models"], "page_samples": info["page_samples"],
                "exported_samples": exported, "baseline": base, "attack": under, "attacker": attack_stats,
                "cachemon_alive": alive, "idle": idle, "bad": bad, "kv_rate": kv_rate, "kv_sent": sent,
                "kv_applied": applied, "kv_block_size": kinfo["block_size"], "load_before": load_before,
                "poll_interval": POLL_INTERVAL, "nproc": os.cpu_count(), "src": str(src)}
    finally:
        _stop(procs)


def load_text(m: dict) -> str:
    """The machine beside a figure: 1-min loadavg over the phase, the CPU other users took, the cores."""
    mc = m["machine"]
    return (f"load {mc['load_min']:.2f}-{mc['load_max']:.2f} (1-min avg, mean {mc['load_mean']:.2f}, "
            f"{mc['load_samples']} samples), others' CPU {mc['others_cores']:.2f} of {mc['nproc']} cores")


def cores_text(m: dict) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in m["machine"]["cores_by_process"].items())


def rows(r: dict) -> list[dict]:
    b, a = r["baseline"], r["attack"]
    full = r["minutes"] >= FULL_MINUTES
    span = (f"{r['minutes']:g} min ({'the full soak' if full else 'short soak; --full for the full 10 min'})"
            f", {r['baseline_minutes']:g} min baseline first")
    what = (f"{r['upstreams']} upstreams x {r['series']} series at {r['poll_interval']} polls ({r['models']} model "
            f"names, {r['page_samples']} samples per page), {r['idle']} idle connections + {r['bad']} bad-password "
            f"clients + KV events from {r['upstreams']} replicas at {r['kv_rate']:g} block events/s each, {span}")
    la, lb = load_text(a), load_text(b)
    sent, got = r["kv_sent"]["total"], r["kv_applied"]
    sent_blocks = sent["stored_blocks"] + sent["removed_blocks"]
    got_blocks = got["stored_blocks"] + got["removed_blocks"]
    rates = r["kv_sent"]["block_events_per_s_per_replica"]
    kv_note = (f"sent {sent['stored_blocks']} stored + {sent['removed_blocks']} removed blocks "
               f"({sent['constructed_removals']} of the removals constructed: end-of-pass drains) in "
               f"{sent['messages']} messages, {min(rates):.0f}-{max(rates):.0f} block events/s per replica; "
               f"applied {got['stored_blocks']:.0f} stored + {got['removed_blocks']:.0f} removed; events received "
               f"{got['stored_events']:.0f}/{sent['stored_events']} stored, {got['removed_events']:.0f}/"
               f"{sent['removed_events']} removed; lost batches {got['lost_batches']:.0f}, recovered "
               f"{got['recovered_batches']:.0f}, ledger anomalies {got['anomalies']:.0f}, cached blocks at the end "
               f"{got['cached_blocks']:.0f} (0 expected: every pass drained), in sync {got['in_sync']:.0f}/"
               f"{r['upstreams']}, reused tokens {got['reused_tokens']:.0f}; drained {got['drain_seconds']:.1f} s "
               f"after the publishers stopped; publishers' CPU {r['kv_sent']['cpu_seconds']:.1f} s")
    note = (f"{what}. Under load: {a['scrapes']} scrapes, {a['scrape_failed']} failed, p50 {a['p50'] * 1e3:.1f} ms, "
            f"max {a['max'] * 1e3:.0f} ms; ready {a['probes_ok']} ok / {a['probes_bad']} not 200; {la}. Baseline: "
            f"{b['scrapes']} scrapes, {b['scrape_failed']} failed, p50 {b['p50'] * 1e3:.1f} ms, p99 "
            f"{b['p99'] * 1e3:.1f} ms; ready {b['probes_ok']} ok / {b['probes_bad']} not 200; {lb}. Attacker: "
            f"{json.dumps(r['attacker'])}. cachemon alive at the end: {r['cachemon_alive']}; "
            f"{r['exported_samples']} samples on its page. Load before the soak started: {r['load_before']:.2f}. "
            f"Cores used by the soak's own processes under load: {cores_text(a)}; baseline: {cores_text(b)}. "
            f"Others' CPU = the machine's busy time (/proc/stat) minus these, so it includes the kernel's "
            f"loopback network work for them: an upper bound of what other users took")
    baseline = "same scraper, same run, polls only (no attackers, no KV events)"
    return [
        result(f"soak: scraper p99 (/metrics every 1 s, right password), {what}", a["p99"], b["p99"], baseline,
               "<= 100 ms (machine otherwise idle)", passed=a["p99"] <= 0.1 and r["cachemon_alive"], note=note),
        result("soak: scraper p50", a["p50"], b["p50"], baseline, "-", note=la),
        result("soak: cachemon peak RSS", a["rss_max"], b["rss_max"], baseline, "<= 128 MB", unit="MB",
               passed=a["rss_max"] <= 128, note=la),
        result("soak: /-/ready probes not 200 (1 s timeout)", float(a["probes_bad"]), float(b["probes_bad"]),
               baseline, "0 (always 200)", unit="probes", passed=a["probes_bad"] == 0 and a["probes_ok"] > 0,
               note=la),
        result("soak: cachemon CPU, % of one core", 100 * a["cpu_s"] / a["machine"]["seconds"],
               100 * b["cpu_s"] / b["machine"]["seconds"], baseline, "-", unit="%",
               note=f"{a['cpu_s']:.1f} CPU s in {a['machine']['seconds']:.0f} s (baseline {b['cpu_s']:.1f} s in "
                    f"{b['machine']['seconds']:.0f} s); {la}"),
        result("soak: KV block events applied by the ledger / sent", float(got_blocks), float(sent_blocks),
               "the publishers' count", "all, 0 lost, 0 anomalies", unit="block events",
               passed=got_blocks == sent_blocks and got["lost_batches"] == 0 and got["anomalies"] == 0,
               note=f"{kv_note}; {la}"),
    ]


def run(minutes: float | None = None) -> list[dict]:
    """`make bench`: CACHEMON_SOAK_MINUTES (default 2) minutes of load."""
    m = minutes if minutes is not None else float(os.environ.get("CACHEMON_SOAK_MINUTES", "2"))
    return rows(soak(m))


def main() -> int:
    ap = argparse.ArgumentParser(description="cachemon soak: polls, idle connections, bad passwords, KV events")
    ap.add_argument("--full", action="store_true", help="the full soak of issue 26: every default, 10 minutes")
    ap.add_argument("--minutes", type=float, default=FULL_MINUTES, help="the loaded phase (default: the full 10)")
    ap.add_argument("--baseline-minutes", type=float, help="polls-only phase first (default: minutes/4, >= 0.5)")
    ap.add_argument("--upstreams", type=int, default=UPSTREAMS, help="upstreams, and KV-event replicas")
    ap.add_argument("--series", type=int, default=SERIES)
    ap.add_argument("--idle", type=int, default=IDLE)
    ap.add_argument("--bad", type=int, default=BAD)
    ap.add_argument("--kv-rate", type=float, default=KV_RATE, help="block events/s per replica")
    ap.add_argument("--src", type=Path, default=ROOT / "src",
                    help="run cachemon from this tree (e.g. an older commit's src, for a before/after)")
    ap.add_argument("--json", help="also write the raw figures here")
    a = ap.parse_args()
    if a.full:
        a.minutes, a.upstreams, a.series, a.idle, a.bad, a.kv_rate = (FULL_MINUTES, UPSTREAMS, SERIES, IDLE, BAD,
                                                                       KV_RATE)
    res = soak(a.minutes, a.baseline_minutes, a.upstreams, a.series, a.idle, a.bad, a.kv_rate, a.src)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2))
    ok = True
    rs = rows(res)
    for row in rs:
        def show(v: float, unit: str = row["unit"]) -> str:
            return f"{v * 1e3:.1f} ms" if unit == "s" else f"{v:.1f} {unit}"
        print(f"{row['work'][:120]}: {show(row['cachemon'])} (baseline {show(row['baseline'])}), target "
              f"{row['target']}: {({True: 'ok', False: 'FAIL', None: '-'})[row['passed']]}")
        if row["note"] and row is not rs[0]:
            print(f"    {row['note']}")
        ok &= row["passed"] is not False
    print(rs[0]["note"])
    print(f"cachemon from {res['src']}")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve-upstreams":
        serve_upstreams(int(sys.argv[2]), int(sys.argv[3]))
        sys.exit(0)
    if len(sys.argv) > 1 and sys.argv[1] == "--attack":
        attack(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
        sys.exit(0)
    sys.exit(main())
