"""A hybrid sliding-window + full-attention model on REAL vLLM 0.32.0 (tests/fixtures/
vllm-0.32.0-cpu-hybrid-swa, recorded by scripts/e2e/kv_record.py hybrid_swa; the model config is
constructed, the engine's events are real; its README has the per-request table).

Its KV events carry two groups per store: group 0 "sliding_window", which stores only the blocks it
keeps while its token_ids span the whole range, and group 1 "full_attention". Asserted: every payload
decodes (the sparse stores included), the ledger follows the full-attention group and its split equals
what that group's events imply, the other group's events are counted, per request the full group's
blocks stored follow vLLM's usage, and the recompute from block 0 of cached blocks that the
sliding-window group forces (a shared prefix with no hit) is not read as a full-report reuse report.
hybrid_swa_full (the same traffic in full report mode): per request the reports give usage's cached
tokens, and the split equals hybrid_swa's. The cached blocks the full-attention group recomputes for
want of the window are the ledger's ``sliding_window`` reason, per request what the sliding-window
group's own stores imply.
"""
from __future__ import annotations

import pytest

from cachemon.normalise.kv_batch import KvBatch, Removed, Stored
from cachemon.state.ledger.fleet import FleetLedger
from kv_support import KV_FIXTURES, messages, requests
from test_kv_full_report_real import _replay_counting
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
    # the oracle reads a cached block stored again as recompute_last_block; on this model it is the window's cost
    want["sliding_window"] = want.pop("recompute_last_block")
    assert {k: x for k, x in v.stored_tokens.items() if x} == {k: float(x) for k, x in want.items()}
    assert want["sliding_window"] == 640           # 3 + 2 cached blocks recomputed: no hit for lack of the window
    assert led.side.window == 256
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


def test_hybrid_full_report_reads_each_report_once_and_keeps_the_window_recomputes():
    """hybrid_swa_full: the same traffic, every request full-report. Each group reports (the
    sliding-window group's report lists blocks it never held); the full-attention group's recompute
    of cached blocks (no hit for lack of the window, i=2 and i=6) has a report's shape. The
    sliding-window group decides: per request the hits equal usage's cached tokens, the split equals
    the capture without reports (hybrid_swa), and nothing is left ambiguous."""
    folder = HYBRID.parent / "hybrid_swa_full"
    fleet, msgs, after = _replay_counting(folder)
    reused = {k: v[0] for k, v in after.items()}
    reqs = sorted(requests(folder), key=lambda r: r["t_send"])
    bounds = [r["t_send"] for r in reqs] + [float("inf")]
    prev = 0.0
    for i, r in enumerate(reqs):
        win = [m for m in msgs if bounds[i] <= m["t"] < bounds[i + 1]]
        got = (reused[id(win[-1])] - prev) if win else 0.0
        if win:
            prev = reused[id(win[-1])]
        assert got == r["usage"]["prompt_tokens_details"]["cached_tokens"], i
    led = fleet.replica(msgs[0]["replica"])
    assert led is not None and led.anomalies["ambiguous_reports"] == 0
    plain = FleetLedger()
    for m in messages(HYBRID):
        plain.on_batch(m["replica"], "tiny", m["batch"], m["t"])
    want = plain.view(msgs[0]["replica"])
    got_view = fleet.view(msgs[0]["replica"])
    assert want is not None and got_view is not None and got_view.in_sync
    assert got_view.stored_tokens == want.stored_tokens
    assert want.stored_tokens["sliding_window"] == 640 and want.stored_tokens["recompute_last_block"] == 0


