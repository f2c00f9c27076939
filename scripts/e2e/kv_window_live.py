#!/usr/bin/env python3
"""`cachemon run` live on a REAL hybrid sliding-window vLLM (CPU build): what it exports about the window.

    PYTHONPATH=src .venv/bin/python scripts/e2e/kv_window_live.py \
        --out tests/fixtures/vllm-0.32.0-cpu-hybrid-swa/live_cachemon [--vllm-python /work/vllm/venv/bin/python]

Not in CI (a real server: ~2 min per start on a CPU). One vLLM 0.32.0 server with the tiny hybrid model of
``kv_more.swa_partial_model`` (constructed config: window 512, block 128, one sliding-window and one
full-attention layer) and ``--kv-events-config``, recorded by kv_record's ``Recorder`` (its own SUB socket
writes events.jsonl); a fresh ``cachemon run --poll-interval 1s`` following the same events
(kv_attribution.start_cachemon); the ``swa_partial`` traffic. Written to --out besides the recording:
``cachemon-polls.json`` (cachemon's /metrics read after every poll: causes active, stored tokens by reason,
in-sync, missed tokens by cause) and ``cachemon-final.txt`` (the ``cachemon_kv_*`` and ``cachemon_cause_*``
lines of its last page). tests/test_window_live_real.py checks them against the recorded events.

Only processes started here are stopped (SIGINT to their group, then SIGKILL).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import kv_attribution as A  # noqa: E402
import kv_more  # noqa: E402
import kv_record as K  # noqa: E402
import requests  # noqa: E402
from kv_recorder import TOPIC  # noqa: E402

if not hasattr(K, "TOPIC"):    # kv_attribution.start_cachemon reads it there (it moved to kv_recorder)
    K.TOPIC = TOPIC  # type: ignore[attr-defined]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--vllm-python", default="/work/vllm/venv/bin/python")
    ap.add_argument("--start-timeout", type=float, default=400.0)
    ap.add_argument("--linger", type=float, default=8.0, help="seconds of polls after the traffic")
    args = ap.parse_args()
    out = Path(args.out)
    rargs = SimpleNamespace(scenario="swa_partial", out=str(out), vllm_python=args.vllm_python,
                            start_timeout=args.start_timeout, gap=1.0)
    rec = K.Recorder(rargs, {"raw_page": True})
    meta: dict = {"command": "python scripts/e2e/kv_window_live.py " + " ".join(sys.argv[1:])}
    rec.add_replica("vllm", 160)
    kv_more.swa_partial_model(rec)
    rec.start_loops()
    time.sleep(0.5)
    watch: A.Watch | None = None
    try:
        r = rec.replicas["vllm"]
        r.start()
        rec.version = r.session.get(r.api + "/version", timeout=5).json().get("version", "")
        work = Path(tempfile.mkdtemp(prefix="kvwin-"))      # cachemon's config and log (machine paths)
        cm, url = A.start_cachemon(rec, work, "window")
        watch = A.Watch(url)
        time.sleep(3)                            # a few idle polls before the traffic
        rec.phase("traffic start")
        kv_more.sc_swa_partial(rec, meta)
        rec.phase("traffic end")
        time.sleep(args.linger)
        saved = {"t_final": time.time(), "final": A.scrape(url)}
        page = requests.get(url, timeout=5).text
        watch.close()
        rec.finish(meta)
        rec.procs.stop(cm)
    finally:
        _stop(rec, watch)
    saved.update(samples=watch.samples, phases=rec.phases)
    (out / "cachemon-polls.json").write_text(json.dumps(saved, default=str) + "\n")
    (out / "cachemon-final.txt").write_text(
        "".join(x + "\n" for x in page.splitlines() if x.startswith(("cachemon_kv_", "cachemon_cause_"))))
    print(json.dumps({"polls": len(watch.samples), "final": saved["final"]}, indent=1))
    return 0


def _stop(rec: K.Recorder, watch: A.Watch | None) -> None:
    """Everything started here, whatever happened: the watcher, the servers, the recorder's loops."""
    if watch is not None:
        watch.close()
    rec.procs.stop_all()
    rec.stop_flag.set()


if __name__ == "__main__":
    sys.exit(main())
