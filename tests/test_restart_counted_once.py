"""One restart is one restart, also where some series appear only once traffic arrives and the page has
no process_start_time or *_created (vLLM 0.32's Rust frontend).

The pages are the real vLLM 0.32.0 pages of tests/fixtures/vllm-0.32.0-cpu with lines taken OUT
(CONSTRUCTED by removal only: process_start_time_seconds, every *_created sample, and on the idle page
the series the Rust frontend shows only after traffic). The real Rust capture's test is in
tests/test_rust_frontend.py.
"""
from __future__ import annotations

from cachemon import catalog as C
from cachemon.normalise.normaliser import normalise_text, to_update
from cachemon.state.store import Store
from helpers import REAL_032

KEY = (C.QUERY_TOKENS.name, ("tiny", "0", "local"))
PROMPT = (C.PROMPT_TOKENS.name, ("tiny", "0"))
LATE = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total")     # absent until traffic (CONSTRUCTED)


def rust_like(scenario: str, drop: tuple[str, ...] = ()):
    lines = [ln for ln in (REAL_032 / f"metrics-{scenario}.txt").read_text().splitlines()
             if not ln.startswith("process_start_time_seconds") and "_created" not in ln
             and not ln.startswith(drop or ("\0",))]
    return to_update(normalise_text("\n".join(lines) + "\n"))


def test_series_back_after_traffic_below_their_old_value_count_no_second_restart():
    st = Store({"1m": 60}).upstream("u")
    st.apply(rust_like("static-system-prompt"), 0.0)
    st.apply(rust_like("timestamp-in-system-prompt"), 1.0)
    before = st.counters[PROMPT].value
    # the restart: the new process's idle page, without the series that wait for traffic
    assert st.apply(rust_like("idle", LATE), 2.0)
    assert st.restarts == 1
    # traffic: those series come back, far below their old values; the restart is already counted
    assert st.apply(rust_like("static-system-prompt"), 3.0) is None
    assert st.restarts == 1
    # and their new life is added on top of the old total, as for the series that reset in the open
    new = rust_like("static-system-prompt")
    got = next(s.value for s in new.counters if (s.key.metric, s.key.labels) == PROMPT)
    assert st.counters[PROMPT].value == before + got
    assert st.counters[KEY].value == 13296 + 13584 + 13296


def test_without_a_restart_a_series_that_pauses_is_not_folded():
    st = Store({"1m": 60}).upstream("u")
    st.apply(rust_like("static-system-prompt"), 0.0)
    st.apply(rust_like("timestamp-in-system-prompt", LATE), 1.0)     # absent once, no restart
    st.apply(rust_like("request-id-at-head"), 2.0)
    assert st.restarts == 0
    last = rust_like("request-id-at-head")
    assert st.counters[PROMPT].value == next(s.value for s in last.counters if (s.key.metric, s.key.labels) == PROMPT)
