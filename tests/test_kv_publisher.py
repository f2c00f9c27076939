"""The KV-events re-publisher (tests/kv_publisher.py) over real pyzmq sockets on 127.0.0.1,
fed with a real recording (tests/fixtures/vllm-0.32.0-cpu-kv-events/)."""
from __future__ import annotations

from pathlib import Path

import pytest

zmq = pytest.importorskip("zmq")

from kv_publisher import END_SEQ, Republisher, load_events  # noqa: E402

FIX = Path(__file__).parent / "fixtures" / "vllm-0.32.0-cpu-kv-events"


def _sub(ctx, endpoint):
    s = ctx.socket(zmq.SUB)
    s.setsockopt(zmq.RCVHWM, 0)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SUBSCRIBE, b"")
    s.connect(endpoint)
    return s


def _drain(sock, n, timeout_ms=3000):
    out = []
    while len(out) < n and sock.poll(timeout_ms):
        out.append(sock.recv_multipart())
    return out


def _replay(ctx, endpoint, start):
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.connect(endpoint)
    d.send_multipart([b"", start.to_bytes(8, "big")])
    got = []
    while d.poll(3000):
        m = d.recv_multipart()
        if m[2] == END_SEQ:
            assert m == [b"", b"", END_SEQ, b""]
            break
        got.append(m)
    else:
        pytest.fail("no end marker from the replay socket")
    d.close(0)
    return got


def test_round_trip_with_a_recoverable_and_a_lost_gap():
    msgs = load_events(FIX / "tiny_pool" / "events.jsonl")
    assert len(msgs) > 10
    drop, lost = msgs[3].seq, msgs[5].seq
    ctx = zmq.Context()
    try:
        with Republisher(msgs, drop=[drop], lost=[lost]) as rp:
            sub = _sub(ctx, rp.pub_endpoint)
            assert rp.wait_subscribed(5)
            assert rp.publish() == len(msgs) - 2
            got = _drain(sub, len(msgs) - 2)
            # the PUB frames are vLLM's: [topic, 8-byte big-endian seq, payload], byte for byte
            want = [m for m in msgs if m.seq not in (drop, lost)]
            assert [(g[0], int.from_bytes(g[1], "big"), g[2]) for g in got] == \
                [(m.topic, m.seq, m.payload) for m in want]
            # the replay socket recovers the dropped seq but not the lost one
            rep = _replay(ctx, rp.replay_endpoint, drop)
            seqs = [int.from_bytes(m[2], "big") for m in rep]
            assert seqs[0] == drop and lost not in seqs
            assert seqs == [m.seq for m in msgs if m.seq >= drop and m.seq != lost]
            assert rep[0][1] == msgs[3].topic and rep[0][3] == msgs[3].payload
            sub.close(0)
    finally:
        ctx.destroy(0)


def test_a_seq_going_back_empties_the_replay_buffer_like_a_new_process():
    msgs = load_events(FIX / "restart" / "events.jsonl")
    restart_at = next(i for i in range(1, len(msgs)) if msgs[i].seq <= msgs[i - 1].seq)
    ctx = zmq.Context()
    try:
        with Republisher(msgs) as rp:
            rp.publish()
            rep = _replay(ctx, rp.replay_endpoint, 0)
            assert [int.from_bytes(m[2], "big") for m in rep] == [m.seq for m in msgs[restart_at:]]
    finally:
        ctx.destroy(0)
