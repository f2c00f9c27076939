"""Slow readers (issue 38): clients that send requests, pipelined or not, and never read the replies.

The pages and requests here are CONSTRUCTED (a gauge family of 3 000 rows, ~200 KB, the size of
`cachemon run`'s page in the soak). A slow reader's receive buffer is made small (SO_RCVBUF) so
that a page cannot vanish into the kernel, as over a real network with a client that stopped reading.
"""
from __future__ import annotations

import dataclasses
import fcntl
import socket
import struct
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from cachemon.expose.render import Family
from cachemon.web.workers import Limits, Registry, Server, make_server, serve_in_thread
from helpers import wait_until

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from attack_slow_readers import run_attack  # noqa: E402

ROWS = 3000
METRICS = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
HEALTHY = b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n"


class Rows:
    """CONSTRUCTED: one gauge family of `rows` label sets."""

    def __init__(self, rows: int = ROWS) -> None:
        self.rows = rows

    def collect(self) -> Iterator[Family]:
        f = Family("test_rows", "gauge", "Rows.")
        for i in range(self.rows):
            f.add(f'row="{i:06d}"', float(i))
        yield f


def limits(**settings: object) -> Limits:
    """Limits with the settings this tree has (the same tests run unchanged against 74d8045)."""
    known = {f.name for f in dataclasses.fields(Limits)}
    return Limits(**{k: v for k, v in settings.items() if k in known})     # type: ignore[arg-type]


def unsent_bytes(sock: socket.socket) -> int:
    """The kernel's count of bytes sent on `sock` and not yet taken by the peer (SIOCOUTQ)."""
    return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0])


def serve(limits: Limits, rows: int = ROWS) -> Server:
    reg = Registry()
    reg.register(Rows(rows))
    server = make_server("127.0.0.1", 0, reg, limits=limits)
    serve_in_thread(server)
    return server


def stop(server: Server) -> None:
    server.shutdown()
    server.server_close()


def slow_reader(port: int, request: bytes, times: int) -> socket.socket:
    """A connection that sends `times` pipelined requests and never reads (a 4 KiB receive buffer)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    s.setblocking(False)
    try:
        s.send(request * times)
    except BlockingIOError:
        pass
    return s


def closed_by_server(s: socket.socket, within: float) -> bool:
    """True once the server has closed or reset the connection (reading what it sent meanwhile)."""
    s.setblocking(True)
    s.settimeout(within)
    try:
        while s.recv(1 << 20):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_when_every_connection_is_a_stalled_slow_reader_a_probe_and_a_scrape_still_get_in():
    # 74d8045: a connection writing a reply was never closed to make room, so 8 slow readers
    # filled the server for write_timeout (30 s) and every new connection was refused.
    server = serve(limits(max_connections=8, stall_timeout=0.2, write_timeout=30.0))
    port = server.server_address[1]
    socks = [slow_reader(port, METRICS, 50) for _ in range(8)]
    try:
        assert wait_until(lambda: len(server._conns) == 8, 5)
        time.sleep(0.5)        # every reply stalled for longer than stall_timeout
        assert requests.get(f"http://127.0.0.1:{port}/-/ready", timeout=2).status_code == 200
        r = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
        assert r.status_code == 200 and r.text.count("\ntest_rows{") == ROWS
        assert server.refused["slow_reader"] >= 1
    finally:
        for s in socks:
            s.close()
        stop(server)


def test_a_client_pipelining_without_reading_pins_one_backlog_of_replies_not_one_per_request():
    # 74d8045 answered every pipelined request into the kernel's send buffer (up to its 4 MiB
    # autotuned size) and read 128 KiB of requests ahead; now the next request waits while more
    # than pipeline_backlog bytes of replies are unread, and the server buffers one read chunk.
    backlog = 65536
    server = serve(limits(pipeline_backlog=backlog))
    port = server.server_address[1]
    n = 10000
    s = slow_reader(port, HEALTHY, n)
    try:
        time.sleep(1.0)
        (c,) = server._conns.values()
        assert unsent_bytes(c.sock) <= backlog + 1024
        assert len(c.buf) <= 16384
        # once the client reads, every request is answered, in order
        s.setblocking(True)
        s.settimeout(10)
        rest = HEALTHY * n
        got = b""
        deadline = time.monotonic() + 30
        while got.count(b"HTTP/1.1 200 OK") < n and time.monotonic() < deadline:
            if rest:
                try:
                    sent = s.send(rest[:65536], socket.MSG_DONTWAIT)
                    rest = rest[sent:]
                except BlockingIOError:
                    pass
            try:
                got += s.recv(1 << 20, socket.MSG_DONTWAIT)
            except BlockingIOError:
                time.sleep(0.01)
        # the first send may have been partial: count what the server got from both sends
        assert got.count(b"HTTP/1.1 200 OK") >= n
        assert got.count(b"HTTP/1.1 ") == got.count(b"HTTP/1.1 200 OK")
    finally:
        s.close()
        stop(server)


def test_reply_bytes_over_the_budget_close_the_stalled_readers_holding_them():
    # 74d8045 kept every stalled reply (a ~1 MB page each when rendered apart) until
    # write_timeout (30 s): N slow readers held N pages. Budget 2 MiB: the stalled ones go.
    budget = 2 << 20
    server = serve(limits(max_buffered_bytes=budget, stall_timeout=0.2, write_timeout=30.0, send_buffer=65536),
                   rows=30000)
    port = server.server_address[1]
    socks = []
    try:
        for _ in range(8):         # one at a time: each reply a page rendered for it alone
            socks.append(slow_reader(port, METRICS, 1))
            time.sleep(0.25)
        assert closed_by_server(socks[0], within=5)
        assert server.refused["slow_reader"] >= 1
        assert server.buffered_bytes <= budget + 2 * len(server.registry.render(False))
    finally:
        for s in socks:
            s.close()
        stop(server)


@pytest.mark.slow
def test_1100_pipelining_non_readers_leave_the_scraper_and_the_readiness_probe_working():
    # Round 6 on 74d8045: 18 of 47 scrapes and 4 of 6 probes failed, peak RSS 188 MB; this harness
    # on 74d8045 (00:09 UTC, load 7): 17 of 17 scrapes, 17 of 17 probes failed, peak 206 MB.
    import cachemon

    r = run_attack(connections=1100, seconds=15.0, procs=2, src=Path(cachemon.__file__).resolve().parents[1])
    assert r["listener_alive"]
    assert r["scrapes"] >= 8 and r["scrapes_failed"] <= 1, r
    assert r["probes"] >= 8 and r["probes_failed_in_a_row"] < 3 and r["probes_failed"] <= 1, r
    assert r["rss_peak_mb"] - r["rss_before_mb"] <= 48, r
