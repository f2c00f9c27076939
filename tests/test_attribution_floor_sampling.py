"""The match floor in the short-prompt and dynamic-prefix rules, parallel sampling's inflation, and a
change that came with a restart (issue 23 §3, §5, §8).

Real data: the vLLM 0.32.0 pages of tests/fixtures/vllm-0.32.0-cpu, through the shared snapshot builder.
Where a case changes a real snapshot's field (a floor vLLM would report for a hybrid model, n > 1) or
builds one, it says CONSTRUCTED.
"""
from __future__ import annotations

import time
from dataclasses import replace

import pytest

from cachemon.judge import attribute as A
from cachemon.judge.cause_tracker import CauseTracker
from test_attribution import real, snapshots

NOW = 1000.0


def real_snapshot(first: str, last: str) -> A.ModelSnapshot:
    [snap] = snapshots("vllm", real(first), real(last), 30.0, time.time())
    return snap


def test_real_page_carries_the_floor_and_the_n_histogram():
    snap = real_snapshot("idle", "static-system-prompt")
    assert (snap.block_size, snap.match_floor) == (128, 128)
    # 16 finished requests, each with n = 1: no extra copies
    assert (snap.interval_sampling_requests, snap.interval_sampling_sequences) == (16.0, 16.0)
    assert A.CauseCode.PARALLEL_SAMPLING_INFLATED not in A.attribute(snap).codes


def test_real_dynamic_prefix_traffic_under_a_hybrid_floor_is_short_prompts_not_a_dynamic_prefix():
    snap = real_snapshot("static-system-prompt", "timestamp-in-system-prompt")
    assert A.attribute(snap).codes == (A.CauseCode.DYNAMIC_PREFIX,)          # 831-token prompts, floor 128
    # CONSTRUCTED: the same real traffic where the page says a hybrid model's floor of 1056 tokens
    # (tests/fixtures/constructed/v1-0.32-match-floor.txt, engine 0): no 831-token prompt can hit
    a = A.attribute(replace(snap, match_floor=1056))
    assert a.codes == (A.CauseCode.SHORT_PROMPTS,)
    [short] = a.causes
    assert "1056 tokens" in short.message and "the block is 128" in short.message
    assert short.tokens == pytest.approx(snap.step_query_tokens or snap.interval_query_tokens)   # every miss


# CONSTRUCTED: ten prompts of 101-127 tokens (vLLM's bucket bounds 100 and 200 around the 128 block), none hit
SHORT_BUT_NOT_PROVABLY = A.ModelSnapshot(
    upstream="u", model="m", now=NOW, prefix_caching="true", block_size=128, match_floor=128,
    since_start_query_tokens=1e5, since_start_hit_tokens=5e4, interval_seconds=60.0,
    interval_query_tokens=1200.0, interval_hit_tokens=0.0, interval_preemptions=0.0,
    interval_prompt_buckets=((100.0, 0.0), (200.0, 10.0), (float("inf"), 10.0)),
    step_query_tokens=120.0, step_hit_tokens=0.0)


def test_constructed_prompts_not_provably_longer_than_a_block_are_no_dynamic_prefix():
    # the short-prompt share is a lower bound (0 here: no bucket bound between 100 and 128), and the
    # dynamic-prefix rule used to read "not provably short" as "long": both could be named in turn
    a = A.attribute(SHORT_BUT_NOT_PROVABLY)
    assert a.severity == "critical" and a.codes == ()
    # once the prompts are certainly longer than the floor, the same zero hits are a dynamic prefix
    longer = replace(SHORT_BUT_NOT_PROVABLY, interval_prompt_buckets=(
        (100.0, 0.0), (200.0, 0.0), (500.0, 10.0), (float("inf"), 10.0)))
    assert A.attribute(longer).codes == (A.CauseCode.DYNAMIC_PREFIX,)
    # and prompts certainly shorter than the block are short prompts, never both
    short = replace(SHORT_BUT_NOT_PROVABLY, interval_prompt_buckets=(
        (100.0, 10.0), (200.0, 10.0), (float("inf"), 10.0)))
    assert A.attribute(short).codes == (A.CauseCode.SHORT_PROMPTS,)


def test_constructed_parallel_sampling_is_named_beside_a_fine_ratio():
    snap = real_snapshot("idle", "static-system-prompt")
    # CONSTRUCTED: the same real interval with 8 of its 16 requests sent with n = 3 (32 sequences)
    a = A.attribute(replace(snap, interval_sampling_sequences=32.0))
    assert A.CauseCode.PARALLEL_SAMPLING_INFLATED in a.codes
    cause = next(c for c in a.causes if c.code == A.CauseCode.PARALLEL_SAMPLING_INFLATED)
    assert (cause.certainty, cause.tokens) == ("measured", None)
    assert "32 sequences for 16 finished requests" in cause.message and "16 extra copies" in cause.message
    # below one extra copy in ten sequences it is noise
    assert A.CauseCode.PARALLEL_SAMPLING_INFLATED not in A.attribute(replace(snap, interval_sampling_sequences=17.0)).codes
    # it explains no miss: zero hits with it are still a dynamic prefix
    dyn = real_snapshot("static-system-prompt", "timestamp-in-system-prompt")
    assert A.attribute(replace(dyn, interval_sampling_sequences=2 * (dyn.interval_sampling_requests or 0))).codes == (
        A.CauseCode.PARALLEL_SAMPLING_INFLATED, A.CauseCode.DYNAMIC_PREFIX)


