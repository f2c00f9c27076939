#!/usr/bin/env python3
"""Record a real vLLM (CPU build) scenario WITH its KV-cache events, for tests and the e2e proof.

    python scripts/e2e/kv_record.py SCENARIO --out tests/fixtures/vllm-0.32.0-cpu-kv-events/SCENARIO \
        [--vllm-python /work/vllm/venv/bin/python]

For one scenario this starts one (or two) real vLLM servers on 127.0.0.1 with
``--kv-events-config`` (ZMQ PUB + replay ROUTER), subscribes to each server's events with a
pyzmq SUB socket *before* the server starts (so nothing is missed, and the socket reconnects by
itself across a restart), sends the scenario's traffic and writes, with receive times:

* ``events.jsonl``   one line per ZMQ message: ``{"t", "replica", "topic", "seq", "payload_b64"}``
                     (the raw msgpack payload, undecoded, so readers decode it themselves);
* ``metrics.jsonl``  ``/metrics`` polled every second: ``{"t", "replica", "text"}`` with only the
                     ``vllm:`` counter/gauge families and ``process_start_time_seconds`` (a valid
                     exposition), or ``{"t", "replica", "unchanged": true}`` when it equals the
                     previous poll of that replica;
* ``requests.jsonl`` the request stream in the line shape ``cachemon analyze`` reads
                     (``{"scenario", "i", "time", "request", "usage", "completion_token_ids"?}`` plus
                     ``replica``, ``t_send``, ``t_recv``), with ``{"event": "reset_prefix_cache"}`` and
                     ``{"event": "restart"}`` lines where they happened;
* ``vllm-server[-REPLICA].log`` the server's output, machine paths replaced by placeholders;
* ``metadata.json``  flags, ports, pool sizes, phases, start/stop times, the replay-socket check
                     and vLLM's final prefix-cache counters.

Only processes started here are ever stopped (SIGINT to their process group, then SIGKILL).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from concurrent.futures import ThreadPoolExecutor  # noqa: E402

from kv_floors import FLOORS  # noqa: E402
from kv_more import MORE  # noqa: E402
from kv_recorder import ROOT, SYSTEM_TEXT, Recorder, _rid, _stamp, chat, record_main, sc_multiturn, seq_send, tenant_system  # noqa: E402
from kv_tiers_plans import TIERS  # noqa: E402
from router import Router  # noqa: E402

from cachemon.tools.capture import build_request  # noqa: E402


def run(args) -> None:
    sc = args.scenario
    plan = SCENARIOS[sc]
    rec = Recorder(args, plan)
    meta: dict = {"command": "python scripts/e2e/kv_record.py " + " ".join(sys.argv[1:]).replace(str(ROOT) + "/", "")}
    names = ["replica0", "replica1"] if plan.get("replicas", 1) == 2 else ["vllm"]
    for k, n in enumerate(names):
        rep = rec.add_replica(n, plan.get("pool"))
        if plan.get("hash_seeds"):
            rep.hash_seed = plan["hash_seeds"][k]
    if plan.get("setup"):
        plan["setup"](rec)
    rec.start_loops()
    time.sleep(0.5)
    try:
        for r in rec.replicas.values():
            r.start()
        first = next(iter(rec.replicas.values()))
        try:
            rec.version = first.session.get(first.api + "/version", timeout=5).json().get("version", "")
        except Exception:
            rec.version = ""
        plan["fn"](rec, meta)
        rec.finish(meta)
    finally:
        rec.procs.stop_all()
        rec.stop_flag.set()
    print(json.dumps({k: meta.get(k) for k in ("messages_per_replica", "replay_check", "final_counters")}, indent=1))


def sc_tiny_pool(rec: Recorder, _meta: dict) -> None:
    r = rec.replicas["vllm"]
    # 6 tenants x 6 cached blocks = 36 > the pool's free blocks: cycling through them evicts
    bodies = [chat(tenant_system(k), f"Round {rnd}: where is order {100 * k + rnd}?")
              for rnd in range(3) for k in range(6)]
    rec.phase("traffic")
    seq_send(rec, r, "tiny_pool", bodies)
    # then two tenants only (fit in the pool): hits again
    rec.phase("two tenants")
    seq_send(rec, r, "tiny_pool", [chat(tenant_system(k), f"Again {j} for {k}") for j in range(2) for k in (0, 1)],
             start=len(bodies))


def warm_bodies(tag: str) -> list[dict]:
    return [chat(tenant_system(k), f"{tag} {j}: where is my parcel {k}{j}?") for j in range(2) for k in range(3)]


def sc_reset(rec: Recorder, meta: dict) -> None:
    r = rec.replicas["vllm"]
    rec.phase("warm")
    seq_send(rec, r, "reset", warm_bodies("Warm"))
    time.sleep(2)
    meta["reset"] = rec.reset(r)
    time.sleep(4)          # AllBlocksCleared is published at the next engine step: show the delay
    rec.phase("after reset")
    seq_send(rec, r, "reset", warm_bodies("Warm"), start=6)


def sc_restart(rec: Recorder, _meta: dict) -> None:
    r = rec.replicas["vllm"]
    rec.phase("warm")
    seq_send(rec, r, "restart", warm_bodies("Warm"))
    time.sleep(2)
    r.stop()
    rec.write_event("restart", replica=r.name)
    r.start()
    rec.phase("after restart")
    seq_send(rec, r, "restart", warm_bodies("Warm"), start=6)


def sc_dyn_head(rec: Recorder, _meta: dict) -> None:
    r = rec.replicas["vllm"]
    bodies = []
    for i in range(20):
        value = f"[Request ID: {_rid(i)}] Current time: {_stamp(i)}. " if i % 2 == 0 else f"Current time: {_stamp(i)}. "
        bodies.append(chat(value + SYSTEM_TEXT, f"Question {i}: where is my parcel number {1000 + i}?"))
    rec.phase("head")
    seq_send(rec, r, "dynamic_prefix_head", bodies)


def sc_dyn_tail(rec: Recorder, _meta: dict) -> None:
    r = rec.replicas["vllm"]
    bodies = [chat(SYSTEM_TEXT + f"Current time: {_stamp(i)}. Request ID: {_rid(i)}.",
                   f"Question {i}: where is my parcel number {1000 + i}?") for i in range(20)]
    rec.phase("tail")
    seq_send(rec, r, "dynamic_prefix_tail", bodies)


def sc_cold_start(rec: Recorder, _meta: dict) -> None:
    r = rec.replicas["vllm"]
    rec.phase("cold")
    seq_send(rec, r, "cold_start", [dict(build_request("static-system-prompt", i, "tiny"), ignore_eos=True)
                                    for i in range(10)])


def sc_routing(rec: Recorder, meta: dict) -> None:
    reps = list(rec.replicas.values())
    log = open(rec.out / "router.jsonl", "wb")
    router = Router([r.api for r in reps], "round-robin", log=log)
    base = router.start()
    rec.phase("round-robin")
    # tenants in pairs A A B B ...: round-robin sends each tenant's second request to the other replica
    bodies = [chat(tenant_system(k), f"Visit {v}.{j} of tenant {k}") for v in range(3) for k in range(3) for j in range(2)]
    try:
        for i, b in enumerate(bodies):
            line = rec.send(base, None, rec.args.scenario, i, b)
            line["replica"] = reps[_last_routed(rec.out / "router.jsonl")].name
            rec.write_request(line)
            time.sleep(rec.args.gap)
    finally:
        router.stop()
        log.close()
    meta["router"] = {"policy": "round-robin", "per_replica": router.per_replica}


def sc_cache_salt(rec: Recorder, _meta: dict) -> None:
    """The same prompt with cache_salt a, b, a, none, a: the salt enters block 0's hash (vLLM puts
    it in the first block's extra keys, v1/core/kv_cache_utils.py), so each salt is its own chain."""
    r = rec.replicas["vllm"]
    bodies = []
    for i, salt in enumerate(["tenant-a", "tenant-b", "tenant-a", None, "tenant-a"]):
        extra = {"cache_salt": salt} if salt else {}
        bodies.append(chat(SYSTEM_TEXT, f"Salted question {i}", **extra))
    rec.phase("cache_salt")
    seq_send(rec, r, "cache_salt", bodies)


