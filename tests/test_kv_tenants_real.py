"""Per tenant and per adapter on the REAL vLLM 0.32.0 tenants_lora capture (scripts/e2e/kv_more.py
sc_tenants_lora; skipped until recorded): three tenants with cache_salts sharing one system prompt, one
without a salt, one with a timestamp at the head, two LoRA adapters over the same prompts; round 1 and
the adapters' round 2 in full report mode. The salts are constructed test salts (the capture's
metadata says so), so they may appear in this file.

Asserted: the ledger's per-tenant split (and hits) equals an independent reading of the events here
(tenant = the salt of the chain head, inherited through parent_block_hash; isolation = a block whose
token content, the chain of token ids alone, is cached at that moment under another vLLM hash), the
isolation tokens equal the shared system-prompt blocks stored once per extra salt or adapter, and the
hits per tenant equal the responses' cached_tokens of its full-mode requests.
"""
from __future__ import annotations

import hashlib
from collections import Counter, defaultdict

import pytest

from cachemon.normalise.kv_batch import Cleared, Removed, Stored
from cachemon.state.ledger.fleet import FleetLedger
from cachemon.state.ledger.tenants import TenantLabels
from kv_support import messages, metadata, requests, scenario

KEY = b"tenants-lora-test-key-16+"


def _folder():
    p = scenario("tenants_lora")
    if not (p / "events.jsonl").exists() or not (p / "events.jsonl").stat().st_size:
        pytest.skip("capture tenants_lora not recorded yet (scripts/e2e/kv_more.py)")
    return p


def _reports(msgs, reqs) -> set[int]:
    """Reuse reports, found from the requests: in a full-mode request's window, the first chain-head
    store covering exactly its cached tokens (vLLM sends it at the lookup, before the request's stores)."""
    bounds = [r["t_send"] for r in reqs] + [float("inf")]
    out = set()
    for i, r in enumerate(reqs):
        cached = r["usage"]["prompt_tokens_details"]["cached_tokens"]
        if r["report_mode"] != "full" or not cached:
            continue
        win = [m for m in msgs if bounds[i] <= m["t"] < bounds[i + 1]]
        ev = next(e for m in win for e in m["batch"].events
                  if isinstance(e, Stored) and e.parent is None and len(e.hashes) * e.block_size == cached)
        out.add(id(ev))
    return out


def _salt(e: Stored):
    head = e.extra[0] if e.extra else None
    if not isinstance(head, tuple):
        return None
    items = [x for x in head if isinstance(x, str) and x != e.lora]
    return items[0] if items else None


def oracle(msgs, reports, label):
    """(tenant, adapter) -> reason -> tokens, and (tenant, adapter) -> hit tokens, from the events."""
    cached: Counter = Counter()               # vLLM hash -> copies
    gone: dict = {}                           # vLLM hash -> how it left
    tenant_of: dict = {}                      # vLLM hash -> (tenant, adapter)
    tc_of: dict = {}                          # vLLM hash -> token content (chain of token ids)
    tc_cached: Counter = Counter()            # token content -> cached hashes
    split: dict = defaultdict(Counter)
    hits: Counter = Counter()
    for m in msgs:
        for e in m["batch"].events:
            if isinstance(e, Cleared):
                for h in cached:
                    gone[h] = "reset"
                    tc_cached[tc_of[h]] -= 1
                cached.clear()
            elif isinstance(e, Removed):
                for h in e.hashes:
                    cached[h] -= 1
                    if cached[h] == 0:
                        del cached[h]
                        gone[h] = "capacity"
                        tc_cached[tc_of[h]] -= 1
            elif isinstance(e, Stored):
                key = (label(_salt(e)), e.lora or "") if e.parent is None else tenant_of[e.parent]
                if id(e) in reports:
                    hits[key] += len(e.hashes) * e.block_size
                    continue
                ids = tuple(e.tokens)
                tc = None if e.parent is None else tc_of[e.parent]
                for k, h in enumerate(e.hashes):
                    tc = (tc, ids[k * e.block_size:(k + 1) * e.block_size])
                    if h in cached:
                        why = "recompute_last_block"
                    elif h in gone:
                        why = gone.pop(h)
                    elif tc_cached[tc] > 0:
                        why = "isolation"
                    else:
                        why = "first"
                    split[key][why] += e.block_size
                    if h not in cached:
                        tc_cached[tc] += 1
                    cached[h] += 1
                    tenant_of[h], tc_of[h] = key, tc
    return split, hits


def test_per_tenant_split_hits_and_isolation_equal_what_the_events_imply():
    folder = _folder()
    msgs = messages(folder)
    reqs = sorted(requests(folder), key=lambda r: r["t_send"])
    salts = metadata(folder)["tenants"]["salts"]
    names = {hashlib.sha256(salts["t1"].encode()).hexdigest(): "t1"}
    labels = TenantLabels(names, KEY, 20)
    fleet = FleetLedger(tenants=labels, full_reports=True)     # rounds in full report mode
    for m in msgs:
        fleet.on_batch(m["replica"], "tiny", m["batch"], m["t"])
    snap = fleet.snapshot()[0]
    got = {(t, a): {k: v for k, v in split.items() if v} for t, a, split, _ in snap.tenants}
    got_hits = {(t, a): h for t, a, _, h in snap.tenants if h}

    def label(salt):
        return "" if salt is None else labels.label(salt)[0]

    want, want_hits = oracle(msgs, _reports(msgs, reqs), label)
    assert got == {k: {r: float(x) for r, x in v.items() if x} for k, v in want.items()}
    assert got_hits == {k: float(v) for k, v in want_hits.items() if v}
    # hits per tenant = its full-mode requests' cached tokens
    by_req: Counter = Counter()
    for r in reqs:
        if r["report_mode"] == "full":
            by_req[(label(r["salt"]), r["adapter"] or "")] += r["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert got_hits == {k: float(v) for k, v in by_req.items() if v}
    # isolation = the shared system-prompt blocks, stored once per salt or adapter after the first
    first_round = [r for r in reqs if r["t_send"] < reqs[7]["t_send"]]      # round 0: 7 requests
    assert [r["tenant"] for r in first_round] == ["t1", "t2", "t3", "t0", "ts", "t0", "t0"]
    t1 = next(e for m in msgs for e in m["batch"].events if isinstance(e, Stored) and _salt(e) == salts["t1"])
    t2 = next(e for m in msgs for e in m["batch"].events if isinstance(e, Stored) and _salt(e) == salts["t2"])
    bs = t1.block_size
    shared = 0
    while shared < min(len(t1.hashes), len(t2.hashes)) and \
            tuple(t1.tokens)[shared * bs:(shared + 1) * bs] == tuple(t2.tokens)[shared * bs:(shared + 1) * bs]:
        shared += 1
    assert shared > 0
    iso = sum(v.get("isolation", 0) for v in got.values())
    assert iso == 5 * shared * bs            # t2, t3, t0 without a salt, t0 with a1, t0 with a2
    assert snap.stored_tokens["isolation"] == iso
    assert set(got) >= {("t1", ""), (label(salts["t2"]), ""), ("", ""), ("", "a1"), ("", "a2")}
