"""More kv_record.py scenarios: full report mode, twin removals, parallel sampling, tenants and
LoRA adapters, native CPU offloading. Registered into kv_record.SCENARIOS by kv_record.main(); both build on kv_recorder.py.

Each plan may carry, besides ``fn`` and ``pool``: ``extra_args`` (more server flags, may name
``{lora_a1}``/``{lora_a2}``, the adapter folders made by ``setup``), ``setup`` (called with the
recorder before the server starts) and ``keep_histograms`` (histogram families kept in
metrics.jsonl besides the counters and gauges).
"""
from __future__ import annotations

import json
import subprocess
import time

import requests
from kv_recorder import RS_PATH, SYSTEM_TEXT, Recorder, _stamp, chat, sc_multiturn, seq_send, tenant_system

FULL = {"vllm_xargs": {"kv_cache_report_mode": "full"}}


def _send(rec: Recorder, r, scenario: str, i: int, body: dict, **tags) -> dict:
    """Send one request; record ``tags`` (tenant, salt, adapter, report_mode) in its line."""
    line = rec.send(r.api, r.name, scenario, i, body)
    mode = (body.get("vllm_xargs") or {}).get("kv_cache_report_mode", "incremental")
    line.update(report_mode=mode, **tags)
    rec.write_request(line)
    time.sleep(rec.args.gap)
    return line


def sc_full_report_mixed(rec: Recorder, meta: dict) -> None:
    """Full-report and normal requests interleaved on a shared system prompt, a second tenant,
    a prompt diverging in the middle (partial hit), then a reset and the same again."""
    r = rec.replicas["vllm"]
    half = len(SYSTEM_TEXT) // 2
    middle = SYSTEM_TEXT[:half] + " (revised) " + SYSTEM_TEXT[half:]
    plan = [
        (SYSTEM_TEXT, "normal"), (SYSTEM_TEXT, "full"), (SYSTEM_TEXT, "normal"), (SYSTEM_TEXT, "full"),
        (tenant_system(1), "full"), (tenant_system(1), "normal"), (tenant_system(1), "full"),
        (middle, "full"), (middle, "normal"), (SYSTEM_TEXT, "full"),
    ]
    i = 0

    def run_plan(tag: str) -> None:
        nonlocal i
        for system, mode in plan:
            extra = FULL if mode == "full" else {}
            _send(rec, r, rec.args.scenario, i, chat(system, f"{tag} question {i}", **extra))
            i += 1
    rec.phase("mixed")
    run_plan("Before")
    time.sleep(2)
    meta["reset"] = rec.reset(r)
    time.sleep(3)
    rec.phase("after reset")
    run_plan("After")


def _ids(seed: int, n: int) -> list[int]:
    return [(seed * 131 + 7 * k) % 800 + 20 for k in range(n)]


def sc_twin_removal(rec: Recorder, _meta: dict) -> None:
    """Prompts of exactly 256 tokens (2 blocks) sent twice store block 1 twice under one hash (at
    most prompt - 1 tokens can hit). A pool of 9 usable blocks then evicts one copy while the other
    stays cached; a 384-token prompt extending A shows whether A's block 1 still hits."""
    r = rec.replicas["vllm"]

    def comp(ids: list[int]) -> dict:
        return {"model": "tiny", "max_tokens": 1, "temperature": 0, "ignore_eos": True, "prompt": ids}
    a, ax = _ids(1, 256), _ids(1, 256) + _ids(9, 128)
    seqs = [("A", a), ("A", a), ("B", _ids(2, 256)), ("A+X", ax), ("C", _ids(3, 256)), ("A", a),
            ("D", _ids(4, 256)), ("A+X", ax), ("E", _ids(5, 256)), ("F", _ids(6, 256)), ("A+X", ax), ("A", a)]
    rec.phase("twins")
    for i, (name, ids) in enumerate(seqs):
        _send(rec, r, "twin_removal", i, comp(ids), prompt_name=name)