def _last_routed(path: Path) -> int:
    lines = path.read_text().splitlines()
    return int(json.loads(lines[-1])["replica"])


def sc_bursts(rec: Recorder, _meta: dict) -> None:
    r = rec.replicas["vllm"]
    i = 0
    with ThreadPoolExecutor(8) as ex:
        for burst in range(4):
            rec.phase(f"burst {burst}")
            # bursts: 4 tenants, 2 requests each; bursts_tiny_pool: 8 tenants, 7 blocks each > the pool
            tenants = 8 if rec.args.scenario == "bursts_tiny_pool" else 4
            bodies = [chat(tenant_system(k % tenants), f"Burst {burst} request {k}") for k in range(8)]
            futs = [ex.submit(rec.send, r.api, r.name, rec.args.scenario, i + k, b) for k, b in enumerate(bodies)]
            for f in futs:
                rec.write_request(f.result())
            i += len(bodies)
            time.sleep(1.5)


def sc_block_edge(rec: Recorder, _meta: dict) -> None:
    """Completions given as token ids whose length is an exact multiple of the block size (and +-1),
    each sent twice: at most prompt_tokens - 1 can hit, so the repeat of a 256-token prompt
    recomputes its last block and stores it again while it is still cached."""
    r = rec.replicas["vllm"]
    base = [(7 * k) % 500 + 10 for k in range(300)]
    bodies = []
    for n in (256, 255, 257, 384):
        body = {"model": "tiny", "max_tokens": 1, "temperature": 0, "ignore_eos": True, "prompt": base[:n]}
        bodies += [body, body]
    rec.phase("block edges")
    seq_send(rec, r, "block_edge", bodies)


SCENARIOS = {
    "block_edge": {"fn": sc_block_edge, "pool": 160},
    "tiny_pool": {"fn": sc_tiny_pool, "pool": 36},
    "reset": {"fn": sc_reset, "pool": 160},
    "restart": {"fn": sc_restart, "pool": 160},
    "dynamic_prefix_head": {"fn": sc_dyn_head, "pool": 160},
    "dynamic_prefix_tail": {"fn": sc_dyn_tail, "pool": 160},
    "routing": {"fn": sc_routing, "pool": 160, "replicas": 2},
    "routing_hashseed": {"fn": sc_routing, "pool": 160, "replicas": 2, "hash_seeds": ["1", "2"]},
    "cache_salt": {"fn": sc_cache_salt, "pool": 160},
    "bursts": {"fn": sc_bursts, "pool": 160},
    "bursts_tiny_pool": {"fn": sc_bursts, "pool": 40},
    "multiturn": {"fn": sc_multiturn, "pool": 160},
    "cold_start": {"fn": sc_cold_start, "pool": 160},
}


def main() -> int:
    SCENARIOS.update({name: {**plan, "raw_page": True} for name, plan in {**MORE, **TIERS, **FLOORS}.items()})
    return record_main(__doc__, SCENARIOS, run)


if __name__ == "__main__":
    sys.exit(main())
