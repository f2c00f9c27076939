"""The fast finite pool (runs of blocks) equals the literal block-by-block pool, on
seeded random streams built to hit the hard cases: prompts at exact block multiples
(a block recomputed while its copy is cached), generated blocks, tiny pools (eviction
every request, requests that do not fit), and resets."""
from __future__ import annotations

import random

import pytest

from cachemon.diagnostics.prefix_sim import PrefixCacheSim
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


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("pool", [3, 5, 8, 13, 30])
def test_fast_pool_equals_literal_pool(seed, pool):
    bs = 4
    fast, literal = PrefixCacheSim(bs, pool), LiteralPrefixCacheSim(bs, pool)
    for item in stream(seed, bs):
        if item is None:
            fast.reset()
            literal.reset()
            continue
        ids, out, out_ids = item
        assert fast.run(ids, None, None, out, out_ids) == literal.run(ids, None, None, out, out_ids)
    assert (fast.cached_tokens, fast.oversized) == (literal.cached_tokens, literal.oversized)
    assert fast.cached_tokens > 0
