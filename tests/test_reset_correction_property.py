
"""Property: for any sequence of pages where each source series is monotone except for declared
resets, the exported counters equal vLLM's first value plus the sum of the true increments,
series by series (pages are CONSTRUCTED by the test; they go through the real parser,
normaliser and state).

A declared reset looks like a real one (issue 17): a series that went down fell to at most half
its value (a smaller decrease is a one-poll glitch, held: tests/test_upstream_glitches.py), and a
new process start time whose counters did not all fall is confirmed by the process's next page,
so a process restart is followed by a page of the same process on which every series grows (a
series vLLM shows stays on its pages). A series re-created in its process (a later ``_created``) reads
below its last value: a new life starts from 0, and its first page holds a poll of traffic, not more
than the whole earlier life (a later ``_created`` on a counter that did not fall is no new life)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachemon import catalog as C
from cachemon.normalise.normaliser import normalise_text, to_update
from cachemon.state.store import Store
from helpers import exposition

STEMS = {"vllm:prefix_cache_queries_total": C.QUERY_TOKENS.name, "vllm:prompt_tokens_total": C.PROMPT_TOKENS.name}
MODELS = ("a", "b")
REPLICAS = ("r1", "r2")     # a label cachemon drops: replicas of one model collapse onto one series
SOURCES = [(stem, m, r) for stem in STEMS for m in MODELS for r in REPLICAS]

# what happens to a source series on a page
GROW, ABSENT, DROP, RECREATED = "grow", "absent", "drop", "recreated"


def exported_key(src):
    stem, model, _ = src
    labels = (model, "0", "local") if STEMS[stem] == C.QUERY_TOKENS.name else (model, "0")
    return STEMS[stem], labels


@st.composite
def histories(draw):
    n_pages = draw(st.integers(2, 8))
    pages = []
    for _ in range(n_pages):
        after_restart = bool(pages) and pages[-1][0]
        process_restart = bool(pages) and not after_restart and draw(st.booleans()) and draw(st.booleans())
        kinds = [GROW] if after_restart else [GROW, GROW, GROW, ABSENT, DROP, RECREATED]
        events = {s: draw(st.sampled_from(kinds)) for s in SOURCES}
        amounts = {s: draw(st.integers(0, 10_000)) for s in SOURCES}
        pages.append((process_restart, events, amounts))
    return pages


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(histories())
def test_exported_counters_equal_the_sum_of_true_increments(history):
    store = Store({"1m": 60})
    state = store.upstream("u")
    raw = {}                    # source -> current raw value in vLLM
    created = {s: 1.0 for s in SOURCES}
    expected = {}               # source -> true total (first value + increments)
    pst = 1000.0
    for t, (process_restart, events, amounts) in enumerate(history):
        if process_restart:
            pst += 10.0
            # Every series of the process starts over from 0, also one missing from this page.
            raw = dict.fromkeys(raw, 0)
        rows = []
        for src in SOURCES:
            ev, amount = events[src], amounts[src]
            if process_restart and ev != ABSENT:
                ev = GROW
            if ev == ABSENT or (src not in raw and ev in (DROP,)):
                continue
            if src not in raw:
                raw[src] = expected[src] = amount                  # first sight: vLLM's own value
            elif process_restart or ev == RECREATED:
                # a new life counts from 0; a re-created series (a later _created) reads below its last value
                # when it had one: its first page holds a poll of traffic, not a whole earlier life's (a later
                # _created on a counter that did not fall is no new life: issue 38, series.py)
                raw[src] = amount % raw[src] if ev == RECREATED and raw[src] >= 1 else amount
                amount = raw[src]
                expected[src] += amount
                if ev == RECREATED:
                    created[src] += 1.0
            elif ev == DROP:
                if raw[src] < 1:
                    continue
                raw[src] = amount % (raw[src] // 2 + 1)             # at most half: a detectable reset
                expected[src] += raw[src]
            else:
                raw[src] += amount
                expected[src] += amount
            stem, model, replica = src
            labels = {"engine": "0", "model_name": model, "replica": replica}
            rows.append((stem, labels, float(raw[src])))
            rows.append((stem.replace("_total", "_created"), labels, created[src]))
        page = exposition(rows, process_start=pst)
        state.apply(to_update(normalise_text(page)), float(t))
    state.apply(to_update(normalise_text(page)), float(len(history)))     # the next poll, nothing new
    want = {}
    for src, total in expected.items():
        want[exported_key(src)] = want.get(exported_key(src), 0) + total
    got = {k: c.value for k, c in state.counters.items() if k.metric in STEMS.values()}
    assert got == want
