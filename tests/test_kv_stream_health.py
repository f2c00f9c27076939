"""The KV-event stream's health on /metrics (issue 34): disconnects, protocol errors, batches lost by reason
(gap, handler) and the time of the last message, as the KV stage exports them, on the real 0.32.0 capture
(tests/fixtures/vllm-0.32.0-cpu-kv-events/tiny_pool) re-published over real ZMQ sockets on 127.0.0.1.

The capture has no disconnect, no gap and no failing handler (the recorder's SUB stayed connected), so
each is CONSTRUCTED here, and says so: a publisher closed and bound again on the same port, a frame over
ZMQ's hard limit between two real batches, a seq withheld, a sink that raises on one real batch.
Each exported value is compared with what the test made happen.
"""
from __future__ import annotations

import threading
import time

import pytest

from cachemon import catalog as C
from cachemon.config import KvEventsSettings
from test_kv_stream import Publisher, Recorder, _free_port, captured, families, stage_for

UP = 'upstream="vllm-0"'


class FailsOn(Recorder):
    """CONSTRUCTED: a sink with a bug that raises on the batches of the given seqs (a real ledger does not)."""

    def __init__(self, seqs: set[int]):
        super().__init__()
        self.failing = seqs

    def on_batch(self, replica, model, batch, at):
        if batch.seq in self.failing:
            raise RuntimeError("a constructed ledger bug")
        super().on_batch(replica, model, batch, at)


def health(stage) -> dict[str, float | None]:
    fam = families(stage)
    lost = fam[C.KV_LOST_BATCHES.name]
    return {"up": fam[C.KV_STREAM_UP.name][UP],
            "disconnects": fam[C.KV_STREAM_DISCONNECTS.name][UP],
            "protocol_errors": fam[C.KV_STREAM_PROTOCOL_ERRORS.name][UP],
            "last_message": fam[C.KV_STREAM_LAST_MESSAGE.name].get(UP),
            **{f"lost_{r}": lost[f'{UP},reason="{r}"'] for r in ("gap", "handler", "decode_error", "oversized")}}


@pytest.mark.slow
def test_the_stream_health_on_metrics_is_what_happened_to_a_real_capture():
    from helpers import eventually
    msgs = captured("tiny_pool")
    withheld, failing = msgs[5][0], msgs[8][0]       # CONSTRUCTED: a gap and a handler error
    port = _free_port()
    pub, sink = Publisher(pub_port=port, replay=False), FailsOn({failing})
    # frames of the real capture are under 2 KB; ZMQ refuses one over 4 x 4096 bytes (MAXMSGSIZE)
    stage = stage_for(pub, sink, replay=False, settings=KvEventsSettings(max_frame_bytes=4096))
    stop = threading.Event()
    stage.start(stop)
    pubs = [pub]
    try:
        pub.wait_subscribed()
        eventually(lambda: health(stage)["up"] == 1.0, what="stream up")
        h = health(stage)
        assert h["last_message"] is None                             # no message yet: no age to tell
        assert h["disconnects"] == h["protocol_errors"] == h["lost_gap"] == h["lost_handler"] == 0

        # the first half of the capture, one seq withheld and one batch the sink fails on
        half = len(msgs) // 2
        for s, p in msgs[:half]:
            pub.send(s, p, lost=s == withheld)
        t0 = time.time()
        pub.send(*msgs[half])
        sink.wait(lambda r: msgs[half][0] in r.seqs())
        t1 = time.time()
        h = health(stage)
        assert t0 <= h["last_message"] <= t1                         # the last frame's arrival
        assert h["lost_gap"] == 1 and h["lost_handler"] == 1
        assert sink.seqs() == [s for s, _ in msgs[:half + 1] if s not in (withheld, failing)]
        assert h["disconnects"] == h["protocol_errors"] == 0

        # CONSTRUCTED: a frame over ZMQ's hard limit; ZMQ drops the connection and schedules no retry
        # (a protocol error), the stream makes a new socket; the frame's seq is a gap
        too_big = msgs[half][0] + 1
        pub.raw([pub.topic, too_big.to_bytes(8, "big"), b"\x00" * 64 * 1024])
        eventually(lambda: health(stage)["protocol_errors"] == 1, timeout=10, what="a protocol error")
        pub.wait_subscribed(timeout=10)                              # the new socket's subscription
        h = health(stage)
        assert h["disconnects"] == 1 and h["lost_oversized"] == 0    # never read into Python
        # CONSTRUCTED: vLLM goes away and comes back on the same port (the same process: seqs go on)
        eventually(lambda: health(stage)["up"] == 1.0, what="stream up again")
        pubs.pop().close()
        eventually(lambda: health(stage)["up"] == 0.0, what="stream down")
        pub = Publisher(pub_port=port, replay=False)
        pubs.append(pub)
        pub.wait_subscribed(timeout=15)                              # ZMQ reconnected by itself
        rest = [(s + 1, p) for s, p in msgs[half + 1:]]              # after the refused frame's seq
        for s, p in rest:
            pub.send(s, p)
        sink.wait(lambda r: rest[-1][0] in r.seqs())
        t2 = time.time()
        h = health(stage)
        assert h["disconnects"] == 2 and h["protocol_errors"] == 1
        assert h["lost_gap"] == 2 and h["lost_handler"] == 1          # the withheld seq and the refused frame
        assert h["lost_decode_error"] == h["lost_oversized"] == 0
        assert t1 < h["last_message"] <= t2
    finally:
        stop.set()
        stage.close()
        for p in pubs:
            p.close()
