#!/usr/bin/env python3
"""Replay a recorded vLLM KV-events stream over real ZMQ sockets (no vllm import).

    python scripts/e2e/kv_replay.py tests/fixtures/vllm-0.32.0-cpu-kv-events/tiny_pool/events.jsonl \
        --pub tcp://127.0.0.1:5557 --replay tcp://127.0.0.1:5558 [--replica NAME] [--speed 10] \
        [--drop 3,7] [--lost 9] [--wait-subscriber 5]

Sends the recording's messages the way vLLM 0.32.0 does (``[topic, seq, payload]`` on PUB, replay
from a ROUTER); ``--speed`` divides the recorded gaps (0: as fast as possible); ``--drop`` seqs are
not published but can be replayed, ``--lost`` seqs are neither. The work is done by
``tests/kv_publisher.Republisher`` (shared with the tests). Binds 127.0.0.1 only.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from kv_publisher import Republisher, load_events  # noqa: E402


def _seqs(s: str) -> set[int]:
    return {int(x) for x in s.split(",") if x.strip()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("events")
    ap.add_argument("--replica", default=None, help="only this replica's messages (default: all)")
    ap.add_argument("--pub", default="tcp://127.0.0.1:5557")
    ap.add_argument("--replay", default="tcp://127.0.0.1:5558", help="'' for no replay socket")
    ap.add_argument("--speed", type=float, default=1.0, help="pace factor; 0 sends at once")
    ap.add_argument("--drop", type=_seqs, default=set())
    ap.add_argument("--lost", type=_seqs, default=set())
    ap.add_argument("--wait-subscriber", type=float, default=10.0, help="seconds to wait for a subscriber")
    ap.add_argument("--linger", type=float, default=5.0, help="seconds to keep answering replay requests after")
    args = ap.parse_args()
    for ep in (args.pub, args.replay):
        if ep and not ep.startswith("tcp://127.0.0.1:"):
            sys.exit("kv_replay: only tcp://127.0.0.1:PORT endpoints")
    msgs = load_events(args.events, args.replica)
    if not msgs:
        sys.exit("kv_replay: no messages in the recording (wrong --replica?)")
    with Republisher(msgs, args.pub, args.replay or None, drop=args.drop, lost=args.lost) as rp:
        print(f"publishing {len(msgs)} messages on {rp.pub_endpoint}, replay {rp.replay_endpoint}", flush=True)
        if not rp.wait_subscribed(args.wait_subscriber):
            print("no subscriber yet; publishing anyway", flush=True)
        n = rp.publish(speed=args.speed or None)
        print(f"sent {n}, dropped {len(msgs) - n}", flush=True)
        time.sleep(args.linger)
    return 0


if __name__ == "__main__":
    sys.exit(main())
