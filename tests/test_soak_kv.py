"""The soak's KV-event stream (benchmarks/soak_kv.py: real captured vLLM 0.32.0 events re-encoded with
fresh hashes, constructed drains) is a stream cachemon's own decoder and ledger take whole: every
block stored and removed is placed, nothing is an anomaly, and the final drain empties the ledger."""
from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from soak_kv import FIXTURES, SCENARIOS, Replica, load_scenario  # noqa: E402

from cachemon.normalise.kv_decode import KvDecoder  # noqa: E402
from cachemon.state.ledger.fleet import FleetLedger  # noqa: E402


def test_the_soak_stream_is_applied_whole_and_drains_to_empty():
    rep = Replica([load_scenario(FIXTURES / s) for s in SCENARIOS], random.Random(7))
    dec, fleet = KvDecoder(), FleetLedger()
    for i in range(60):                              # a few passes over every scenario
        frames = rep.message(final=(i == 59))
        assert frames[0] == b"kv-events" and int.from_bytes(frames[1], "big") == i
        fleet.on_batch("r0", "tiny", dec.decode(frames[2], i), 1_800_000_000.0 + i)
    (snap,) = fleet.snapshot()
    sent = rep.sent
    assert sent["stored_blocks"] > 1000 and sent["removed_blocks"] == sent["stored_blocks"]
    assert sum(snap.stored_tokens.values()) == sent["stored_blocks"] * 128
    assert snap.cached_blocks == 0 and snap.in_sync and snap.reused_tokens == 0
    assert all(n == 0 for _kind, n in snap.anomalies)
    assert sent["constructed_removals"] < sent["removed_blocks"] / 2     # most removals are captured ones
