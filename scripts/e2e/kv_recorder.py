"""The recording machinery of kv_record.py and kv_more.py: real vLLM replicas with their KV-event
subscriptions, the recorder that writes a fixture folder, and the request helpers the scenarios share.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "src"))

import requests  # noqa: E402
import zmq  # noqa: E402
from procs import Procs, free_port, wait_for  # noqa: E402

from cachemon.tools.capture import SYSTEM_TEXT  # noqa: E402

MODEL_SRC = ROOT / "tests" / "fixtures" / "vllm-0.32.0-cpu" / "model"
MODEL_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "config.json")
TOPIC = "kv-events"
RS_PATH = "/work/vllm/wheel/vllm/vllm-rs"   # vLLM's Rust frontend binary here (redacted in logs)
KEEP_TYPES = ("counter", "gauge")


# ---------------------------------------------------------------------------- replicas
class Replica:
    def __init__(self, name: str, rec: Recorder, pool: int | None):
        self.name, self.rec, self.pool = name, rec, pool
        self.api_port, self.ev_port, self.replay_port = free_port(), free_port(), free_port()
        self.api = f"http://127.0.0.1:{self.api_port}"
        suffix = "" if name == "vllm" else f"-{name}"
        self.log = rec.out / f"vllm-server{suffix}.log"
        self.proc = None
        self.up = False
        self.starts: list[float] = []
        self.stops: list[float] = []
        self.session = requests.Session()
        self.hash_seed: str | None = None

    def argv(self) -> list[str]:
        cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{self.ev_port}",
               "replay_endpoint": f"tcp://*:{self.replay_port}", "topic": TOPIC}
        plan = self.rec.plan
        # `vllm serve` (via the shared CLI wrapper) where the plan asks for it: only it honours
        # VLLM_USE_RUST_FRONTEND; otherwise the API server module, as recorded before
        head = ([self.rec.args.vllm_python, plan["serve_cli"], "serve", str(self.rec.model_dir)] if plan.get("serve_cli")
                else [self.rec.args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.rec.model_dir)])
        a = [*head, "--load-format", "dummy", "--served-model-name", "tiny",
             "--enable-prefix-caching", "--enable-prompt-tokens-details", "--enable-log-requests",
             "--max-model-len", "4096", "--dtype", "bfloat16", "--host", "127.0.0.1", "--port", str(self.api_port),
             "--kv-events-config", json.dumps(cfg)]
        if self.pool:
            a += ["--num-gpu-blocks-override", str(self.pool)]
        lora = {f"lora_{n}": str(self.rec.tmp / "lora" / n) for n in ("a1", "a2")}
        a += [x.format(**lora) for x in plan.get("extra_args", [])]
        return a

    def start(self) -> float:
        env = dict(os.environ)
        env.update({"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOG_STATS_INTERVAL": "1", "VLLM_SERVER_DEV_MODE": "1",
                    "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1",
                    "TRANSFORMERS_OFFLINE": "1", "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
                    "PYTHONUNBUFFERED": "1"})
        env.pop("PYTHONHASHSEED", None)   # the default: sha256 block hashes equal in every process
        if self.hash_seed is not None:    # a per-replica seed: the same content, different hashes
            env["PYTHONHASHSEED"] = self.hash_seed
        env.update(self.rec.plan.get("env", {}))
        t0 = time.time()
        self.proc = self.rec.procs.start(self.name, self.argv(), self.log, env=env, cwd=self.rec.tmp,
                                         stop_signal=signal.SIGINT, stop_timeout=30.0, append=bool(self.starts))
        self.starts.append(t0)
        wait_for(lambda: self.session.get(self.api + "/v1/models", timeout=2).status_code == 200,
                 self.rec.args.start_timeout, 1.0, f"{self.name} ready", alive=self.proc.alive)
        self.up = True
        self.rec.phase(f"{self.name} ready")
        print(f"[{self.name}] ready after {time.time() - t0:.0f}s", flush=True)
        return time.time() - t0

    def stop(self) -> None:
        self.up = False
        if self.proc is not None:
            self.rec.procs.stop(self.proc)
            self.proc = None
            self.stops.append(time.time())
            self.rec.phase(f"{self.name} stopped")

    def replay_check(self) -> dict:
        """Ask the replay ROUTER for every buffered batch from seq 0 (vLLM's protocol)."""
        ctx = zmq.Context.instance()
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(f"tcp://127.0.0.1:{self.replay_port}")
        s.send_multipart([b"", (0).to_bytes(8, "big")])
        seqs, frames, end = [], None, False
        deadline = time.time() + 10
        while time.time() < deadline:
            if not s.poll(1000):
                continue
            msg = s.recv_multipart()
            frames = len(msg)
            seq = int.from_bytes(msg[-2], "big", signed=True)
            if seq == -1:
                end = True
                break
            seqs.append(seq)
        s.close()
        return {"asked_from_seq": 0, "batches": len(seqs), "first_seq": seqs[0] if seqs else None,
                "last_seq": seqs[-1] if seqs else None, "end_marker": end,
                "contiguous": seqs == list(range(seqs[0], seqs[0] + len(seqs))) if seqs else True,
                "frames_per_message": frames}

    def metrics(self) -> str:
        r = self.session.get(self.api + "/metrics", timeout=5)
        r.raise_for_status()
        return r.text


def compact_metrics(text: str, keep_histograms: tuple[str, ...] = ()) -> str:
    """Only the vllm: counter and gauge families (no histograms but those named, no *_created) and
    process_start_time_seconds; HELP/TYPE kept, so it stays a valid exposition."""
    out, keep = [], False
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            name = line.split()[2]
            if line.startswith("# HELP "):
                keep = ((name.startswith("vllm:") and not name.endswith("_created"))
                        or name == "process_start_time_seconds")
                held = line
                continue
            typ = line.split()[3]
            keep = keep and (typ in KEEP_TYPES or name in keep_histograms)
            if keep:
                out += [held, line]
            continue
        if keep and line and not line.startswith("#"):
            out.append(line)
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------- recorder
class Recorder:
    def __init__(self, args, plan: dict):
        self.args = args
        self.plan = plan       # the scenario's entry of kv_record.SCENARIOS
        self.out = Path(args.out).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        for f in self.out.iterdir():
            if f.is_file():
                f.unlink()
        self.tmp = Path(tempfile.mkdtemp(prefix="kvrec-"))
        self.model_dir = self.tmp / "model"
        self.model_dir.mkdir()
        for name in MODEL_FILES:
            shutil.copyfile(MODEL_SRC / name, self.model_dir / name)
        if getattr(args, "old_release", False):
            old_release_tokenizer(self.model_dir)
        self.procs = Procs()
        self.replicas: dict[str, Replica] = {}
        self.lock = threading.Lock()
        self.stop_flag = threading.Event()
        self.events_f = open(self.out / "events.jsonl", "w", encoding="utf-8")
        self.metrics_f = open(self.out / "metrics.jsonl", "w", encoding="utf-8")
        self.requests_f = open(self.out / "requests.jsonl", "w", encoding="utf-8")
        self.phases: list[dict] = []
        self.counts: dict[str, int] = {}
        self.threads: list[threading.Thread] = []
        self.ctx = zmq.Context.instance()
        self.socks: dict = {}
        self.t0 = time.time()
        self.keep_histograms = tuple(plan.get("keep_histograms", ()))

    def phase(self, name: str) -> None:
        with self.lock:
            self.phases.append({"t": time.time(), "phase": name})

    def add_replica(self, name: str, pool: int | None) -> Replica:
        r = Replica(name, self, pool)
        s = self.ctx.socket(zmq.SUB)
        s.setsockopt(zmq.RCVHWM, 0)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SUBSCRIBE, b"")
        s.connect(f"tcp://127.0.0.1:{r.ev_port}")     # before the server binds: ZMQ retries
        self.socks[s] = name
        self.replicas[name] = r
        return r

    # -- background loops
    def _events_loop(self) -> None:
        poller = zmq.Poller()
        for s in self.socks:
            poller.register(s, zmq.POLLIN)
        while not self.stop_flag.is_set():
            for s, _ in poller.poll(200):
                while True:
                    try:
                        msg = s.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    t = time.time()
                    line = {"t": t, "replica": self.socks[s], "frames": len(msg)}
                    if len(msg) == 3:
                        line.update(topic=msg[0].decode("utf-8", "replace"), seq=int.from_bytes(msg[1], "big"),
                                    payload_b64=base64.b64encode(msg[2]).decode())
                    else:   # not vLLM's shape: kept raw
                        line["frames_b64"] = [base64.b64encode(f).decode() for f in msg]
                    with self.lock:
                        self.events_f.write(json.dumps(line) + "\n")
                        self.events_f.flush()
                        self.counts[self.socks[s]] = self.counts.get(self.socks[s], 0) + 1
        # drain what is left
        for s in self.socks:
            s.close(0)

    def _metrics_loop(self) -> None:
        last: dict[str, str] = {}
        while not self.stop_flag.wait(1.0 - (time.time() % 1.0)):
            for r in list(self.replicas.values()):
                if not r.up:
                    continue
                try:
                    text = compact_metrics(r.metrics(), self.keep_histograms)
                except Exception:   # the server is going down: skip this poll
                    continue
                t = time.time()
                line = {"t": t, "replica": r.name}
                if last.get(r.name) == text:
                    line["unchanged"] = True
                else:
                    line["text"] = text
                    last[r.name] = text
                with self.lock:
                    self.metrics_f.write(json.dumps(line) + "\n")
                    self.metrics_f.flush()

    def start_loops(self) -> None:
        for fn in (self._events_loop, self._metrics_loop):
            th = threading.Thread(target=fn, daemon=True)
            th.start()
            self.threads.append(th)

    # -- traffic
    def send(self, base: str, replica: str | None, scenario: str, i: int, body: dict, *, token_ids: bool = True) -> dict:
        sent = dict(body, return_token_ids=True) if token_ids else body
        t_send = time.time()
        path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
        r = requests.post(base + path, json=sent, timeout=600)
        t_recv = time.time()
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.text[:300]}")
        d = r.json()
        ch = d["choices"][0]
        line = {"scenario": scenario, "i": i, "time": t_send, "t_send": t_send, "t_recv": t_recv,
                "replica": replica, "request": body, "usage": d["usage"]}
        if token_ids and isinstance(ch.get("token_ids"), list):
            line["completion_token_ids"] = ch["token_ids"]
        line["_content"] = (ch.get("message") or {}).get("content") if "messages" in body else ch.get("text")
        return line

    def write_request(self, line: dict) -> None:
        line = {k: v for k, v in line.items() if not k.startswith("_")}
        with self.lock:
            self.requests_f.write(json.dumps(line, ensure_ascii=False) + "\n")
            self.requests_f.flush()

    def write_event(self, kind: str, **extra) -> None:
        with self.lock:
            self.requests_f.write(json.dumps({"event": kind, "time": time.time(), **extra}) + "\n")
            self.requests_f.flush()

    def reset(self, r: Replica) -> dict:
        t = time.time()
        resp = r.session.post(r.api + "/reset_prefix_cache", timeout=60)
        self.write_event("reset_prefix_cache", replica=r.name, status=resp.status_code)
        self.phase(f"reset {r.name} HTTP {resp.status_code}")
        return {"t": t, "status": resp.status_code}

    # -- end
    def finish(self, meta: dict) -> None:
        time.sleep(2.5)     # let the last metrics poll and events land
        meta["replay_check"] = {}
        meta["final_counters"] = {}
        for r in self.replicas.values():
            if r.up:
                meta["replay_check"][r.name] = r.replay_check()
                meta["final_counters"][r.name] = final_counters(r.metrics())
                suffix = '' if r.name == 'vllm' else '-' + r.name
                page = r.metrics()
                (self.out / f"metrics-final{suffix}.txt").write_text(
                    compact_metrics(page, self.keep_histograms), encoding="utf-8")
                if self.plan.get("raw_page"):   # the whole page too (histograms, _created)
                    (self.out / f"metrics-final-raw{suffix}.txt").write_text(page, encoding="utf-8")
        for r in self.replicas.values():
            r.stop()
        time.sleep(1.0)
        self.stop_flag.set()
        for th in self.threads:
            th.join(5)
        for f in (self.events_f, self.metrics_f, self.requests_f):
            f.close()
        meta.update(
            scenario=self.args.scenario, recorded_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.t0)),
            vllm_version=self.version, messages_per_replica=self.counts, phases=self.phases,
            replicas={n: {"pool_blocks_override": r.pool, "api_port": r.api_port, "event_port": r.ev_port,
                          "replay_port": r.replay_port, "starts": r.starts, "stops": r.stops,
                          "PYTHONHASHSEED": r.hash_seed,
                          "argv": redact(" ".join(r.argv()[1:]), self)}
                      for n, r in self.replicas.items()},
            env={"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOG_STATS_INTERVAL": "1", "VLLM_SERVER_DEV_MODE": "1",
                 **{k: redact(v, self) for k, v in self.plan.get("env", {}).items()}})
        (self.out / "metadata.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
        if self.args.scenario == "multiturn":
            # the same stream as a request log without output token ids (the case where analyze must
            # infer a turn's generation from the next turn of its conversation)
            lines = (self.out / "requests.jsonl").read_text(encoding="utf-8").splitlines()
            stripped = []
            for ln in lines:
                d = json.loads(ln)
                d.pop("completion_token_ids", None)
                stripped.append(json.dumps(d, ensure_ascii=False))
            (self.out / "requests-without-output-ids.jsonl").write_text("\n".join(stripped) + "\n", encoding="utf-8")
        for r in self.replicas.values():
            if r.log.exists():
                r.log.write_text(redact(r.log.read_text(errors="replace"), self), encoding="utf-8")
        shutil.rmtree(self.tmp, ignore_errors=True)

    version = ""


def old_release_tokenizer(model_dir: Path) -> None:
    """The same tokenizer for old vLLM releases (0.10.x, 0.11.x: transformers 4.x), which cannot read the
    ``tokenizer_class`` current transformers writes (``TokenizersBackend``) nor a separate
    ``chat_template.jinja``: the class becomes ``PreTrainedTokenizerFast`` and the template moves into
    ``tokenizer_config.json`` (../shared/notes/real-vllm-on-cpu.md). The vocabulary is unchanged, so
    token ids equal the 0.32.0 captures'."""
    cfg_path = model_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg.pop("backend", None)
    cfg["chat_template"] = (model_dir / "chat_template.jinja").read_text(encoding="utf-8")
    cfg_path.write_text(json.dumps(cfg, indent=1) + "\n", encoding="utf-8")


def redact(text: str, rec: Recorder) -> str:
    text = text.replace(str(rec.model_dir), "model").replace(str(rec.tmp), "<tmp>")
    venv = str(Path(rec.args.vllm_python).parent.parent)
    text = text.replace(venv, "<vllm-venv>").replace(str(ROOT), "<repo>")
    text = text.replace(RS_PATH, "<vllm-rs>")
    return re.sub(r"/(?:root|home/[^/\s]+)/", "<home>/", text)


def final_counters(text: str) -> dict:
    out: dict[str, float] = {}
    for line in text.splitlines():
        for name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total",
                     "vllm:generation_tokens_total", "vllm:request_success_total", "vllm:num_preemptions_total"):
            if line.startswith(name + "{") or line.startswith(name + " "):
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


