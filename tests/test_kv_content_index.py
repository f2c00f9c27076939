"""The fleet indexes (state/ledger/index.py: routing, isolation), both implementations, against a multiset, on CONSTRUCTED
data: random 60-bit ids (and repeats of them) held and released in random order, and a constructed stream of
salted and unsalted chains on two replicas with evictions, a reset and a restart, after each of which the
indexes must hold exactly the content ids and token content ids the replicas' ledgers hold as cached.

The compiled one (native/, cachemon-native) is tested where it is installed; with CACHEMON_REQUIRE_NATIVE=1
(.ci/run sets it) its absence fails."""
from __future__ import annotations

import importlib
import os
import random
import tracemalloc
from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

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


def contents(idx: I.FleetIndex) -> Counter[int]:
    """What the index holds (the pure one's layout checked too: each id in the bucket its low bits name, no
    bucket past DEDUPE_AT, an id with copies counted aside also in its bucket)."""
    out = Counter(idx.ids())
    if isinstance(idx, I.BucketIndex):
        for a in idx.buckets:
            assert all(idx.buckets[u & idx.mask] is a for u in a) and len(a) <= I.DEDUPE_AT
        assert all(u in idx for u in idx.more) and min(idx.more.values(), default=1) >= 1
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


def test_each_index_refuses_what_is_outside_its_domain_alike(kind: str) -> None:
    """The domain (index.FleetIndex): ints 0 <= id < 2**62. Outside it: TypeError or ValueError from add,
    discard and count, nothing changed, and ``in`` False, in both implementations."""
    idx = I.new_index()
    idx.add(5)
    for bad, error in (((1 << 62), ValueError), (-1, ValueError), (1 << 64, ValueError), (-(1 << 70), ValueError),
                       ("x", TypeError), (None, TypeError), (1.0, TypeError)):
        for call in (idx.add, idx.discard, idx.count):
            with pytest.raises(error):
                call(bad)
        assert bad not in idx
    assert contents(idx) == Counter({5: 1}) and True not in idx
    idx.add(True)                                # a bool is an int
    assert idx.count(1) == 1 and 1 in idx


def test_the_compiled_index_takes_no_arguments() -> None:
    with pytest.raises(TypeError):
        _compiled_or_skip()(16)


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
        assert led_a is not None and led_b is not None
        # one index of each kind per model, shared by its replicas
        assert led_a.isolation_index is not None and led_a.isolation_index is led_b.isolation_index
        assert led_a.routing is not None and led_a.routing is led_b.routing
        want = Counter(led_a.cached_token_contents()) + Counter(led_b.cached_token_contents())
        assert contents(led_a.isolation_index) == want
        assert contents(led_a.routing) == Counter(led_a.cached_contents()) + Counter(led_b.cached_contents())

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
    assert snap["a"]["routing"] > 0 and snap["b"]["routing"] > 0          # and the routing one
    assert {s.replica: dict(s.anomalies)["index_misses"] for s in f.snapshot()} == {"a": 0, "b": 0}


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
    assert led is not None and led.isolation_index is not None and len(led.isolation_index) == 6
    assert led.stored_tokens()["isolation"] == 3 * BS
    uid = led.isolation_index.ids()[0]
    assert led.isolation_index.discard(uid) and led.anomalies["index_misses"] == 0
    held = len(led.isolation_index)
    f.on_batch("a", "m", KvBatch(2, t + 1, [Removed((h,), "GPU") for h in (102, 101, 100, 202, 201, 200)]), t + 1)
    assert led.anomalies["index_misses"] == 1 and len(led.isolation_index) == held - 5 == 0


def test_copies_of_one_id_cost_one_entry(kind: str) -> None:
    """Issue 38 item 1: N tenants sharing one system prompt are N copies of its blocks' ids. The index holds
    a count per id, not an entry per copy (the first compiled index kept a slot per copy and probed past
    each: 200 000 copies took 48 s, one add 20 s). CONSTRUCTED: 60 000 copies of one id take the memory of
    a few (traced by tracemalloc: the compiled table and the pure arrays are both allocated through it)."""
    uid = 0x0123456789ABCDEF
    idx = I.new_index()
    for u in (uid, 7, 1 << 40):
        idx.add(u)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(60_000):
            idx.add(uid)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 2048, grown                  # a slot a copy would be 480 000 bytes or more
    assert idx.count(uid) == 60_001 and len(idx) == 60_003 and uid in idx
    for _ in range(60_000):
        assert idx.discard(uid)
    assert contents(idx) == Counter({uid: 1, 7: 1, 1 << 40: 1})
    assert idx.discard(uid) and not idx.discard(uid) and uid not in idx


