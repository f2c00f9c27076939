"""Attribution v2 on real vLLM 0.32.0 captures replayed in time (tests/fixtures/vllm-0.32.0-cpu-kv-events/).

Counters only (the KV-event ledger is tested on constructed views in test_attribution_v2.py): these are
the captures' real /metrics pages, polled every second, fed at their recorded times; what is derived is
said in tests/kv_capture_replay.py. Skipped (visibly) where the captures are not in the checkout.
Each scenario starts a fresh vLLM server, so every one begins with a cold cache.
"""
from __future__ import annotations

import json

import pytest

from assert_support import nonempty
from cachemon.judge import attribute as A
from kv_capture_replay import capture_dir, replay

ROOT = capture_dir()
pytestmark = pytest.mark.skipif(ROOT is None, reason="tests/fixtures/vllm-0.32.0-cpu-kv-events/ not present")


def scenario(name: str, **kw):
    if ROOT is None or not (ROOT / name / "metadata.json").is_file():     # written when the recording ends
        pytest.skip(f"capture {name} not recorded")
    r = replay(ROOT / name, **kw)
    assert r.polls and all(len(p) >= 4 for p in r.polls.values()), "a capture without polls proves nothing"
    return r


def lost_cached_tokens(name: str) -> float:
    """vLLM's own truth (usage.prompt_tokens_details.cached_tokens): the tenants' round just before the
    event hit what the same tenants' first round after it no longer found."""
    rows = [json.loads(line) for line in (ROOT / name / "requests.jsonl").read_text().splitlines()]  # type: ignore[operator]
    at = next(r["time"] for r in rows if "event" in r)
    before = [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in rows if "usage" in r and r["t_send"] < at]
    after = [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in rows if "usage" in r and r["t_send"] > at]
    n = len(before) // 2          # tenants x 2 rounds on each side of the event
    return float(sum(before[n:]) - sum(after[:n]))


@pytest.mark.parametrize("name", ["tiny_pool", "reset", "restart", "routing", "multiturn", "cold_start",
                                  "dynamic_prefix_tail", "bursts", "block_edge"])
def test_a_fresh_servers_first_traffic_is_cold_cache_never_a_dynamic_prefix(name):
    r = scenario(name)
    for replica in nonempty(r.polls):
        assert r.ever(replica, A.CauseCode.DYNAMIC_PREFIX) == 0, (replica, r.named[replica])
        # named at the first poll, even where the first requests finished before cachemon's first poll of
        # the process (every capture here: the recorder's first poll came after the first request)
        assert r.polls_to(replica, A.CauseCode.COLD_CACHE, r.first_request[replica]) == 1, replica


@pytest.mark.parametrize("stride,short_window,most", [(1, 4.0, 10), (2, 8.0, 6)])
def test_dynamic_prefix_at_the_head_from_a_cold_start_is_named_within_10_polls(stride, short_window, most):
    # the capture's 1 s polls, and every other one: `cachemon run`'s default 2 s (short window: 4 polls)
    r = scenario("dynamic_prefix_head", stride=stride, short_window=short_window)
    t0 = r.first_request["vllm"]
    assert r.polls_to("vllm", A.CauseCode.COLD_CACHE, t0) == 1
    n = r.polls_to("vllm", A.CauseCode.DYNAMIC_PREFIX, t0)
    assert n is not None and n <= most
    # nothing else: no hit ever, 20 distinct heads
    assert {c for _, a in r.polls["vllm"] for c in a} == {A.CauseCode.COLD_CACHE, A.CauseCode.DYNAMIC_PREFIX}


@pytest.mark.parametrize("name,event,code", [("reset", "reset_prefix_cache", A.CauseCode.CACHE_RESET),
                                             ("restart", "restart", A.CauseCode.RESTART)])
def test_reset_and_restart_are_named_with_their_true_cost(name, event, code):
    r = scenario(name)
    at = next(m["time"] for m in r.markers if m["event"] == event)
    n = r.polls_to("vllm", code, at)
    assert n is not None and n <= 3
    # the estimate (misses above the miss ratio before the event, the cold start left out) against vLLM's truth:
    # each of the 3 tenants' second round hit 768 tokens before the event; after it, the first round missed them
    assert r.missed[("vllm", code, "estimated")] == pytest.approx(3 * 768, rel=0.01)   # an estimate: within 1 %
    assert lost_cached_tokens(name) == 3 * 768
