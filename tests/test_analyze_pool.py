"""The fast finite pool (runs of blocks) equals the literal block-by-block pool, on
seeded random streams built to hit the hard cases: prompts at exact block multiples
(a block recomputed while its copy is cached), generated blocks, tiny pools (eviction
every request, requests that do not fit), and resets."""
from __future__ import annotations

import random

import pytest

from cachemon.analyze.sim.prefix import PrefixCacheSim
from literal_prefix_sim import LiteralPrefixCacheSim


def stream(seed: int, bs: int):
    rng = random.Random(seed)
    heads = [[rng.randrange(50) for _ in range(rng.randrange(1, 6) * bs)] for _ in range(8)]
    for _ in range(400):
        r = rng.random()
        if r < 0.02:
            yield None                                   # a reset
            continue
        ids = rng.choice(heads)[: rng.randrange(1, 6) * bs]
        if r < 0.6:
            ids = ids + [rng.randrange(50) for _ in range(rng.randrange(0, 2 * bs))]
        out_ids = [rng.randrange(50) for _ in range(rng.randrange(1, 3 * bs))] if r > 0.7 else None
        yield ids, (len(out_ids) if out_ids else rng.choice([1, 1, 2, bs, 2 * bs + 1])), out_ids


@pytest.mark.parametrize("uncached_first", [True, False], ids=["uncached-first", "append-all"])
@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("pool", [3, 5, 8, 13, 30])
def test_fast_pool_equals_literal_pool(seed, pool, uncached_first):
    """Both free-queue orders (normalise/eras.FREE_ORDERS): uncached blocks reused first (0.24.0 on) or
    appended with the rest (before)."""
    bs = 4
    fast = PrefixCacheSim(bs, pool, uncached_first=uncached_first)
    literal = LiteralPrefixCacheSim(bs, pool, uncached_first=uncached_first)
    for item in stream(seed, bs):
        if item is None:
            fast.reset()
            literal.reset()
            continue
        ids, out, out_ids = item
        assert fast.run(ids, None, None, out, out_ids) == literal.run(ids, None, None, out, out_ids)
    assert (fast.cached_tokens, fast.oversized) == (literal.cached_tokens, literal.oversized)
    assert fast.cached_tokens > 0


@pytest.mark.parametrize("seed", range(6))
def test_the_two_free_orders_differ_on_a_tight_pool(seed):
    """The order is not a no-op: on a pool that evicts every few requests the two orders hit differently
    (each checked against the literal pool above)."""
    bs, pool = 4, 8
    sims = [PrefixCacheSim(bs, pool, uncached_first=u) for u in (True, False)]
    for item in stream(seed, bs):
        for sim in sims:
            if item is None:
                sim.reset()
            else:
                sim.run(item[0], None, None, item[1], item[2])
    assert sims[0].cached_tokens != sims[1].cached_tokens
