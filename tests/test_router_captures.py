"""vLLM's own router (vllm-router 0.1.17) in front of two REAL vLLM 0.32.0 CPU replicas with KV events:
the captures of scripts/e2e/router_record.py in tests/fixtures/vllm-0.32.0-cpu-router/<scenario>/ (README there).

What is asserted:
* the truth is the engines' own: per replica, vLLM's prefix_cache_hits_total equals the sum of the
  requests' usage.prompt_tokens_details.cached_tokens, and the routing tokens follow from usage alone
  (a request's stored full blocks, when the other replica had served its tenant before);
* cachemon's ledger `routing` tokens equal that truth per replica (sequential clients), and its split
  equals the events' own reading under concurrency;
* the router's page is read exactly (normalise/routers.py against prometheus_client's parser);
* replayed in time through the attribution stage with the router's pages, `router_blind` is named on the
  captures where the router is blind and on none where it is not; one replica serving everything is
  `replica_load_skew`, with the router's policy beside it.
"""
from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from assert_support import nonempty
from cachemon.normalise.routers import KINDS, read_page
from cachemon.state.ledger.fleet import FleetLedger
from kv_capture_replay import replay as replay_in_time
from kv_support import replay as replay_events
from test_kv_ledger_real import oracle

ROOT = Path(__file__).resolve().parent / "fixtures" / "vllm-0.32.0-cpu-router"
BS = 128
# (capture, the router blind in it?) -- what each capture's router page says, README "What each shows"
CAPTURES = {
    "cache_aware_blind_seq": True,       # missing_tokens 40: the workers lack --enable-scale-out
    "round_robin_seq": False,            # round_robin makes no prefix decision at all
    "cache_aware_seq": False,            # prefix_hit / prefix_miss decisions
    "cache_aware_concurrent": False,
    "cache_aware_balance_concurrent": False,   # --balance-abs-threshold 0: load_imbalance 23 of 40 decisions
    "kv_aware_seq": True,                # every lookup of its own KV index a miss, credited 0, the engine hit 36 of 40
    "round_robin_concurrent": False,
    "round_robin_groups_seq": False,     # groups of five: routing tokens on both replicas
}
SEQUENTIAL = [n for n in CAPTURES if n.endswith("_seq")]


def _folder(name: str) -> Path:
    p = ROOT / name
    if not (p / "requests.jsonl").exists():
        pytest.skip(f"capture {name} not recorded")
    return p


def _requests(folder: Path) -> list[dict]:
    rows = [json.loads(x) for x in (folder / "requests.jsonl").read_text(encoding="utf-8").splitlines() if x.strip()]
    return sorted((r for r in rows if "usage" in r), key=lambda r: r["t_send"])


def _tenant(r: dict) -> int:
    m = re.match(r"Tenant (\d+) policy", r["request"]["messages"][0]["content"])
    assert m, "every request of these captures names its tenant first"
    return int(m.group(1))


def _final(folder: Path, replica: str, name: str) -> float:
    text = (folder / f"metrics-final-{replica}.txt").read_text(encoding="utf-8")
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def usage_truth(folder: Path) -> dict[str, float]:
    """Routing tokens per replica from vLLM's usage only: a request stores floor((prompt + completion - 1) / bs)
    blocks less its cached ones; they were cached on the other replica when it had served the tenant before
    (one at a time, no eviction: the pool holds every tenant)."""
    served: dict[str, set[int]] = {}
    out: Counter[str] = Counter()
    for r in _requests(folder):
        u, rep = r["usage"], r["replica"]
        stored = (u["prompt_tokens"] + u["completion_tokens"] - 1) // BS * BS - u["prompt_tokens_details"]["cached_tokens"]
        if any(_tenant(r) in t for other, t in served.items() if other != rep):
            out[rep] += stored
        served.setdefault(rep, set()).add(_tenant(r))
    return {rep: float(out[rep]) for rep in served}


@pytest.mark.parametrize("name", list(CAPTURES))
def test_the_engines_counters_equal_their_usage(name):
    folder = _folder(name)
    reqs = _requests(folder)
    assert len(reqs) == 40 and all(r["replica"] for r in reqs), "every request resolved to its replica"
    for rep in ("replica0", "replica1"):
        cached = sum(r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in reqs if r["replica"] == rep)
        prompt = sum(r["usage"]["prompt_tokens"] for r in reqs if r["replica"] == rep)
        assert _final(folder, rep, "vllm:prefix_cache_hits_total") == cached, rep
        assert _final(folder, rep, "vllm:prefix_cache_queries_total") == prompt, rep


@pytest.mark.parametrize("name", SEQUENTIAL)
def test_routing_tokens_are_exact_per_replica(name):
    folder = _folder(name)
    fleet = FleetLedger()
    msgs = replay_events(folder, fleet)
    assert msgs
    truth = usage_truth(folder)
    for rep, want in nonempty(truth.items()):
        v = fleet.view(rep)
        got = v.stored_tokens.get("routing", 0.0) if v is not None else 0.0
        assert got == want, (rep, got, want)


@pytest.mark.parametrize("name", list(CAPTURES))
def test_the_ledgers_split_equals_the_events_under_any_client(name):
    folder = _folder(name)
    fleet = FleetLedger()
    msgs = replay_events(folder, fleet)
    for rep, want in nonempty(oracle(msgs).items()):
        v = fleet.view(rep)
        assert v is not None and v.in_sync
        assert {k: x for k, x in v.stored_tokens.items() if x} == {k: float(x) for k, x in want.items()}, rep


