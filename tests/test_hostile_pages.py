"""The cost of hostile pages (issue 17, item 6): label-set churn and pages with many label sets.
Pages are CONSTRUCTED here (a label set per churn name); they go through the real poller, parser,
normaliser and state. Work is measured by benchmarks/bench_hostile.py, never timed here."""
from __future__ import annotations

import logging
import time

import pytest

from cachemon import catalog as C
from cachemon.config import Upstream
from cachemon.demo.replay import ReplayServer
from cachemon.normalise.normaliser import WANTED, normalise_text, to_update
from cachemon.runtime.poller import UpstreamPoller
from cachemon.sources.exposition import ExpositionError, LabelBudget, parse
from cachemon.state.store import Store

Q, H = "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"


def page(names: list[str], real: bool = True) -> str:
    """A CONSTRUCTED page: every churn name's queries and hits, then the real model's."""
    out = ["# TYPE vllm:prefix_cache_queries counter", "# TYPE vllm:prefix_cache_hits counter"]
    out += [f'{Q}{{engine="0",model_name="{n}"}} 1.0' for n in names]
    out += [f'{H}{{engine="0",model_name="{n}"}} 1.0' for n in names]
    if real:
        out += [f'{Q}{{engine="0",model_name="real"}} 1000.0', f'{H}{{engine="0",model_name="real"}} 900.0']
    return "\n".join(out) + "\n"


def churn(start: int, n: int) -> list[str]:
    return [f"churn-{i:06d}" for i in range(start, start + n)]


def models(st) -> set[str]:
    return {k.labels[0] for k in st.counters if k.metric == C.QUERY_TOKENS.name}


@pytest.fixture
def served():
    srv = ReplayServer([("p", "# nothing yet\n")]).start()
    yield srv
    srv.stop()


def poller(srv, max_series: int = 8, evict_after: float = 600.0, timeout: float = 3.0):
    store = Store({"1m": 60}, max_series, evict_after)
    p = UpstreamPoller(Upstream(srv.url, "u", timeout), store)
    p._need_version = False
    return p, store.upstreams["u"]


def test_each_refused_label_set_is_counted_once_over_many_polls(served):
    p, st = poller(served, max_series=8)
    served.serve(page(churn(0, 3000), real=False))
    for _ in range(4):
        assert p.poll_once() is not None
    first = st.overflow_total
    assert 0 < first <= 3000
    for _ in range(3):
        p.poll_once()
    assert st.overflow_total == first           # the same page again: nothing new refused


def test_a_page_with_many_label_sets_is_read_within_a_label_set_budget_that_keeps_known_ones():
    body = page(churn(0, 5000))
    known = frozenset({("real", "0")})
    budget = LabelBudget(limit=16, keep=known)
    got = parse(body, WANTED, budget=budget)
    idents = {(lab.get("model_name"), lab.get("engine")) for rows in got.samples.values() for lab, _ in rows}
    assert ("real", "0") in idents                # last on the page, read: it was admitted before
    assert len(idents) <= 16 + 1
    assert budget.skipped == 2 * 5000 - 2 * 16   # every sample not read is counted


def test_parsing_is_bounded_by_the_poll_deadline():
    body = page(churn(0, 20_000))
    with pytest.raises(ExpositionError) as err:
        parse(body, WANTED, deadline=time.monotonic() - 1.0)
    assert err.value.reason == "timeout"


def test_a_new_real_model_gets_a_slot_at_once_after_churn(served):
    p, st = poller(served, max_series=8)
    for i in range(10):                          # 10 000 names of churn, 1000 a poll, no real model
        served.serve(page(churn(1000 * i, 1000), real=False))
        p.poll_once()
    served.serve(page(churn(20_000, 3), real=True))
    p.poll_once()
    assert "real" in models(st)
    assert st.counters[(C.QUERY_TOKENS.name, ("real", "0", "local"))].value == 1000


def test_a_known_model_keeps_its_slot_under_churn_listed_before_it(served):
    p, st = poller(served, max_series=8)
    served.serve(page([], real=True))
    p.poll_once()
    for i in range(5):
        served.serve(page(churn(1000 * i, 1000), real=True))
        p.poll_once()
        assert "real" in models(st)
    assert st.counters[(C.QUERY_TOKENS.name, ("real", "0", "local"))].value == 1000


def test_refusals_are_logged_once_per_upstream(served, caplog):
    p, st = poller(served, max_series=8)
    with caplog.at_level(logging.WARNING, logger="cachemon"):
        for i in range(5):
            served.serve(page(churn(1000 * i, 1000), real=False))
            p.poll_once()
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage() and "label set" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "max_series_per_upstream" in lines[0]


