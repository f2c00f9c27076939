"""cachemon's per-tier view on a REAL vLLM 0.32.0 (CPU build) with native CPU offloading:
tests/fixtures/vllm-0.32.0-cpu-offloading/ (recorded by scripts/e2e/kv_tiers_live.py with a live
``cachemon run`` beside the server; how, and what is real, in its README).

vLLM's own counters are the yardstick: ``vllm:prompt_tokens_cached_by_source_total`` (hits by the tier
that supplied them), ``usage.prompt_tokens_details.cached_tokens`` per request, and the KV events read
here with msgspec only (tests/kv_support.load_messages, no cachemon code). Checked:

1. hits by tier: the page normalised (and replayed poll by poll through the store) and cachemon's live
   page equal vLLM's counter, whose tiers sum to the requests' cached tokens;
2. stores and removals per medium: the ledger's and cachemon's live tier counters equal the events;
3. the tier-aware capacity cause: blocks evicted from the device and loaded back from the CPU tier are
   the tier's hits (equal to vLLM's host counter), not capacity misses; blocks evicted from both tiers
   are (cause capacity_eviction, named live); the blocks computed again after the tier itself was
   emptied without an event are misses of the reset.

Four captures: ``cpu_offload_hostcopy`` (a big CPU tier; device and silent tier resets),
``cpu_offload_hostcopy_small`` (a CPU tier smaller than the working set: it evicts too),
``cpu_offload_hostcopy_described`` (the same with the connector's self-describing events: the tier's
stores carry token ids, parents and the block size) and ``cpu_fs_tiers`` (the same CPU tier with vLLM's
file-system tier behind it: medium STORAGE, locality LOCAL, hits from source disk).
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace

import pytest

from cachemon import catalog as C
from cachemon.check import JUDGED_KINDS
from cachemon.judge import attribute as A
from cachemon.judge.snapshots import SnapshotBuilder, read_store
from cachemon.normalise.normaliser import normalise_text, to_update
from cachemon.runtime.attribution_stage import AttributionSettings
from cachemon.state.events import EventLog
from cachemon.state.ledger.fleet import FleetLedger
from cachemon.state.store import Store
from helpers import FIXTURES, samples, value
from kv_support import load_messages, messages, requests
from test_kv_tiers_example_connector import replay

ROOT = FIXTURES / "vllm-0.32.0-cpu-offloading"
FIX = ROOT / "cpu_offload_hostcopy"
SMALL = ROOT / "cpu_offload_hostcopy_small"
DESCRIBED = ROOT / "cpu_offload_hostcopy_described"     # SMALL's set-up with self-describing tier events
FS = ROOT / "cpu_fs_tiers"        # SMALL's set-up with vLLM's tiering spec: a file-system tier behind the CPU one
SMALLS = (SMALL, DESCRIBED)       # tenants evicted from every tier: capacity misses
EVICTING = (SMALL, DESCRIBED, FS)  # a CPU tier smaller than the working set
ALL = pytest.mark.parametrize("fix", [FIX, SMALL, DESCRIBED, FS], ids=lambda p: p.name)
MEDIUM_SOURCE = {"CPU": "host", "STORAGE": "disk"}   # vLLM's cache-hit source per tier medium (tiering/base.py)
BS = 128
SOURCES = ("device", "host", "disk", "p2p", "external_unspecified")


def _vllm_by_source(fix=FIX) -> dict[str, float]:
    vllm = samples((fix / "metrics-final-raw.txt").read_text())
    return {s: value(vllm, "vllm:prompt_tokens_cached_by_source_total", source=s, engine="0") for s in SOURCES}


def _cachemon_final(fix) -> dict:
    return samples((fix / "cachemon-final.txt").read_text())


def _ledger(fix):
    fleet = FleetLedger()
    for m in messages(fix):
        fleet.on_batch(m["replica"], "tiny", m["batch"], m["t"])
    return fleet.snapshot()[0]


@ALL
def test_the_capture_is_real_native_offloading_with_hits_from_the_host_tier(fix):
    meta = json.loads((fix / "metadata.json").read_text())
    assert meta["vllm_version"] == "0.32.0"
    by = _vllm_by_source(fix)
    assert by["host"] > 0 and (by["disk"] > 0) == (fix == FS) and by["p2p"] == by["external_unspecified"] == 0
    # vLLM's HELP: the tiers sum to local + external hits; here also to the requests' cached tokens
    vllm = samples((fix / "metrics-final-raw.txt").read_text())
    local = value(vllm, "vllm:prefix_cache_hits_total", engine="0")
    external = value(vllm, "vllm:external_prefix_cache_hits_total", engine="0")
    cached = sum(r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in requests(fix))
    assert sum(by.values()) == local + external == cached
    assert (by["device"], by["host"] + by["disk"]) == (local, external)
    n = normalise_text((fix / "metrics-final-raw.txt").read_text())
    assert n.engines[("tiny", "0")].offloading == "native"      # kv_offloading_size is set on this page


@ALL
def test_hits_by_tier_normalised_replayed_and_exported_live_equal_vllms_counter(fix):
    by = _vllm_by_source(fix)
    n = normalise_text((fix / "metrics-final-raw.txt").read_text())
    assert _by_source(n) == by
    # every recorded poll through the store (reset-corrected counters): the last value is vLLM's
    st = Store({"1m": 60.0}).upstream("vllm")
    for line in (fix / "metrics.jsonl").read_text().splitlines():
        d = json.loads(line)
        if "text" in d:
            st.apply(to_update(normalise_text(d["text"])), d["t"])
    assert st.restarts == 0
    assert {s: st.counters[(C.HIT_TOKENS_BY_SOURCE.name, ("tiny", "0", s))].value for s in SOURCES} == by
    # cachemon's own page, scraped live at the end of the run
    live = _cachemon_final(fix)
    assert {s: value(live, C.HIT_TOKENS_BY_SOURCE.sample_name, source=s) for s in SOURCES} == by


@ALL
def test_stores_and_removals_per_medium_equal_the_events(fix):
    stored: Counter = Counter()
    removed: Counter = Counter()
    for m in load_messages(fix):
        for e in m.events:
            med = e.get("medium")
            if med in (None, "GPU"):
                continue
            if e["type"] == "BlockStored":
                stored[med] += len(e["block_hashes"])
            elif e["type"] == "BlockRemoved":
                removed[med] += len(e["block_hashes"])
    assert stored["CPU"] > 0 and (removed["CPU"] > 0) == (fix in EVICTING)
    assert set(stored) == ({"CPU", "STORAGE"} if fix == FS else {"CPU"})
    shapes = {(e.get("block_size"), len(e["token_ids"])) for m in load_messages(fix) for e in m.events
              if e["type"] == "BlockStored" and e.get("medium") == "CPU"}
    assert shapes == ({(BS, BS)} if fix == DESCRIBED else {(0, 0)})    # self-describing, or placeholders
    # vLLM 0.32.0's CPU tier names no locality (the field's default, None, is omitted on the wire); the fs
    # tier the one it was configured with
    loc = {(e.get("medium"), e.get("locality")) for m in load_messages(fix) for e in m.events if "medium" in e}
    assert loc == {("GPU", None), ("CPU", None)} | ({("STORAGE", "LOCAL")} if fix == FS else set())
    snap = _ledger(fix)
    assert {t.medium: t.stored_blocks for t in snap.tiers} == {k: float(v) for k, v in stored.items()}
    assert {t.medium: t.removed_blocks for t in snap.tiers} == {k: float(removed[k]) for k in stored}
    live = _cachemon_final(fix)
    for med in stored:
        assert value(live, C.KV_TIER_STORED_BLOCKS.sample_name, medium=med) == stored[med]
        assert value(live, C.KV_TIER_REMOVED_BLOCKS.sample_name, medium=med) == removed[med]


def independent_split(folder) -> tuple[int, dict[str, int]]:
    """(tokens loaded from a tier, computed tokens by reason) from vLLM's usage and events alone.

    Requests were sent one at a time and each one's events arrived before the next was sent. vLLM
    computed ``floor((P + C - 1) / bs) - cached / bs`` blocks of a request (docs/kv-events.md, checked on
    every kv-events capture); its GPU stores hold those plus the blocks it loaded from a tier, which
    come first. Computed blocks are classified by the plain rules: cached now (recompute_last_block),
    else how the block last left the pool (BlockRemoved of its last copy: capacity; AllBlocksCleared:
    reset), else first."""
    reqs = sorted(requests(folder), key=lambda r: r["t_send"])
    msgs = load_messages(folder)
    gpu: Counter = Counter()
    gone: dict[int, str] = {}
    split: Counter = Counter()
    loaded_tokens = 0
    for i, r in enumerate(reqs):
        end = reqs[i + 1]["t_send"] if i + 1 < len(reqs) else float("inf")
        evs = [e for m in msgs if r["t_send"] <= m.t < end for e in m.events if e.get("medium") in (None, "GPU")]
        u = r["usage"]
        cached = u["prompt_tokens_details"]["cached_tokens"]
        computed = (u["prompt_tokens"] + u["completion_tokens"] - 1) // BS - cached // BS
        loaded = sum(len(e["block_hashes"]) for e in evs if e["type"] == "BlockStored") - computed
        assert loaded >= 0
        loaded_tokens += loaded * BS
        for e in evs:
            if e["type"] == "AllBlocksCleared":
                gone.update(dict.fromkeys(gpu, "reset"))
                gpu.clear()
            elif e["type"] == "BlockRemoved":
                for h in e["block_hashes"]:
                    gpu[h] -= 1
                    if gpu[h] <= 0:
                        del gpu[h]
                        gone[h] = "capacity"
            elif e["type"] == "BlockStored":
                for h in e["block_hashes"]:
                    if loaded:
                        loaded -= 1
                        gone.pop(h, None)
                    else:
                        split["recompute_last_block" if h in gpu else gone.pop(h, "first")] += BS
                    gpu[h] += 1
    return loaded_tokens, dict(split)


@ALL
def test_loads_from_the_cpu_tier_are_hits_not_capacity_misses(fix):
    """cpu_offload_hostcopy: the 6 tenants again after the device evicted them, all loaded from the CPU tier
    (no capacity miss); after ``reset_prefix_cache?reset_external=true`` (nothing published for the tier)
    two tenants are computed: misses of the reset, not the tier's hits. cpu_offload_hostcopy_small: the
    oldest tenants were evicted from both tiers: capacity misses, and cachemon named capacity_eviction."""
    by = _vllm_by_source(fix)
    loaded, split = independent_split(fix)
    assert loaded == by["host"] + by["disk"] > 0      # the reading agrees with vLLM's own counter
    assert (split.get("capacity", 0) > 0) == (fix in SMALLS) and (split.get("reset", 0) > 0) == (fix == FIX)
    snap = _ledger(fix)
    # per tier: a block promoted from the file tier into the CPU tier for the load is the file tier's hit
    tiers = {t.medium: t.hit_tokens for t in snap.tiers if t.hit_tokens}
    assert tiers == {m: by[src] for m, src in MEDIUM_SOURCE.items() if by[src]}
    assert {k: v for k, v in snap.stored_tokens.items() if v} == {k: float(v) for k, v in split.items()}
    assert snap.in_sync
    assert dict(snap.anomalies)["tier_unannounced_clears"] == (1 if fix == FIX else 0)   # the silent tier reset
    # cachemon's live page at the end of the run says the same
    live = _cachemon_final(fix)
    assert {m: value(live, C.KV_TIER_HIT_TOKENS.sample_name, medium=m) for m in tiers} == tiers
    got = {dict(ls)["reason"]: v for (n, ls), v in live.items() if n == C.KV_STORED_TOKENS.sample_name and v}
    assert got == {k: float(v) for k, v in split.items()}
    named = {dict(ls)["cause"] for line in (fix / "cachemon-pages.jsonl").read_text().splitlines()
             for (n, ls), v in samples(json.loads(line)["text"]).items() if n == "cachemon_cause_active" and v}
    assert ("capacity_eviction" in named) == (fix in SMALLS)


def _page_at(t: float):
    """The last /metrics page vLLM served before ``t`` (metrics.jsonl: unchanged polls repeat the last)."""
    text = None
    for line in (FIX / "metrics.jsonl").read_text().splitlines():
        d = json.loads(line)
        if d["t"] >= t:
            break
        text = d.get("text", text)
    assert text is not None
    return normalise_text(text)


def test_the_capacity_heuristic_without_events_does_not_count_what_the_cpu_tier_served():
    """Metrics only (no KV events), judged on the 'again' phase: every prompt missed by the device pool and
    was loaded from the CPU tier. Its misses exceed the pool, which alone reads as 'the working set does not
    fit'; the tier's hits (external_prefix_cache_hits, here all from source host) are no loss."""
    phases = {p["phase"]: p["t"] for p in json.loads((FIX / "metadata.json").read_text())["phases"]}
    t0, t1 = phases["again"], next(t for name, t in phases.items() if name.startswith("reset "))
    store = Store({"1m": 60.0})
    builder = SnapshotBuilder(AttributionSettings(window=t1 - t0), kinds=JUDGED_KINDS, events=EventLog())
    for t in (phases["fill"], t0, t1):            # idle (before any request), after fill, after again
        assert not store.apply("vllm", to_update(_page_at(t)), t).restart
        [s] = builder.build(read_store(store), t)
    host = [_by_source(_page_at(t))["host"] for t in (t0, t1)]
    assert s.interval_tier_hit_tokens == host[1] - host[0] > 0 and s.interval_hit_tokens == 0
    assert s.pool_tokens is not None and s.interval_query_tokens - s.interval_hit_tokens > s.pool_tokens
    assert A.CauseCode.CAPACITY not in A.attribute(s).codes
    blind = A.attribute(replace(s, interval_tier_hit_tokens=None))     # what a tier-blind rule said
    assert A.CauseCode.CAPACITY in blind.codes


def _by_source(n) -> dict[str, float]:
    return {k.labels[2]: v for k, v in n.counters.items() if k.metric == C.HIT_TOKENS_BY_SOURCE.name}


@ALL
@pytest.mark.parametrize("ahead", [0.0, 0.9])
def test_the_causes_replayed_through_cachemons_stages_cost_what_the_ledger_split_says(fix, ahead):
    """The recorded polls and batches through store, ledger and attributor (as ``cachemon run``; ``ahead``:
    the events a poll interval ahead of the page, as live): with the CPU tier's loads out of the split, the
    big tier's capture names cache_reset for exactly the tokens computed after the silent tier reset and no
    capacity_eviction; the small tier's names capacity_eviction for exactly the blocks evicted from both."""
    _, split = independent_split(fix)
    active, missed = replay(ahead=ahead, fix=fix)
    assert missed.get(A.CauseCode.CACHE_RESET) == split.get("reset")
    assert missed.get(A.CauseCode.CAPACITY) == split.get("capacity")
    assert (A.CauseCode.CAPACITY in active) == (fix in SMALLS)
