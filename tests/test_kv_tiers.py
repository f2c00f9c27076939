"""Other tiers (CPU offload, file system, object store) in the ledger, on CONSTRUCTED streams.

Shapes as vLLM 0.32.0 sends them (``distributed/kv_transfer/kv_connector/v1/offloading/events.py``):
the offloading connector reports a tier's blocks as BlockStored / BlockRemoved with ``medium`` "CPU"
(or FS, OBJ, STORAGE) and the GPU pool's block hashes; without the block's metadata it sends a
placeholder with ``token_ids`` empty and ``block_size`` 0. A block loaded back from a tier is cached in
the GPU pool again, which vLLM reports as a GPU BlockStored.
"""
from __future__ import annotations

import msgspec

from cachemon.normalise.kv_decode import decode_payload
from cachemon.normalise.kv_events import Removed, Stored
from cachemon.state.kv_ledger import FleetLedger
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
    assert led.tier_hit_tokens == {"CPU": 2 * BS} and led.tier_stored == {"CPU": 2}
    assert r.view().cached_blocks == 2
    r.send(Removed((hs[0], hs[1]), "CPU"))                   # gone from the CPU tier too
    r.remove(*hs)
    r.store(blocks(1, 2))                                    # now recomputed: capacity
    assert split(r) == {"first": 2 * BS, "capacity": 2 * BS}
    assert led.tier_removed == {"CPU": 2} and not led.tiers["CPU"]
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
    assert led is not None and led.tier_stored == {"CPU": 2} and len(led._cached) == 0
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
    assert led is not None and len(led.tiers["CPU"]) == 10 and led.anomalies["overflow_blocks"] == 15
    assert led.tier_stored == {"CPU": 25}


def test_a_store_whose_first_blocks_came_from_the_cpu_tier_and_the_rest_were_computed():
    f = FleetLedger()
    r = Replica(f, "a")
    hs = r.store(blocks(1, 2, 3, 4))
    r.send(Stored(tuple(hs[:2]), None, (), 0, None, "CPU"))  # blocks 0-1 offloaded
    r.remove(*hs)                                            # all four evicted from the GPU
    r.store(blocks(1, 2, 3, 4))                              # 0-1 loaded from the CPU, 2-3 computed again
    assert split(r) == {"first": 4 * BS, "capacity": 2 * BS}
    led = f.replica("a")
    assert led is not None and led.tier_hit_tokens == {"CPU": 2 * BS} and r.view().cached_blocks == 4
