"""Fleet (issue 16 item 6): one cachemon follows several replicas' KV events in one process, so the
`routing` reason sees the model's whole fleet. The real 0.32.0 `routing` capture (two replicas behind a
round-robin router, tests/fixtures/vllm-0.32.0-cpu-kv-events/routing) is re-published by two
Republishers into an in-process Daemon built from examples/fleet-kv-events.yaml (its hosts swapped for
127.0.0.1), beside a replay of each replica's real final /metrics page."""
from __future__ import annotations

import pytest
import requests

zmq = pytest.importorskip("zmq")
pytest.importorskip("msgspec")

from cachemon import catalog as C  # noqa: E402
from cachemon.config import load_yaml  # noqa: E402
from cachemon.daemon import Daemon  # noqa: E402
from cachemon.demo.replay import ReplayServer, load_pages  # noqa: E402
from cachemon.runconfig import from_dict  # noqa: E402
from helpers import FIXTURES, samples, wait_until  # noqa: E402
from kv_publisher import Republisher, load_events  # noqa: E402

ROUTING = FIXTURES / "vllm-0.32.0-cpu-kv-events" / "routing"
EXAMPLE = FIXTURES.parent.parent / "examples" / "fleet-kv-events.yaml"


def test_the_example_fleet_config_loads_with_cachemons_loader():
    cfg = from_dict(load_yaml(str(EXAMPLE)))
    kv = [u.kv_events for u in cfg.upstreams]
    assert len(kv) == 3 and all(k is not None and k.replay and k.topic == "kv-events" for k in kv)
    # one model per fleet cachemon: every replica names the same one
    assert {k.model for k in kv if k is not None} == {"llama-3-8b"}
    assert cfg.listen.port != 9867          # not the sidecar's default port


def test_one_daemon_follows_two_replicas_and_exports_routing_on_the_right_one():
    msgs = load_events(ROUTING / "events.jsonl")
    order = [m.replica for m in msgs]
    assert sorted(set(order)) == ["replica0", "replica1"]
    pubs = {r: Republisher([m for m in msgs if m.replica == r]) for r in ("replica0", "replica1")}
    pages = {r: ReplayServer(load_pages([str(ROUTING / f"metrics-final-{r}.txt")])).start() for r in pubs}
    cfg = from_dict(load_yaml(str(EXAMPLE)))
    cfg.upstreams = cfg.upstreams[:2]
    for u, r in zip(cfg.upstreams, ("replica0", "replica1"), strict=True):
        u.name, u.url = r, pages[r].url
        assert u.kv_events is not None
        u.kv_events.endpoint, u.kv_events.replay = pubs[r].pub_endpoint, pubs[r].replay_endpoint
        u.kv_events.model = "tiny"         # the capture's served model name
    cfg.listen.address, cfg.listen.port = "127.0.0.1", 0
    cfg.kv_events.new_series_hold = 0.0    # the ledger's counts at once (shipped: 0 for 90s; tests/test_new_series.py)
    daemon = Daemon(cfg)
    daemon.start()
    url = f"http://127.0.0.1:{daemon.port}/metrics"
    stored = C.KV_EVENTS.sample_name

    def got() -> dict:
        return samples(requests.get(url, timeout=5).text)

    try:
        assert all(p.wait_subscribed(10) for p in pubs.values())
        # in the recorded order across the two sockets: each message is in the ledger before the next is sent
        # (ZMQ orders one socket's messages, not two sockets'; routing depends on which replica stored first)
        sent = {r: 0 for r in pubs}
        for r in order:
            pubs[r].publish(start=sent[r], stop=sent[r] + 1)
            sent[r] += 1
            n = sent[r]
            assert wait_until(lambda r=r, n=n: got().get((stored, (("type", "stored"), ("upstream", r)))) == n, 10)
        g = got()
    finally:
        daemon.shutdown()
        for p in pubs.values():
            p.close()
        for s in pages.values():
            s.stop()

    def tokens(replica: str, reason: str) -> float | None:
        return g.get((C.KV_STORED_TOKENS.sample_name,
                      (("model_name", "tiny"), ("reason", reason), ("upstream", replica))))

    # replica0 stored every tenant first; each tenant's next request went to replica1, which stored what
    # replica0 had cached: 18 blocks x 128 tokens each (the fixture README's counts; equal to the plain
    # re-reading of the events in tests/test_kv_ledger_real.py's oracle)
    assert tokens("replica0", "first") == 18 * 128 and tokens("replica0", "routing") == 0
    assert tokens("replica1", "routing") == 18 * 128 and tokens("replica1", "first") == 0
    for r in pubs:
        assert g[(C.KV_LEDGER_IN_SYNC.sample_name, (("upstream", r),))] == 1
