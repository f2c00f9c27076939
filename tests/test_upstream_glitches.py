
"""One-poll glitches, two processes behind one URL, garbage gauges and absurd counters (issue 17,
items 3 and 4). Pages are CONSTRUCTED here (helpers.exposition) and go through the real parser,
normaliser and state; the real captures' restart behaviour stays covered by
test_state_reset_correction.py."""
from __future__ import annotations

import logging
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachemon import catalog as C
from cachemon.expose.collector import CachemonCollector
from cachemon.expose.render import render
from cachemon.normalise.normaliser import normalise_text, to_update
from cachemon.state.store import Store
from helpers import exposition, samples, value

Q, H = "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"
PROMPT = "vllm:prompt_tokens_total"
KV = "vllm:kv_cache_usage_perc"
LAB = {"engine": "0", "model_name": "m"}
QK = (C.QUERY_TOKENS.name, ("m", "0", "local"))
HK = (C.HIT_TOKENS.name, ("m", "0", "local"))
MK = (C.MISS_TOKENS.name, ("m", "0", "local"))
PST = 1_795_000_000.0


def new_state():
    store = Store({"1m": 60})
    return store, store.upstream("u")


def poll(state, t: float, q: float, h: float, pst: float | None = PST, extra=()):
    rows = [(Q, LAB, q), (H, LAB, h), *extra]
    return state.apply(to_update(normalise_text(exposition(rows, process_start=pst))), t)


def exported(store) -> dict:
    return samples(render([CachemonCollector(store)]).decode())


# -- item 3: one-poll glitches ------------------------------------------------------------

def test_queries_one_token_lower_for_one_poll_is_a_held_glitch_not_a_restart():
    store, s = new_state()
    q, h = 1_018_000.0, 916_200.0                     # a healthy 90 %
    for t in range(10):
        poll(s, 2.0 * t, q + 1000 * t, h + 900 * t)
    before = s.counters[QK].value
    assert poll(s, 20.0, q + 9000 - 1, h + 8100) is None      # one token lower, once
    assert s.counters[QK].value == before                    # held: never backwards, no phantom
    assert s.restarts == 0
    assert s.rejected["glitch"] == 1
    poll(s, 22.0, q + 10_000, h + 9000)                      # resumes with the true value
    assert s.counters[QK].value == q + 10_000
    hits, queries = s.windows[("m", "0", "local")].ratio(60)
    assert 0.89 < hits / queries <= 0.9


def test_hits_one_token_lower_for_one_poll_never_gives_a_ratio_above_one():
    store, s = new_state()
    for t in range(10):
        poll(s, 2.0 * t, 100_000.0 + 1000 * t, 90_000.0 + 900 * t)
    poll(s, 20.0, 110_000.0, 98_100.0 - 1)           # one token below the last reading
    poll(s, 22.0, 111_000.0, 100_000.0)
    assert s.restarts == 0
    hits, queries = s.windows[("m", "0", "local")].ratio(60)
    assert hits / queries <= 1.0
    assert s.counters[HK].value == 100_000


def test_hit_counter_lagging_one_scrape_adds_no_phantom_miss_tokens():
    """vLLM increments queries, then hits, in two statements (vllm/v1/metrics/loggers.py,
    PrometheusStatLogger.record, 0.32.0): a scrape between them sees the new queries with the old
    hits. Truth: 300 miss tokens."""
    store, s = new_state()
    poll(s, 0.0, 1000.0, 700.0)                      # miss 300
    poll(s, 2.0, 3300.0, 700.0)                      # queries of a 2300-token all-hit batch, hits not yet
    for smp in (s.counters[HK], s.counters[QK]):
        assert smp.value <= s.counters[QK].value
    poll(s, 4.0, 3300.0, 3000.0)                     # the hits land: miss is still 300
    poll(s, 6.0, 3300.0, 3000.0)
    assert s.restarts == 0
    assert s.counters[MK].value == 300
    assert s.counters[QK].value == 3300 and s.counters[HK].value == 3000


