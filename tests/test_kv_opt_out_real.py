"""Requests that skip the prefix lookup (``prompt_logprobs``; ``echo`` + ``logprobs`` on completions) on a REAL
vLLM 0.32.0 (CPU build) capture: tests/fixtures/vllm-0.32.0-cpu-floors/prompt_logprobs_mixed (recorded by
scripts/e2e/kv_record.py, scenario of scripts/e2e/kv_floors.py; no request in full report mode).

vLLM recomputes such a request's prompt and publishes every full block again from block 0, parent null,
whether cached or not; it counts the request in neither `prefix_cache_queries` nor `prefix_cache_hits`
(issue 38 item 3: read as reuse reports, they gave 4 480 phantom hit tokens and switched full reports on,
so the later one-block twin read as a hit too). Asserted against the truth computed here from the raw
msgpack and vLLM's own answers, independently of the ledger:
* every parent-null store whose block 0 was cached lies in the window of a prompt_logprobs / echo request;
* the ledger's `cache_opt_out` tokens = the cached blocks those stores recomputed (5 120), reused tokens 0
  (no request asked for full reports), full reports never switched on, the one-block twin a twin;
* vLLM's hit counter = the normal requests' cached tokens, and the opted-out requests' cached tokens are 0.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from cachemon.state.ledger.fleet import FleetLedger
from kv_support import load_messages, messages, metadata, requests

FOLDER = Path(__file__).parent / "fixtures" / "vllm-0.32.0-cpu-floors" / "prompt_logprobs_mixed"
OPTED_OUT = ("prompt_logprobs", "echo_logprobs")


def _truth() -> tuple[int, list[float]]:
    """(tokens of cached blocks stored again by chain-head stores, those stores' receive times), from the raw
    events: a reference count per hash (no request here reports, so every BlockStored is a store)."""
    refs: Counter[int] = Counter()
    tokens, times = 0, []
    for m in load_messages(FOLDER):
        for ev in m.events:
            if ev["type"] == "BlockStored":
                hs = ev["block_hashes"]
                if ev.get("parent_block_hash") is None and refs[hs[0]] and len(hs) > 1:
                    tokens += sum(ev["block_size"] for h in hs if refs[h])
                    times.append(m.t)
                refs.update(hs)
            elif ev["type"] == "BlockRemoved":
                refs.subtract(ev["block_hashes"])
            elif ev["type"] == "AllBlocksCleared":
                refs.clear()
    return tokens, times


def test_opted_out_requests_are_named_never_hits_and_never_switch_full_reports_on() -> None:
    reqs = requests(FOLDER)
    truth_tokens, times = _truth()
    # each such store comes from a request that skipped the lookup (by the request log's send/receive times)
    windows = [(r["t_send"], r["t_recv"] + 0.5) for r in reqs if r["kind"] in OPTED_OUT]
    assert times and all(any(a <= t <= b for a, b in windows) for t in times)
    fleet = FleetLedger()                               # kv_events.full_reports: auto (the default)
    for m in messages(FOLDER):
        fleet.on_batch(m["replica"], "tiny", m["batch"], m["t"])
    led, view = fleet.replica("vllm"), fleet.view("vllm")
    assert led is not None and view is not None
    assert view.stored_tokens["cache_opt_out"] == truth_tokens == 5120
    assert led.reused_tokens == 0 and led.reuse_reports == 0 and not led.full_reports
    assert led.opt_outs == 7                             # 6 all cached (ambiguous on the wire) + 1 certain
    # i=15, 16: a one-block completion sent twice: the second recomputes its block, a twin, not a hit
    assert view.stored_tokens["recompute_last_block"] == 128
    assert led.anomalies["ambiguous_reports"] == 7      # the 6 all-cached chain heads and the twin


def test_vllm_counts_opted_out_requests_in_neither_queries_nor_hits() -> None:
    reqs = requests(FOLDER)
    normal = [r for r in reqs if r["kind"] == "normal"]
    final = metadata(FOLDER)["final_counters"]["vllm"]
    assert final["vllm:prefix_cache_hits_total"] == sum(r["usage"]["prompt_tokens_details"]["cached_tokens"]
                                                        for r in normal) == 5248
    assert final["vllm:prefix_cache_queries_total"] == sum(r["usage"]["prompt_tokens"] for r in normal)
    assert all(r["usage"]["prompt_tokens_details"]["cached_tokens"] == 0 for r in reqs if r["kind"] in OPTED_OUT)


def test_declared_full_reports_read_the_all_cached_shape_as_reports_and_false_never() -> None:
    """The documented limit: on a replica declared to send full reports (kv_events.full_reports: true) an
    opted-out request whose whole prompt is cached reads as a report; the certain one (block 13: cached
    blocks and new ones in one chain-head store) stays named. Declared false: never a report."""
    for declared, reused, opt_out in ((True, 4480, 768), (False, 0, 5120)):
        fleet = FleetLedger(full_reports=declared)
        for m in messages(FOLDER):
            fleet.on_batch(m["replica"], "tiny", m["batch"], m["t"])
        led, view = fleet.replica("vllm"), fleet.view("vllm")
        assert led is not None and view is not None
        assert (led.reused_tokens, view.stored_tokens["cache_opt_out"]) == (reused, opt_out), declared
