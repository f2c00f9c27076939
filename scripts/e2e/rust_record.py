#!/usr/bin/env python3
"""Record the same small traffic through vLLM's Rust frontend and its Python frontend (both via `vllm serve`).

    python scripts/e2e/rust_record.py --out tests/fixtures/vllm-0.32.0-cpu-rust-frontend \
        [--frontends rust,python] [--vllm-python /work/vllm/venv/bin/python] \
        [--rs-path /work/vllm/wheel/vllm/vllm-rs]

Per frontend (one server at a time, folder OUT/FRONTEND/):

* ``metrics.jsonl``  the RAW ``/metrics`` page every ~2 s, as served (no reduction):
                     ``{"t", "replica", "accept", "status", "content_type", "text"}`` (``accept`` is the
                     request's Accept header, null when none was sent; the text/plain poll runs every
                     time, an OpenMetrics-Accept poll and a poll without Accept every third time),
                     or ``{..., "unchanged": true}`` without ``text`` when it equals the previous
                     poll with the same Accept, or ``{..., "same_as_accept": "text/plain"}`` without
                     ``text`` when it equals the text/plain page fetched just before in the same poll;
* ``requests.jsonl`` the requests in kv_record.py's line shape, plus ``{"event": "restart"}``;
* ``events.jsonl``   the KV events (kv_record.py's shape; the engine core publishes them);
* ``endpoints.json`` every probed GET endpoint's status, Content-Type and body (after the first
                     start, before traffic, and again at the end), POST /reset_prefix_cache at the end;
* ``vllm-server.log`` what `vllm serve` wrote (Rust frontend lines keep their ANSI codes), machine
                     paths replaced;
* ``metadata.json``  argv, env, phases with times, start/stop times.

Traffic: idle polls, 4 chat requests sharing the ~830-token system prompt and 3 with a changing
head (a timestamp before it), an idle pause longer than 10 s (stats lines), SIGINT + start again
(same port), idle polls, the same again (4 + 3), an idle pause, probes.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import requests  # noqa: E402
import zmq  # noqa: E402
from kv_recorder import MODEL_FILES, MODEL_SRC, ROOT, SYSTEM_TEXT, TOPIC, _stamp, chat, redact  # noqa: E402
from procs import Procs, free_port, wait_for  # noqa: E402

CLI = Path("/work/shared/tools/vllm_cli.py")
ACCEPT_TEXT = "text/plain"
ACCEPT_OM = "application/openmetrics-text; version=1.0.0; charset=utf-8"
GET_PROBES = ("/health", "/ping", "/version", "/v1/models", "/server_info", "/load", "/is_sleeping",
              "/is_paused", "/tokenizer_info", "/kv_event_sources", "/get_world_size",
              "/fault_tolerance/status", "/weight_info", "/v1/server_info", "/stats")
STATS_INTERVAL = "2"
BODY_MAX = 100_000


class FrontendRun:
    def __init__(self, args, frontend: str, out: Path):
        self.args, self.frontend, self.out = args, frontend, out
        out.mkdir(parents=True, exist_ok=True)
        for f in out.iterdir():
            if f.is_file():
                f.unlink()
        self.tmp = Path(tempfile.mkdtemp(prefix="rsrec-"))
        self.model_dir = self.tmp / "model"
        self.model_dir.mkdir()
        for name in MODEL_FILES:
            shutil.copyfile(MODEL_SRC / name, self.model_dir / name)
        self.port, self.ev_port, self.replay_port = free_port(), free_port(), free_port()
        self.api = f"http://127.0.0.1:{self.port}"
        self.procs = Procs()
        self.proc = None
        self.up = False
        self.lock = threading.Lock()
        self.stop_flag = threading.Event()
        self.phases: list[dict] = []
        self.starts: list[float] = []
        self.ready: list[float] = []
        self.stops: list[float] = []
        self.metrics_f = open(out / "metrics.jsonl", "w", encoding="utf-8")
        self.requests_f = open(out / "requests.jsonl", "w", encoding="utf-8")
        self.events_f = open(out / "events.jsonl", "w", encoding="utf-8")
        self.log = out / "vllm-server.log"
        self.endpoints: dict[str, dict] = {}
        self.n_events = 0

    # -- server
    def argv(self) -> list[str]:
        cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{self.ev_port}",
               "replay_endpoint": f"tcp://*:{self.replay_port}", "topic": TOPIC}
        return [self.args.vllm_python, str(CLI), "serve", str(self.model_dir), "--load-format", "dummy",
                "--served-model-name", "tiny", "--enable-prefix-caching", "--enable-prompt-tokens-details",
                "--enable-log-requests", "--max-model-len", "4096", "--dtype", "bfloat16",
                "--host", "127.0.0.1", "--port", str(self.port), "--num-gpu-blocks-override", "160",
                "--kv-events-config", json.dumps(cfg)]

    def env_extra(self) -> dict:
        e = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOG_STATS_INTERVAL": STATS_INTERVAL, "VLLM_SERVER_DEV_MODE": "1"}
        if self.frontend == "rust":
            e.update(VLLM_USE_RUST_FRONTEND="1", VLLM_RUST_FRONTEND_PATH=self.args.rs_path)
        return e

    def start(self) -> None:
        env = dict(os.environ)
        env.update({"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1",
                    "TRANSFORMERS_OFFLINE": "1", "NO_PROXY": "127.0.0.1,localhost",
                    "no_proxy": "127.0.0.1,localhost", "PYTHONUNBUFFERED": "1"})
        env.pop("PYTHONHASHSEED", None)
        for k in ("VLLM_USE_RUST_FRONTEND", "VLLM_RUST_FRONTEND_PATH"):
            env.pop(k, None)
        env.update(self.env_extra())
        t0 = time.time()
        self.proc = self.procs.start(self.frontend, self.argv(), self.log, env=env, cwd=self.tmp,
                                     stop_signal=signal.SIGINT, stop_timeout=30.0, append=bool(self.starts))
        self.starts.append(t0)
        self.phase("start")
        wait_for(lambda: requests.get(self.api + "/v1/models", timeout=2).status_code == 200,
                 self.args.start_timeout, 1.0, f"{self.frontend} ready", alive=self.proc.alive)
        self.ready.append(time.time())
        self.up = True
        self.phase("ready")
        print(f"[{self.frontend}] ready after {time.time() - t0:.0f}s", flush=True)

    def stop(self) -> None:
        self.up = False
        if self.proc is not None:
            self.procs.stop(self.proc)
            self.proc = None
            self.stops.append(time.time())
            self.phase("stopped")

    def phase(self, name: str) -> None:
        with self.lock:
            self.phases.append({"t": time.time(), "phase": name})

    # -- loops
    def _metrics_loop(self) -> None:
        last: dict = {}
        k = 0
        while not self.stop_flag.wait(2.0 - (time.time() % 2.0)):
            if not self.up:
                continue
            accepts = [ACCEPT_TEXT] + ([ACCEPT_OM, None] if k % 3 == 0 else [])
            k += 1
            plain = None
            for acc in accepts:
                try:
                    r = requests.get(self.api + "/metrics", headers={"Accept": acc} if acc else {}, timeout=5)
                except Exception:   # going down: skip this poll
                    continue
                line = {"t": time.time(), "replica": self.frontend, "accept": acc, "status": r.status_code,
                        "content_type": r.headers.get("content-type")}
                key = (acc, r.status_code, line["content_type"])
                if acc == ACCEPT_TEXT:
                    plain = (r.text, line["content_type"])
                if last.get(key) == r.text:
                    line["unchanged"] = True
                elif acc != ACCEPT_TEXT and plain == (r.text, line["content_type"]):
                    line["same_as_accept"] = ACCEPT_TEXT    # the page the text/plain poll just got
                    last[key] = r.text
                else:
                    line["text"] = r.text
                    last[key] = r.text
                with self.lock:
                    self.metrics_f.write(json.dumps(line, ensure_ascii=False) + "\n")
                    self.metrics_f.flush()

    def _events_loop(self) -> None:
        import base64
        s = zmq.Context.instance().socket(zmq.SUB)
        s.setsockopt(zmq.RCVHWM, 0)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SUBSCRIBE, b"")
        s.connect(f"tcp://127.0.0.1:{self.ev_port}")
        while not self.stop_flag.is_set():
            if not s.poll(200):
                continue
            msg = s.recv_multipart()
            line = {"t": time.time(), "replica": self.frontend, "frames": len(msg)}
            if len(msg) == 3:
                line.update(topic=msg[0].decode("utf-8", "replace"), seq=int.from_bytes(msg[1], "big"),
                            payload_b64=base64.b64encode(msg[2]).decode())
            else:
                line["frames_b64"] = [base64.b64encode(f).decode() for f in msg]
            with self.lock:
                self.events_f.write(json.dumps(line) + "\n")
                self.events_f.flush()
                self.n_events += 1
        s.close(0)

    # -- traffic
    def send(self, i: int, body: dict) -> None:
        t_send = time.time()
        r = requests.post(self.api + "/v1/chat/completions", json=dict(body, return_token_ids=True), timeout=600)
        t_recv = time.time()
        line = {"scenario": f"rust_frontend/{self.frontend}", "i": i, "time": t_send, "t_send": t_send,
                "t_recv": t_recv, "replica": self.frontend, "request": body}
        if r.status_code != 200:
            line["http_status"] = r.status_code
            line["error"] = r.text[:500]
        else:
            d = r.json()
            line["usage"] = d.get("usage")
            ids = d["choices"][0].get("token_ids")
            if isinstance(ids, list):
                line["completion_token_ids"] = ids
        with self.lock:
            self.requests_f.write(json.dumps(line, ensure_ascii=False) + "\n")
            self.requests_f.flush()
        time.sleep(self.args.gap)

    def traffic(self, rnd: int, start: int) -> int:
        i = start
        self.phase(f"traffic round {rnd}: shared system prompt")
        for j in range(4):
            self.send(i, chat(SYSTEM_TEXT, f"Round {rnd} question {j}: where is my parcel {10 * rnd + j}?"))
            i += 1
        self.phase(f"traffic round {rnd}: timestamp at the head")
        for j in range(3):
            self.send(i, chat(f"Current time: {_stamp(100 * rnd + j)}. " + SYSTEM_TEXT,
                              f"Round {rnd} head question {j}"))
            i += 1
        return i

    def probe(self, when: str) -> None:
        res = {}
        for path in GET_PROBES:
            try:
                r = requests.get(self.api + path, timeout=10)
                body = r.text
                res[path] = {"status": r.status_code, "content_type": r.headers.get("content-type"),
                             "body": body[:BODY_MAX], "body_truncated": len(body) > BODY_MAX}
            except Exception as e:
                res[path] = {"error": f"{type(e).__name__}: {e}"[:300]}
        self.endpoints[when] = res

    def run(self) -> None:
        threads = [threading.Thread(target=f, daemon=True) for f in (self._metrics_loop, self._events_loop)]
        for th in threads:
            th.start()
        meta: dict = {"command": "python scripts/e2e/rust_record.py " + " ".join(sys.argv[1:]).replace(str(ROOT) + "/", ""),
                      "frontend": self.frontend}
        try:
            self.start()
            self.probe("after first start, before traffic")
            time.sleep(6)                    # idle polls: which series exist before any traffic
            i = self.traffic(0, 0)
            self.phase("idle")
            time.sleep(14)                   # > 10 s: stats lines at either interval
            self.stop()
            with self.lock:
                self.requests_f.write(json.dumps({"event": "restart", "time": time.time(), "replica": self.frontend}) + "\n")
            self.start()
            self.phase("idle after restart")
            time.sleep(6)
            self.traffic(1, i)
            self.phase("idle")
            time.sleep(14)
            self.probe("at the end")
            r = requests.post(self.api + "/reset_prefix_cache", timeout=30)
            self.endpoints["POST /reset_prefix_cache"] = {"status": r.status_code, "body": r.text[:1000],
                                                          "content_type": r.headers.get("content-type")}
            time.sleep(2.5)
            self.stop()
        finally:
            self.procs.stop_all()
            time.sleep(0.5)
            self.stop_flag.set()
            for th in threads:
                th.join(5)
            for f in (self.metrics_f, self.requests_f, self.events_f):
                f.close()
        meta.update(recorded_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.starts[0])),
                    argv=redact(" ".join(self.argv()[1:]), self), env=self.env_extra(), port=self.port,
                    starts=self.starts, ready=self.ready, stops=self.stops, phases=self.phases,
                    kv_event_messages=self.n_events)
        if self.frontend == "rust":
            meta["env"]["VLLM_RUST_FRONTEND_PATH"] = "<vllm-rs>"
        ep = json.dumps(self.endpoints, indent=1).replace(self.args.rs_path, "<vllm-rs>")
        (self.out / "endpoints.json").write_text(redact(ep, self) + "\n", encoding="utf-8")
        (self.out / "metadata.json").write_text(redact(json.dumps(meta, indent=1), self) + "\n", encoding="utf-8")
        text = self.log.read_text(errors="replace").replace(self.args.rs_path, "<vllm-rs>")
        self.log.write_text(redact(text, self), encoding="utf-8")
        shutil.rmtree(self.tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--frontends", default="rust,python")
    ap.add_argument("--vllm-python", default="/work/vllm/venv/bin/python")
    ap.add_argument("--rs-path", default="/work/vllm/wheel/vllm/vllm-rs")
    ap.add_argument("--start-timeout", type=float, default=400.0)
    ap.add_argument("--gap", type=float, default=1.0)
    args = ap.parse_args()

    def _bye(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, _bye)
    for fe in args.frontends.split(","):
        FrontendRun(args, fe, Path(args.out).resolve() / fe).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
