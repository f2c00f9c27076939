"""The demo's traffic (demo/traffic.py): counters that grow every poll from the real captured pages,
and the KV-event replay (demo/kv_replay.py) that makes later plays look like new prompts."""
from __future__ import annotations

import msgspec
import pytest

from assert_support import nonempty
from cachemon.demo.kv_replay import bundled_capture, renew
from cachemon.demo.replay import bundled_pages
from cachemon.demo.traffic import IDLE, PER_PHASE_REQUESTS, ROUND, Traffic
from cachemon.normalise.normaliser import normalise_text

Q = 'vllm:prefix_cache_queries_total{engine="0",model_name="tiny"}'
H = 'vllm:prefix_cache_hits_total{engine="0",model_name="tiny"}'


def values(page: str) -> dict[str, float]:
    out = {}
    for line in page.splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            out[k] = float(v)
    return out


def traffic(rate: float = 1.0) -> Traffic:
    return Traffic(bundled_pages(), rate=rate, start=0.0, clock=lambda: 0.0)


def test_idle_serves_the_idle_capture_then_counters_grow_every_second_of_traffic():
    t = traffic()
    idle = {k: v for k, v in values(bundled_pages()[0][1]).items()}
    assert values(t.page(IDLE.seconds - 1))[Q] == idle[Q] == 0.0
    seen = [values(t.page(IDLE.seconds + s))[Q] for s in range(1, 600)]
    assert all(b > a for a, b in zip(seen, seen[1:], strict=False))    # every poll, not every phase


def test_each_phase_has_the_captured_ratio_over_whole_batches_of_requests():
    t = traffic()
    static, stamp = ROUND[0], ROUND[1]
    start = IDLE.seconds
    a, b = values(t.page(start)), values(t.page(start + PER_PHASE_REQUESTS))   # 16 requests at 1/s
    assert (b[Q] - a[Q], b[H] - a[H]) == (13296.0, 11520.0)        # the real pages' difference
    c = start + static.seconds
    d, e = values(t.page(c)), values(t.page(c + PER_PHASE_REQUESTS))
    assert (e[Q] - d[Q], e[H] - d[H]) == (13584.0, 0.0)           # timestamp at the head: no hits
    assert t.position(c + 1)[2] is stamp


def test_histograms_stay_valid_expositions_and_no_counter_ever_drops():
    t = traffic(rate=0.93)
    prev: dict[str, float] = {}
    for s in nonempty(range(0, 1800, 37)):
        page = t.page(s)
        normalise_text(page)                       # parses as vLLM 0.32.0 (raises on a bad page)
        v = values(page)
        for k in t.accumulating:
            assert v[k] >= prev.get(k, 0.0), (s, k)
        bucket = [(k, x) for k, x in v.items() if k.startswith("vllm:request_prompt_tokens_bucket")]
        assert [x for _, x in bucket] == sorted(x for _, x in bucket)
        count = v['vllm:request_prompt_tokens_count{engine="0",model_name="tiny"}']
        assert count == bucket[-1][1]
        prev = v


def test_the_time_scale_shortens_phases_only():
    fast = Traffic(bundled_pages(), start=0.0, clock=lambda: 0.0, time_scale=0.05)
    assert fast.position(IDLE.seconds * 0.05 + ROUND[0].seconds * 0.05 + 0.1)[2] is ROUND[1]
    with pytest.raises(ValueError):
        Traffic(bundled_pages(), time_scale=0)


def test_a_replayed_batch_is_new_content_the_first_play_is_the_capture_itself():
    cap = bundled_capture("dynamic_prefix_head")
    assert cap.requests == 20 and 0.8 < cap.rate < 1.0 and len(cap.batches) == 20
    raw = cap.batches[0][2]
    first = msgspec.msgpack.decode(renew(raw, 0, 1.0))[1][0]
    again = msgspec.msgpack.decode(renew(raw, 1, 2.0))[1][0]
    orig = msgspec.msgpack.decode(raw)[1][0]
    assert first["block_hashes"] == orig["block_hashes"] and first["token_ids"] == orig["token_ids"]
    assert not set(again["block_hashes"]) & set(orig["block_hashes"])
    assert again["token_ids"][1:] == orig["token_ids"][1:] and again["token_ids"][0] != orig["token_ids"][0]


def test_the_bundled_kv_events_are_the_fixture_bytes():
    from importlib import resources
    from pathlib import Path
    for name in nonempty(("dynamic_prefix_head", "dynamic_prefix_tail")):
        shipped = resources.files("cachemon") / "data" / "captures" / "vllm-0.32.0-cpu-kv-events" / name / "events.jsonl"
        fixture = Path(__file__).parent / "fixtures" / "vllm-0.32.0-cpu-kv-events" / name / "events.jsonl"
        assert shipped.read_bytes() == fixture.read_bytes()