# CONSTRUCTED: every request misses after a restart 20 s ago; the chat template changed (seen 5 s after it)
AFTER_RESTART = A.ModelSnapshot(
    upstream="u", model="m", now=NOW, prefix_caching="true", block_size=128, match_floor=128,
    since_start_query_tokens=8310.0, since_start_hit_tokens=0.0, interval_seconds=60.0,
    interval_query_tokens=8310.0, interval_hit_tokens=0.0, interval_preemptions=0.0,
    interval_prompt_buckets=((128.0, 0.0), (512.0, 0.0), (1024.0, 10.0), (float("inf"), 10.0)),
    step_query_tokens=831.0 * 2, step_hit_tokens=0.0, baseline_miss_ratio=63 / 831,
    events=(A.Event("restart", NOW - 20), A.Event("change", NOW - 15, "chat_template")))


def test_constructed_template_change_across_a_restart_is_named_with_it():
    a = A.attribute(AFTER_RESTART)
    assert a.codes == (A.CauseCode.RESTART, A.CauseCode.CHANGE)
    assert "chat_template changed" in a.causes[1].message
    excess = 2 * 831 - 2 * 831 * 63 / 831
    # one count for both: the step's excess shared between the events that came together
    assert [c.tokens for c in a.causes] == pytest.approx([excess / 2, excess / 2])
    # so both become active at once (each cost more than the tracker's token floor)
    tracker = CauseTracker()
    tracker.update([a], NOW)
    assert tracker.active_for("u", "m") == {A.CauseCode.RESTART, A.CauseCode.CHANGE}
    # CONSTRUCTED: with KV events the ledger names the restart by its tokens; the misses are back at the
    # baseline (no excess) and the ratio is fine, yet the template that came with it is still named
    ledger = replace(AFTER_RESTART, interval_hit_tokens=7680.0, step_hit_tokens=2 * 768.0,
                     kv_stored_tokens={"restart": 831.0}, step_kv_stored_tokens={"restart": 63.0}, kv_in_sync=True)
    assert A.attribute(ledger).codes == (A.CauseCode.RESTART, A.CauseCode.CHANGE)
    assert A.attribute(replace(ledger, events=ledger.events[:1])).codes == (A.CauseCode.RESTART,)
    # a change long before the restart is its own event: the excess goes to the restart only
    apart = replace(AFTER_RESTART, events=(A.Event("restart", NOW - 20), A.Event("change", NOW - 300, "model")))
    got = {c.code: c.tokens for c in A.attribute(apart).causes}
    assert got == pytest.approx({A.CauseCode.RESTART: excess, A.CauseCode.CHANGE: 0.0})


def test_real_parallel_sampling_capture_names_the_inflation():
    """tests/fixtures/vllm-0.32.0-cpu-kv-events/parallel_n: 8 real requests, four of them n=3 (16 sequences);
    vLLM counted each copy's prompt as a query that hit the first copy."""
    import json

    from cachemon.judge.snapshots import SnapshotBuilder, read_store
    from cachemon.normalise.normaliser import normalise_text, to_update
    from cachemon.runtime.attribution_stage import AttributionSettings
    from cachemon.state.store import Store
    from helpers import FIXTURES

    store = Store({"1m": 60.0})
    st, builder = store.upstream("vllm"), SnapshotBuilder(AttributionSettings(window=300.0))
    text, named = "", []
    for line in (FIXTURES / "vllm-0.32.0-cpu-kv-events" / "parallel_n" / "metrics.jsonl").read_text().splitlines():
        poll = json.loads(line)
        text = poll.get("text") or text
        with store.lock:
            st.apply(to_update(normalise_text(text)), poll["t"])
        [snap] = builder.build(read_store(store), poll["t"])
        named.append(A.CauseCode.PARALLEL_SAMPLING_INFLATED in A.attribute(snap).codes)
    assert (snap.interval_sampling_requests, snap.interval_sampling_sequences) == (8.0, 16.0)
    # named from the first n=3 request on (poll 3), never before it
    assert named[:2] == [False, False] and all(named[2:])
    cause = next(c for c in A.attribute(snap).causes if c.code == A.CauseCode.PARALLEL_SAMPLING_INFLATED)
    assert "16 sequences for 8 finished requests" in cause.message and "8 extra copies" in cause.message
