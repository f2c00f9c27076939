"""A BlockRemoved for a hash while a twin copy stays cached (vllm#55092).

vLLM keeps one physical block per copy: a prompt of whole blocks sent again recomputes its last block
and caches a second copy under the same hash, and each copy's eviction sends its own BlockRemoved. The
ledger's reference counts per hash must keep the content cached until the last copy goes. The first
test is CONSTRUCTED (made-up token ids and hashes); the second runs the REAL block_edge capture.
"""
from __future__ import annotations

from collections import Counter

from cachemon.normalise.kv_batch import Cleared, Removed, Stored
from cachemon.state.ledger.fleet import FleetLedger
from kv_support import replay
from test_kv_ledger_constructed import BS, Replica, blocks, split
from test_kv_ledger_real import _folder


def test_a_removal_while_a_twin_stays_keeps_the_content_for_routing_history_and_lifetimes():
    f = FleetLedger()
    a, b = Replica(f, "a", seed=1), Replica(f, "b", seed=2)
    hs = a.store(blocks(1, 2))
    a.store(blocks(1, 2), upto=1)            # the last block again while cached: a twin (2 copies)
    led = f.replica("a")
    assert led is not None and led.copies(hs[1]) == 2
    a.remove(hs[1])                          # one copy evicted; its twin stays
    assert led.copies(hs[1]) == 1 and a.view().cached_blocks == 2
    assert led.lifetime.count == 0 and led.history_size() == 0     # nothing departed
    b.store(blocks(1, 2))                    # the other replica: cached on a now -> routing, not first
    assert split(b) == {"routing": 2 * BS}
    a.store(blocks(1, 2), upto=1)            # stored again on a while the twin is cached
    assert split(a) == {"first": 2 * BS, "recompute_last_block": 2 * BS}
    a.remove(hs[1], hs[1])                   # both remaining copies go
    assert led.copies(hs[1]) == 0 and led.lifetime.count == 1 and led.anomalies["unknown_removed"] == 0
    a.store(blocks(1, 2), upto=1)
    assert split(a)["capacity"] == BS


def test_reference_counts_equal_the_copies_vllm_reports_on_the_real_block_edge_capture():
    fleet = FleetLedger()
    msgs = replay(_folder("block_edge"), fleet)
    copies: Counter = Counter()
    for m in msgs:
        for e in m["batch"].events:
            if isinstance(e, Stored):
                copies.update(e.hashes)
            elif isinstance(e, Removed):
                copies.subtract(e.hashes)
            elif isinstance(e, Cleared):
                copies.clear()
    led = fleet.replica("vllm")
    assert led is not None
    twins = [h for h, n in copies.items() if n > 1]
    assert twins, "the capture has a whole-block prompt sent twice"
    assert all(led.copies(h) == n for h, n in copies.items())
    assert led.anomalies["unknown_removed"] == 0
