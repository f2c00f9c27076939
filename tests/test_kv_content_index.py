"""The isolation index (state/kv_records.ContentIndex) against a plain multiset, on CONSTRUCTED data:
random 60-bit ids (and repeats of them) held and released in random order, and a constructed stream of
salted and unsalted chains on two replicas with evictions, a reset and a restart, after each of which
the index must hold exactly the token content ids the replicas' ledgers hold as cached."""
from __future__ import annotations

import random
from collections import Counter

from cachemon.normalise.kv_events import Cleared, KvBatch, Removed, Stored
from cachemon.state import kv_records as K
from cachemon.state.kv_ledger import FleetLedger
from cachemon.state.kv_tenants import TenantLabels

BS = 4


def contents(idx: K.ContentIndex) -> Counter[int]:
    """What the index holds, checking its layout: each bucket holding only the ids whose low bits name it."""
    out: Counter[int] = Counter()
    for k, a in enumerate(idx.buckets):
        assert all(u & idx.mask == k for u in a)
        out.update(a)
    assert len(idx) == sum(out.values()) and Counter(idx.ids()) == out
    return out


def test_hold_and_release_equal_a_multiset_across_bucket_splits():
    rng = random.Random(25)
    idx = K.ContentIndex()
    ref: Counter[int] = Counter()
    pool = [rng.getrandbits(60) for _ in range(3000)] + [0, (1 << 60) - 1]
    for step in range(20_000):
        if ref and rng.random() < 0.45:
            u = rng.choice(list(ref))
            idx.release_all([u])
            ref[u] -= 1
            if not ref[u]:
                del ref[u]
        else:
            u = rng.choice(pool)
            idx.hold_all([u])
            ref[u] += 1
        if step % 2500 == 0:
            assert contents(idx) == ref
    assert len(idx.buckets) > 16                      # it split on the way
    assert contents(idx) == ref
    for u in pool[:200] + [0, (1 << 60) - 1]:
        assert idx.copies(u) == ref[u]
    idx.release_all([rng.getrandbits(60) for _ in range(50)])      # ids never held: nothing changes
    assert contents(idx) == ref


def _chain(rng: random.Random, prefix: list[int], depth: int) -> list[int]:
    return prefix + [rng.randrange(50) for _ in range(depth - len(prefix))]


def test_the_ledger_keeps_the_index_equal_to_what_its_replicas_cache():
    f = FleetLedger(tenants=TenantLabels({}, b"constructed-key", 20), max_blocks=400)
    rng = random.Random(7)
    shared = [1, 2, 3]
    seq = {"a": 0, "b": 0}
    cached: dict[str, list[int]] = {"a": [], "b": []}        # vLLM hashes in store order (LRU: oldest first)
    t = 1000.0

    def send(rep: str, *evs) -> None:
        nonlocal t
        t += 1.0
        f.on_batch(rep, "m", KvBatch(seq[rep], t, list(evs)), t)
        seq[rep] += 1

    def check() -> None:
        led_a, led_b = f.replica("a"), f.replica("b")
        assert led_a is not None and led_b is not None and led_a.iso is not None and led_a.iso is led_b.iso
        want = Counter(led_a.cached_token_contents()) + Counter(led_b.cached_token_contents())
        assert contents(led_a.iso) == want

    for i in range(600):
        rep = "a" if i % 3 else "b"
        salt = rng.choice([None, "salt-x", "salt-y", "salt-z"])
        toks = _chain(rng, shared if rng.random() < 0.5 else [], rng.randint(4, 9))
        hs = [hash((rep, seq[rep], i, k)) & ((1 << 63) - 1) for k in range(len(toks))]
        evs: list = []
        while len(cached[rep]) + len(hs) > 300:
            evs.append(Removed((cached[rep].pop(0),), "GPU"))
        extra = ((salt,) if salt else None,) + (None,) * (len(hs) - 1)
        evs.append(Stored(tuple(hs), None, tuple(t0 * 10 + j for t0 in toks for j in range(BS)), BS, None, "GPU",
                          extra))
        send(rep, *evs)
        cached[rep] += hs
        if i % 97 == 96:
            check()
        if i == 300:
            send("a", Cleared())
            cached["a"] = []
            check()
        if i == 450:
            f.on_restart("b", t)
            seq["b"], cached["b"] = 0, []
            check()
    check()
    snap = {s.replica: s.stored_tokens for s in f.snapshot()}
    assert snap["a"]["isolation"] > 0 and snap["b"]["isolation"] > 0      # the stream does exercise the index
