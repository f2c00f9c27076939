"""The isolation index (state/ledger/index.py), both implementations, against a plain multiset, on CONSTRUCTED
data: random 60-bit ids (and repeats of them) held and released in random order, and a constructed stream of
salted and unsalted chains on two replicas with evictions, a reset and a restart, after each of which the
index must hold exactly the token content ids the replicas' ledgers hold as cached.

The compiled one (native/, cachemon-native) is tested where it is installed; with CACHEMON_REQUIRE_NATIVE=1
(.ci/run sets it) its absence fails."""
from __future__ import annotations

import importlib
import os
import random
from collections import Counter

import pytest

from cachemon.normalise.kv_batch import Cleared, KvBatch, Removed, Stored
from cachemon.state.ledger import index as I
from cachemon.state.ledger.fleet import FleetLedger
from cachemon.state.ledger.tenants import TenantLabels

BS = 4


def _compiled_or_skip() -> type:
    try:
        return importlib.import_module("cachemon_native").IdMultiset  # type: ignore[no-any-return]
    except ImportError:
        if os.environ.get("CACHEMON_REQUIRE_NATIVE"):
            pytest.fail("cachemon-native is not installed (pip install --no-build-isolation ./native)")
        pytest.skip("cachemon-native is not installed")


@pytest.fixture(params=["pure-python", "compiled"])
def kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test with each implementation as the one ``new_index`` makes."""
    if request.param == "compiled":
        _compiled_or_skip()
        monkeypatch.delenv(I.PURE_ENV, raising=False)
    else:
        monkeypatch.setenv(I.PURE_ENV, "1")
    assert I.implementation() == request.param
    return str(request.param)


def contents(idx: I.ContentIndex) -> Counter[int]:
    """What the index holds (the pure one's layout checked too: each bucket holding only the ids whose low
    bits name it)."""
    out = Counter(idx.ids())
    if isinstance(idx, I.BucketIndex):
        for k, a in enumerate(idx.buckets):
            assert all(u & idx.mask == k for u in a)
    assert len(idx) == sum(out.values())
    return out


def test_add_and_discard_equal_a_multiset(kind: str) -> None:
    rng = random.Random(25)
    idx = I.new_index()
    ref: Counter[int] = Counter()
    pool = [rng.getrandbits(60) for _ in range(3000)] + [0, (1 << 60) - 1]
    for step in range(20_000):
        if ref and rng.random() < 0.45:
            u = rng.choice(list(ref))
            assert idx.discard(u)
            ref[u] -= 1
            if not ref[u]:
                del ref[u]
        else:
            u = rng.choice(pool)
            idx.add(u)
            ref[u] += 1
        if step % 2500 == 0:
            assert contents(idx) == ref
    if isinstance(idx, I.BucketIndex):
        assert len(idx.buckets) > 16                  # it split on the way
    assert contents(idx) == ref
    for u in pool[:200] + [0, (1 << 60) - 1]:
        assert idx.count(u) == ref[u]
        assert (u in idx) == (ref[u] > 0)
    never = [rng.getrandbits(60) for _ in range(50)]
    assert I.release_all(idx, never) == len([u for u in never if not ref[u]])   # ids never held: counted, kept
    assert contents(idx) == ref
    I.release_all(idx, list(ref.elements()))
    assert len(idx) == 0 and idx.ids() == [] and pool[0] not in idx


def test_the_compiled_index_refuses_what_it_cannot_hold() -> None:
    kind = _compiled_or_skip()
    idx = kind()
    for bad, error in (((1 << 62), ValueError), (-1, OverflowError), ("x", TypeError), (None, TypeError)):
        with pytest.raises(error):
            idx.add(bad)
        with pytest.raises(error):
            _ = bad in idx
    with pytest.raises(TypeError):
        kind(16)
    assert len(idx) == 0


def _chain(rng: random.Random, prefix: list[int], depth: int) -> list[int]:
    return prefix + [rng.randrange(50) for _ in range(depth - len(prefix))]


def test_the_ledger_keeps_the_index_equal_to_what_its_replicas_cache(kind: str) -> None:
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


def test_an_id_the_index_lost_is_counted_never_silent(kind: str) -> None:
    """CONSTRUCTED: two salts' chains of equal tokens (the second one's blocks are isolation), then an id
    taken out of the index behind the ledger's back: the eviction of its block finds it missing and counts
    it (cachemon_kv_ledger_anomalies_total{kind="index_misses"})."""
    f = FleetLedger(tenants=TenantLabels({}, b"constructed-key", 20))
    toks = tuple(range(3 * BS))
    t = 1000.0
    for seq, (salt, base) in enumerate((("salt-x", 100), ("salt-y", 200))):
        t += 1.0
        f.on_batch("a", "m", KvBatch(seq, t, [Stored((base, base + 1, base + 2), None, toks, BS, None, "GPU",
                                                        ((salt,), None, None))]), t)
    led = f.replica("a")
    assert led is not None and led.iso is not None and len(led.iso) == 6
    assert led.stored_tokens()["isolation"] == 3 * BS
    uid = led.iso.ids()[0]
    assert led.iso.discard(uid) and led.anomalies["index_misses"] == 0
    held = len(led.iso)
    f.on_batch("a", "m", KvBatch(2, t + 1, [Removed((h,), "GPU") for h in (102, 101, 100, 202, 201, 200)]), t + 1)
    assert led.anomalies["index_misses"] == 1 and len(led.iso) == held - 5 == 0
