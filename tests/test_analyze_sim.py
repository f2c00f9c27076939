"""The simulator's rules, one at a time, on constructed token lists (labelled: these
are made-up ids, the real-data checks are in test_analyze_exact.py)."""
from __future__ import annotations

import random
from array import array

from hypothesis import given, settings
from hypothesis import strategies as st

from assert_support import nonempty
from cachemon.analyze.sim.block_hash import block_hashes, extra_key
from cachemon.analyze.sim.prefix import PrefixCacheSim
from literal_prefix_sim import LiteralPrefixCacheSim


def seq(start, n):
    return list(range(start, start + n))


def test_only_full_blocks_are_cached():
    sim = PrefixCacheSim(block_size=4)
    assert sim.run(seq(0, 7)) == 0          # 1 full block cached (tokens 0-3), tail of 3 not
    assert sim.run(seq(0, 7) + [99]) == 4   # second block 4-6 + 99 was never full before


def test_at_most_prompt_minus_one():
    sim = PrefixCacheSim(block_size=4)
    sim.run(seq(0, 8))
    # identical 8-token prompt: both blocks cached, but at most 7 tokens may hit -> 1 block
    assert sim.run(seq(0, 8)) == 4
    assert sim.run(seq(0, 9)) == 8          # 9 tokens: 8 may hit -> both blocks


def test_chain_breaks_after_first_difference():
    sim = PrefixCacheSim(block_size=4)
    sim.run(seq(0, 16))
    changed = seq(0, 16)
    changed[5] = 999                         # block 1 differs; blocks 2, 3 equal but chained
    assert sim.run(changed + [1]) == 4


def test_cache_salt_and_lora_separate_caches():
    sim = PrefixCacheSim(block_size=4)
    sim.run(seq(0, 12), extra_key(cache_salt="tenant-a"))
    assert sim.run(seq(0, 12), extra_key(cache_salt="tenant-b")) == 0
    assert sim.run(seq(0, 12), extra_key(cache_salt="tenant-a")) == 8
    assert sim.run(seq(0, 12)) == 0
    assert sim.run(seq(0, 12), extra_key(lora="adapter-1")) == 0
    assert sim.run(seq(0, 12), extra_key(lora="adapter-1")) == 8


def test_lru_evicts_least_recent_and_tails_first():
    # 5 blocks incl. vLLM's null block -> 4 usable. Constructed prompts of 2 full blocks + 1 token.
    sim = PrefixCacheSim(block_size=4, cache_blocks=5)
    a, b = seq(0, 9), seq(100, 9)
    assert sim.run(a) == 0                   # uses 3 blocks: a0 a1 + partial
    assert sim.run(b) == 0                   # needs 3: 1 never used + 2 popped from the LRU front.
    # Free order after A was reversed (partial, a1, a0), so the partial and a1 went first:
    # a0 survives, a1 does not.
    assert sim.run(a) == 4
    # That A evicted B's tail: b1, then the partial block; b0 survives
    assert sim.run(b) == 4


def test_lru_touch_protects_hit_blocks():
    sim = PrefixCacheSim(block_size=4, cache_blocks=4)     # 3 usable
    a = seq(0, 8) + [7]                      # 2 full blocks + 1
    sim.run(a)
    assert sim.run(a) == 8                   # hits both; only 1 new block needed


def test_duplicate_blocks_are_kept_like_vllm():
    # A prompt of exactly 2 blocks, repeated: block 1 cannot hit (prompt-1 cap), so it is
    # recomputed into a second physical block with the same hash (vLLM does not de-duplicate).
    h1 = block_hashes(seq(0, 8), 4)[1]
    literal = LiteralPrefixCacheSim(block_size=4, cache_blocks=6)     # 5 usable
    fast = PrefixCacheSim(block_size=4, cache_blocks=6)
    for sim in (literal, fast):
        sim.run(seq(0, 8))
        assert sim.run(seq(0, 8)) == 4
    assert len(literal._cached[h1]) == 2
    assert len(fast._dups[h1]) == 1            # a second copy, in the second request's run


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 40)), min_size=1, max_size=40), st.integers(1, 8))
def test_unlimited_equals_huge_lru_pool(reqs, bs):
    # Constructed random streams: a few shared prefixes with random suffixes. The binary
    # search of the unlimited cache must agree with the linear walk of the LRU pool when
    # nothing is ever evicted.
    rng = random.Random(len(reqs) * 31 + bs)
    prefixes = [[rng.randrange(50) for _ in range(30)] for _ in range(4)]
    unlimited, lru = PrefixCacheSim(bs), PrefixCacheSim(bs, cache_blocks=10_000)
    for p, n in nonempty(reqs):
        ids = prefixes[p][:n % 31] + [rng.randrange(50) for _ in range(n // 3)]
        assert unlimited.run(ids) == lru.run(ids)


def test_block_hashes_are_chained_and_full_only():
    assert block_hashes(seq(0, 3), 4) == []
    h = block_hashes(seq(0, 8), 4)
    assert len(h) == 2
    assert block_hashes(seq(0, 8), 4, extra_key(cache_salt="s"))[1] != h[1]
    other = seq(0, 8)
    other[0] = 42
    assert block_hashes(other, 4)[1] != h[1]   # block 1 equal, parent differs


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 60), st.integers(0, 1)), min_size=1, max_size=30),
       st.integers(1, 8))
def test_memoised_hasher_equals_plain_hashes(reqs, bs):
    # Constructed streams with shared prefixes of every length, with and without a salt.
    from cachemon.analyze.sim.block_hash import BlockHasher
    rng = random.Random(bs)
    prefixes = [[rng.randrange(20) for _ in range(60)] for _ in range(3)]
    hasher = BlockHasher(bs, memo=2)
    for p, n, salted in nonempty(reqs):
        ids = prefixes[p][:n] + [rng.randrange(20) for _ in range(rng.randrange(10))]
        extra = extra_key(cache_salt="s") if salted else None
        assert hasher(ids, extra) == block_hashes(ids, bs, extra)


def test_memoised_hasher_is_not_fooled_by_a_reused_list():
    # The memo compares later requests with the remembered one: a caller that refills
    # the same list object must not make the memo see the new tokens as the old ones.
    from cachemon.analyze.sim.block_hash import BlockHasher
    hasher = BlockHasher(4)
    buf = list(range(40))
    first = hasher(buf)
    buf[20:] = range(100, 120)
    assert hasher(buf) == block_hashes(buf, 4) != first
    assert hasher(bytes(array("I", buf))) == block_hashes(buf, 4)