def _need(window: int, bs: int) -> int:
    return -(-(window - 1) // bs)


@pytest.mark.parametrize("name", ["hybrid_swa", "swa_partial"])
def test_each_window_cut_is_what_the_sliding_window_group_lacked(name):
    """Per request, from the events alone: the blocks the full-attention group held at the start of the
    request's store, stored again (vLLM's hit, usage's cached tokens, is where the store starts), and
    the sliding-window group's own stores before it: at every point past the hit up to the end of those
    blocks it lacked one of the ``cdiv(window - 1, block)`` blocks just before (vLLM 0.32.0,
    ``SlidingWindowManager.find_longest_cache_hit``). The ledger's ``sliding_window`` tokens of the
    request are exactly those blocks. swa_partial (window 512) was recorded after the rule was written."""
    folder = HYBRID.parent / name
    msgs = messages(folder)
    reqs = sorted(requests(folder), key=lambda r: r["t_send"])
    bounds = [r["t_send"] for r in reqs] + [float("inf")]
    fleet = FleetLedger()
    full: set[object] = set()                    # group 1 (full attention): hashes stored
    parent: dict[object, object] = {}            # the chain, from the full group's stores
    swa: set[object] = set()                     # group 0 (sliding window): hashes it stored
    window = bs = 0
    cuts = []
    for i, r in enumerate(reqs):
        before = fleet.view(msgs[0]["replica"])
        sw0 = before.stored_tokens["sliding_window"] if before is not None else 0.0
        held_full, held_swa = set(full), set(swa)
        store = None
        for m in msgs:
            if not bounds[i] <= m["t"] < bounds[i + 1]:
                continue
            fleet.on_batch(m["replica"], "tiny", m["batch"], m["t"])
            for e in m["batch"].events:
                if isinstance(e, Stored) and e.group == 1:
                    store = store or e
                    up = e.parent
                    for h in e.hashes:
                        parent[h] = up
                        up = h
                    full.update(e.hashes)
                    bs = e.block_size
                elif isinstance(e, Stored) and e.group == 0:
                    swa.update(e.hashes)
                    window = e.window or window
        after = fleet.view(msgs[0]["replica"])
        assert after is not None
        cuts.append(after.stored_tokens["sliding_window"] - sw0)
        if store is None:                        # a full hit: nothing stored, nothing cut
            assert cuts[-1] == 0
            continue
        above: list[object] = []                 # the request's blocks above its store, from block 0
        up = store.parent
        while up is not None:
            above.insert(0, up)
            up = parent[up]
        chain = above + list(store.hashes)
        hit = len(above)
        assert hit * bs == r["usage"]["prompt_tokens_details"]["cached_tokens"]
        lead = 0
        while lead < len(store.hashes) and store.hashes[lead] in held_full:
            lead += 1
        need = _need(window, bs)
        for p in range(hit + 1, hit + lead + 1):     # no hit point up to the full group's held prefix
            assert any(h not in held_swa for h in chain[max(p - need, 0):p]), (i, p)
        assert cuts[-1] == lead * bs, i
    assert sum(cuts) > 0 and window in (256, 512) and bs == 128


def test_the_window_is_exported_where_the_events_name_it_and_only_there():
    """cachemon_kv_sliding_window_tokens: the window of the capture's sliding-window group (its events'
    kv_cache_spec_sliding_window), absent for a plain model's capture (tiny_pool: one full-attention group)."""
    from cachemon import catalog as C
    from cachemon.expose.kv_collector import KvLedgerCollector

    def exported(folder) -> dict[str, float]:
        fleet = FleetLedger()
        for m in messages(folder):
            fleet.on_batch(m["replica"], "tiny", m["batch"], m["t"])
        fams = {f.name: f for f in KvLedgerCollector(fleet).collect()}
        return dict(fams[C.KV_SLIDING_WINDOW.name].samples)

    windows = {e.window for m in messages(HYBRID) for e in m["batch"].events if isinstance(e, Stored) and e.window}
    assert exported(HYBRID) == {'upstream="vllm",model_name="tiny"': float(max(windows))}
    assert max(windows) == 256
    assert exported(KV_FIXTURES / "tiny_pool") == {}


@pytest.mark.parametrize("name", ["hybrid_swa", "hybrid_swa_full", "swa_partial", "swa_only", "swa_tiny_pool",
                                  "swa_pool_mix", "swa_chunked", "swa_multiturn"])
def test_every_payload_of_every_sliding_window_capture_decodes_and_keeps_the_ledger_in_sync(name):
    """The sliding-window group publishes a BlockStored without any hash (its token ids kept) for a prefill
    chunk it keeps no block of (swa_chunked) and at every decode step that fills a block (swa_multiturn):
    such a store decodes (nothing to hold), so no batch is lost and the ledger stays in sync."""
    folder = HYBRID.parent / name
    msgs = messages(folder)                  # raises KvDecodeError on any payload it cannot read
    empty = [e for m in msgs for e in m["batch"].events if isinstance(e, Stored) and not e.hashes]
    assert all(e.kind == "sliding_window" and e.window for e in empty)
    if name in ("swa_chunked", "swa_multiturn"):
        assert empty
    fleet = FleetLedger()
    for m in msgs:
        fleet.on_batch(m["replica"], "tiny", m["batch"], m["t"])
    view = fleet.view(msgs[0]["replica"])
    assert view is not None and view.in_sync and view.sliding_window