@pytest.mark.parametrize("name", list(CAPTURES))
def test_the_router_page_is_read_exactly(name):
    text = (_folder(name) / "router-metrics-final.txt").read_text(encoding="utf-8")
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    got = read_page(KINDS["vllm-router"], text)
    assert got.skipped == 0

    def total(family: str, **labels: str) -> float:
        f = fams.get(family)
        return sum(s.value for s in (f.samples if f else []) if s.name.endswith("_total")
                   and all(s.labels.get(k) == v for k, v in labels.items()))

    per_outcome = {"hit": "prefix_hit", "miss": "prefix_miss", "blind": "missing_tokens", "load": "load_imbalance",
                   "cost": "prefix_cost"}
    for outcome, label in per_outcome.items():
        assert got.decisions.get(outcome, 0.0) == total("vllm_router_prefix_routing_decisions", outcome=label)
    for result in ("hit", "miss"):
        assert got.lookups.get(result, 0.0) == total("vllm_router_kv_placement_lookups", result=result)
    # kv_aware (0.1.17) counts no processed requests per worker on its page: then none are read
    assert sum(got.per_worker.values()) == total("vllm_router_processed_requests") in (0, 40)
    assert got.policy == json.loads((_folder(name) / "metadata.json").read_text())["router"]["policy"]


def _named(name: str):
    return replay_in_time(_folder(name), kv_events=True, router=True)


@pytest.mark.parametrize("name", list(CAPTURES))
def test_the_blind_router_is_named_where_it_is_blind_and_nowhere_else(name):
    out = _named(name)
    named = {rep: any("router_blind" in codes for _, codes in polls) for rep, polls in nonempty(out.named.items())}
    hit = {rep for rep in named if _final(_folder(name), rep, "vllm:prefix_cache_hits_total") > 0}
    if CAPTURES[name]:
        assert hit and all(named[rep] for rep in hit), named
    else:
        assert not any(named.values()), named


@pytest.mark.parametrize("name", list(CAPTURES))
def test_one_replica_serving_everything_is_named_with_the_policy(name):
    out = _named(name)
    reqs = _requests(_folder(name))
    share = Counter(r["replica"] for r in reqs)
    skewed = {rep for rep in out.named if any("replica_load_skew" in codes for _, codes in out.named[rep])}
    if len(share) == 1:
        assert skewed == set(share), (share, skewed)
    elif min(share.values()) >= 10:
        assert not skewed, (share, skewed)


@pytest.mark.parametrize("name", SEQUENTIAL)
def test_routing_tokens_are_split_by_the_routers_policy(name):
    """The router stage beside the ledger, both fed in recorded time: every routing token lands on the policy
    the router's page named, and they total the engines' truth."""
    from cachemon.config import Upstream
    from cachemon.config.routers import RouterEntry
    from cachemon.runtime.router_stage import RouterStage
    from cachemon.state.routers import RouterBook
    from kv_support import messages
    folder = _folder(name)
    meta = json.loads((folder / "metadata.json").read_text())
    ups = [Upstream(url=f"http://127.0.0.1:{r['api_port']}/metrics", name=n) for n, r in meta["replicas"].items()]
    fleet = FleetLedger()

    def routing(up: str) -> float:
        v = fleet.view(up)
        return v.stored_tokens.get("routing", 0.0) if v is not None else 0.0
    entry = RouterEntry(url="http://127.0.0.1:9/metrics", kind="vllm-router", name="front")
    stage = RouterStage([entry], ups, RouterBook(), 1.0, routing_tokens=routing)
    kv = messages(folder)
    last = ""
    for line in map(json.loads, (folder / "router-metrics.jsonl").read_text().splitlines()):
        while kv and kv[0]["t"] <= line["t"]:
            m = kv.pop(0)
            fleet.on_batch(m["replica"], "tiny", m["batch"], m["t"])
        last = last if line.get("unchanged") else line["text"]
        stage.feed(entry, line["t"], last)
    assert not kv, "the router was polled until after the last event"
    want = sum(usage_truth(folder).values())
    assert stage.routing_by_policy == ({("front", meta["router"]["policy"]): want} if want else
                                       {("front", meta["router"]["policy"]): 0.0})


@pytest.mark.parametrize("name", list(CAPTURES))
def test_the_fleets_routing_tokens_equal_usage_under_any_client(name):
    """Concurrent clients make which replica stored a tenant's prefix first a race; the fleet's total is not:
    every stored block beyond each tenant's first copy (usage: stored = whole blocks - cached) was held by the
    other replica (no eviction here), so the ledger's routing tokens over both replicas equal it."""
    folder = _folder(name)
    fleet = FleetLedger()
    replay_events(folder, fleet)
    reqs = _requests(folder)
    stored = sum((r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"] - 1) // BS * BS
                 - r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in reqs)
    first = {_tenant(r): (r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"] - 1) // BS * BS for r in reqs}
    views = [fleet.view(rep) for rep in ("replica0", "replica1")]
    routing = sum(v.stored_tokens.get("routing", 0.0) for v in views if v is not None)
    assert routing == stored - sum(first.values())


@pytest.mark.parametrize("name", list(CAPTURES))
def test_load_over_locality_is_named_where_the_router_says_it_chose_for_load(name):
    out = _named(name)
    page = read_page(KINDS["vllm-router"], (_folder(name) / "router-metrics-final.txt").read_text())
    named = {rep for rep, polls in out.named.items() if any("load_over_locality" in c for _, c in polls)}
    if page.decisions.get("load", 0.0) > 0:
        # both replicas got requests the router sent for balance, and both stored the other's prefixes again
        assert named == {"replica0", "replica1"}, named
        assert all(any("routing_skew" in c for _, c in out.named[rep]) for rep in named)
    else:
        assert not named, named