def test_hits_above_queries_on_a_page_are_never_exported_above_queries():
    """The page renders queries before hits; an increment between the two reads shows hits ahead."""
    store, s = new_state()
    poll(s, 0.0, 1000.0, 950.0)
    poll(s, 2.0, 1000.0, 1040.0)                     # hits read after a batch, queries before it
    assert s.counters[HK].value <= s.counters[QK].value
    assert s.windows[("m", "0", "local")].ratio(60) is None       # no query growth: no ratio, never 9000 %
    poll(s, 4.0, 1100.0, 1040.0)
    assert s.counters[HK].value == 1040 and s.counters[QK].value == 1100
    hits, queries = s.windows[("m", "0", "local")].ratio(60)
    assert (hits, queries) == (90, 100)


def test_a_real_restart_is_still_a_restart():
    store, s = new_state()
    poll(s, 0.0, 50_000.0, 40_000.0)
    reason = poll(s, 2.0, 120.0, 0.0)                 # same pst (no process collector change), near 0
    assert reason and s.restarts == 1
    assert s.counters[QK].value == 50_120
    reason = poll(s, 4.0, 10.0, 0.0, pst=PST + 500)   # new process, counters near 0
    assert reason and "process_start_time" in reason and s.restarts == 2
    assert s.counters[QK].value == 50_130


def test_new_process_with_counters_past_the_old_ones_is_confirmed_on_its_second_page():
    store, s = new_state()
    poll(s, 0.0, 1000.0, 0.0)
    assert poll(s, 2.0, 1500.0, 0.0, pst=PST + 99) is None     # held: a restart or a second process?
    assert s.counters[QK].value == 1000
    reason = poll(s, 4.0, 1600.0, 0.0, pst=PST + 99)
    assert reason and s.restarts == 1
    assert s.counters[QK].value == 1000 + 1600


def test_two_replicas_behind_one_url_are_detected_and_only_the_first_is_exported(caplog):
    store, s = new_state()
    a, b = 11_000_000.0, 9_500_000.0
    with caplog.at_level(logging.WARNING, logger="cachemon.state"):
        for i in range(20):
            if i % 2 == 0:
                poll(s, 2.0 * i, a + 2000 * i, 0.9 * (a + 2000 * i), pst=PST)
            else:
                poll(s, 2.0 * i, b + 2000 * i, 0.9 * (b + 2000 * i), pst=PST + 3600)
    assert s.counters[QK].value == a + 2000 * 18            # the first process's series only
    assert s.restarts == 0
    assert s.multiple_processes
    assert s.rejected["other_process"] >= 9
    assert sum("two processes" in r.getMessage() for r in caplog.records) == 1
    got = exported(store)
    assert value(got, C.MULTIPLE_PROCESSES.sample_name, upstream="u") == 1
    assert value(got, C.REJECTED_SAMPLES.sample_name, upstream="u", reason="other_process") >= 9


def test_an_older_process_start_time_is_never_a_restart():
    store, s = new_state()
    poll(s, 0.0, 5000.0, 0.0)
    assert poll(s, 2.0, 9000.0, 0.0, pst=PST - 60) is None
    assert s.counters[QK].value == 5000 and s.restarts == 0 and s.multiple_processes


