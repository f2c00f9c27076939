"""Native CPU offloading on a REAL vLLM 0.32.0 cpu_offload capture (scripts/e2e/kv_more.py
sc_cpu_offload, ``--kv-offloading-backend native``): 6 tenants x 6 blocks cycle through a 23-block
device pool, then each tenant again (hits from the CPU tier). It cannot be recorded on the CPU build
(both offloading connectors fail at start-up there: tests/fixtures/vllm-0.32.0-cpu-kv-events/README.md,
"cpu_offload"), so this test is skipped here and runs on a capture from a GPU machine; the tier rules
are tested on constructed streams in test_kv_tiers.py.

Asserted against an independent reading of the events: every payload decodes (the connector's events
included), the stored / removed blocks per medium, and the GPU split with tier-loaded blocks taken out
(the leading blocks of a GPU store that the CPU tier held at that moment are a load, not a capacity miss).
"""
from __future__ import annotations

from collections import Counter, defaultdict

import pytest

from cachemon.normalise.kv_events import Cleared, Removed, Stored
from cachemon.state.kv_ledger import FleetLedger
from kv_support import messages, scenario


def _folder():
    p = scenario("cpu_offload")
    if not (p / "events.jsonl").exists() or not (p / "events.jsonl").stat().st_size:
        pytest.skip("no cpu_offload events: offloading does not run on vLLM's CPU build (see the fixtures' README)")
    return p


def test_tiers_kept_apart_and_loads_from_the_cpu_tier_are_no_capacity_loss():
    msgs = messages(_folder())
    fleet = FleetLedger()
    for m in msgs:
        fleet.on_batch(m["replica"], "tiny", m["batch"], m["t"])
    gpu: Counter = Counter()
    tier: dict[str, Counter] = defaultdict(Counter)
    stored_blocks: Counter = Counter()
    removed_blocks: Counter = Counter()
    gone: dict = {}
    split: Counter = Counter()
    loaded = 0
    for m in msgs:
        for e in m["batch"].events:
            med = e.medium if e.medium not in (None, "GPU") else None
            if isinstance(e, Cleared):
                if med:
                    tier[med].clear()
                else:
                    gone.update(dict.fromkeys(gpu, "reset"))
                    gpu.clear()
            elif isinstance(e, Removed):
                if med:
                    removed_blocks[med] += len(e.hashes)
                    tier[med].subtract(e.hashes)
                    tier[med] = +tier[med]
                    continue
                for h in e.hashes:
                    gpu[h] -= 1
                    if gpu[h] == 0:
                        del gpu[h]
                        gone[h] = "capacity"
            elif isinstance(e, Stored):
                if med:
                    stored_blocks[med] += len(e.hashes)
                    tier[med].update(e.hashes)
                    continue
                head = True                  # the leading blocks a tier holds were loaded from it
                for h in e.hashes:
                    head = head and h not in gpu and any(h in t for t in tier.values())
                    if head:
                        loaded += e.block_size
                        gone.pop(h, None)
                    else:
                        why = "recompute_last_block" if h in gpu else gone.pop(h, "first")
                        split[why] += e.block_size
                    gpu[h] += 1
    assert stored_blocks, "the capture has events of another medium"
    snap = fleet.snapshot()[0]
    assert {t.medium: t.stored_blocks for t in snap.tiers} == {k: float(v) for k, v in stored_blocks.items()}
    assert {t.medium: t.removed_blocks for t in snap.tiers} == {k: float(v) for k, v in removed_blocks.items()}
    assert sum(t.hit_tokens for t in snap.tiers) == loaded
    assert {k: x for k, x in snap.stored_tokens.items() if x} == {k: float(v) for k, v in split.items() if v}
    assert snap.in_sync
