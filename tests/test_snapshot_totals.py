"""What one poll says about one model (judge/model_totals.ModelTotals): the builder's typed totals.

Constructed counters (store keys: metric, (model, engine, cache | le)); the real pages reach the same
code through tests/test_attribution.py and tests/test_check_command.py."""
from __future__ import annotations

import math

from cachemon import catalog as C
from cachemon.judge.model_totals import ModelTotals, delta, model_totals, prompt_buckets

Q, H, PRE, EV, PLEN = (C.QUERY_TOKENS.name, C.HIT_TOKENS.name, C.PREEMPTIONS.name, C.KV_EVICTED_BLOCKS.name,
                       C.PROMPT_LENGTH_REQUESTS.name)


def test_totals_sum_engines_and_keep_only_the_local_cache():
    counters = [((Q, ("m", "0", "local")), 100.0), ((Q, ("m", "1", "local")), 50.0),
                ((Q, ("m", "0", "connector")), 999.0), ((H, ("m", "0", "local")), 40.0),
                ((PRE, ("m", "0")), 2.0), ((EV, ("m", "1")), 7.0),
                ((PLEN, ("m", "0", "128.0")), 3.0), ((PLEN, ("m", "1", "128.0")), 1.0),
                ((PLEN, ("m", "0", "+Inf")), 5.0), ((PLEN, ("m", "1", "+Inf")), 2.0)]
    [(model, t)] = model_totals(counters).items()
    assert model == "m"
    assert (t.query, t.hit, t.preemptions, t.evicted) == (150.0, 40.0, 2.0, 7.0)
    assert dict(t.prompt_buckets) == {128.0: 4.0, math.inf: 7.0}
    assert t.requests() == 7.0


def test_a_missing_series_is_none_and_its_delta_too():
    """A model seen only through other per-model counters is present, with no totals: its deltas are
    None (no such series), not 0."""
    t = model_totals([((Q, ("m", "0", "connector")), 9.0), ((PLEN, ("m", "0", "not-a-number")), 1.0)])["m"]
    assert t == ModelTotals()
    assert t.requests() is None
    assert delta(t, ModelTotals(query=5.0), "query") is None
    assert delta(ModelTotals(query=8.0), None, "query") is None               # no base
    assert delta(ModelTotals(query=8.0), ModelTotals(), "query") == 8.0       # a base without it: from 0


def test_prompt_buckets_are_the_interval_sorted_with_inf_last():
    old = ModelTotals(prompt_buckets={128.0: 1.0, math.inf: 2.0})
    new = ModelTotals(prompt_buckets={math.inf: 9.0, 512.0: 3.0, 128.0: 4.0})
    assert prompt_buckets(new, old) == ((128.0, 3.0), (512.0, 3.0), (math.inf, 7.0))
    assert prompt_buckets(new, None) == ((128.0, 4.0), (512.0, 3.0), (math.inf, 9.0))
