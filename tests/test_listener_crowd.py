"""A crowd of /metrics requests shares renders instead of being turned away with 503s.

The collector is CONSTRUCTED: it blocks every render until the test lets it go, so the requests
that arrive meanwhile are provably waiting together."""
from __future__ import annotations

import threading
from collections.abc import Iterator

import requests

from cachemon.expose.render import Family
from cachemon.web.workers import Registry, make_server, serve_in_thread
from helpers import eventually

CROWD = 40


class GatedRows:
    def __init__(self) -> None:
        self.gate = threading.Event()
        self.renders = 0
        self.entered = threading.Semaphore(0)

    def describe(self) -> list[Family]:
        return [Family("test_rows", "gauge", "Rows.")]

    def collect(self) -> Iterator[Family]:
        self.renders += 1
        self.entered.release()
        self.gate.wait(10)
        f = Family("test_rows", "gauge", "Rows.")
        f.add(f'render="{self.renders}"', 1.0)
        yield f


def test_requests_arriving_during_a_render_all_get_the_next_page_and_none_get_a_503():
    rows = GatedRows()
    reg = Registry()
    reg.register(rows)
    server = make_server("127.0.0.1", 0, reg)
    serve_in_thread(server)
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    results: list[tuple[int, str]] = []
    lock = threading.Lock()

    def scrape() -> None:
        r = requests.get(url, timeout=20)
        with lock:
            results.append((r.status_code, r.text))

    try:
        first = [threading.Thread(target=scrape) for _ in range(2)]     # one per render thread, in turn
        for t in first:
            t.start()
            assert rows.entered.acquire(timeout=10)
        crowd = [threading.Thread(target=scrape) for _ in range(CROWD)]
        for t in crowd:
            t.start()
        eventually(lambda: len(server._page_jobs) == CROWD, what=f"{CROWD} requests waiting for a render")
        rows.gate.set()
        for t in first + crowd:
            t.join(20)
        assert len(results) == CROWD + 2
        assert {code for code, _ in results} == {200}
        assert rows.renders <= 3                         # 2 in flight, then one for the whole crowd
        assert all("test_rows" in text for _, text in results)
        assert server.refused["busy"] == 0
    finally:
        rows.gate.set()
        server.shutdown()
        server.server_close()