def sc_parallel_n(rec: Recorder, _meta: dict) -> None:
    """n=1 and n=3 on a shared system prompt (seeded sampling so the 3 copies differ), and n=3 on a
    cold prompt (its copies hit each other). `parallel_n_full`: the same with every request in full
    report mode."""
    r = rec.replicas["vllm"]
    rec.phase("parallel n")
    plan = [(SYSTEM_TEXT, 1), (SYSTEM_TEXT, 1), (SYSTEM_TEXT, 3), (SYSTEM_TEXT, 3), (tenant_system(2), 3),
            (tenant_system(2), 1), (tenant_system(3), 1), (tenant_system(3), 3)]
    extra = FULL if rec.args.scenario.endswith("_full") else {}
    for i, (system, n) in enumerate(plan):
        body = chat(system, f"Sample question {i}", n=n, seed=1234 + i, **extra)
        if n > 1:
            body["temperature"] = 0.8
        _send(rec, r, rec.args.scenario, i, body, n=n)


SALTS = {"t1": "test-salt-t1-constructed", "t2": "test-salt-t2-constructed", "t3": "test-salt-t3-constructed"}


def make_adapters(rec: Recorder) -> None:
    """Two LoRA adapters (rank 8, q_proj/v_proj, small random weights) for the tiny Llama, written
    with the vLLM venv's torch + safetensors."""
    code = r'''
import json, sys, torch
from safetensors.torch import save_file
cfg = json.load(open(sys.argv[1] + "/config.json"))
h, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
q_out, v_out = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
for k, d in enumerate(sys.argv[2:]):
    import os; os.makedirs(d, exist_ok=True)
    g = torch.Generator().manual_seed(100 + k)
    t = {}
    for i in range(layers):
        for proj, out in (("q_proj", q_out), ("v_proj", v_out)):
            p = f"base_model.model.model.layers.{i}.self_attn.{proj}"
            t[p + ".lora_A.weight"] = (torch.randn(8, h, generator=g) * 0.01).to(torch.bfloat16)
            t[p + ".lora_B.weight"] = (torch.randn(out, 8, generator=g) * 0.01).to(torch.bfloat16)
    save_file(t, d + "/adapter_model.safetensors")
    json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 8, "lora_alpha": 16, "lora_dropout": 0.0,
               "bias": "none", "target_modules": ["q_proj", "v_proj"], "base_model_name_or_path": "model",
               "fan_in_fan_out": False, "modules_to_save": None}, open(d + "/adapter_config.json", "w"), indent=1)
'''
    dirs = [str(rec.tmp / "lora" / n) for n in ("a1", "a2")]
    subprocess.run([rec.args.vllm_python, "-c", code, str(rec.model_dir), *dirs], check=True)


def sc_tenants_lora(rec: Recorder, meta: dict) -> None:
    """Three salted tenants sharing one system prompt, one tenant without a salt, one with a
    timestamp at the head, and two LoRA adapters over the same prompts; round 1 and the adapters'
    second request use full report mode."""
    r = rec.replicas["vllm"]
    who = [("t1", None), ("t2", None), ("t3", None), ("t0", None), ("ts", None), ("t0", "a1"), ("t0", "a2")]
    i = 0
    for rnd in range(3):
        rec.phase(f"round {rnd}")
        for tenant, adapter in who:
            system = (f"Current time: {_stamp(10 * i)}. " + SYSTEM_TEXT) if tenant == "ts" else SYSTEM_TEXT
            extra: dict = {}
            salt = SALTS.get(tenant)
            if salt:
                extra["cache_salt"] = salt
            full = rnd == 1 or (adapter is not None and rnd == 2)
            if full:
                extra.update(FULL)
            body = chat(system, f"Round {rnd}: question from {tenant} number {i}", **extra)
            if adapter:
                body["model"] = adapter
            _send(rec, r, rec.args.scenario, i, body, tenant=tenant, salt=salt, adapter=adapter)
            i += 1
    meta["tenants"] = {"salts": SALTS, "salts_note": "constructed test salts, not secrets",
                       "adapters": {"a1": "rank 8 q_proj/v_proj, torch seed 100",
                                    "a2": "rank 8 q_proj/v_proj, torch seed 101"}}


