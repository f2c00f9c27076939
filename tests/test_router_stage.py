"""The `routers:` section and the router stage: a REAL vllm-router page (tests/fixtures/vllm-0.32.0-cpu-router/,
served here over HTTP as the router served it) polled, its workers named as the configured upstreams, its
decisions exported under cachemon's names and handed to attribution; constructed snapshots (labelled) for
the causes no capture here shows (router_stale, load_over_locality)."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from cachemon import catalog as C
from cachemon.config import ConfigError
from cachemon.daemon import Daemon
from cachemon.judge.attribute import ModelSnapshot, attribute
from cachemon.normalise.routers import KINDS, ROUTER_KINDS, read_page
from cachemon.runconfig import from_dict
from cachemon.state.routers import RouterBook, RouterView

FIX = Path(__file__).resolve().parent / "fixtures" / "vllm-0.32.0-cpu-router" / "cache_aware_blind_seq"
CLOSED = "http://127.0.0.1:9/metrics"


def _serve(text: str):
    class H(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 -- http.server's name
            body = text.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_a):
            pass
    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def _config(router_url: str) -> dict:
    meta = json.loads((FIX / "metadata.json").read_text())
    ups = [{"name": n, "url": f"http://127.0.0.1:{r['api_port']}/metrics"} for n, r in meta["replicas"].items()]
    return {"upstreams": ups, "listen": {"address": "127.0.0.1", "port": 0},
            "routers": [{"name": "front", "url": router_url, "kind": "vllm-router"}]}


def _samples(families, spec):
    fam = next(f for f in families if f.name == spec.name)
    return {labels: v for labels, v in fam.samples}


def test_the_router_stage_polls_a_real_page_and_exports_it_under_cachemons_names():
    srv = _serve((FIX / "router-metrics-final.txt").read_text())
    try:
        d = Daemon(from_dict(_config(f"http://127.0.0.1:{srv.server_port}/metrics")))
        stage = next(c for c in d.components if type(c).__name__ == "RouterStage")
        att = next(c for c in d.components if hasattr(c, "attributor"))
        assert att.attributor.router_view is not None       # the same book, read by attribution
        stage.poll_once()
        fams = list(stage.collect())
    finally:
        srv.shutdown()
    assert _samples(fams, C.ROUTER_UP) == {'router="front"': 1.0}
    decisions = _samples(fams, C.ROUTER_PREFIX_DECISIONS)
    assert decisions['router="front",outcome="blind"'] == 40.0
    assert decisions['router="front",outcome="hit"'] == 0.0
    # the worker URL is the upstream's host:port: named by the upstream's name, no new label on its series
    assert _samples(fams, C.ROUTER_REQUESTS) == {'router="front",upstream="replica0"': 40.0}
    info = _samples(fams, C.ROUTER_INFO)
    assert info == {'router="front",kind="vllm-router",policy="cache_aware",evidence="real"': 1.0}


def test_a_router_that_cannot_be_read_is_down_not_a_crash():
    d = Daemon(from_dict(_config(CLOSED)))
    stage = next(c for c in d.components if type(c).__name__ == "RouterStage")
    stage.poll_once()
    assert _samples(list(stage.collect()), C.ROUTER_UP) == {'router="front"': 0.0}


def test_no_routers_section_no_stage():
    cfg = _config(CLOSED)
    del cfg["routers"]
    assert not any(type(c).__name__ == "RouterStage" for c in Daemon(from_dict(cfg)).components)


@pytest.mark.parametrize("bad, key", [
    ({"kind": "nginx"}, "routers[0].kind"),
    ({"upstreams": ["nope"]}, "routers[0].upstreams[0]"),
    ({"workers": {"http://w:1": "nope"}}, "routers[0].workers[http://w:1]"),
])
def test_a_bad_routers_entry_is_a_one_line_config_error(bad, key):
    cfg = _config(CLOSED)
    cfg["routers"][0].update(bad)
    with pytest.raises(ConfigError) as e:
        from_dict(cfg)
    assert str(e.value).startswith(key)


def test_every_router_row_says_where_it_comes_from():
    for row in ROUTER_KINDS:
        assert row.evidence in ("real", "constructed") and row.cite, row.kind
        assert row.decisions or row.lookups or row.credited_tokens or row.per_worker, row.kind
    assert [r.kind for r in ROUTER_KINDS if r.evidence == "real"] == ["vllm-router"]


def test_a_garbled_line_of_a_wanted_family_is_counted_not_guessed():
    page = (FIX / "router-metrics-final.txt").read_text()
    bad = page + 'vllm_router_prefix_routing_decisions_total{policy="cache_aware",outcome="prefix_hit"} abc\n'
    got = read_page(KINDS["vllm-router"], bad)
    assert got.skipped == 1 and got.decisions.get("hit", 0.0) == 0.0 and got.decisions["blind"] == 40.0


def test_a_router_restart_starts_its_history_again():
    book = RouterBook()
    book.add("r", KINDS["vllm-router"], {"w0": "a", "w1": "b"}, ("a", "b"))
    from cachemon.normalise.routers import RouterReading
    book.record("r", 0.0, RouterReading(decisions={"hit": 10.0}, per_worker={"w0": 10.0}))
    book.record("r", 5.0, RouterReading(decisions={"hit": 2.0}, per_worker={"w0": 2.0}))    # restarted
    book.record("r", 10.0, RouterReading(decisions={"hit": 6.0}, per_worker={"w0": 6.0}))
    v = book.view("a", 10.0, 60.0)
    assert v is not None and v.decisions == {"hit": 4.0} and v.requests_here == 4.0
    assert book.view("b", 10.0, 60.0).requests_here == 0.0


# --- constructed snapshots: the causes no capture here shows ------------------------------------------

def _view(**kw) -> RouterView:
    base = dict(router="dyn", kind="dynamo", evidence="constructed", policy="kv", blind_fix="", seconds=60.0,
                decisions={}, lookups={}, credited_tokens=None, requests_here=10.0, requests_total=20.0, fronted=2)
    return RouterView(**{**base, **kw})


def _snap(router: RouterView, hit: float = 4000.0, query: float = 10000.0) -> ModelSnapshot:
    """Constructed: one replica of two over a 60 s window."""
    return ModelSnapshot(upstream="a", model="m", now=100.0, interval_seconds=60.0, interval_query_tokens=query,
                         interval_hit_tokens=hit, step_query_tokens=query / 10, step_hit_tokens=hit / 10,
                         fleet_query_tokens=query, fleet_hit_tokens=hit, router=router)


def test_router_stale_is_credited_tokens_the_engine_did_not_hit():
    # constructed: Dynamo credited 12,000 tokens on 20 requests, 10 of them here (6,000), the replica hit 4,000
    a = attribute(_snap(_view(credited_tokens=12000.0)))
    stale = next(c for c in a.causes if c.code == "router_stale")
    assert "credited 6000" in stale.message and stale.tokens == 600.0     # capped by the step's misses
    assert "router_stale" not in attribute(_snap(_view(credited_tokens=8000.0))).codes


def test_load_over_locality_needs_a_decision_that_says_so():
    assert "load_over_locality" in attribute(_snap(_view(decisions={"hit": 5.0, "load": 3.0}))).codes
    assert "load_over_locality" not in attribute(_snap(_view(decisions={"hit": 8.0}))).codes


def test_a_router_that_credits_nothing_while_the_engine_hits_is_blind():
    assert "router_blind" in attribute(_snap(_view(credited_tokens=0.0))).codes
    assert "router_blind" not in attribute(_snap(_view(credited_tokens=0.0), hit=0.0)).codes


# --- `cachemon check` with `routers:` ------------------------------------------------------------------

class _Pages:
    """One HTTP server per source, each serving the page set last (the capture's pages at a recorded time)."""

    def __init__(self) -> None:
        self.page: dict[str, str] = {}
        self.servers: dict[str, ThreadingHTTPServer] = {}

    def add(self, name: str) -> str:
        pages = self.page

        class H(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 -- http.server's name
                body = pages[name].encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_a):
                pass
        srv = self.servers[name] = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{srv.server_port}/metrics"

    def at(self, folder: Path, t: float) -> None:
        """Every source's last recorded page at time ``t``."""
        for line in map(json.loads, (folder / "metrics.jsonl").read_text().splitlines()):
            if line["t"] <= t and "text" in line:
                self.page[line["replica"]] = line["text"]
        for line in map(json.loads, (folder / "router-metrics.jsonl").read_text().splitlines()):
            if line["t"] <= t and "text" in line:
                self.page["router"] = line["text"]


def test_check_names_the_blind_router_from_a_real_capture():
    from cachemon.check.run import run_checks
    from cachemon.config import Upstream
    from cachemon.config.routers import RouterEntry
    meta = json.loads((FIX / "metadata.json").read_text())
    reqs = [json.loads(x) for x in (FIX / "requests.jsonl").read_text().splitlines()]
    pages = _Pages()
    ups = [Upstream(url=pages.add(n), name=n) for n in ("replica0", "replica1")]
    router = RouterEntry(url=pages.add("router"), kind="vllm-router",
                         workers={f"http://127.0.0.1:{r['api_port']}": n for n, r in meta["replicas"].items()})
    pages.at(FIX, reqs[10]["t_recv"] + 1.5)           # the first read: 11 requests in
    try:
        reports = run_checks(ups, 1.0, {}, routers=[router],
                             sleep=lambda _s: pages.at(FIX, reqs[-1]["t_recv"] + 2.5))   # the second: all 40
    finally:
        for srv in pages.servers.values():
            srv.shutdown()
    by_name = {r["name"]: r for r in reports}
    causes = {c["cause"]: c["message"] for a in by_name["replica0"]["attribution"] for c in a["causes"]}
    assert "--enable-scale-out" in causes["router_blind"]
    assert "policy cache_aware" in causes["replica_load_skew"]
    assert not [c for a in by_name["replica1"]["attribution"] for c in a["causes"]]


def test_the_router_vs_engine_row_names_only_real_causes():
    import re

    from cachemon.judge.causes import CAUSES
    from cachemon.monitoring.router_row import router_row
    panel = next(p for p in router_row() if p.get("title") == "Router causes")
    names = re.search(r'cause=~"([^"]+)"', panel["targets"][0]["expr"]).group(1).split("|")
    assert set(names) <= {str(x) for x in CAUSES} and "router_blind" in names


def test_a_dynamo_page_reaches_router_stale_and_blind():
    """CONSTRUCTED Dynamo pages (names from its source: normalise/routers.py's row); no Dynamo runs here.
    Two reads 60 s apart: 20 requests, 12,000 credited tokens, over two fronted replicas."""
    def page(requests: int, credited: int) -> str:
        return ("# TYPE dynamo_component_router_requests_total counter\n"
                f'dynamo_component_router_requests_total{{router_id="1"}} {requests}\n'
                "# TYPE dynamo_component_router_kv_selected_cached_prefix_tokens_total counter\n"
                f'dynamo_component_router_kv_selected_cached_prefix_tokens_total{{phase="aggregated",model="m"}} {credited}\n')
    book = RouterBook()
    book.add("dyn", KINDS["dynamo"], {}, ("a", "b"))
    book.record("dyn", 40.0, read_page(KINDS["dynamo"], page(0, 0)))
    book.record("dyn", 100.0, read_page(KINDS["dynamo"], page(20, 12000)))
    v = book.view("a", 100.0, 60.0)
    assert v is not None and v.requests_total == 20.0 and v.requests_here == 10.0 and v.credited_tokens == 12000.0
    assert "router_stale" in attribute(_snap(v)).codes       # 6,000 credited here, 4,000 hit
    book.record("dyn", 160.0, read_page(KINDS["dynamo"], page(40, 12000)))
    blind = book.view("a", 160.0, 60.0)
    assert blind is not None and blind.credited_tokens == 0.0
    assert "router_blind" in attribute(_snap(blind)).codes   # credited nothing on 20 requests while hitting


def test_routing_tokens_before_the_router_names_a_policy_make_no_series():
    from cachemon.config import Upstream
    from cachemon.config.routers import RouterEntry
    from cachemon.runtime.router_stage import RouterStage
    entry = RouterEntry(url=CLOSED, kind="vllm-router", name="front")
    ups = [Upstream(url="http://127.0.0.1:1/metrics", name="a")]
    routed = {"a": 0.0}
    stage = RouterStage([entry], ups, RouterBook(), 1.0, routing_tokens=lambda u: routed[u])
    stage.feed(entry, 1.0, "# a router page before its first request: no decision family yet\n")
    assert stage.routing_by_policy == {}
    routed["a"] = 768.0
    stage.feed(entry, 2.0, (FIX / "router-metrics-final.txt").read_text())
    assert stage.routing_by_policy == {("front", "cache_aware"): 768.0}


def test_a_routers_default_name_never_shows_its_credentials():
    from cachemon.config.routers import RouterEntry
    assert RouterEntry(url="http://user:secret@router:29000/metrics", kind="vllm-router").name == "router:29000"


def test_a_hostile_router_page_is_bounded_counted_and_never_a_wrong_number():
    """Red team round 7 (issue 38), the router's page as the wire: the REAL vllm-router page with
    constructed hostile lines appended. Before: 20 000 worker URLs a page gave 20 000 series, the book kept
    every worker of every page (400 000 after 20 polls; 100 polls of a 1.6 MiB page: RSS 30 -> 303 MB),
    each new policy name a new series, NaN and +Inf were exported as decisions, and a malformed label set
    raised out of the stage every poll (a traceback, and router_up left at its last value)."""
    from cachemon.config.routers import RouterEntry
    from cachemon.normalise.routers import MAX_POLICIES, MAX_WORKERS
    from cachemon.runtime.router_stage import RouterStage

    real = (FIX / "router-metrics-final.txt").read_text()
    entry = RouterEntry(url=CLOSED, kind="vllm-router", name="front")
    book = RouterBook()
    stage = RouterStage([entry], [], book, 1.0, routing_tokens=lambda _u: 0.0)
    for poll in range(20):
        hostile = [f'vllm_router_processed_requests_total{{worker="http://w{poll}-{i}:8000"}} 1' for i in range(5000)]
        hostile += [f'vllm_router_policy_decisions_total{{policy="p{poll}-{i}"}} 1' for i in range(40)]
        hostile += ['vllm_router_prefix_routing_decisions_total{outcome="prefix_hit"} NaN',
                    'vllm_router_prefix_routing_decisions_total{outcome="prefix_miss"} +Inf',
                    'vllm_router_kv_placement_lookups_total{result="hit"} -5',
                    'vllm_router_processed_requests_total{worker=oops} 1']
        stage.feed(entry, float(poll), real + "\n".join(hostile) + "\n")
    fams = list(stage.collect())
    requests = _samples(fams, C.ROUTER_REQUESTS)
    assert len(requests) == MAX_WORKERS and len(book.routers()[0][4]) == MAX_WORKERS
    assert len(_samples(fams, C.ROUTER_ROUTING_TOKENS)) <= MAX_POLICIES + 1
    decisions = _samples(fams, C.ROUTER_PREFIX_DECISIONS)
    assert decisions['router="front",outcome="blind"'] == 40.0 and decisions['router="front",outcome="hit"'] == 0.0
    assert all(v == v and v not in (float("inf"), float("-inf")) for v in decisions.values())
    refused = _samples(fams, C.ROUTER_REFUSED_SAMPLES)
    assert refused['router="front",reason="invalid_value"'] == 20 * 3
    assert refused['router="front",reason="unparsed"'] == 20
    assert refused['router="front",reason="worker_cap"'] > 0 and refused['router="front",reason="policy_cap"'] > 0
    assert _samples(fams, C.ROUTER_UP) == {'router="front"': 1.0}


def test_a_router_that_stays_down_is_said_once_and_its_return_once(caplog):
    """Red team round 7 (issue 38): a router down logged a WARNING at every poll (86 400 lines a day at 1 s
    polls); an upstream's failure is said when it changes (runtime/poller.py), and so is a router's now."""
    import logging

    d = Daemon(from_dict(_config(CLOSED)))
    stage = next(c for c in d.components if type(c).__name__ == "RouterStage")
    with caplog.at_level(logging.INFO, logger="cachemon.routers"):
        for _ in range(5):
            stage.poll_once()
        srv = _serve((FIX / "router-metrics-final.txt").read_text())
        try:
            stage.entries[0].url = f"http://127.0.0.1:{srv.server_port}/metrics"
            stage.poll_once()
            stage.poll_once()
        finally:
            srv.shutdown()
    said = [r.getMessage() for r in caplog.records if r.name == "cachemon.routers"]
    assert len(said) == 2 and "cannot connect" in said[0] and said[1] == "router front is back up"
    assert _samples(list(stage.collect()), C.ROUTER_UP) == {'router="front"': 1.0}


def _said_for(url: str, caplog) -> list[str]:
    import logging
    d = Daemon(from_dict(_config(url)))
    stage = next(c for c in d.components if type(c).__name__ == "RouterStage")
    with caplog.at_level(logging.INFO, logger="cachemon.routers"):
        stage.poll_once()
        stage.poll_once()
    return [r.getMessage() for r in caplog.records if r.name == "cachemon.routers"]


def test_an_unreachable_router_is_named_as_a_router_not_as_vllm(caplog):
    """Red team (issue 38): the router's fetch error ended with the engine scrape's hint ("is vLLM running?
    (vllm serve MODEL --port 9; cachemon's default upstream is ...)"): it names the router, its URL and the
    setting to fix."""
    said = _said_for(CLOSED, caplog)
    assert len(said) == 1
    assert "127.0.0.1:9" in said[0] and "vllm-router router 'front'" in said[0] and "routers[front].url" in said[0]
    assert "vllm serve" not in said[0] and "vLLM running" not in said[0] and "default upstream" not in said[0]


def test_a_router_url_that_serves_an_engine_page_says_so_once(caplog):
    # real: a vLLM 0.32.0 replica's /metrics from the same recording, configured as the router's page
    srv = _serve((FIX / "metrics-final-replica0.txt").read_text())
    try:
        said = _said_for(f"http://127.0.0.1:{srv.server_port}/metrics", caplog)
    finally:
        srv.shutdown()
    assert len(said) == 1, said
    assert "vLLM engine's /metrics, not the router's" in said[0] and "routers[front].url" in said[0]
    assert "vllm_router_prefix_routing_decisions_total" in said[0]


def test_a_router_page_before_any_decision_is_not_called_wrong(caplog):
    # real: the recorded router page names its families: no warning for the right page
    srv = _serve((FIX / "router-metrics-final.txt").read_text())
    try:
        assert _said_for(f"http://127.0.0.1:{srv.server_port}/metrics", caplog) == []
    finally:
        srv.shutdown()


def test_a_router_404_points_at_its_metrics_page_not_vllms():
    from cachemon.sources import hints
    hint = hints.not_found("http://10.0.0.5:30080/stats", 404, hints.router_endpoint("front", "vllm-router"))
    assert hint.startswith("did you mean http://10.0.0.5:30080/metrics?") and "routers[front].url" in hint
    assert "vLLM" not in hint
