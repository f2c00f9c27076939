#!/usr/bin/env python3
"""cachemon's per-tier view live on a REAL vLLM (CPU build) with a KV tier besides the device pool
(issue §4), recorded as a fixture in the same run:

    PYTHONPATH=src .venv/bin/python scripts/e2e/kv_tiers_live.py cpu_offload_hostcopy \\
        --out tests/fixtures/vllm-0.32.0-cpu-offloading [--vllm-python /work/vllm/venv/bin/python]

Not in CI (a real server: ~2-3 min per start on this CPU). For the scenario (kv_tiers_plans.TIERS):

* one real vLLM 0.32.0 server with ``--kv-events-config``, started and recorded by kv_recorder's
  ``Recorder`` (events.jsonl from its own SUB socket, requests.jsonl, metrics.jsonl, the final pages);
* a fresh ``cachemon run --poll-interval 1s`` following the server's /metrics and its KV events (the
  same config shape as kv_attribution.py);
* the scenario's traffic (``sc_tiers``);
* cachemon's own /metrics page, read after every phase and at the end, written beside the capture:
  ``cachemon-pages.jsonl`` (``{"t", "phase", "text"}``, cachemon_ families only) and
  ``cachemon-final.txt``.

At the end it checks cachemon's final live page against vLLM's final page (hits per source equal; the
ledger's hits per tier medium equal vLLM's source for that medium: CPU host, STORAGE disk), prints both and
exits 1 on a disagreement. tests/test_kv_tiers_real.py and tests/test_kv_tiers_example_connector.py hold
the recorded capture to vLLM's own counters and to an independent reading of the events, and replay it
through cachemon's stages. Only processes started here are stopped.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import requests  # noqa: E402
from kv_recorder import ROOT, TOPIC, Recorder, record_main, redact  # noqa: E402
from kv_tiers_plans import TIERS  # noqa: E402
from procs import free_port, wait_for  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402


def start_cachemon(rec: Recorder):
    """``cachemon run`` on the replica's /metrics and its KV events (with the replay socket)."""
    port = free_port()
    r = rec.replicas["vllm"]
    cfg = {"upstreams": [{"name": r.name, "url": r.api + "/metrics",
                          "kv_events": {"endpoint": f"tcp://127.0.0.1:{r.ev_port}",
                                        "replay": f"tcp://127.0.0.1:{r.replay_port}", "topic": TOPIC}}],
           "kv_events": {"new_series_hold": "0s"}}      # the ledger's counts at once: compared with vLLM's below
    cfg_path = rec.tmp / "cachemon.yaml"
    cfg_path.write_text(json.dumps(cfg), encoding="utf-8")
    argv = [sys.executable, "-m", "cachemon.cli", "run", "--listen", f"127.0.0.1:{port}", "--poll-interval", "1s",
            "--window", "10s", "--window", "1m", "--config", str(cfg_path)]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    p = rec.procs.start("cachemon", argv, rec.tmp / "cachemon.log", env=env, cwd=rec.tmp)
    url = f"http://127.0.0.1:{port}/metrics"
    wait_for(lambda: "cachemon_upstream_up" in requests.get(url, timeout=2).text, 60, 0.3, "cachemon serving",
             alive=p.alive)
    return p, url


def cachemon_page(url: str, rec: Recorder) -> str:
    """cachemon's /metrics, its cachemon_ lines, machine paths replaced as in the server logs."""
    text = requests.get(url, timeout=5).text
    return redact("\n".join(x for x in text.splitlines() if "cachemon_" in x) + "\n", rec)


SOURCE_OF = {"CPU": "host", "STORAGE": "disk"}    # vLLM's cache-hit source per tier medium


def live_checks(out: Path) -> dict:
    """cachemon's final live page against vLLM's own final page: hits per source, and the KV-event
    ledger's hits per tier medium against the source vLLM counts that medium's hits under."""
    def parse(text: str) -> dict:
        return {(smp.name, tuple(sorted(smp.labels.items()))): smp.value
                for fam in text_string_to_metric_families(text) for smp in fam.samples}

    def pick(d: dict, name: str, key: str) -> dict[str, float]:
        return {dict(ls)[key]: v for (n, ls), v in d.items() if n == name}
    vllm = parse((out / "metrics-final-raw.txt").read_text())
    cm = parse((out / "cachemon-final.txt").read_text())
    by = pick(vllm, "vllm:prompt_tokens_cached_by_source_total", "source")
    res: dict = {"vllm_by_source": by,
                 "cachemon_by_source": pick(cm, "cachemon_prefix_cache_hit_tokens_by_source_total", "source"),
                 "cachemon_tier_hits": pick(cm, "cachemon_kv_tier_hit_tokens_total", "medium"),
                 "cachemon_causes": sorted(pick(cm, "cachemon_cause_active", "cause"))}
    res["by_source_equal"] = res["cachemon_by_source"] == by
    res["tier_hits_equal"] = all(by.get(SOURCE_OF.get(m, ""), -1) == v for m, v in res["cachemon_tier_hits"].items())
    return res


def run(args) -> None:
    plan = {**TIERS[args.scenario], "raw_page": True}
    rec = Recorder(args, plan)
    meta: dict = {"command": "PYTHONPATH=src python scripts/e2e/kv_tiers_live.py " + " ".join(sys.argv[1:])}
    r = rec.add_replica("vllm", plan["pool"])
    if plan.get("setup"):
        plan["setup"](rec)
    rec.start_loops()
    time.sleep(0.5)
    pages = open(rec.out / "cachemon-pages.jsonl", "w", encoding="utf-8")
    phase = rec.phase

    try:
        r.start()
        rec.version = r.session.get(r.api + "/version", timeout=5).json().get("version", "")
        cm, url = start_cachemon(rec)

        def phase_and_page(name: str) -> None:      # cachemon's page as each phase begins
            time.sleep(2.5)                         # >= 2 polls after the last request
            pages.write(json.dumps({"t": time.time(), "phase": name, "text": cachemon_page(url, rec)}) + "\n")
            pages.flush()
            phase(name)
        rec.phase = phase_and_page                  # type: ignore[method-assign]
        time.sleep(3)
        plan["fn"](rec, meta)
        rec.phase = phase                           # type: ignore[method-assign]
        time.sleep(4)
        final = cachemon_page(url, rec)
        (rec.out / "cachemon-final.txt").write_text(final, encoding="utf-8")
        pages.write(json.dumps({"t": time.time(), "phase": "final", "text": final}) + "\n")
        pages.close()
        meta["cachemon_argv"] = "cachemon run --listen 127.0.0.1:PORT --poll-interval 1s --window 10s --window 1m " \
                                "--config cachemon.yaml (upstreams: vllm, its /metrics and kv_events endpoint+replay)"
        rec.procs.stop(cm)
        rec.finish(meta)
    finally:
        rec.procs.stop_all()
        rec.stop_flag.set()
    print(json.dumps({k: meta.get(k) for k in ("messages_per_replica", "final_counters")}, indent=1))
    checks = live_checks(rec.out)
    print(json.dumps(checks, indent=1))
    if not (checks["by_source_equal"] and checks["tier_hits_equal"]):
        raise SystemExit("FAIL: cachemon's live page disagrees with vLLM's (above)")


def main() -> int:
    return record_main(__doc__, TIERS, run)


if __name__ == "__main__":
    sys.exit(main())
