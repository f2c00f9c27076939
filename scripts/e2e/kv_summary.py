#!/usr/bin/env python3
"""Summarise the KV-event recordings (tests/fixtures/vllm-*-cpu-kv-events/*): per scenario and
replica, the messages, seq ranges, stored / removed / cleared events and blocks, requests, the
stored blocks the per-request formula predicts, and vLLM's final prefix-cache counters.
Prints a Markdown table (used for the fixture README). Needs msgspec; no vllm.

    python scripts/e2e/kv_summary.py [FIXTURE_DIR]
"""
from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import msgspec

ROOT = Path(__file__).resolve().parent.parent.parent
BS = 128


def summarise(d: Path) -> list[dict]:
    msgs = [json.loads(x) for x in (d / "events.jsonl").read_text().splitlines() if x.strip()]
    reqs = [json.loads(x) for x in (d / "requests.jsonl").read_text().splitlines() if x.strip()]
    meta = json.loads((d / "metadata.json").read_text())
    rows = []
    for rep in sorted({m["replica"] for m in msgs} | set(meta["replicas"])):
        mine = [m for m in msgs if m["replica"] == rep]
        c = {"BlockStored": 0, "BlockRemoved": 0, "AllBlocksCleared": 0}
        blocks = {"BlockStored": 0, "BlockRemoved": 0}
        seqs = [m["seq"] for m in mine]
        for m in mine:
            _, events, _ = msgspec.msgpack.decode(base64.b64decode(m["payload_b64"]))
            for e in events:
                # 0.24.0 on: maps with "type"; before: arrays [tag, block_hashes, ...] (0.11.2 capture)
                kind, hashes = (e["type"], e.get("block_hashes")) if isinstance(e, dict) else (e[0], e[1:2] and e[1])
                c[kind] = c.get(kind, 0) + 1
                if kind in blocks:
                    blocks[kind] += len(hashes)
        rs = [r for r in reqs if r.get("usage") and r.get("replica") == rep]   # not refused requests
        pred = sum((r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"] - 1) // BS
                   - ((r["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0) // BS for r in rs)
        runs, cur = [], None
        for s in seqs:
            if cur is None or s != cur[1] + 1:
                cur = [s, s]
                runs.append(cur)
            else:
                cur[1] = s
        fc = meta["final_counters"].get(rep, {})
        rows.append({"scenario": d.name, "replica": rep, "messages": len(mine),
                     "seq": ", ".join(f"{a}–{b}" for a, b in runs),
                     "stored": f"{c['BlockStored']} ({blocks['BlockStored']})",
                     "removed": c["BlockRemoved"], "cleared": c["AllBlocksCleared"],
                     "requests": len(rs), "formula": pred,
                     "queries/hits": f"{fc.get('vllm:prefix_cache_queries_total', 0):.0f} / "
                                     f"{fc.get('vllm:prefix_cache_hits_total', 0):.0f}",
                     "replay": "{batches} ({first_seq}–{last_seq})".format(**meta["replay_check"][rep])
                     if rep in meta["replay_check"] else ""})
    return rows


def main() -> int:
    base = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "tests/fixtures/vllm-0.32.0-cpu-kv-events"
    rows = [r for d in sorted(base.iterdir()) if (d / "metadata.json").is_file() for r in summarise(d)]
    cols = list(rows[0]) if rows else []
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r[k]) for k in cols) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
