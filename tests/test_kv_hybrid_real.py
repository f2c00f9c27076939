"""A hybrid sliding-window + full-attention model on REAL vLLM 0.32.0 (tests/fixtures/
vllm-0.32.0-cpu-hybrid-swa, recorded by scripts/e2e/kv_record.py hybrid_swa; the model config is
constructed, the engine's events are real; its README has the per-request table).

Its KV events carry two groups per store: group 0 "sliding_window", which stores only the blocks it
keeps while its token_ids span the whole range, and group 1 "full_attention". Asserted: every payload
decodes (the sparse stores included), the ledger follows the full-attention group and its split equals
what that group's events imply, the other group's events are counted, per request the full group's
blocks stored follow vLLM's usage, and the recompute from block 0 of cached blocks that the
sliding-window group forces (a shared prefix with no hit) is not read as a full-report reuse report.
"""
from __future__ import annotations

from cachemon.normalise.kv_events import KvBatch, Removed, Stored
from cachemon.state.kv_ledger import FleetLedger
from kv_support import KV_FIXTURES, messages, requests
from test_kv_ledger_real import oracle

HYBRID = KV_FIXTURES.parent / "vllm-0.32.0-cpu-hybrid-swa" / "hybrid_swa"


def test_the_ledger_follows_the_full_attention_group_of_a_hybrid_model():
    msgs = messages(HYBRID)                       # raises KvDecodeError on any payload it cannot read
    kinds = {(e.group, e.kind) for m in msgs for e in m["batch"].events if isinstance(e, Stored)}
    assert kinds == {(0, "sliding_window"), (1, "full_attention")}
    fleet = FleetLedger()
    for m in msgs:
        fleet.on_batch(m["replica"], "tiny", m["batch"], m["t"])
    rep = msgs[0]["replica"]
    led = fleet.replica(rep)
    assert led is not None and led.group == 1
    full = [dict(m, batch=KvBatch(m["batch"].seq, m["batch"].ts, [e for e in m["batch"].events
                                                                    if getattr(e, "group", 0) == 1]))
            for m in msgs]
    want = oracle(full)[rep]
    v = fleet.view(rep)
    assert v is not None and v.in_sync
    assert {k: x for k, x in v.stored_tokens.items() if x} == {k: float(x) for k, x in want.items()}
    assert want["recompute_last_block"] == 640     # 3 + 2 cached blocks recomputed: no hit for lack of the window
    assert led.reused_tokens == 0
    others = sum(1 for m in msgs for e in m["batch"].events
                 if isinstance(e, Stored | Removed) and e.group == 0)
    assert led.anomalies["other_groups"] == others > 0
    reqs = sorted(requests(HYBRID), key=lambda r: r["t_send"])
    bounds = [r["t_send"] for r in reqs] + [float("inf")]
    for i, r in enumerate(reqs):
        got = sum(len(e.hashes) for m in full if bounds[i] <= m["t"] < bounds[i + 1]
                  for e in m["batch"].events if isinstance(e, Stored))
        u = r["usage"]
        cached = u["prompt_tokens_details"]["cached_tokens"]
        assert got == (u["prompt_tokens"] + u["completion_tokens"] - 1) // 128 - cached // 128
