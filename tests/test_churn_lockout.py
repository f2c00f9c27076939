"""A page whose model_name churns must not lock out a real model that stays (issue 26: after 3
minutes of 10 000 churning names, `llama-real` was still not exported 5 s after it appeared).
Pages are CONSTRUCTED (a label set per churn name, the real model last); they go through the
real parser, normaliser and state (fewer label sets a page than the poller's label-set budget)."""
from __future__ import annotations

import pytest

from cachemon import catalog as C
from cachemon.normalise.normaliser import normalise_text, to_update
from cachemon.state.store import Store

Q, H = "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"
MAX = 16


def page(names: list[str], real: bool) -> str:
    out = ["# TYPE vllm:prefix_cache_queries counter", "# TYPE vllm:prefix_cache_hits counter"]
    out += [f'{Q}{{engine="0",model_name="{n}"}} 1.0' for n in names]
    out += [f'{H}{{engine="0",model_name="{n}"}} 1.0' for n in names]
    if real:
        out += [f'{Q}{{engine="0",model_name="llama-real"}} 1000.0',
                f'{H}{{engine="0",model_name="llama-real"}} 900.0']
    return "\n".join(out) + "\n"


def live(poll: int, per_poll: int, lifetime: int) -> list[str]:
    """The churn names on the page at `poll`: `per_poll` new each poll, each listed `lifetime` polls."""
    return [f"churn-{i:06d}" for i in range(max(0, poll - lifetime + 1) * per_poll, (poll + 1) * per_poll)]


# (new names a poll, polls each stays): one-poll churn; names that live long enough to be
# established (3 polls) and then go; as many on the page as the guard holds, or more
@pytest.mark.parametrize("per_poll, lifetime", [(4, 1), (4, 4), (2, 6), (4, 5), (8, 3)])
def test_a_real_model_that_stays_gets_a_slot_within_two_polls_under_churn(per_poll, lifetime):
    st = Store({"1m": 60}, MAX, 600.0).upstream("u")
    polls = 160 // per_poll                  # 160 names of churn (10 times the guard) before the real model
    for i in range(polls):
        st.apply(to_update(normalise_text(page(live(i, per_poll, lifetime), real=False))), float(i))
    assert len(st.idents) == MAX                  # the guard is full of churn
    got = []
    for i in range(polls, polls + 6):
        st.apply(to_update(normalise_text(page(live(i, per_poll, lifetime), real=True))), float(i))
        got.append(any(k.labels[0] == "llama-real" for k in st.counters))
    assert got[1:] == [True] * 5, got                 # from the second poll on, and it keeps it
    assert st.counters[(C.QUERY_TOKENS.name, ("llama-real", "0", "local"))].value == 1000
    assert len(st.idents) <= MAX
