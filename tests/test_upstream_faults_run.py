"""Wrong-number faults of a hostile upstream, end to end: `cachemon run` as a subprocess polls a
fake upstream that serves CONSTRUCTED pages, page by page; the exported counters must equal the
true increments (issue 10, items 1-4 and 6). `cachemon check` on an invalid page (item 3)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cachemon.demo.replay import ReplayServer
from helpers import CachemonProcess, exposition, value, wait_polls

Q, H = "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"
PROMPT = "vllm:prompt_tokens_total"
QT, HT = "cachemon_prefix_cache_query_tokens_total", "cachemon_prefix_cache_hit_tokens_total"
UP = "fake"


def lab(model: str, **extra: str) -> dict[str, str]:
    return {"engine": "0", "model_name": model, **extra}


@pytest.fixture
def upstream():
    srv = ReplayServer([("empty", "# nothing yet\n")]).start()
    yield srv
    srv.stop()


@pytest.fixture
def run(upstream):
    procs = []

    def start(*extra: str) -> CachemonProcess:
        p = CachemonProcess("--upstream", f"{UP}={upstream.url}", "--poll-interval", "100ms", *extra)
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.stop()


def serve_and_poll(upstream, proc, series, process_start=None, polls: int = 2) -> dict:
    upstream.serve(exposition(series, process_start))
    return wait_polls(proc, UP, polls)


@pytest.mark.slow
def test_one_series_going_down_leaves_the_others_alone(upstream, run):
    proc = run()
    serve_and_poll(upstream, proc, [
        (Q, lab("A"), 1000), (H, lab("A"), 500), (Q, lab("B"), 100_000), (H, lab("B"), 50_000),
        (PROMPT, lab("B"), 1000)], process_start=1.0)
    # A's counter drops (that series restarted); B gets +100 queries; B's prompt_tokens drops by 1.
    got = serve_and_poll(upstream, proc, [
        (Q, lab("A"), 10), (H, lab("A"), 5), (Q, lab("B"), 100_100), (H, lab("B"), 50_000),
        (PROMPT, lab("B"), 999)], process_start=1.0)
    assert value(got, QT, upstream=UP, model_name="B", cache="local") == 100_100
    assert value(got, HT, upstream=UP, model_name="B", cache="local") == 50_000
    # A is corrected on its own: its old total plus what its new life counted.
    assert value(got, QT, upstream=UP, model_name="A", cache="local") == 1010
    assert value(got, HT, upstream=UP, model_name="A", cache="local") == 505


@pytest.mark.slow
def test_a_process_restart_corrects_every_series_of_the_process(upstream, run):
    proc = run()
    serve_and_poll(upstream, proc, [(Q, lab("A"), 1000), (Q, lab("B"), 2000)], process_start=1.0)
    # The process restarted and both counters already grew past their old values: a restart or a
    # second process behind the URL? The new process's second page confirms it (3 polls: the first
    # may have read the old page).
    got = serve_and_poll(upstream, proc, [(Q, lab("A"), 1500), (Q, lab("B"), 2500)], process_start=99.0, polls=3)
    assert value(got, QT, upstream=UP, model_name="A") == 1000 + 1500
    assert value(got, QT, upstream=UP, model_name="B") == 2000 + 2500
    assert value(got, "cachemon_upstream_restarts_total", upstream=UP) == 1


@pytest.mark.slow
def test_a_created_change_corrects_only_its_own_series(upstream, run):
    proc = run()
    created = "vllm:prefix_cache_queries_created"
    serve_and_poll(upstream, proc, [(Q, lab("A"), 1000), (created, lab("A"), 10.0),
                                    (Q, lab("B"), 2000), (created, lab("B"), 10.0)])
    # A restarted (a later _created and its counter fell); B rose under its old _created
    got = serve_and_poll(upstream, proc, [(Q, lab("A"), 300), (created, lab("A"), 50.0),
                                          (Q, lab("B"), 2100), (created, lab("B"), 10.0)])
    assert value(got, QT, upstream=UP, model_name="A") == 1000 + 300
    assert value(got, QT, upstream=UP, model_name="B") == 2100
    # a later _created on a counter that rose is no restart: the rise is counted once (issue 38 item 7)
    got = serve_and_poll(upstream, proc, [(Q, lab("A"), 500), (created, lab("A"), 90.0),
                                          (Q, lab("B"), 2100), (created, lab("B"), 10.0)])
    assert value(got, QT, upstream=UP, model_name="A") == 1000 + 500


@pytest.mark.slow
def test_one_replica_restarting_does_not_add_the_other_replicas_totals(upstream, run):
    """Ray: replicas differ only in a label cachemon drops, so they collapse onto one series."""
    proc = run()
    q = "ray_vllm:prefix_cache_queries_total"
    h = "ray_vllm:prefix_cache_hits_total"
    r1, r2 = lab("m", ReplicaId="r1"), lab("m", ReplicaId="r2")
    got = serve_and_poll(upstream, proc, [(q, r1, 50_000), (q, r2, 300), (h, r1, 100), (h, r2, 0)])
    assert value(got, QT, upstream=UP, model_name="m") == 50_300
    # +100 on r1; r2 restarted and counted 100 since. Miss tokens advance only once the page stood still for
    # state/store.SETTLE_S (5 s): vLLM increments queries and hits in two statements. 100 ms polls: 70 polls.
    got = serve_and_poll(upstream, proc, [(q, r1, 50_100), (q, r2, 100), (h, r1, 100), (h, r2, 0)], polls=70)
    assert value(got, QT, upstream=UP, model_name="m") == 50_500
    assert value(got, "cachemon_prefix_cache_miss_tokens_total", upstream=UP, model_name="m") == 50_500 - 100


@pytest.mark.slow
def test_exact_duplicate_series_are_counted_once_and_reported(upstream, run):
    proc = run()
    got = serve_and_poll(upstream, proc, [(Q, lab("A"), 1000), (Q, lab("A"), 1000), (H, lab("A"), 700)])
    assert value(got, QT, upstream=UP, model_name="A") == 1000
    assert value(got, "cachemon_upstream_rejected_samples_total", upstream=UP, reason="duplicate_series") >= 1
    assert value(got, "cachemon_upstream_up", upstream=UP) == 1


@pytest.mark.slow
def test_check_does_not_double_duplicate_series(upstream):
    # Doubled, 700 hits of 2000 queries would read as 35 %: a false critical (exit 3).
    upstream.serve(exposition([(Q, lab("A"), 1000), (Q, lab("A"), 1000), (H, lab("A"), 700)]))
    res = subprocess.run([sys.executable, "-m", "cachemon.cli", "check", "--upstream", upstream.url,
                          "--interval", "0", "--format", "json"], check=False, capture_output=True, text=True, timeout=60)
    report = json.loads(res.stdout)
    src = report["sources"][0]
    assert src["series"][0]["query_tokens"] == 1000
    assert "duplicate_series" in {f["code"] for f in src["findings"]}
    assert res.returncode == 1      # 70 % hit ratio: a warning, and the invalid page is one too


@pytest.mark.slow
def test_non_finite_and_negative_counter_samples_are_refused_and_the_last_good_value_kept(upstream, run):
    proc = run()
    steps = [1000, -5, 1100, float("inf"), 1200, float("nan"), 50]    # 50: the series restarted
    for v in steps:
        got = serve_and_poll(upstream, proc, [(Q, lab("A"), v), (H, lab("A"), 0)])
    assert value(got, QT, upstream=UP, model_name="A") == 1200 + 50
    for reason in ("negative", "infinite", "nan"):
        assert value(got, "cachemon_upstream_rejected_samples_total", upstream=UP, reason=reason) >= 1, reason


@pytest.mark.slow
def test_cardinality_guard_holds_per_upstream_over_time_and_evicts_vanished_series(upstream, run, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("normalise:\n  max_series_per_upstream: 4\n  evict_after: 1s\n")
    proc = run("--config", str(cfg))

    def models(parsed: dict) -> set[str]:
        return {dict(ls)["model_name"] for (n, ls), _ in parsed.items() if n == QT}

    def page(names):
        return [(Q, lab(m), 10.0) for m in names]

    # 4 polls: seen on 3 polls, a label set is established and keeps its slot until evict_after
    # (one seen on fewer polls, then gone, gives it up at once to a new one: churn)
    got = serve_and_poll(upstream, proc, page(["m0", "m1", "m2"]), polls=4)
    assert models(got) == {"m0", "m1", "m2"}
    # model_name churns: three new names, one slot left.
    upstream.serve(exposition(page(["m3", "m4", "m5"])))
    seen = []
    got = proc.wait_for(lambda p: seen.append(models(p)) or
                        (value(p, "cachemon_series_evicted_total", upstream=UP) or 0) >= 3 and models(p) == {"m3", "m4", "m5"},
                        timeout=15)
    assert all(len(s) <= 4 for s in seen), seen
    assert models(got) == {"m3", "m4", "m5"}
    assert value(got, "cachemon_series_evicted_total", upstream=UP) == 3
    assert value(got, "cachemon_series_overflow_total", upstream=UP) == 2     # m4, m5 until m0-m2 left