ALERT_SALTS = {**SALTS, "ts": "test-salt-ts-constructed"}
ALERT_ROUNDS, ALERT_PERIOD = 20, 26.0     # a round every 26 s: ~8.7 minutes of traffic


def sc_tenants_alert(rec: Recorder, meta: dict) -> None:
    """For the per-tenant alert: t1, t2, t3 with salts sharing one system prompt, t0 without a salt, and
    ts with its own salt and a timestamp at the head of its prompt; every request in full report mode
    (exact per-tenant hits), one round of the five every ALERT_PERIOD seconds, ALERT_ROUNDS rounds."""
    r = rec.replicas["vllm"]
    i, start = 0, time.time()
    for rnd in range(ALERT_ROUNDS):
        time.sleep(max(0.0, start + rnd * ALERT_PERIOD - time.time()))
        rec.phase(f"round {rnd}")
        for tenant in ("t1", "t2", "t3", "t0", "ts"):
            system = (f"Current time: {_stamp(10 * i)}. " + SYSTEM_TEXT) if tenant == "ts" else SYSTEM_TEXT
            salt = ALERT_SALTS.get(tenant)
            extra: dict = dict(FULL, cache_salt=salt) if salt else dict(FULL)
            body = chat(system, f"Round {rnd}: question from {tenant} number {i}", max_tokens=2, **extra)
            _send(rec, r, rec.args.scenario, i, body, tenant=tenant, salt=salt, adapter=None)
            i += 1
    meta["tenants"] = {"salts": ALERT_SALTS, "salts_note": "constructed test salts, not secrets",
                       "rounds": ALERT_ROUNDS, "round_period_s": ALERT_PERIOD}


def sc_cpu_offload(rec: Recorder, _meta: dict) -> None:
    """Native CPU offloading with a small device pool: 6 tenants x 6 blocks cycle through 23
    usable device blocks (evicted from the device), then each tenant again (hits from the CPU tier)."""
    r = rec.replicas["vllm"]
    rec.phase("fill")
    seq_send(rec, r, "cpu_offload", [chat(tenant_system(k), f"Fill {k}") for k in range(6)])
    time.sleep(2)
    rec.phase("again")
    seq_send(rec, r, "cpu_offload", [chat(tenant_system(k), f"Again {k}") for k in range(6)], start=6)
    time.sleep(2)
    rec.phase("again 2")
    seq_send(rec, r, "cpu_offload", [chat(tenant_system(k), f"Third {k}") for k in (0, 5)], start=12)


