#!/usr/bin/env python3
"""End-to-end check of cachemon against a real vLLM (CPU build). Entry point: scripts/e2e-vllm.

Starts a real vLLM server (tiny model written locally, dummy weights, prefix caching on),
`cachemon run` on its /metrics and its log file, and a real Prometheus with a test copy
of cachemon's rules (short windows, see prom.py); drives the scenarios of scenarios.py;
asserts each result as a named check; prints a report; exits 1 on any FAIL (and on any
SKIP unless --allow-missing), 2 if the harness itself could not run.

Only 127.0.0.1 is used. Every child runs in its own process group and is stopped in
``finally`` and on SIGINT/SIGTERM/SIGHUP and on the global --timeout.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))

import prom  # noqa: E402
import requests  # noqa: E402
import scenarios as S  # noqa: E402
from procs import Procs, free_port, pick, wait_for  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from report import Report  # noqa: E402

try:
    from cachemon.tools.capture import CaptureError, VllmClient, build_request, cached_tokens
except ImportError as e:   # pragma: no cover - the wrapper checks this first
    sys.exit(f"e2e: cannot import cachemon ({e}); install it first: pip install -e '.[dev]'")

MODEL_SRC = ROOT / "tests" / "fixtures" / "vllm-0.32.0-cpu" / "model"
MODEL_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "config.json")
STATS_RE = re.compile(r"Prefix cache hit rate: ([0-9.]+)%")
BLOCK_SIZE = 128


class Aborted(Exception):
    pass


class RunTimeout(BaseException):
    """The global --timeout; a BaseException so that no `except Exception` in a wait loop swallows it."""


def has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def parse_samples(text: str) -> list[tuple[str, dict, float]]:
    out = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.append((s.name, s.labels, s.value))
    return out


class Harness:
    def __init__(self, args):
        self.args = args
        self.work = Path(args.workdir).resolve()
        self.report = Report(strict=not args.allow_missing)
        self.procs = Procs()
        self.vllm = self.cachemon = self.prometheus = None
        self.vllm_port, self.cm_port, self.prom_port = free_port(), free_port(), free_port()
        self.api = f"http://127.0.0.1:{self.vllm_port}"
        self.client = VllmClient(self.api, timeout=120.0)
        self.cm_url = f"http://127.0.0.1:{self.cm_port}/metrics"
        self.promapi = prom.PromAPI(f"http://127.0.0.1:{self.prom_port}")
        self.log = self.work / "vllm-server.log"
        self.model_dir = self.work / "model"
        self.segments: list[list[dict]] = [[]]     # requests per vLLM process lifetime (cache state)
        self.analyze_extra: list[list[dict]] = [[]]  # requests sent by tools (warmup) in that lifetime
        self.offset = {"hit": 0.0, "query": 0.0}   # vLLM counters of earlier process lifetimes
        self.seq = {}                              # scenario -> next request index
        self.rules_info: dict = {}
        self.features = {
            "log source": has("cachemon.runtime.logsource"),
            "warmup": has("cachemon.tools.warmup_command"),
            "analyze": has("cachemon.analyze.command"),
            "alert rules": any(ROOT.joinpath("alerts").glob("*.y*ml")),
            "recording rules": any(ROOT.joinpath("prometheus").glob("*.y*ml")),
            "dashboards": any(ROOT.joinpath("dashboards").glob("*.json")),
        }
        self.requests_file = None

    # ------------------------------------------------------------------ processes
    def write_model(self) -> None:
        """The tiny model: the exact tokenizer of the recorded fixtures + a tiny Llama config (weights: dummy)."""
        self.model_dir.mkdir(parents=True, exist_ok=True)
        for name in MODEL_FILES:
            src = MODEL_SRC / name
            if not src.is_file():
                raise Aborted(f"{src} is missing: the e2e model comes from the repo's fixtures")
            shutil.copyfile(src, self.model_dir / name)

    def vllm_env(self) -> dict:
        env = dict(os.environ)
        env.update({
            "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOG_STATS_INTERVAL": "2", "VLLM_SERVER_DEV_MODE": "1",
            "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost", "PYTHONUNBUFFERED": "1",
        })
        return env

    def start_vllm(self, append: bool) -> float:
        argv = [self.args.vllm_python, "-m", "vllm.entrypoints.openai.api_server",
                "--model", str(self.model_dir), "--load-format", "dummy", "--served-model-name", "tiny",
                "--enable-prefix-caching", "--enable-prompt-tokens-details", "--enable-log-requests",
                "--max-model-len", "4096", "--dtype", "bfloat16", "--host", "127.0.0.1", "--port", str(self.vllm_port)]
        t0 = time.monotonic()
        self.vllm = self.procs.start("vllm", argv, self.log, env=self.vllm_env(), cwd=self.work,
                                     stop_signal=signal.SIGINT, stop_timeout=30.0, append=append)
        try:
            wait_for(lambda: requests.get(self.api + "/v1/models", timeout=2).status_code == 200,
                     self.args.start_timeout, 1.0, "vLLM ready", alive=self.vllm.alive)
        except (TimeoutError, RuntimeError) as e:
            tail = self.log.read_text(errors="replace").splitlines()[-25:]   # start-up only: no prompts yet
            raise Aborted(f"{e}; last lines of {self.log}:\n    " + "\n    ".join(tail)) from e
        return time.monotonic() - t0

    def start_cachemon(self) -> None:
        exe = shutil.which("cachemon", path=str(Path(sys.executable).parent)) or None
        argv = ([exe] if exe else [sys.executable, "-m", "cachemon.cli"]) + [
            "run", "--upstream", f"vllm=http://127.0.0.1:{self.vllm_port}/metrics",
            "--listen", f"127.0.0.1:{self.cm_port}", "--poll-interval", "1s",
            "--window", "1m", "--window", "5m", "--window", S.SHORT_WINDOW]
        cfg = S.cachemon_config()
        if cfg:
            (self.work / "cachemon.yaml").write_text(cfg, encoding="utf-8")
            argv += ["--config", str(self.work / "cachemon.yaml")]
        if self.features["log source"]:
            argv += ["--log-file", str(self.log), "--from-beginning", "--state-file", str(self.work / "log-state.json")]
        self.cachemon = self.procs.start("cachemon", argv, self.work / "cachemon.log", cwd=self.work)
        try:
            wait_for(lambda: "cachemon_upstream_up" in requests.get(self.cm_url, timeout=2).text, 30, 0.5,
                     "cachemon serving", alive=self.cachemon.alive)
        except (TimeoutError, RuntimeError) as e:
            raise Aborted(f"{e}; see {self.work / 'cachemon.log'}") from e

    def start_prometheus(self) -> None:
        binary = self.args.prometheus
        rules_dir = self.work / "rules"
        self.rules_info = prom.rewrite_rules([ROOT / "alerts", ROOT / "prometheus"], rules_dir)
        promtool = shutil.which("promtool") or str(Path(binary).with_name("promtool"))
        if self.rules_info["files"] and Path(promtool).exists():
            res = subprocess.run([promtool, "check", "rules", *map(str, self.rules_info["files"])],
                                 capture_output=True, text=True, timeout=60)
            self.report.check("prometheus.test-rules-valid", res.returncode == 0,
                              f"promtool check rules on {len(self.rules_info['files'])} rewritten files"
                              + ("" if res.returncode == 0 else ": " + res.stdout[-300:] + res.stderr[-300:]))
        cfg = self.work / "prometheus.yml"
        prom.write_config(cfg, f"127.0.0.1:{self.cm_port}", str(rules_dir / "*.y*ml"), f"127.0.0.1:{self.vllm_port}")
        data = self.work / "prometheus-data"
        data.mkdir(exist_ok=True)
        self.prometheus = self.procs.start("prometheus", [
            binary, f"--config.file={cfg}", f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{self.prom_port}", "--log.level=warn",
            "--storage.tsdb.retention.time=1d"], self.work / "prometheus.log", cwd=self.work)
        try:
            wait_for(self.promapi.ready, 60, 0.5, "Prometheus ready", alive=self.prometheus.alive)
            wait_for(self.promapi.targets_up, 30, 0.5, "Prometheus scraping cachemon")
        except (TimeoutError, RuntimeError) as e:
            raise Aborted(f"{e}; see {self.work / 'prometheus.log'}") from e

    # ------------------------------------------------------------------ traffic
    def send(self, scenario: str, phase: str) -> dict:
        i = self.seq.get(scenario, 0)
        self.seq[scenario] = i + 1
        body = build_request(scenario, i, "tiny")
        data = self.client.chat(body)
        rec = {"scenario": scenario, "phase": phase, "i": i, "request": body, "usage": data["usage"]}
        if cached_tokens(data["usage"]) is None:
            raise Aborted("vLLM answered without usage.prompt_tokens_details.cached_tokens")
        self.segments[-1].append(rec)
        self.requests_file.write(json.dumps(rec) + "\n")
        self.requests_file.flush()
        return rec

    def drive(self, scenario: str, phase: str, *, min_requests: int = 1, min_seconds: float = 0.0,
              max_seconds: float = 120.0, until=None, check_every: float = 1.0,
              pace: float = 0.0) -> tuple[list[dict], bool, float]:
        """Send requests back to back; stop when `until()` holds (after the minimums) or at max_seconds."""
        t0 = time.monotonic()
        recs, met, last_check = [], until is None, 0.0
        while True:
            recs.append(self.send(scenario, phase))
            if pace:
                time.sleep(pace)
            el = time.monotonic() - t0
            if len(recs) < min_requests or el < min_seconds:
                continue
            if until is None:
                break
            if el - last_check >= check_every:
                last_check = el
                try:
                    met = bool(until())
                except Exception:
                    met = False
                if met:
                    break
            if el >= max_seconds:
                break
        took = time.monotonic() - t0
        self.report.phases.append({
            "phase": phase, "scenario": scenario, "requests": len(recs), "seconds": took,
            "prompt_tokens": sum(r["usage"]["prompt_tokens"] for r in recs),
            "cached_tokens": sum(cached_tokens(r["usage"]) for r in recs)})
        return recs, met, took

    # ------------------------------------------------------------------ readings
    def vllm_counters(self) -> dict[str, float]:
        s = parse_samples(self.client.metrics())

        def total(name):
            return sum(v for _, v in pick(s, name))

        return {"hit": total("vllm:prefix_cache_hits_total"), "query": total("vllm:prefix_cache_queries_total")}

    def cm_samples(self):
        return parse_samples(requests.get(self.cm_url, timeout=5).text)

    def cm_counters(self, samples=None) -> dict[str, float]:
        s = samples or self.cm_samples()

        def total(name):
            return sum(v for _, v in pick(s, name, upstream="vllm", cache="local"))

        return {"hit": total("cachemon_prefix_cache_hit_tokens_total"),
                "query": total("cachemon_prefix_cache_query_tokens_total")}

    def check_counters(self, label: str) -> None:
        """cachemon's unified counters == vLLM's own (+ earlier process lifetimes), once cachemon has polled."""
        last = {}

        def equal():
            v = self.vllm_counters()
            c = self.cm_counters()
            want = {k: v[k] + self.offset[k] for k in v}
            last.update(v=v, c=c, want=want)
            return all(abs(c[k] - want[k]) < 0.5 for k in want)

        try:
            ok = bool(wait_for(equal, 20, 0.5, "counters equal"))
        except TimeoutError:
            ok = False
        v, c, want = last.get("v", {}), last.get("c", {}), last.get("want", {})
        off = f" (vLLM now {v.get('hit', 0):.0f}/{v.get('query', 0):.0f} + earlier lifetimes " \
              f"{self.offset['hit']:.0f}/{self.offset['query']:.0f})" if self.offset["query"] else ""
        if len(self.segments) == 1 and v:
            seg = self.segments[0]
            sp = sum(x["usage"]["prompt_tokens"] for x in seg)
            sc = sum(cached_tokens(x["usage"]) for x in seg)
            self.report.check(f"vllm.usage-sums-equal-counters.{label}", (sc, sp) == (v["hit"], v["query"]),
                              f"sum of per-request cached/prompt tokens {sc}/{sp} vs vLLM counters "
                              f"{v['hit']:.0f}/{v['query']:.0f}")
        self.report.check(f"counters.{label}", ok,
                          f"cachemon hit/query tokens {c.get('hit', 0):.0f}/{c.get('query', 0):.0f} vs vLLM "
                          f"{want.get('hit', 0):.0f}/{want.get('query', 0):.0f}{off}")

    def check_log_ratio(self, label: str) -> None:
        if not self.features["log source"]:
            self.report.skip(f"log.{label}", "log source (cachemon.sources.logs) not present")
            return

        def stats_lines():
            return STATS_RE.findall(self.log.read_text(errors="replace"))

        # vLLM logs a stats line every 2 s while busy and stops when idle: wait for the last one.
        prev, stable_since, deadline = None, time.monotonic(), time.monotonic() + 40
        while time.monotonic() < deadline:
            n = len(stats_lines())
            if n != prev:
                prev, stable_since = n, time.monotonic()
            elif time.monotonic() - stable_since > 6:
                break
            time.sleep(0.5)
        lines = stats_lines()
        if not lines:
            self.report.fail(f"log.{label}", f"no 'Prefix cache hit rate' line in {self.log}")
            return
        logged = float(lines[-1])
        got = {}

        def equal():
            vals = [v for lab, v in pick(self.cm_samples(), "cachemon_prefix_cache_reported_hit_ratio")
                    if lab.get("basis") == "recent_requests" and lab.get("cache", "local") == "local"]
            got["vals"] = vals
            return len(vals) == 1 and abs(vals[0] * 100 - logged) < 0.05 + 1e-9

        try:
            ok = bool(wait_for(equal, 20, 0.5, "log ratio"))
        except TimeoutError:
            ok = False
        vals = got.get("vals") or []
        self.report.check(f"log.{label}", ok,
                          f"last logged 'Prefix cache hit rate: {lines[-1]}%' vs cachemon log-derived "
                          f"{', '.join(f'{v * 100:.2f}%' for v in vals) or 'absent'} ({len(lines)} stats lines so far)")

    def alert_states(self, name: str) -> dict[str, str]:
        """severity -> firing|pending for one alert name."""
        return {a["labels"].get("severity", ""): a["state"] for a in self.promapi.alerts()
                if a["labels"].get("alertname") == name}

    # ------------------------------------------------------------------ the run
    def run(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        self.requests_file = open(self.work / "requests.jsonl", "w", encoding="utf-8")
        r = self.report
        r.figures["work dir"] = str(self.work)
        missing = [k for k, v in self.features.items() if not v]
        r.figures["features present"] = ", ".join(k for k, v in self.features.items() if v) or "none"
        if missing:
            r.figures["features missing"] = ", ".join(missing)
        self.write_model()
        took = self.start_vllm(append=False)
        r.figures["vLLM"] = f"{self.client.version() or '?'} (vllm-cpu), model tiny (dummy weights), start-up {took:.0f} s"
        self.start_cachemon()
        self.start_prometheus()
        try:
            S.run_scenarios(self)
        finally:
            n = sum(len(seg) for seg in self.segments)
            r.figures["requests sent"] = f"{n} chat completions (incl. warm-up and capture), all one at a time"

    def cleanup(self) -> None:
        self.procs.stop_all()
        if self.requests_file:
            self.requests_file.close()


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="scripts/e2e-vllm", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vllm-python", required=True,
                    help="python of the venv that has vllm-cpu installed (scripts/e2e-vllm passes it)")
    ap.add_argument("--prometheus", default=shutil.which("prometheus") or "/usr/bin/prometheus", help="Prometheus binary")
    ap.add_argument("--workdir", default=str(ROOT / ".e2e" / time.strftime("run-%Y%m%d-%H%M%S")),
                    help="where logs, requests, rules and the report go (default .e2e/run-DATE)")
    ap.add_argument("--start-timeout", type=float, default=420, help="seconds allowed for vLLM to become ready")
    ap.add_argument("--timeout", type=int, default=2400, help="hard limit for the whole run, seconds")
    ap.add_argument("--allow-missing", action="store_true",
                    help="report features that are not present yet as SKIP without failing the run")
    return ap.parse_args()


def _run_guarded(h: Harness, timeout: int) -> None:
    """Run the harness under --timeout and the signals; whatever ends it lands in the report, and the
    processes are stopped in every case."""
    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    def on_alarm(_signum, _frame):
        raise RunTimeout(f"the whole run exceeded --timeout {timeout}s")

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(timeout)
    try:
        h.run()
    except Aborted as e:
        h.report.error = str(e)
    except CaptureError as e:
        h.report.error = f"request to vLLM failed: {e}"
    except (TimeoutError, RunTimeout) as e:
        h.report.error = str(e)
    except KeyboardInterrupt as e:
        h.report.error = f"interrupted ({e})"
    except Exception as e:   # a bug in the harness: still clean up and report
        import traceback
        traceback.print_exc()
        h.report.error = f"harness error: {type(e).__name__}: {e}"
    finally:
        signal.alarm(0)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        h.cleanup()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)


def main() -> int:
    args = _args()
    if not Path(args.vllm_python).exists():
        print(f"e2e: {args.vllm_python} does not exist", file=sys.stderr)
        return 2
    if not Path(args.prometheus).exists():
        print(f"e2e: no Prometheus binary at {args.prometheus} (apt-get install -y prometheus)", file=sys.stderr)
        return 2
    os.environ["NO_PROXY"] = os.environ["no_proxy"] = "127.0.0.1,localhost"
    h = Harness(args)
    _run_guarded(h, args.timeout)
    text = h.report.render()
    print(text)
    try:
        (h.work / "report.txt").write_text(text + "\n", encoding="utf-8")
        h.report.write(h.work / "report.json")
        print(f"(report also in {h.work / 'report.txt'} and report.json; logs and requests in {h.work})")
    except OSError:
        pass
    if h.report.error:
        return 2
    return 0 if h.report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
