"""Log-source benchmarks (issue 3).

The log is GENERATED here (constructed, not captured): lines shaped like a real vLLM
0.32.0 server's output (tests/fixtures/vllm-0.32.0-cpu/server.log): uvicorn access lines,
"Added request" lines, warnings, request-log lines, and its real stats lines.

- tailer throughput on lines that are not stats lines (target >= 1 M lines/s)
- a realistic mixed log through the whole log source vs a naive tailer in the style of the
  common blog exporter: readline + regex per line + prometheus_client Counter.inc()
  per line, measured in the same run (target >= 3x)
- idle CPU of a real `cachemon run --log-file` process tailing a quiet file for 10 s
  (target < 1 % of a core), from /proc/<pid>/stat
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from common import FIXTURES, median_seconds, result

REAL_STATS = [line for line in (FIXTURES / "vllm-0.32.0-cpu" / "server.log").read_text().splitlines()
              if "] Engine 000:" in line]
NOISE = [
    'INFO:     127.0.0.1:{n} - "POST /v1/chat/completions HTTP/1.1" 200 OK',
    "(APIServer pid=22255) INFO 11-29 15:56:48 [async_llm.py:578] Added request chatcmpl-{n:016x}-93159474.",
    'INFO:     127.0.0.1:{n} - "GET /metrics HTTP/1.1" 200 OK',
    "(APIServer pid=22255) WARNING 11-29 15:56:48 [serving.py:210] request chatcmpl-{n:016x} took longer than expected",
    "(APIServer pid=22255) INFO 11-29 15:56:48 [request_logger.py:65] Received request chatcmpl-{n:016x}: "
    "params: SamplingParams(n=1, temperature=0.0, top_p=1.0, max_tokens=4), lora_request: None.",
]


def generate(path: Path, lines: int, stats_every: int | None) -> int:
    """Write the log in slices (bounded memory); returns how many stats lines it holds."""
    n_stats = 0
    with open(path, "w") as f:
        for start in range(0, lines, 10_000):
            out = []
            for i in range(start, min(lines, start + 10_000)):
                if stats_every and i % stats_every == stats_every - 1:
                    out.append(REAL_STATS[i % len(REAL_STATS)])
                    n_stats += 1
                else:
                    out.append(NOISE[i % len(NOISE)].format(n=40000 + i))
            f.write("\n".join(out) + "\n")
    return n_stats


def tail_with_cachemon(path: Path):
    from cachemon.runtime.logsource import LogSource
    from cachemon.sources.logs.settings import LogConfig, LogFileSpec
    from cachemon.state.store import Store

    cfg = LogConfig(files=[LogFileSpec(str(path), "bench")], from_beginning=True, state_file="",
                    watch_events=False)
    src = LogSource(cfg, Store({"1m": 60.0}))
    while src.poll():
        pass
    s = src.entries[0].stream
    for e in src.entries:
        e.follower.close()
    return s


_NAIVE_RX = re.compile(r"Engine (\d+): Avg prompt throughput: ([\d.]+) tokens/s, .*?Running: (\d+) reqs, "
                       r"Waiting: (\d+) reqs, .*?KV cache usage: ([\d.]+)%(?:, Prefix cache hit rate: ([\d.]+)%)?")


def tail_naive(path: Path):
    """The blog-exporter pattern: a text readline loop, one regex per line, Counter.inc() per line."""
    from prometheus_client import CollectorRegistry, Counter, Gauge

    reg = CollectorRegistry()
    lines = Counter("log_lines", "lines", ["outcome"], registry=reg)
    kv = Gauge("kv_usage", "kv", ["engine"], registry=reg)
    hit = Gauge("hit_rate", "hit", ["engine"], registry=reg)
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = _NAIVE_RX.search(line)
            if m:
                kv.labels(m.group(1)).set(float(m.group(5)) / 100)
                if m.group(6):
                    hit.labels(m.group(1)).set(float(m.group(6)) / 100)
                lines.labels("parsed").inc()
            else:
                lines.labels("unmatched").inc()
    return reg


def bench_throughput(tmp: Path):
    n = 500_000
    plain = tmp / "plain.log"
    generate(plain, n, None)
    s = tail_with_cachemon(plain)
    assert s.lines["unmatched"] == n, s.lines
    t = median_seconds(lambda: tail_with_cachemon(plain), repeat=5)
    rate = n / t
    rows = [result(f"tail {n} non-stats vLLM log lines ({plain.stat().st_size // 2**20} MiB)", t / n,
                   unit="s/line", target=">= 1 M lines/s", passed=rate >= 1e6,
                   note=f"{rate / 1e6:.2f} M lines/s")]
    mixed = tmp / "mixed.log"
    n_stats = generate(mixed, n, 100)          # one stats line per 100 (busy server, chatty access log)
    s = tail_with_cachemon(mixed)
    assert s.stats_lines == n_stats and s.lines["malformed"] == 0, s.lines
    ours = median_seconds(lambda: tail_with_cachemon(mixed), repeat=5)
    base = median_seconds(lambda: tail_naive(mixed), repeat=3)
    rows.append(result(f"realistic mixed log, {n} lines, 1 % stats lines, whole log source", ours / n,
                       base / n, "readline + regex + Counter.inc() per line", ">= 3x", unit="s/line",
                       passed=base / ours >= 3, note=f"cachemon {n / ours / 1e6:.2f} M lines/s, "
                                                     f"naive {n / base / 1e6:.2f} M lines/s"))
    return rows


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")   # utime + stime


def bench_idle_cpu(tmp: Path, seconds: float = 10.0):
    import socket
    log = tmp / "quiet.log"
    log.write_text(REAL_STATS[0] + "\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "cachemon.cli", "run", "--listen", f"127.0.0.1:{port}",
                             "--log-file", str(log), "--state-file", str(tmp / "state.json")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
                break
            except OSError:
                time.sleep(0.1)
        time.sleep(1.0)                       # past start-up
        c0, t0 = _cpu_seconds(proc.pid), time.monotonic()
        time.sleep(seconds)
        c1, t1 = _cpu_seconds(proc.pid), time.monotonic()
    finally:
        proc.terminate()
        proc.wait(10)
    frac = (c1 - c0) / (t1 - t0)
    return result(f"idle CPU of `cachemon run --log-file` on a quiet file ({seconds:.0f} s, poll 250 ms)",
                  frac * 100, unit="% of a core", target="< 1 %", passed=frac < 0.01,
                  note=f"{(c1 - c0) * 1000:.0f} ms CPU in {t1 - t0:.1f} s")


def run():
    with tempfile.TemporaryDirectory(prefix="cachemon-bench-logs-") as d:
        tmp = Path(d)
        return bench_throughput(tmp) + [bench_idle_cpu(tmp)]


if __name__ == "__main__":
    for r in run():
        print(r)
