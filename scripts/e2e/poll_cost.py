"""What one cachemon poll of `/metrics` costs a real vLLM API server, in CPU seconds.

    python scripts/e2e/poll_cost.py --vllm-python /path/to/vllm-venv/bin/python [--loras 0,8] [--polls 200]

For each setting (plain, then with N LoRA adapters loaded) it starts a real vLLM (tiny model from
the repo's fixtures, dummy weights, prefix caching on), sends a little traffic so every histogram
has data, then measures the API server's CPU time (utime+stime of its process, from /proc) over
two equal windows: one idle, one with ``--polls`` GETs of /metrics at ``--rate`` per second.
CPU per poll = (polled − idle) / polls. The engine-core child is measured too, to show polls do
not reach it. Prints one table row per setting and writes report.json into the work dir.

Not part of CI: it needs vLLM (`make e2e` installs it; see docs/e2e.md).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
from procs import Procs, free_port, wait_for  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MODEL_SRC = ROOT / "tests" / "fixtures" / "vllm-0.32.0-cpu" / "model"
MODEL_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "config.json")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process (not its children), from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        kids = task / "children"
        if kids.exists():
            out += [int(k) for k in kids.read_text().split()]
    return out


def write_lora(dirpath: Path, rank: int, seed: int) -> None:
    """A PEFT LoRA adapter for the tiny Llama (q_proj/v_proj), written by hand as safetensors:
    constructed, zero-valued B so outputs do not change; only its presence matters here."""
    cfg = json.loads((MODEL_SRC / "config.json").read_text())
    hidden, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    kv_out = cfg["num_key_value_heads"] * cfg["head_dim"]
    q_out = cfg["num_attention_heads"] * cfg["head_dim"]
    tensors: dict[str, tuple[list[int], bytes]] = {}
    for layer in range(layers):
        for proj, out in (("q_proj", q_out), ("v_proj", kv_out)):
            base = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            a = [((i * 7 + seed) % 13 - 6) / 100.0 for i in range(rank * hidden)]
            tensors[f"{base}.lora_A.weight"] = ([rank, hidden], struct.pack(f"<{len(a)}f", *a))
            tensors[f"{base}.lora_B.weight"] = ([out, rank], bytes(4 * out * rank))
    header, offset, blobs = {}, 0, []
    for name, (shape, blob) in tensors.items():
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    dirpath.mkdir(parents=True, exist_ok=True)
    (dirpath / "adapter_model.safetensors").write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))
    (dirpath / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": rank * 2, "lora_dropout": 0.0,
        "target_modules": ["q_proj", "v_proj"], "bias": "none", "base_model_name_or_path": "tiny",
        "fan_in_fan_out": False, "inference_mode": True}))


def measure(args: argparse.Namespace, work: Path, loras: int) -> dict:
    model = work / "model"
    model.mkdir(parents=True, exist_ok=True)
    for name in MODEL_FILES:
        (model / name).write_bytes((MODEL_SRC / name).read_bytes())
    port = free_port()
    argv = [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--load-format", "dummy", "--served-model-name", "tiny", "--enable-prefix-caching",
            "--max-model-len", "4096", "--dtype", "bfloat16", "--host", "127.0.0.1", "--port", str(port)]
    if loras:
        mods = []
        for i in range(loras):
            write_lora(work / f"lora{i}", rank=8, seed=i)
            mods.append(f"lora{i}={work / f'lora{i}'}")
        argv += ["--enable-lora", "--max-loras", str(min(loras, 4)), "--max-lora-rank", "8",
                 "--max-cpu-loras", str(loras), "--lora-modules", *mods]
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_NO_USAGE_STATS="1", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", NO_PROXY="127.0.0.1,localhost", PYTHONUNBUFFERED="1")
    procs = Procs()
    api = f"http://127.0.0.1:{port}"
    try:
        vllm = procs.start("vllm", argv, work / "vllm-server.log", env=env, cwd=work,
                           stop_signal=signal.SIGINT, stop_timeout=30.0)
        t0 = time.monotonic()
        wait_for(lambda: requests.get(api + "/v1/models", timeout=2).status_code == 200,
                 args.start_timeout, 1.0, "vLLM ready", alive=vllm.alive)
        startup = time.monotonic() - t0
        names = ["tiny"] + [f"lora{i}" for i in range(loras)]
        for i in range(args.requests):   # every histogram gets observations; every adapter is used
            requests.post(api + "/v1/completions", timeout=60, json={
                "model": names[i % len(names)], "prompt": f"warm up {i} " * 40, "max_tokens": 4})
        time.sleep(3)
        page = requests.get(api + "/metrics", timeout=10).text
        samples = sum(1 for line in page.splitlines() if line and not line.startswith("#"))
        engine = children(vllm.pid)
        session = requests.Session()
        rounds = []
        for _ in range(args.rounds):
            idle = _window(vllm.pid, engine, args.polls / args.rate, None)
            polled = _window(vllm.pid, engine, args.polls / args.rate, (session, api, args.polls, args.rate))
            rounds.append(((polled["api"] - idle["api"]) / args.polls, (polled["engine"] - idle["engine"]) / args.polls,
                           polled["latency"]))
        per_poll = statistics.median(r[0] for r in rounds)
        return {"loras": loras, "startup_s": round(startup, 1), "page_bytes": len(page.encode()),
                "samples": samples, "api_cpu_ms_per_poll": round(per_poll * 1000, 2),
                "api_cpu_ms_per_poll_rounds": [round(r[0] * 1000, 2) for r in rounds],
                "engine_cpu_ms_per_poll": round(statistics.median(r[1] for r in rounds) * 1000, 2),
                "latency_ms_median": round(statistics.median(r[2] for r in rounds) * 1000, 2),
                "core_share_at": {f"{iv:g}s": round(per_poll / iv * 100, 3) for iv in (1, 2, 5, 15, 30)}}
    finally:
        procs.stop_all()


def _window(api_pid: int, engine: list[int], seconds: float, load: tuple | None) -> dict:
    """CPU seconds the API server and engine processes used over ``seconds`` (with polls if ``load``)."""
    a0 = cpu_seconds(api_pid)
    e0 = sum(cpu_seconds(p) for p in engine)
    start = time.monotonic()
    latencies = []
    if load is None:
        time.sleep(seconds)
    else:
        session, api, polls, rate = load
        for i in range(polls):
            due = start + i / rate
            time.sleep(max(0.0, due - time.monotonic()))
            t = time.monotonic()
            session.get(api + "/metrics", timeout=10).raise_for_status()
            latencies.append(time.monotonic() - t)
        time.sleep(max(0.0, start + seconds - time.monotonic()))
    return {"api": cpu_seconds(api_pid) - a0, "engine": sum(cpu_seconds(p) for p in engine) - e0,
            "latency": statistics.median(latencies) if latencies else 0.0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm-python", required=True, help="python of a venv with vllm-cpu 0.32.0")
    ap.add_argument("--loras", default="0,8", help="comma-separated adapter counts to measure (0 = none)")
    ap.add_argument("--polls", type=int, default=200)
    ap.add_argument("--rate", type=float, default=10.0, help="polls per second in the polled window")
    ap.add_argument("--rounds", type=int, default=3, help="idle/polled window pairs; the median is reported")
    ap.add_argument("--requests", type=int, default=24, help="completions sent before measuring")
    ap.add_argument("--start-timeout", type=float, default=420.0)
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="cachemon-pollcost-"))
    rows = []
    for n in (int(x) for x in args.loras.split(",")):
        row = measure(args, work / f"loras-{n}", n)
        rows.append(row)
        print(f"loras={n:<3} page={row['page_bytes']:>7} B samples={row['samples']:>4} "
              f"api cpu/poll={row['api_cpu_ms_per_poll']:>6.2f} ms (rounds {row['api_cpu_ms_per_poll_rounds']}) "
              f"engine cpu/poll={row['engine_cpu_ms_per_poll']:.2f} ms latency={row['latency_ms_median']:.1f} ms "
              f"core share @2s={row['core_share_at']['2s']}% @15s={row['core_share_at']['15s']}%", flush=True)
    (work / "report.json").write_text(json.dumps(rows, indent=2))
    print(f"report: {work / 'report.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
