"""A KV connector tier that publishes no KV events, on a REAL vLLM 0.32.0 (CPU build): ExampleConnector
(KV saved per prompt to a folder with safetensors and loaded back), tests/fixtures/vllm-0.32.0-cpu-example-
connector/example_connector/ (scripts/e2e/kv_tiers_live.py, a live ``cachemon run`` beside the server; its
README says how). vLLM reports its hits as ``source="external_unspecified"``; the blocks it loads are stored
in the device pool like computed ones (GPU BlockStored, the same hashes), so the KV-event ledger alone
reads them as misses (capacity, reset). Checked: hits by tier equal vLLM's counter (normalised, live), and
the causes cachemon names, replayed poll by poll from the recorded pages and events through the store, the
ledger and the snapshot builder, do not call those loads capacity or reset losses; a tier-blind reading did.
"""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from cachemon import catalog as C
from cachemon.normalise.normaliser import normalise_text, to_update
from cachemon.runtime.attribution_stage import AttributionSettings, Attributor
from cachemon.state.events import EventLog
from cachemon.state.ledger.fleet import FleetLedger
from cachemon.state.store import Store
from helpers import FIXTURES, samples, value
from kv_support import messages, requests

FIX = FIXTURES / "vllm-0.32.0-cpu-example-connector" / "example_connector"
SOURCES = ("device", "host", "disk", "p2p", "external_unspecified")


def test_hits_from_an_event_less_tier_by_source_normalised_and_live():
    vllm = samples((FIX / "metrics-final-raw.txt").read_text())
    by = {s: value(vllm, "vllm:prompt_tokens_cached_by_source_total", source=s, engine="0") for s in SOURCES}
    cached = sum(r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in requests(FIX))
    assert by["external_unspecified"] == value(vllm, "vllm:external_prefix_cache_hits_total", engine="0") == cached > 0
    n = normalise_text((FIX / "metrics-final-raw.txt").read_text())
    got = {k.labels[2]: v for k, v in n.counters.items() if k.metric == C.HIT_TOKENS_BY_SOURCE.name}
    assert got == by
    live = samples((FIX / "cachemon-final.txt").read_text())
    assert {s: value(live, C.HIT_TOKENS_BY_SOURCE.sample_name, source=s) for s in SOURCES} == by
    assert not any(n == C.KV_TIER_STORED_BLOCKS.sample_name for n, _ in live)      # no tier events at all


def replay(tier_blind: bool = False, ahead: float = 0.0, fix=FIX) -> tuple[set[str], dict[str, float]]:
    """Every recorded poll and KV batch in time order through cachemon's own stages (store, ledger,
    attributor with its hold and hold-down, as ``cachemon run`` wires them): the causes that became active
    and the tokens each cost. ``tier_blind``: the snapshots without the tier hits (the rules before).
    ``ahead``: the ledger holds the batches of that many seconds after the page was read (live, the events
    arrive at once while the page is polled once a poll interval: cachemon run's evaluation can see the
    stores of a request whose hits the last page did not count yet)."""
    polls = [json.loads(x) for x in (fix / "metrics.jsonl").read_text().splitlines()]
    batches = messages(fix)
    fleet = FleetLedger()
    store = Store({"1m": 60.0})
    att = Attributor(store, AttributionSettings(), events=EventLog(), ledger_view=fleet.view)
    if tier_blind:
        build = att.builder.build
        att.builder.build = lambda *a, **k: [replace(s, interval_tier_hit_tokens=None) for s in build(*a, **k)]
    active: set[str] = set()
    text = None
    b = 0
    for p in polls:
        while b < len(batches) and batches[b]["t"] <= p["t"] + ahead:
            m = batches[b]
            fleet.on_batch(m["replica"], "tiny", m["batch"], m["t"])
            b += 1
        text = p.get("text", text)
        assert not store.apply("vllm", to_update(normalise_text(text)), p["t"]).restart
        att.evaluate(p["t"])
        active |= att.tracker.active_for("vllm", "tiny")
    return active, {k[2]: v for k, v in att.missed.items()}


@pytest.mark.parametrize("ahead", [0.0, 0.9])
def test_loads_from_an_event_less_tier_are_not_capacity_or_reset_losses(ahead):
    live = {x.split('cause="')[1].split('"')[0] for line in (FIX / "cachemon-pages.jsonl").read_text().splitlines()
            for x in json.loads(line)["text"].splitlines() if x.startswith("cachemon_cause_active{") and x.endswith(" 1.0")}
    blind, _ = replay(tier_blind=True, ahead=ahead)
    assert {"capacity_eviction", "cache_reset"} <= blind       # what a tier-blind cachemon says
    active, missed = replay(ahead=ahead)
    assert "capacity_eviction" not in active and "cache_reset" not in active, (active, missed, live)
    assert live == {"cold_cache"}                               # cachemon's own pages, live beside vLLM
