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
full_report_bursts (every request full-report, 8 concurrent, evicting): per burst the report tokens
equal the burst's cached tokens, 169 blocks in all = vLLM's hit counter / 128; the rest follows usage.
parallel_n_full: each copy of an n=3 request reports; per request reused = cached x (copies that hit).
twin_removal, block_edge: whole-block twins stay twins (no report read).
twin_removal: prompts of whole blocks sent twice, in a pool small enough that one copy is evicted
while its twin stays: after every message the ledger's copies per hash equal the events' count.
"""
from __future__ import annotations

from collections import Counter

import pytest

from assert_support import nonempty
from cachemon.normalise.kv_batch import Cleared, KvBatch, Removed, Stored
from cachemon.state.ledger.fleet import FleetLedger, Reason
from kv_support import messages, replay, requests, scenario
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


def _replay_counting(folder) -> tuple[FleetLedger, list[dict], dict[int, tuple[float, int]]]:
    """The capture fed to a fleet ledger; after each message (by id) the replica's reused tokens and
    stored tokens so far. Its clients send full reports (kv_events.full_reports: true)."""
    fleet = FleetLedger(full_reports=True)
    after: dict[int, tuple[float, int]] = {}

    def each(m: dict) -> None:
        led = fleet.replica(m["replica"])
        assert led is not None
        after[id(m)] = (led.reused_tokens, sum(led.tokens))

    return fleet, replay(folder, fleet, "tiny", each), after


def test_full_report_hits_per_request_equal_cached_tokens_and_the_split_stays_exact():
    folder = _folder("full_report_mixed")
    fleet, msgs, after = _replay_counting(folder)
    reused_after = {k: v[0] for k, v in after.items()}
    reqs = sorted(requests(folder), key=lambda r: r["t_send"])
    assert {r["report_mode"] for r in reqs} == {"full", "incremental"}
    bs = _bs(msgs)
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


def _final_hits(folder) -> float:
    for line in (folder / "metrics-final.txt").read_text().splitlines():
        if line.startswith("vllm:prefix_cache_hits_total{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no vllm:prefix_cache_hits_total in metrics-final.txt")


def _bursts(reqs: list[dict]) -> list[list[dict]]:
    """Requests grouped by burst: sends more than 0.5 s after the previous one start a new burst."""
    out: list[list[dict]] = []
    for r in reqs:
        if not out or r["t_send"] - out[-1][-1]["t_send"] > 0.5:
            out.append([])
        out[-1].append(r)
    return out


def test_full_report_bursts_reports_equal_the_hits_of_each_concurrent_burst():
    """Every request full-report, 8 in flight at once, a pool small enough to evict. A report may name
    blocks that another request cached earlier in the same engine step (vLLM caches a request's blocks
    when it schedules it, kv_cache_manager.allocate_slots -> cache_blocks, before the next request's
    lookup in the same pass), so "cached before this batch" would miss 30 report blocks here; reports
    add no reference, so blocks evicted since are stored again, not reported."""
    folder = _folder("full_report_bursts")
    fleet, msgs, after = _replay_counting(folder)
    reused_after = {k: v[0] for k, v in after.items()}
    reqs = sorted(requests(folder), key=lambda r: r["t_send"])
    assert {r["report_mode"] for r in reqs} == {"full"}
    bursts = _bursts(reqs)
    assert len(bursts) == 5 and all(len(b) == 8 for b in bursts)
    starts = [b[0]["t_send"] for b in bursts] + [float("inf")]
    prev = 0.0
    for k, b in enumerate(bursts):
        win = [m for m in msgs if starts[k] <= m["t"] < starts[k + 1]]
        assert win, k
        got = reused_after[id(win[-1])] - prev
        prev = reused_after[id(win[-1])]
        assert got == sum(r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in b), k
    led = fleet.replica(msgs[0]["replica"])
    assert led is not None and led.in_sync
    hits = sum(r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in reqs)
    assert led.reused_tokens == hits == _final_hits(folder)
    assert led.reuse_reports == sum(1 for r in reqs if r["usage"]["prompt_tokens_details"]["cached_tokens"])
    # what is left is what vLLM computed: its usage's formula, and no removal of an unknown hash
    bs = _bs(msgs)
    formula = sum((r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"] - 1) // bs
                  - r["usage"]["prompt_tokens_details"]["cached_tokens"] // bs for r in reqs)
    assert sum(led.tokens) == formula * bs
    assert led.anomalies["unknown_removed"] == 0


def test_parallel_n_full_each_copy_reports_and_the_reports_add_up_to_vllms_hit_counter():
    """n > 1 in full report mode: each copy of a request looks up and reports on its own; a cold n=3
    request's first copy stores and the other two report (vllm#56923: the copies hit each other)."""
    folder = _folder("parallel_n_full")
    fleet, msgs, after = _replay_counting(folder)
    reqs = sorted(requests(folder), key=lambda r: r["t_send"])
    assert {r["report_mode"] for r in reqs} == {"full"} and {r["request"].get("n", 1) for r in reqs} == {1, 3}
    prev = (0.0, 0)
    for r, win in zip(reqs, _windows(reqs, msgs), strict=True):
        now = after[id(win[-1])] if win else prev
        got, stored = now[0] - prev[0], now[1] - prev[1]
        prev = now
        n = r["request"].get("n", 1)
        cached = r["usage"]["prompt_tokens_details"]["cached_tokens"]
        # a copy that computed the prompt stored it; every other copy reported its hit
        assert got == cached * (n - (1 if stored else 0)), (r["i"], got, cached, n, stored)
    led = fleet.replica(msgs[0]["replica"])
    assert led is not None and led.reused_tokens == _final_hits(folder)


def test_whole_block_twins_stay_twins_with_no_report_read():
    for name in nonempty(("twin_removal", "block_edge")):
        folder = _folder(name)
        fleet = FleetLedger()
        msgs = replay(folder, fleet, "tiny")
        led = fleet.replica(msgs[0]["replica"])
        assert led is not None
        assert led.reused_tokens == 0 and led.anomalies["ambiguous_reports"] == 0, name
        assert led.tokens[int(Reason.RECOMPUTE_LAST_BLOCK)] > 0, name