@st.composite
def glitched(draw):
    """True counter values, and what the upstream shows: one-poll glitches of either sign
    (isolated, at most 1 % of the value and at most G)."""
    n = draw(st.integers(3, 40))
    truth = [draw(st.integers(10_000, 1_000_000))]
    for _ in range(n - 1):
        truth.append(truth[-1] + draw(st.integers(0, 50_000)))
    shown = list(truth)
    for i in range(1, n - 1):
        if draw(st.integers(0, 3)) == 0 and shown[i - 1] == truth[i - 1]:
            g = draw(st.integers(1, min(G, truth[i] // 100)))
            shown[i] = truth[i] + (g if draw(st.booleans()) else -g)
    return truth, shown


G = 5000


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(glitched())
def test_property_exported_counter_never_decreases_and_ends_within_the_glitch_bound(history):
    truth, shown = history
    store, s = new_state()
    last = -1.0
    for i, v in enumerate(shown):
        poll(s, 2.0 * i, float(v), 0.0)
        got = s.counters[QK].value
        assert got >= last
        assert truth[i] - (truth[i] - truth[i - 1] if i else 0) <= got <= truth[i] + G
        last = got
    assert s.restarts == 0
    assert truth[-1] <= s.counters[QK].value <= truth[-1] + G


# -- item 4: garbage gauges and absurd counters ---------------------------------------------

def test_out_of_range_and_non_finite_gauges_are_refused_and_counted():
    store, s = new_state()
    for t, bad in enumerate([float("inf"), 7.5, -3.0, float("nan")]):
        poll(s, 2.0 * t, 1000.0 + t, 0.0, extra=[(KV, LAB, bad)])
        assert (C.KV_CACHE_USAGE.name, ("m", "0")) not in s.gauges, bad
    poll(s, 10.0, 2000.0, 0.0, extra=[(KV, LAB, 0.97)])
    assert s.gauges[(C.KV_CACHE_USAGE.name, ("m", "0"))] == 0.97
    assert s.rejected["out_of_range"] == 2
    assert s.rejected["infinite"] == 1 and s.rejected["nan"] == 1
    running = "vllm:num_requests_running"
    poll(s, 12.0, 2000.0, 0.0, extra=[(running, LAB, -1.0)])
    assert (C.REQUESTS_RUNNING.name, ("m", "0")) not in s.gauges


def test_absurd_counter_jump_is_refused_and_later_increments_still_counted():
    store, s = new_state()
    poll(s, 0.0, 1000.0, 0.0)
    poll(s, 2.0, 1e300, 0.0)
    assert s.counters[QK].value == 1000
    poll(s, 4.0, 1100.0, 0.0)
    poll(s, 6.0, 1250.0, 0.0)
    assert s.counters[QK].value == 1250
    assert s.restarts == 0
    assert s.rejected["implausible_value"] == 1
    # below 2**53 but faster than any server can count: refused as a jump
    poll(s, 8.0, 1250.0 + 1e14, 0.0)
    poll(s, 10.0, 1300.0, 0.0)
    assert s.counters[QK].value == 1300
    assert s.rejected["implausible_jump"] == 1
    assert not math.isinf(s.windows[("m", "0", "local")].ratio(60)[1])


def test_a_bad_block_size_label_is_refused_not_a_crash():
    page = exposition([("vllm:cache_config_info", {"engine": "0", "block_size": "inf", "num_gpu_blocks": "-4"}, 1.0),
                       (Q, LAB, 10.0), (H, LAB, 5.0)])
    n = normalise_text(page)
    upd = to_update(n)
    assert (C.BLOCK_SIZE.name, ("m", "0")) not in upd.gauges
    assert (C.KV_CACHE_CAPACITY.name, ("m", "0")) not in upd.gauges


def test_when_only_the_other_process_answers_it_is_followed_after_a_few_polls():
    """The exported process is gone for good behind the load balancer (or the host's clock stepped
    back across a restart): cachemon must not freeze."""
    store, s = new_state()
    poll(s, 0.0, 5000.0, 0.0)
    for i in range(1, 5):
        assert poll(s, 2.0 * i, 100.0 + i, 0.0, pst=PST - 60) is None
    assert s.counters[QK].value == 5000
    reason = poll(s, 10.0, 105.0, 0.0, pst=PST - 60)
    assert reason and s.restarts == 1
    poll(s, 12.0, 200.0, 0.0, pst=PST - 60)
    assert s.counters[QK].value == 5000 + 200
