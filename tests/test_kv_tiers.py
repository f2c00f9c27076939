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


# --- media from the wire: case, length, number, characters (issue 38 items 5 and 7, issue 35 item 4) --------

def _wire(*events: dict) -> bytes:
    return msgspec.msgpack.encode([1.0, list(events), 0])


def _tier_store(medium: str, *hashes: int) -> dict:
    """CONSTRUCTED: an offload tier's placeholder store (vLLM's OffloadingEventsTracker shape)."""
    return {"type": "BlockStored", "block_hashes": list(hashes), "parent_block_hash": None, "token_ids": [],
            "block_size": 0, "lora_id": None, "medium": medium, "lora_name": None}


def test_one_tier_per_medium_whatever_its_case():
    """vllm-ascend's AscendStore connector publishes one BlockStored per block with ``medium="cpu"`` and its
    token ids (vllm_ascend/distributed/kv_transfer/kv_pool/ascend_store/kv_transfer.py:804-826; CONSTRUCTED
    from that source, none runs here), vLLM's offloading connector ``"CPU"``: one tier, ``CPU``. On 74d8045
    they were two tiers, ``cpu`` beside ``CPU``, and a block the connector removed stayed held."""
    f = FleetLedger()
    r = Replica(f, "a")
    hs = r.store(blocks(1, 2))
    toks = blocks(1, 2)
    ascend = [{"type": "BlockStored", "block_hashes": [h], "parent_block_hash": p, "token_ids": t,
               "block_size": BS, "lora_id": None, "medium": "cpu", "lora_name": None}
              for h, p, t in zip(hs, [None, hs[0]], toks, strict=True)]
    batch = decode_payload(_wire(*ascend))
    assert [e.medium for e in batch.events] == ["CPU", "CPU"]
    f.on_batch("a", "m", batch, r.t)
    f.on_batch("a", "m", decode_payload(_wire({"type": "BlockRemoved", "block_hashes": [hs[1]], "medium": "Cpu"})),
               r.t)
    led = f.replica("a")
    assert led is not None and led.tiers.held == {"CPU": {hs[0]: 1}}
    assert [(t.medium, t.stored_blocks, t.removed_blocks) for t in f.snapshot()[0].tiers] == [("CPU", 2.0, 1.0)]
    # a lower-case gpu is the pool, not a tier
    (gpu,) = decode_payload(_wire(dict(ascend[0], medium="gpu", block_hashes=[999]))).events
    assert gpu.medium == "GPU"


def test_media_are_bounded_in_length_and_in_number_and_the_rest_counted():
    """A hostile publisher (CONSTRUCTED): on 74d8045 3 010 media made 9 030 series, and 300 media of 64 KiB,
    sent once, RSS 38 -> 187 MB and a 56 MiB page. Now a medium over 32 characters is a decode error
    (bad_event, the batch counted lost), and a replica follows at most MAX_TIERS media: the events of
    the others are counted as the tier_overflow anomaly, and the page stays small."""
    from cachemon.expose.kv_collector import KvLedgerCollector
    from cachemon.expose.render import render
    from cachemon.normalise.kv_decode import KvDecodeError
    try:
        decode_payload(_wire(_tier_store("M" * 65536, 1)))
        raise AssertionError("a medium of 64 KiB decoded")
    except KvDecodeError as e:
        assert e.reason == "bad_event"
    (ok,) = decode_payload(_wire(_tier_store("X" * 32, 1))).events
    assert ok.medium == "X" * 32
    f = FleetLedger()
    for i in range(3010):
        f.on_batch("a", "m", decode_payload(_wire(_tier_store(f"T{i}", 10 + i),
                                                  {"type": "BlockRemoved", "block_hashes": [10 + i],
                                                   "medium": f"T{i}"})), 1.0)
    snap = f.snapshot()[0]
    assert len(snap.tiers) == 8                                               # MAX_TIERS
    assert dict(snap.anomalies)["tier_overflow"] == 2 * (3010 - 8)          # a store and a removal each
    page = render([KvLedgerCollector(f)]).decode()
    assert page.count('medium="') == 3 * 8
    assert len(page) < 64 * 1024


def test_no_control_character_of_a_medium_or_lora_name_reaches_metrics():
    """NUL and ESC in a medium and in a LoRA name (CONSTRUCTED; any publisher can send them) reached /metrics
    raw on 74d8045. Each non-printable character is now U+FFFD, and each value so rewritten is counted
    (sanitised_labels)."""
    from prometheus_client.parser import text_string_to_metric_families

    from cachemon.expose.kv_collector import KvLedgerCollector
    from cachemon.expose.render import render
    from cachemon.state.ledger.tenants import TenantLabels
    f = FleetLedger(tenants=TenantLabels({}, b"k" * 16, 20))
    toks = [t for b in blocks(1) for t in b]
    lora = {"type": "BlockStored", "block_hashes": [7], "parent_block_hash": None, "token_ids": toks,
            "block_size": BS, "lora_id": 1, "medium": "GPU", "lora_name": "ad\x00ap\x1b[31mter",
            "extra_keys": [["ad\x00ap\x1b[31mter", "salt"]]}
    f.on_batch("a", "m", decode_payload(_wire(lora, _tier_store("C\x00P\x1bU", 7))), 1.0)
    page = render([KvLedgerCollector(f)]).decode()
    assert not [c for c in page if ord(c) < 32 and c != "\n" or 0x7F <= ord(c) < 0xA0]
    labels = {(k, v) for fam in text_string_to_metric_families(page) for s in fam.samples for k, v in s.labels.items()}
    assert ("adapter", "ad\ufffdap\ufffd[31mter") in labels
    assert ("medium", "C\ufffdP\ufffdU") in labels
    assert dict(f.snapshot()[0].anomalies)["sanitised_labels"] == 2