# ---------------------------------------------------------------------------- traffic
def tenant_system(k: int) -> str:
    """A distinct ~830-token system prompt per tenant (differs from its first token on)."""
    return f"Tenant {k} policy. " + SYSTEM_TEXT


def chat(system: str, user: str, max_tokens: int = 4, **extra) -> dict:
    return {"model": "tiny", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}], **extra}


def _stamp(i: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(1764580000 + i))


def _rid(i: int) -> str:
    return hashlib.sha256(f"kv-events request {i}".encode()).hexdigest()[:16]


def seq_send(rec: Recorder, r: Replica, scenario: str, bodies, token_ids: bool = True, start: int = 0) -> list[dict]:
    lines = []
    for i, b in enumerate(bodies, start):
        line = rec.send(r.api, r.name, scenario, i, b, token_ids=token_ids)
        rec.write_request(line)
        lines.append(line)
        time.sleep(rec.args.gap)
    return lines


def record_main(doc: str | None, scenarios, run) -> int:
    """The command line of kv_record.py and kv_tiers_live.py: SCENARIO --out DIR; SIGTERM stops like Ctrl-C
    (so every server started is stopped)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenario", choices=sorted(scenarios))
    ap.add_argument("--out", required=True)
    ap.add_argument("--vllm-python", default="/work/vllm/venv/bin/python")
    ap.add_argument("--start-timeout", type=float, default=400.0)
    ap.add_argument("--old-release", action="store_true",
                    help="an old vLLM (0.10.x/0.11.x, venv from old_release_venv.sh): tokenizer config for transformers 4")
    ap.add_argument("--gap", type=float, default=1.0, help="seconds between sequential requests (metrics polls between)")
    args = ap.parse_args()

    def _bye(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, _bye)
    run(args)
    return 0


def sc_multiturn(rec: Recorder, _meta: dict) -> None:
    """Two conversations x 3 turns, 200 generated tokens a turn (whole blocks of generation);
    each later turn repeats the earlier assistant replies verbatim."""
    r = rec.replicas["vllm"]
    convs = [[{"role": "system", "content": tenant_system(10 + c)}] for c in range(2)]
    i = 0
    rec.phase("multiturn")
    for turn in range(3):
        for c, conv in enumerate(convs):
            conv.append({"role": "user", "content": f"Turn {turn} of chat {c}: what next?"})
            body = {"model": "tiny", "max_tokens": 200, "temperature": 0, "ignore_eos": True, "messages": list(conv)}
            line = rec.send(r.api, r.name, "multiturn", i, body)
            rec.write_request(line)
            conv.append({"role": "assistant", "content": line["_content"]})
            i += 1
            time.sleep(rec.args.gap)
