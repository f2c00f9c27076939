"""Other tiers (CPU offload, file system, object store) in the ledger, on CONSTRUCTED streams.

Shapes as vLLM 0.32.0 sends them (``distributed/kv_transfer/kv_connector/v1/offloading/events.py``):
the offloading connector reports a tier's blocks as BlockStored / BlockRemoved with ``medium`` "CPU"
(or FS, OBJ, STORAGE) and the GPU pool's block hashes; without the block's metadata it sends a
placeholder with ``token_ids`` empty and ``block_size`` 0. A block loaded back from a tier is cached in
the GPU pool again, which vLLM reports as a GPU BlockStored.
"""
from __future__ import annotations

import msgspec

from cachemon.normalise.kv_batch import Cleared, Removed, Stored
from cachemon.normalise.kv_decode import decode_payload
from cachemon.state.ledger.fleet import FleetLedger
from cachemon.state.ledger.tiers import SETTLE_S
from test_kv_ledger_constructed import BS, Replica, blocks, split


def test_a_block_evicted_from_the_gpu_and_loaded_back_from_the_cpu_tier_is_no_capacity_loss():
    f = FleetLedger()
    r = Replica(f, "a")
    hs = r.store(blocks(1, 2))
    r.send(Stored(tuple(hs), None, (), 0, None, "CPU"))     # offloaded: a copy in the CPU tier
    r.remove(*hs)                                            # evicted from the GPU pool
    r.store(blocks(1, 2))                                    # loaded back from the CPU tier
    assert split(r) == {"first": 2 * BS}
    led = f.replica("a")
    assert led is not None
    assert led.tiers.hit_tokens == {} and led.tiers.pending_tokens() == 2 * BS   # settles after SETTLE_S
    r.send(dt=SETTLE_S)                                      # a later batch: the tier did not store them
    assert led.tiers.hit_tokens == {"CPU": 2 * BS} and led.tiers.stored == {"CPU": 2}
    assert r.view().cached_blocks == 2
    r.send(Removed((hs[0], hs[1]), "CPU"))                   # gone from the CPU tier too
    r.remove(*hs)
    r.store(blocks(1, 2))                                    # now recomputed: capacity
    assert split(r) == {"first": 2 * BS, "capacity": 2 * BS}
    assert led.tiers.removed == {"CPU": 2} and not led.tiers.held["CPU"]
    snap = f.snapshot()[0]
    assert [(t.medium, t.stored_blocks, t.removed_blocks, t.hit_tokens) for t in snap.tiers] == \
        [("CPU", 2.0, 2.0, 2.0 * BS)]


def test_the_offload_placeholder_decodes_and_is_kept_apart():
    ev = {"type": "BlockStored", "block_hashes": [11, 12], "parent_block_hash": None, "token_ids": [],
          "block_size": 0, "lora_id": None, "medium": "CPU", "lora_name": None, "group_idx": 0, "locality": "local"}
    batch = decode_payload(msgspec.msgpack.encode([1.0, [ev], 0]))
    (st,) = batch.events
    assert isinstance(st, Stored) and st.hashes == (11, 12) and st.medium == "CPU" and st.block_size == 0
    f = FleetLedger()
    f.on_batch("a", "m", batch, 1.0)
    led = f.replica("a")
    assert led is not None and led.tiers.stored == {"CPU": 2} and len(led._cached) == 0
    bad = dict(ev, medium="GPU")                             # on the GPU pool it stays an error
    try:
        decode_payload(msgspec.msgpack.encode([1.0, [bad], 0]))
        raise AssertionError("a GPU store without token ids decoded")
    except ValueError as e:
        assert "token_count" in str(e)


def test_a_tier_holds_at_most_max_blocks_hashes():
    f = FleetLedger(max_blocks=10)
    r = Replica(f, "a")
    r.send(Stored(tuple(range(1, 26)), None, (), 0, None, "CPU"))
    led = f.replica("a")
    assert led is not None and len(led.tiers.held["CPU"]) == 10 and led.tiers.overflow == 15
    assert dict(f.snapshot()[0].anomalies)["overflow_blocks"] == 15
    assert led.tiers.stored == {"CPU": 25}


def test_a_store_whose_first_blocks_came_from_the_cpu_tier_and_the_rest_were_computed():
    f = FleetLedger()
    r = Replica(f, "a")
    hs = r.store(blocks(1, 2, 3, 4))
    r.send(Stored(tuple(hs[:2]), None, (), 0, None, "CPU"))  # blocks 0-1 offloaded
    r.remove(*hs)                                            # all four evicted from the GPU
    r.store(blocks(1, 2, 3, 4))                              # 0-1 loaded from the CPU, 2-3 computed again
    assert split(r) == {"first": 4 * BS, "capacity": 2 * BS}
    led = f.replica("a")
    f.snapshot()                                             # settles what is older than SETTLE_S
    assert led is not None and led.tiers.hit_tokens == {"CPU": 2 * BS} and r.view().cached_blocks == 4


def test_a_tier_emptied_without_an_event_is_found_by_its_next_store_and_the_load_was_a_miss():
    """CONSTRUCTED after the real cpu_offload_hostcopy capture: ``reset_prefix_cache?reset_external=true``
    empties the CPU tier and publishes only the pool's AllBlocksCleared; the blocks computed next are
    stored in the pool, then offloaded again (a second store of hashes the tier seemed to hold)."""
    f = FleetLedger()
    r = Replica(f, "a")
    a, b = r.store(blocks(1, 2)), r.store(blocks(3, 4))
    r.send(Stored(tuple(a + b), None, (), 0, None, "CPU"))   # both offloaded
    r.send(Cleared())                                        # the reset (the tier's reset is silent)
    r.store(blocks(1, 2))                                    # computed: the tier is empty in truth
    r.send(Stored(tuple(a), None, (), 0, None, "CPU"), dt=0.01)   # offloaded again: it was a miss
    r.store(blocks(3, 4))                                    # the tier is known empty now: a miss too
    f.snapshot()
    led = f.replica("a")
    assert led is not None and led.tiers.hit_tokens == {} and led.tiers.unannounced_clears == 1
    assert dict(f.snapshot()[0].anomalies)["tier_unannounced_clears"] == 1
    assert split(r) == {"first": 4 * BS, "reset": 4 * BS}