def test_the_budget_is_counted_in_rejected_samples(served):
    p, st = poller(served, max_series=8)
    served.serve(page(churn(0, 2000)))
    p.poll_once()
    assert st.rejected["label_set_budget"] > 0
    n = normalise_text(page(churn(0, 10)))
    assert to_update(n).rejected["label_set_budget"] == 0      # no budget outside the poller


def test_the_budget_changes_nothing_on_a_real_page_and_reads_every_sample_of_a_label_set_it_read():
    from helpers import REAL_032
    real = (REAL_032 / "metrics-static-system-prompt.txt").read_text()
    assert parse(real, WANTED, budget=LabelBudget(2)).samples == parse(real, WANTED).samples
    # the real model's queries first, then churn, then its hits: every sample of the real model
    # is read, also the ones listed after the budget ran out
    lines = real.splitlines()
    body = (page(churn(0, 3000), real=False).replace("\n", "\n" + "".join(
        x + "\n" for x in lines if x.startswith("vllm:prefix_cache_queries")), 1)
        + "".join(x + "\n" for x in lines if x.startswith("vllm:prefix_cache_hits")))
    budget = LabelBudget(1)
    got = parse(body, WANTED, budget=budget)
    whole = parse(body, WANTED)
    for stem in ("prefix_cache_queries_total", "prefix_cache_hits_total", "prefix_cache_hits_created"):
        assert got.samples[stem] == [r for r in whole.samples[stem] if r[0].get("model_name") == "tiny"], stem
        assert got.samples[stem]
    assert budget.skipped == sum(len(v) for v in whole.samples.values()) - sum(len(v) for v in got.samples.values())
    assert budget.skipped == 2 * 3000


def test_a_kept_model_with_escapes_in_its_name_is_read_past_the_budget():
    name = 'we"ird\\one'
    esc = name.replace("\\", "\\\\").replace('"', '\\"')
    body = page(churn(0, 100), real=False) + (
        f'{Q}{{engine="0",model_name="{esc}"}} 7.0\n'
        f'{Q}{{engine="0",xmodel_name="{esc}",model_name="other"}} 9.0\n')     # not the label: skipped
    budget = LabelBudget(4, keep=frozenset({(name, "0")}))
    got = parse(body, WANTED, budget=budget)
    rows = got.samples["prefix_cache_queries_total"]
    assert [(lab["model_name"], v) for lab, v in rows if lab["model_name"] not in churn(0, 4)] == [(name, 7.0)]
    assert budget.skipped == 2 * 100 - 4 - 4 + 1


def test_control_characters_and_long_values_in_a_pages_labels_never_reach_metrics(served):
    """Issue 38 item 7: the real 0.32.0 page with its model_name made hostile (CONSTRUCTED): ESC and BEL in one
    copy, 100 000 characters in another. On 74d8045 both reached cachemon's /metrics as sent (a 100 KB label
    on every series). Now every value is printable (U+FFFD) and at most 256 characters (a long one cut and
    ended with a digest of the whole, so two long names stay two series), each such sample counted
    (rejected_samples reason label_rewritten); the counts are the page's."""
    from cachemon.expose.collector import CachemonCollector
    from cachemon.expose.render import render
    from helpers import REAL_032, samples
    real = (REAL_032 / "metrics-static-system-prompt.txt").read_text()
    long_a, long_b = "A" * 100_000 + "1", "A" * 100_000 + "2"
    body = real.replace('model_name="tiny"', 'model_name="ti\x1b[31mny\x07"')
    for m in (long_a, long_b):                      # their prefix-cache counters only (the page stays < 16 MiB)
        body += "".join(x + "\n" for x in real.replace('model_name="tiny"', f'model_name="{m}"').splitlines()
                        if x.startswith("vllm:prefix_cache_"))
    p, st = poller(served)
    served.serve(body)
    assert p.poll_once() is not None, st.last_error
    store = p.store
    text = render([CachemonCollector(store)]).decode()
    assert not [c for c in text if (ord(c) < 32 and c != "\n") or 0x7F <= ord(c) < 0xA0]
    names = {dict(ls).get("model_name") for (_, ls) in samples(text)} - {None}
    assert "ti\ufffd[31mny\ufffd" in names
    long_names = [n for n in names if n.startswith("AAAA")]
    assert len(long_names) == 2 and all(len(n) == 256 for n in long_names)
    q = {dict(ls)["model_name"]: v for (n, ls), v in samples(text).items()
         if n == C.QUERY_TOKENS.sample_name and dict(ls).get("cache") == "local"}
    assert q["ti\ufffd[31mny\ufffd"] == 13296 and sorted(q[n] for n in long_names) == [13296, 13296]
    assert st.rejected["label_rewritten"] > 0
