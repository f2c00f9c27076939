"""vLLM's replay socket from the subscriber's side: one request's answers, and the live messages read on
while it waits.

A DEALER sends ``[b"", start_seq]`` to the publisher's ROUTER and gets one message per buffered batch with
``seq >= start_seq`` (``[b"", seq, payload]`` up to 0.25.1, ``[b"", topic, seq, payload]`` from 0.26.0), then
an end marker whose seq is -1 (signed) (``vllm/distributed/kv_events.py``, ``ZmqEventPublisher``).

While a request waits (up to ``replay_timeout``), the live socket is read on into a ``LiveHold``, whose
messages the stream handles after the replay, in order. Before, nothing was read: ZMQ's queue of the live
socket (8 messages at the default max_frame_bytes) filled, the publisher dropped the rest, and each drop
was a new gap that asked a silent replay socket again (11 of 1 918 batches lost in 20 s; 2 002 of 3 000
sent during one 1 s wait in tests/test_kv_hostile.py). The hold is bounded (``max_messages`` and
HELD_BYTES); what does not fit waits in ZMQ's queue, then the publisher's.
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:   # pyzmq is the optional extra kv-events
    import zmq

# A message part as pyzmq's recv_multipart(copy=False) gives it, or as bytes (tests, the replay's own).
Frame: TypeAlias = "zmq.Frame | bytes"
Socket: TypeAlias = "zmq.Socket[bytes]"

END_SEQ = -1
HELD_BYTES = 64 * 1024 * 1024      # live messages held while a replay waits (vLLM's batches: KBs each)


def frame_bytes(frame: Frame) -> bytes:
    return frame if isinstance(frame, bytes) else frame.bytes


def answer(frames: Sequence[Frame]) -> tuple[int, Frame] | None:
    """(seq, payload frame) of one replay answer (seq END_SEQ: the end); None: not an answer's shape."""
    if len(frames) not in (3, 4) or len(frames[-2]) != 8:
        return None
    return int.from_bytes(frame_bytes(frames[-2]), "big", signed=True), frames[-1]


class LiveHold:
    """The live socket (while the stream follows it) and the messages read from it while a replay waits."""

    def __init__(self, max_messages: int, max_bytes: int = HELD_BYTES) -> None:
        self.max_messages, self.max_bytes = max_messages, max_bytes
        self.sub: Socket | None = None
        self.held: deque[Sequence[Frame]] = deque()
        self.bytes = 0

    def __bool__(self) -> bool:
        return bool(self.held)

    def pop(self) -> Sequence[Frame]:
        frames = self.held.popleft()
        self.bytes -= sum(len(f) for f in frames)
        return frames

    def clear(self) -> None:
        self.sub = None
        self.held.clear()
        self.bytes = 0

    def wait(self, zmq: ModuleType, dealer: Socket, timeout_s: float) -> bool:
        """Whether ``dealer`` has an answer within ``timeout_s``, reading the live socket on meanwhile."""
        sub = self.sub
        if sub is None:
            return bool(dealer.poll(int(timeout_s * 1000) + 1))
        poller = zmq.Poller()
        poller.register(dealer, zmq.POLLIN)
        poller.register(sub, zmq.POLLIN)
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            ready = dict(poller.poll(int(left * 1000) + 1))
            if dealer in ready:
                return True
            if sub in ready:
                self._read_on(zmq, sub)

    def _read_on(self, zmq: ModuleType, sub: Socket) -> None:
        while len(self.held) < self.max_messages and self.bytes < self.max_bytes:
            try:
                frames = sub.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self.held.append(frames)
            self.bytes += sum(len(f) for f in frames)
