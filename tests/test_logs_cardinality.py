"""The log source goes through the same normalise step and per-series state as /metrics: its
series are held by the same per-upstream cardinality guard (log lines are CONSTRUCTED here)."""
from __future__ import annotations

from cachemon import catalog as C
from cachemon.state.store import Store
from logs_support import Clock, config, source

RULE = {"regex": r"model=(?P<m>\w+) cache_hit=(?P<hit>\d+) cache_miss=(?P<miss>\d+)",
        "counters": {"hit_tokens": "hit", "miss_tokens": "miss"},
        "labels": {"model_name": {"group": "m"}}}


def test_churning_model_names_in_a_log_are_capped_per_upstream_and_evicted(tmp_path):
    log = tmp_path / "gw.log"
    clock = Clock()
    store = Store({"1m": 60.0}, max_series=2, evict_after=30.0)
    src = source(config([log], tmp_path, from_beginning=True, rules=[RULE]), clock, store)
    log.write_text("".join(f"model=m{i} cache_hit=10 cache_miss=5\n" for i in range(4)))
    src.poll()
    st = store.upstreams["log0"]
    hit = C.HIT_TOKENS.name

    def models() -> set[str]:
        return {k.labels[0] for k in st.counters if k.metric == hit}

    assert models() == {"m0", "m1"}
    assert st.overflow_total == 2                     # m2, m3 refused and counted once each
    # m0-m3 fall silent for longer than evict_after; m4 and m5 arrive and take their slots.
    with log.open("a") as f:
        f.write("model=m4 cache_hit=1 cache_miss=1\nmodel=m5 cache_hit=2 cache_miss=1\n")
    clock.advance(31.0)
    src.poll()
    assert models() == {"m4", "m5"}
    assert st.evicted_total == 2
    assert st.counters[(hit, ("m4", "", "local"))].value == 1
    assert st.counters[(hit, ("m5", "", "local"))].value == 2
    assert st.overflow_total == 2
