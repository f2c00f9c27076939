"""`make demo-stack`: the demo, a real Prometheus with the shipped rules and a real Alertmanager.

Starts `cachemon demo` (the fake vLLM on :18000, cachemon on :9867), Prometheus (:9090) scraping
both with prometheus/recording_rules.yaml and alerts/cachemon-alerts.yaml, and Alertmanager (:9093)
with examples/alertmanager.yml, whose webhook receiver (the compose demo's cachemon:5001) is here
a listener of this script (:5001) that prints every notification. The critical hit-ratio alert fires
during the demo's timestamp phase (docs/demo.md says when). Binaries: Debian's `prometheus` and
`prometheus-alertmanager` packages, or PROMETHEUS= / ALERTMANAGER= paths; with Docker or Podman,
deploy/compose/demo.yaml adds Grafana.

``--time-scale F`` (tests): every phase of the demo AND every duration in copies of the rules
(rate windows, ``for:``, offsets) and of the Alertmanager timings is multiplied by F, with 1 s
scrapes, so the whole story plays F times as fast. The shipped files are never changed.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from cachemon.demo.webhook import AlertWebhook

ROOT = Path(__file__).resolve().parents[1]
RULES = (ROOT / "prometheus" / "recording_rules.yaml", ROOT / "alerts" / "cachemon-alerts.yaml")
AM_CONFIG = ROOT / "examples" / "alertmanager.yml"
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
DURATION = re.compile(r"(?P<pre>\[|offset |for: |group_wait: |group_interval: |repeat_interval: )"
                      r"(?P<n>\d+)(?P<u>[smhd])\b")


def scaled(text: str, scale: float) -> str:
    """Every rule window, offset, ``for:`` and Alertmanager timing multiplied by ``scale`` (>= 1s)."""
    if scale == 1:
        return text

    def one(m: re.Match) -> str:
        seconds = max(1, round(int(m["n"]) * UNITS[m["u"]] * scale))
        return f"{m['pre']}{seconds}s"
    return DURATION.sub(one, text)


def binary(env: str, *names: str) -> str | None:
    if os.environ.get(env):
        return os.environ[env]
    return next((p for p in map(shutil.which, names) if p), None)


def prometheus_config(cachemon: int, vllm: int, alertmanager: int, rules: list[Path], interval: str) -> str:
    return "\n".join([
        "# Written by scripts/demo_stack.py for the demo; production: prometheus/prometheus-static.yml",
        "global:", f"  scrape_interval: {interval}", f"  evaluation_interval: {interval}",
        "rule_files:", *[f"- {p}" for p in rules],
        "alerting:", "  alertmanagers:", "  - static_configs:", f"    - targets: ['127.0.0.1:{alertmanager}']",
        "scrape_configs:",
        "- job_name: cachemon", "  static_configs:", f"  - targets: ['127.0.0.1:{cachemon}']",
        "- job_name: vllm", "  static_configs:", f"  - targets: ['127.0.0.1:{vllm}']", ""])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/demo_stack.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--cachemon-port", type=int, default=9867)
    ap.add_argument("--vllm-port", type=int, default=18000)
    ap.add_argument("--prometheus-port", type=int, default=9090)
    ap.add_argument("--alertmanager-port", type=int, default=9093)
    ap.add_argument("--webhook-port", type=int, default=5001)
    ap.add_argument("--duration", type=float, default=None, help="seconds; default until Ctrl-C")
    args = ap.parse_args(argv)
    prom = binary("PROMETHEUS", "prometheus")
    am = binary("ALERTMANAGER", "alertmanager", "prometheus-alertmanager")
    if not prom or not am:
        missing = " and ".join(n for n, b in (("prometheus", prom), ("alertmanager", am)) if not b)
        print(f"demo-stack: {missing} not found. Debian/Ubuntu: sudo apt-get install prometheus "
              "prometheus-alertmanager (or set PROMETHEUS=/path ALERTMANAGER=/path); with Docker or Podman: "
              "docker compose -f deploy/compose/demo.yaml up", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="cachemon-demo-stack-"))
    rules = []
    for src in RULES:
        dst = work / src.name
        dst.write_text(scaled(src.read_text(encoding="utf-8"), args.time_scale), encoding="utf-8")
        rules.append(dst)
    interval = "1s" if args.time_scale < 1 else "5s"
    (work / "prometheus.yml").write_text(prometheus_config(args.cachemon_port, args.vllm_port,
                                                           args.alertmanager_port, rules, interval))
    am_text = scaled(AM_CONFIG.read_text(encoding="utf-8"), args.time_scale)
    am_text = am_text.replace("http://cachemon:5001/", f"http://127.0.0.1:{args.webhook_port}/")
    (work / "alertmanager.yml").write_text(am_text)
    AlertWebhook("127.0.0.1", args.webhook_port, lambda line: print(line, flush=True))
    procs: list[subprocess.Popen] = []
    logs = {name: open(work / f"{name}.log", "w") for name in ("prometheus", "alertmanager")}  # noqa: SIM115
    try:
        procs.append(subprocess.Popen(
            [sys.executable, "-u", "-m", "cachemon.cli", "demo", f"--listen=127.0.0.1:{args.cachemon_port}",
             f"--vllm-listen=127.0.0.1:{args.vllm_port}", f"--time-scale={args.time_scale}"]))
        procs.append(subprocess.Popen(
            [am, f"--config.file={work / 'alertmanager.yml'}", f"--storage.path={work / 'am'}",
             f"--web.listen-address=127.0.0.1:{args.alertmanager_port}", "--cluster.listen-address="],
            stdout=logs["alertmanager"], stderr=subprocess.STDOUT))
        procs.append(subprocess.Popen(
            [prom, f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{args.prometheus_port}"],
            stdout=logs["prometheus"], stderr=subprocess.STDOUT))
        p = args.prometheus_port
        print("\n".join([
            "demo-stack: where to look",
            f"  Prometheus alerts:   http://127.0.0.1:{p}/alerts",
            f"  hit ratio (5m):      http://127.0.0.1:{p}/graph?g0.expr=model_instance%3Acachemon_prefix_cache_"
            "hit_tokens_per_query_tokens%3Aratio_rate5m&g0.range_input=30m",
            f"  Alertmanager:        http://127.0.0.1:{args.alertmanager_port}",
            f"  cachemon /metrics:   http://127.0.0.1:{args.cachemon_port}/metrics",
            "  notifications:       printed here, as NOTIFICATION lines (examples/alertmanager.yml's webhook)",
            f"  files and logs:      {work}",
            "  Grafana (Docker/Podman): docker compose -f deploy/compose/demo.yaml up -> http://127.0.0.1:3000",
            f"The critical alert fires about {7 * args.time_scale:.2g} minutes into the timestamp phase.",
        ]), flush=True)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        deadline = None if args.duration is None else time.monotonic() + args.duration
        while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
            if any(pr.poll() is not None for pr in procs):
                print(f"demo-stack: a process ended; logs in {work}", file=sys.stderr)
                return 1
            stop.wait(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        for pr in reversed(procs):
            if pr.poll() is None:
                pr.send_signal(signal.SIGINT)
        for pr in procs:
            try:
                pr.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pr.kill()
        for fh in logs.values():
            fh.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
