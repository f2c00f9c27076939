"""Full report mode and twin removals on REAL vLLM 0.32.0 (CPU build) captures, recorded by
scripts/e2e/kv_record.py (scenarios of scripts/e2e/kv_more.py) into
tests/fixtures/vllm-0.32.0-cpu-kv-events/<scenario>/ (skipped where a capture is not there yet).

full_report_mixed: requests with ``kv_cache_report_mode="full"`` and normal ones interleaved, one at a
time, before and after a prefix-cache reset. Asserted:
* per request, the ledger's hit tokens (reuse reports) in the request's window equal the response's
  ``cached_tokens`` for full-mode requests, and 0 for normal ones: exact hits from the events alone;
* the split equals what the events imply once the reports are taken out, and a report is found here
  independently of the ledger's rule: in a full-mode request's window, the first chain-head store
  covering exactly its ``cached_tokens``;
* per request the blocks stored (reports excluded) follow vLLM's usage.
twin_removal: prompts of whole blocks sent twice, in a pool small enough that one copy is evicted
while its twin stays: after every message the ledger's copies per hash equal the events' count.
"""
from __future__ import annotations

from collections import Counter

import pytest

from cachemon.normalise.kv_events import Cleared, KvBatch, Removed, Stored
from cachemon.state.kv_ledger import FleetLedger
from kv_support import messages, requests, scenario
from test_kv_ledger_real import oracle


def _folder(name: str):
    p = scenario(name)
    if not (p / "events.jsonl").exists() or not (p / "events.jsonl").stat().st_size:
        pytest.skip(f"capture {name} not recorded yet (scripts/e2e/kv_more.py)")
    return p


def _windows(reqs: list[dict], msgs: list[dict]) -> list[list[dict]]:
    bounds = [r["t_send"] for r in reqs] + [float("inf")]
    return [[m for m in msgs if bounds[i] <= m["t"] < bounds[i + 1]] for i in range(len(reqs))]


def _bs(msgs) -> int:
    return next(e.block_size for m in msgs for e in m["batch"].events if isinstance(e, Stored))


def test_full_report_hits_per_request_equal_cached_tokens_and_the_split_stays_exact():
    folder = _folder("full_report_mixed")
    msgs = messages(folder)
    reqs = sorted(requests(folder), key=lambda r: r["t_send"])
    assert {r["report_mode"] for r in reqs} == {"full", "incremental"}
    bs = _bs(msgs)
    fleet = FleetLedger()
    reused_after: dict[int, float] = {}
    last: dict[str, int] = {}
    for m in msgs:
        rep, seq = m["replica"], int(m["seq"])
        if rep in last and seq == 0:
            fleet.on_restart(rep, m["t"])
        last[rep] = seq
        fleet.on_batch(rep, "tiny", m["batch"], m["t"])
        led = fleet.replica(rep)
        assert led is not None
        reused_after[id(m)] = led.reused_tokens
    reports: set[int] = set()
    prev = 0.0
    full_hits = 0
    for r, win in zip(reqs, _windows(reqs, msgs), strict=True):
        got = (reused_after[id(win[-1])] - prev) if win else 0.0
        if win:
            prev = reused_after[id(win[-1])]
        cached = r["usage"]["prompt_tokens_details"]["cached_tokens"]
        want = cached if r["report_mode"] == "full" else 0
        assert got == want, (r.get("i"), r["report_mode"], got, cached)
        if r["report_mode"] == "full" and cached:
            full_hits += cached
            rep_ev = next(e for m in win for e in m["batch"].events
                          if isinstance(e, Stored) and e.parent is None and len(e.hashes) * e.block_size == cached)
            reports.add(id(rep_ev))
        # blocks stored by this request, reports excluded, follow vLLM's usage
        stored = sum(len(e.hashes) for m in win for e in m["batch"].events
                     if isinstance(e, Stored) and id(e) not in reports)
        u = r["usage"]
        assert stored == (u["prompt_tokens"] + u["completion_tokens"] - 1) // bs - cached // bs
    assert full_hits > 0
    # the split: what the events imply without the reports (vLLM's hashes, an independent reading)
    plain = [dict(m, batch=KvBatch(m["batch"].seq, m["batch"].ts,
                                   [e for e in m["batch"].events if id(e) not in reports])) for m in msgs]
    for rep, want in oracle(plain).items():
        v = fleet.view(rep)
        assert v is not None and v.in_sync
        assert {k: x for k, x in v.stored_tokens.items() if x} == {k: float(x) for k, x in want.items() if x}
    snap = fleet.snapshot()[0]
    assert snap.reused_tokens == full_hits


def test_twin_removal_copies_follow_the_events_after_every_message():
    folder = _folder("twin_removal")
    msgs = messages(folder)
    fleet = FleetLedger()
    copies: Counter = Counter()
    twins_removed = 0
    for m in msgs:
        fleet.on_batch(m["replica"], "tiny", m["batch"], m["t"])
        for e in m["batch"].events:
            if isinstance(e, Stored):
                copies.update(e.hashes)
            elif isinstance(e, Removed):
                for h in e.hashes:
                    twins_removed += copies[h] > 1
                copies.subtract(e.hashes)
            elif isinstance(e, Cleared):
                copies.clear()
        led = fleet.replica(m["replica"])
        assert led is not None
        assert all(led.copies(h) == n for h, n in copies.items()), m["seq"]
    assert twins_removed > 0, "the capture removes one copy of a twin while the other stays"
    led = fleet.replica(msgs[0]["replica"])
    assert led is not None and led.anomalies["unknown_removed"] == 0
    for rep, want in oracle(msgs).items():
        v = fleet.view(rep)
        assert v is not None and {k: x for k, x in v.stored_tokens.items() if x} == {k: float(x) for k, x in want.items()}