HYBRID_CONFIG = {
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 844, "hidden_size": 128,
    "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
    "head_dim": 64, "query_pre_attn_scalar": 64, "sliding_window": 256,
    "layer_types": ["sliding_attention", "full_attention"], "max_position_embeddings": 4096,
    "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-06, "attention_bias": False,
    "attention_dropout": 0.0, "attn_logit_softcapping": None, "final_logit_softcapping": None,
    "rope_parameters": {"full_attention": {"rope_theta": 1000000.0, "rope_type": "default"},
                        "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}},
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "tie_word_embeddings": True, "use_cache": True,
    "dtype": "bfloat16"}


def hybrid_model(rec: Recorder) -> None:
    """A tiny Gemma-3 text config (one sliding-window layer of 256 tokens, one full-attention layer)
    over the fixtures' tokenizer: constructed config, real engine with --load-format dummy."""
    _write_config(rec, HYBRID_CONFIG)


def swa_partial_model(rec: Recorder) -> None:
    """HYBRID_CONFIG with a 512-token window (4 blocks of 128 before a hit)."""
    _write_config(rec, dict(HYBRID_CONFIG, sliding_window=512))


def swa_only_model(rec: Recorder) -> None:
    """HYBRID_CONFIG with both layers sliding (window 256): one KV-cache group, no full attention."""
    _write_config(rec, dict(HYBRID_CONFIG, layer_types=["sliding_attention", "sliding_attention"]))


def _write_config(rec: Recorder, cfg: dict) -> None:
    (rec.model_dir / "config.json").write_text(json.dumps(cfg, indent=1), encoding="utf-8")
    (rec.out / "model-config.json").write_text(json.dumps(cfg, indent=1) + "\n", encoding="utf-8")


def mamba_model(rec: Recorder) -> None:
    """A tiny NemotronH config (layers: Mamba-2, attention, MLP), built by the vLLM venv's
    transformers (NemotronHConfig) so that every default field is written."""
    code = r'''
import json, sys
from transformers import NemotronHConfig
c = NemotronHConfig(vocab_size=844, hidden_size=128, hybrid_override_pattern="M*-", num_attention_heads=2,
                    num_key_value_heads=1, head_dim=64, mamba_num_heads=8, mamba_head_dim=32, ssm_state_size=16,
                    n_groups=1, intermediate_size=256, max_position_embeddings=4096, chunk_size=128,
                    bos_token_id=1, eos_token_id=2, pad_token_id=0)
c.architectures = ["NemotronHForCausalLM"]
c.dtype = "bfloat16"
print(c.to_json_string())
'''
    out = subprocess.run([rec.args.vllm_python, "-c", code], check=True, capture_output=True, text=True).stdout
    _write_config(rec, json.loads(out))


def sc_hybrid_swa(rec: Recorder, _meta: dict) -> None:
    """What hits on a model with a sliding-window layer group: the shared ~830-token prompt twice,
    a prompt diverging in the middle of it twice (3 blocks in common), a ~1650-token prompt
    extending it twice, and a ~400-token prompt twice."""
    r = rec.replicas["vllm"]
    half = len(SYSTEM_TEXT) // 2
    middle = SYSTEM_TEXT[:half] + " (revised) " + SYSTEM_TEXT[half:]
    rec.phase("hybrid")
    x = FULL if rec.args.scenario.endswith("_full") else {}     # hybrid_swa_full: every request full report
    bodies = [chat(SYSTEM_TEXT, f"Hybrid question {j}", **x) for j in range(2)]
    bodies += [chat(middle, f"Middle question {j}", **x) for j in range(2)]
    bodies += [chat(SYSTEM_TEXT + " " + SYSTEM_TEXT, f"Long question {j}", **x) for j in range(2)]
    bodies += [chat(SYSTEM_TEXT[:500], f"Short question {j}", **x) for j in range(2)]
    seq_send(rec, r, rec.args.scenario, bodies)


def sc_swa_partial(rec: Recorder, _meta: dict) -> None:
    """Traffic the window rule was not written from: a ~1600-token prompt and a second question on it
    (a hit short of the prompt), the ~800-token prompt that is its head twice (cut, then the junction
    kept), a ~550-token head of that twice, the first prompt again, and a prompt diverging late in the
    long one twice (a hit in the middle of the held prefix, then the junction)."""
    r = rec.replicas["vllm"]
    long = SYSTEM_TEXT + " " + SYSTEM_TEXT
    late = SYSTEM_TEXT + " " + SYSTEM_TEXT[:600] + " (changed) " + SYSTEM_TEXT[600:]
    rec.phase("swa")
    bodies = [chat(long, "Window question 0"), chat(long, "Window question 1"),
              chat(SYSTEM_TEXT, "Head question 2"), chat(SYSTEM_TEXT, "Head question 3"),
              chat(SYSTEM_TEXT[:700], "Short head 4"), chat(SYSTEM_TEXT[:700], "Short head 5"),
              chat(long, "Window question 0"),
              chat(late, "Late question 7"), chat(late, "Late question 8")]
    seq_send(rec, r, rec.args.scenario, bodies)


def sc_swa_tiny_pool(rec: Recorder, _meta: dict) -> None:
    """The hybrid model (window 256) on a pool that evicts: 6 tenants' prompts, 3 rounds, then 2 tenants
    twice (as tiny_pool); both groups take their blocks from the one pool."""
    r = rec.replicas["vllm"]
    rec.phase("traffic")
    bodies = [chat(tenant_system(k), f"Round {rnd}: where is order {100 * k + rnd}?")
              for rnd in range(3) for k in range(6)]
    bodies += [chat(tenant_system(k), f"Again {j} for {k}") for j in range(2) for k in (0, 1)]
    seq_send(rec, r, rec.args.scenario, bodies)


def sc_swa_pool_mix(rec: Recorder, _meta: dict) -> None:
    """The hybrid model (window 256) on a pool of 40 blocks: 4, then 5 tenants' prompts cycling, then a
    mixed order; the pool sits at the edge where the sliding-window group's blocks decide what survives
    (chosen because the plain LRU rule, the windowed rule on an unlimited pool and on this pool differ
    here, before recording)."""
    r = rec.replicas["vllm"]
    rec.phase("traffic")
    ks = [0, 1, 2, 3, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 3, 1, 4, 2, 0]
    seq_send(rec, r, rec.args.scenario, [chat(tenant_system(k), f"Round {i}: where is order {100 * k + i}?")
                                         for i, k in enumerate(ks)])


def sc_swa_chunked(rec: Recorder, _meta: dict) -> None:
    """The hybrid model (window 256) on a pool of 72 blocks with ~3250-token prompts (a tenant's system
    prompt 4 times): prefilled in two chunks (2048 tokens a step on CPU), the sliding-window group freeing
    blocks between them. The order was chosen, before recording, where analyze's pool simulation with and
    without chunks disagreed."""
    r = rec.replicas["vllm"]
    rec.phase("traffic")
    ks = [0, 0, 1, 1, 0, 2, 2, 1, 0, 2, 1, 0]
    seq_send(rec, r, rec.args.scenario, [chat(" ".join([tenant_system(k)] * 4), f"Round {i}: where is order {100 * k + i}?")
                                         for i, k in enumerate(ks)])


def sc_swa_multiturn(rec: Recorder, meta: dict) -> None:
    """kv_record.py's multiturn traffic (2 chats x 3 turns, 200 generated tokens a turn, replies repeated
    in the next turn) on the hybrid model: generated blocks are cached by the full-attention group only."""
    sc_multiturn(rec, meta)


def sc_rust_mixed(rec: Recorder, meta: dict) -> None:
    """Through the Rust frontend: full_report_mixed's traffic (with its reset), then cache_salt
    a, a (full), b, and one n=3 request: whether vllm_xargs, cache_salt and n reach the engine."""
    sc_full_report_mixed(rec, meta)
    r = rec.replicas["vllm"]
    rec.phase("salts and n")
    i = 20
    for salt, mode in (("test-salt-a-constructed", "normal"), ("test-salt-a-constructed", "full"),
                       ("test-salt-b-constructed", "normal")):
        extra = dict(FULL) if mode == "full" else {}
        _send(rec, r, rec.args.scenario, i, chat(SYSTEM_TEXT, f"Salted {i}", cache_salt=salt, **extra), salt=salt)
        i += 1
    body = chat(SYSTEM_TEXT, f"Sample {i}", n=3, seed=7, temperature=0.8)
    t = time.time()
    resp = requests.post(r.api + "/v1/chat/completions", json=body, timeout=60)
    line = {"scenario": rec.args.scenario, "i": i, "time": t, "t_send": t, "t_recv": time.time(), "replica": r.name,
            "request": body, "n": 3, "http_status": resp.status_code}
    if resp.status_code == 200:
        line["usage"] = resp.json().get("usage")
    else:   # the Rust frontend refuses n > 1: keep its answer (a line without usage)
        line["error"] = resp.text[:500]
    rec.write_request(line)
    time.sleep(rec.args.gap)


def sc_full_report_bursts(rec: Recorder, _meta: dict) -> None:
    """Concurrent full-report requests on a pool too small for all tenants: bursts of 8 (4 tenants x 2)
    for tenants 0-3, twice, then tenants 4-7 twice (evicting 0-3), then tenants 0-3 again. Every
    request asks for full report mode; lines are in submission order (t_send/t_recv give overlap)."""
    from concurrent.futures import ThreadPoolExecutor
    r = rec.replicas["vllm"]
    i = 0
    with ThreadPoolExecutor(8) as ex:
        for burst, base in enumerate((0, 0, 4, 4, 0)):
            rec.phase(f"burst {burst}")
            bodies = [chat(tenant_system(base + k % 4), f"Burst {burst} request {k}", **FULL) for k in range(8)]
            futs = [ex.submit(rec.send, r.api, r.name, rec.args.scenario, i + k, b) for k, b in enumerate(bodies)]
            for k, f in enumerate(futs):
                line = f.result()
                line.update(report_mode="full", tenant=f"t{base + k % 4}")
                rec.write_request(line)
            i += len(bodies)
            time.sleep(1.5)


LORA_ARGS = ["--enable-lora", "--max-lora-rank", "8", "--max-loras", "2", "--lora-modules", "a1={lora_a1}", "a2={lora_a2}"]
RUST = {"VLLM_USE_RUST_FRONTEND": "1", "VLLM_RUST_FRONTEND_PATH": RS_PATH}

MORE = {
    "full_report_mixed": {"fn": sc_full_report_mixed, "pool": 160},
    # a pool of 10 blocks holds 1280 tokens: max-model-len must fit (the later flag wins in argparse)
    "twin_removal": {"fn": sc_twin_removal, "pool": 10, "extra_args": ["--max-model-len", "1024"]},
    "parallel_n": {"fn": sc_parallel_n, "pool": 160, "keep_histograms": ["vllm:request_params_n"]},
    "parallel_n_full": {"fn": sc_parallel_n, "pool": 160, "keep_histograms": ["vllm:request_params_n"]},
    "tenants_lora": {"fn": sc_tenants_lora, "pool": 160, "setup": make_adapters, "extra_args": LORA_ARGS},
    # 20 rounds of ts store 120 blocks: a pool of 400 evicts nothing
    "tenants_alert": {"fn": sc_tenants_alert, "pool": 400},
    "cpu_offload": {"fn": sc_cpu_offload, "pool": 24,
                    "extra_args": ["--kv-offloading-backend", "native", "--kv-offloading-size", "0.05",
                                   "--max-model-len", "2048"]},
    "cpu_offload_simple": {"fn": sc_cpu_offload, "pool": 24, "env": {"VLLM_USE_SIMPLE_KV_OFFLOAD": "1"},
                           "extra_args": ["--kv-offloading-backend", "native", "--kv-offloading-size", "0.05",
                                          "--max-model-len", "2048"]},
    "rust_frontend_mixed": {"fn": sc_rust_mixed, "pool": 160, "serve_cli": "/work/shared/tools/vllm_cli.py",
                            "env": RUST},
    "full_report_bursts": {"fn": sc_full_report_bursts, "pool": 40},
    "rust_tenants_lora": {"fn": sc_tenants_lora, "pool": 160, "setup": make_adapters, "env": RUST,
                          "serve_cli": "/work/shared/tools/vllm_cli.py", "extra_args": LORA_ARGS},
    "hybrid_swa": {"fn": sc_hybrid_swa, "pool": 160, "setup": hybrid_model},
    "hybrid_swa_full": {"fn": sc_hybrid_swa, "pool": 160, "setup": hybrid_model},
    "hybrid_mamba": {"fn": sc_hybrid_swa, "pool": 160, "setup": mamba_model},
    "swa_partial": {"fn": sc_swa_partial, "pool": 160, "setup": swa_partial_model},
    "swa_only": {"fn": sc_swa_partial, "pool": 160, "setup": swa_only_model},
    "swa_tiny_pool": {"fn": sc_swa_tiny_pool, "pool": 40, "setup": hybrid_model,
                      "extra_args": ["--max-model-len", "2048"]},
    "swa_pool_mix": {"fn": sc_swa_pool_mix, "pool": 40, "setup": hybrid_model,
                     "extra_args": ["--max-model-len", "2048"]},
    "swa_chunked": {"fn": sc_swa_chunked, "pool": 72, "setup": hybrid_model},
    "swa_multiturn": {"fn": sc_swa_multiturn, "pool": 160, "setup": hybrid_model},
}
