#!/usr/bin/env python3
"""Per request of a sequential kv_record.py capture: the KV events that arrived between its send
and the next request's send (stored events/blocks with parents, removals, clears, media), beside
its usage (prompt, cached) and tags (report_mode, tenant, adapter, n, prompt_name).

    python scripts/e2e/kv_per_request.py tests/fixtures/vllm-0.32.0-cpu-kv-events/full_report_mixed
"""
from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import msgspec

TAGS = ("report_mode", "tenant", "adapter", "n", "prompt_name")


def main() -> int:
    d = Path(sys.argv[1])
    msgs = [json.loads(x) for x in (d / "events.jsonl").read_text().splitlines() if x.strip()]
    lines = [json.loads(x) for x in (d / "requests.jsonl").read_text().splitlines() if x.strip()]
    marks = sorted([(ln["t_send"] if "request" in ln else ln["time"], k) for k, ln in enumerate(lines)])
    hashes_seen: dict[int, int] = {}
    for pos, (t0, k) in enumerate(marks):
        t1 = marks[pos + 1][0] if pos + 1 < len(marks) else float("inf")
        ln = lines[k]
        if "request" not in ln:
            print(f"-- {ln['event']} {ln.get('status', '')}")
            continue
        u = ln.get("usage") or {}
        cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens")
        tags = " ".join(f"{t}={ln[t]}" for t in TAGS if ln.get(t) is not None)
        parts = []
        for m in msgs:
            if not t0 <= m["t"] < t1:
                continue
            _, events, _ = msgspec.msgpack.decode(base64.b64decode(m["payload_b64"]))
            for e in events:
                if e["type"] == "BlockStored":
                    hs = e["block_hashes"]
                    known = sum(1 for h in hs if hashes_seen.get(h))
                    for h in hs:
                        hashes_seen[h] = hashes_seen.get(h, 0) + 1
                    par = "null" if e["parent_block_hash"] is None else "p"
                    parts.append(f"S{len(hs)}(parent {par}, {known} known, {e.get('medium')}"
                                 f"{', lora ' + str(e.get('lora_name')) if e.get('lora_name') else ''}"
                                 f"{', xk ' + str(e['extra_keys'][0]) if e.get('extra_keys') and e['extra_keys'][0] else ''})")
                elif e["type"] == "BlockRemoved":
                    h = e["block_hashes"][0]
                    parts.append(f"R(copies {hashes_seen.get(h, 0)}, {e.get('medium')})")
                    hashes_seen[h] = hashes_seen.get(h, 0) - 1
                else:
                    parts.append(e["type"])
        print(f"{ln['i']:>3} {tags:<40} prompt {u.get('prompt_tokens')} cached {cached}: {' '.join(parts) or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