def test_the_compiled_index_grows_a_bounded_step_at_a_time() -> None:
    """Issue 38 item 1: the first compiled index rebuilt its whole table inside one add, holding the GIL
    (200 000 copies: one add of 20 s). Now a larger table is allocated and each later add or discard moves
    at most 16 slots of the old one into it; the move ends before the new table needs to grow.
    CONSTRUCTED: 300 000 distinct ids (random, and consecutive) added and then discarded, the layout
    (``_layout()``: slots, old table's slots, ids still in it, ids counted in the big dict) read after each."""
    kind = _compiled_or_skip()
    rng = random.Random(38)
    for ids in ([rng.getrandbits(62) for _ in range(150_000)], list(range(150_000))):
        idx = kind()
        growths, pending = 0, 0
        for n, u in enumerate(ids, 1):
            idx.add(u)
            slots, old, left, big = idx._layout()
            if old:
                assert pending - 16 <= left <= max(pending, old * 3 // 4)   # at most 16 slots moved a call
                growths += pending == 0
            assert left <= pending or pending == 0
            assert n * 4 <= slots * 3 and big == 0       # never above 3/4 load
            pending = left
        assert growths >= 10 and len(idx) == len(ids)
        for u in ids:
            assert idx.discard(u)
        assert len(idx) == 0 and idx.ids() == [] and idx._layout()[1:] == (0, 0, 0)


class _Agreement(RuleBasedStateMachine):
    """The pure and the compiled index and a Counter, given the same calls (Hypothesis): every answer equal,
    errors included. Ids from a small pool (so copies pile up past the compiled count byte's 254) and
    the domain's edges, plus values outside it."""

    def __init__(self) -> None:
        super().__init__()
        self.pure = I.BucketIndex()
        self.compiled = _compiled_or_skip()()
        self.ref: Counter[int] = Counter()

    ids = st.one_of(st.sampled_from([0, 1, 2, 17, (1 << 62) - 1, (1 << 60) - 1, 0xDEADBEEF]),
                    st.integers(0, (1 << 62) - 1))
    outside = st.one_of(st.integers(max_value=-1), st.integers(min_value=1 << 62), st.text(max_size=2),
                        st.none(), st.floats(allow_nan=False))

    def _same(self, call: str, arg: object) -> object:
        out = []
        for idx in (self.pure, self.compiled):
            try:
                out.append(getattr(idx, call)(arg))
            except (TypeError, ValueError) as e:
                out.append(type(e))
        assert out[0] == out[1], (call, arg, out)
        return out[0]

    @rule(uid=ids, times=st.integers(1, 300))
    def add(self, uid: int, times: int) -> None:
        for _ in range(times):
            assert self._same("add", uid) is None
        self.ref[uid] += times

    @rule(uid=ids, times=st.integers(1, 300))
    def discard(self, uid: int, times: int) -> None:
        for _ in range(times):
            held = self.ref[uid] > 0
            assert self._same("discard", uid) is held
            if held:
                self.ref[uid] -= 1

    @rule(uid=ids)
    def count(self, uid: int) -> None:
        assert self._same("count", uid) == self.ref[uid]
        assert (uid in self.pure) == (uid in self.compiled) == (self.ref[uid] > 0)

    @rule(bad=outside, call=st.sampled_from(["add", "discard", "count"]))
    def refuse(self, bad: object, call: str) -> None:
        assert self._same(call, bad) in (TypeError, ValueError)
        assert bad not in self.pure and bad not in self.compiled

    @rule(n=st.integers(1, 2000), seed=st.integers(0, 1 << 30))
    def many(self, n: int, seed: int) -> None:
        """Enough distinct ids for both to grow (the compiled one mid-move when the next rule runs)."""
        rng = random.Random(seed)
        for _ in range(n):
            u = rng.getrandbits(62)
            self.pure.add(u)
            self.compiled.add(u)
            self.ref[u] += 1

    @invariant()
    def equal(self) -> None:
        assert len(self.pure) == len(self.compiled) == self.ref.total()
        assert sorted(self.pure.ids()) == sorted(self.compiled.ids()) == sorted(self.ref.elements())


_Agreement.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
test_pure_and_compiled_agree = _Agreement.TestCase
