"""Issue 17 items 1 and 2: idle, half-sent, keep-alive and pre-handshake connections, and
wrong-password floods, must not starve /metrics or the probes.

Every attack is bounded (a few hundred sockets on 127.0.0.1, a couple of seconds); the assertion
is that the real scraper and the probes are answered (status 200 within a generous 2 s timeout)
while the attack is held, not a timing micro-threshold.
"""
from __future__ import annotations

import base64
import socket
import ssl
import threading
import time

import bcrypt
import pytest
import requests

from assert_support import nonempty
from cachemon.web.connection import ConnState
from cachemon.web.web_config import load_web_config
from cachemon.web.workers import Limits
from helpers import eventually, self_signed_cert, wait_until
from listener_support import serve, stop


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    return self_signed_cert(tmp_path_factory.mktemp("tls"))


def tls_web(cert, tmp_path):
    p = tmp_path / "web.yml"
    p.write_text(f"tls_server_config:\n  cert_file: {cert / 'c.pem'}\n  key_file: {cert / 'k.pem'}\n")
    return load_web_config(str(p))


def probes_answer(base: str, **kw) -> None:
    """/metrics, /-/ready and /-/healthy each answered 200, on a fresh connection."""
    for path in ("/metrics", "/-/ready", "/-/healthy"):
        r = requests.get(base + path, timeout=2, **kw)
        assert r.status_code == 200, path


def open_idle(addr, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        socks.append(socket.create_connection(addr, timeout=5))
    return socks


def close_all(socks) -> None:
    for s in socks:
        s.close()


def test_300_idle_tcp_connections_do_not_starve_metrics_or_ready():
    server = serve()
    held = open_idle(server.server_address[:2], 300)
    try:
        eventually(lambda: len(server._conns) == 300, what="the server holds all 300")
        probes_answer(f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        close_all(held)
        stop(server)


def test_100_half_sent_requests_do_not_starve_the_probes():
    server = serve()
    held = open_idle(server.server_address[:2], 100)
    try:
        for s in held:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pending: ")   # never finished
        eventually(lambda: sum(bool(c.buf) for c in list(server._conns.values())) == 100,
                   what="the server holds 100 half-read requests")
        base = f"http://127.0.0.1:{server.server_address[1]}"
        for _ in range(7):
            probes_answer(base)
    finally:
        close_all(held)
        stop(server)


def test_100_idle_keep_alive_connections_do_not_starve_the_probes():
    server = serve()
    held = open_idle(server.server_address[:2], 100)
    try:
        assert len(held) == 100
        for s in held:      # one request each, answered, then the connection stays open and idle
            s.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
            assert s.recv(1024).startswith(b"HTTP/1.1 200")
        probes_answer(f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        close_all(held)
        stop(server)


def test_200_tls_connections_that_never_send_a_client_hello_do_not_starve_scrapes(cert, tmp_path):
    server = serve(tls_web(cert, tmp_path))
    held = open_idle(server.server_address[:2], 200)
    try:
        eventually(lambda: len(server._conns) == 200, what="the server holds all 200")
        probes_answer(f"https://127.0.0.1:{server.server_address[1]}", verify=str(cert / "c.pem"))
    finally:
        close_all(held)
        stop(server)


def test_200_tls_connections_stalled_mid_handshake_do_not_starve_scrapes(cert, tmp_path):
    # A ClientHello's first bytes (a TLS record header), then nothing: the handshake is pending.
    server = serve(tls_web(cert, tmp_path))
    held = open_idle(server.server_address[:2], 200)
    try:
        for s in held:
            s.sendall(b"\x16\x03\x01\x02\x00\x01")
        eventually(lambda: sum(c.state == ConnState.HANDSHAKE for c in list(server._conns.values())) == 200,
                   what="200 handshakes pending")
        probes_answer(f"https://127.0.0.1:{server.server_address[1]}", verify=str(cert / "c.pem"))
    finally:
        close_all(held)
        stop(server)


def test_three_times_more_idle_connections_than_the_limit_do_not_starve_the_probes():
    # The 1000-connection case, scaled down: the limit is 100, 300 connections are held.
    server = serve(limits=Limits(max_connections=100))
    held = open_idle(server.server_address[:2], 300)
    try:
        eventually(lambda: server.refused["connection_limit"] == 200, what="200 of 300 closed to make room")
        probes_answer(f"http://127.0.0.1:{server.server_address[1]}")
        text = requests.get(f"http://127.0.0.1:{server.server_address[1]}/metrics", timeout=2).text
        assert 'cachemon_http_refused_total{reason="connection_limit"}' in text
    finally:
        close_all(held)
        stop(server)


def test_when_full_the_oldest_idle_connection_is_closed_first():
    server = serve(limits=Limits(max_connections=10))
    addr = server.server_address[:2]
    held = open_idle(addr, 10)
    try:
        eventually(lambda: len(server._conns) == 10, what="the server holds all 10")
        r = requests.get(f"http://127.0.0.1:{addr[1]}/-/ready", timeout=2)
        assert r.status_code == 200
        held[0].settimeout(2)
        assert held[0].recv(10) == b""                  # the oldest was closed to make room
        held[-1].settimeout(0.2)
        with pytest.raises(TimeoutError):               # the newest is still open
            held[-1].recv(10)
    finally:
        close_all(held)
        stop(server)


def test_idle_keep_alive_connection_is_closed_after_the_idle_timeout():
    server = serve(limits=Limits(idle_timeout=0.5))
    try:
        with socket.create_connection(server.server_address[:2], timeout=5) as s:
            s.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
            assert s.recv(1024).startswith(b"HTTP/1.1 200")
            start = time.monotonic()
            while s.recv(1024):
                pass
            assert time.monotonic() - start < 4
    finally:
        stop(server)


def test_header_deadline_default_is_short():
    # Go's ReadHeaderTimeout-like: a client that connects and sends nothing is cut within seconds.
    assert Limits().request_timeout <= 10


# --- item 2: wrong-password floods ---------------------------------------------------------

def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.mark.slow
def test_wrong_password_flood_does_not_delay_the_verified_scraper(tmp_path):
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=10)).decode().replace("$2b$", "$2y$")
    p = tmp_path / "web.yml"
    p.write_text(f"basic_auth_users:\n  prom: '{hashed}'\n")
    server = serve(load_web_config(str(p)))
    base = f"http://127.0.0.1:{server.server_address[1]}"
    stop_flag = threading.Event()
    statuses: list[int] = []

    def attacker(i: int) -> None:
        n = 0
        with requests.Session() as s:
            while not stop_flag.is_set():
                n += 1
                try:
                    statuses.append(s.get(base + "/metrics", headers={"Authorization": basic("prom", f"x{i}-{n}")},
                                          timeout=10).status_code)
                except requests.RequestException:
                    pass
    try:
        with requests.Session() as scraper:
            # the scraper's credentials are verified once (one bcrypt), then cached
            assert scraper.get(base + "/metrics", auth=("prom", "s3cret"), timeout=5).status_code == 200
            threads = [threading.Thread(target=attacker, args=(i,), daemon=True) for i in range(100)]
            for t in threads:
                t.start()
            assert wait_until(lambda: len(statuses) >= 50, 10)
            for _ in range(10):
                r = scraper.get(base + "/metrics", auth=("prom", "s3cret"), timeout=2)
                assert r.status_code == 200 and "test_rows" in r.text
            # a fresh connection with the good credentials too
            assert requests.get(base + "/metrics", auth=("prom", "s3cret"), timeout=2).status_code == 200
            probes_answer_open = requests.get(base + "/-/ready", timeout=2)
            assert probes_answer_open.status_code == 200
    finally:
        stop_flag.set()
        stop(server)
    assert set(statuses) <= {401, 429}
    assert 429 in statuses          # the bounded queue refused some quickly instead of holding them
    assert 200 not in statuses


def test_refusals_are_counted_on_metrics(tmp_path):
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=10)).decode().replace("$2b$", "$2y$")
    p = tmp_path / "web.yml"
    p.write_text(f"basic_auth_users:\n  prom: '{hashed}'\n")
    server = serve(load_web_config(str(p)), Limits(auth_queue=1))
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        socks = open_idle(server.server_address[:2], 20)
        for i, s in enumerate(socks):
            s.sendall(f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: {basic('prom', f'g{i}')}\r\n\r\n".encode())
        codes = []
        for s in socks:
            s.settimeout(10)
            codes.append(int(s.recv(1024).split()[1]))
        close_all(socks)
        assert codes.count(429) >= 15 and set(codes) <= {401, 429}
        text = requests.get(base + "/metrics", auth=("prom", "s3cret"), timeout=10).text
        assert 'cachemon_http_refused_total{reason="auth_queue_full"}' in text
    finally:
        stop(server)


def test_tls_handshake_with_the_real_client_works_while_silent_connections_are_held(cert, tmp_path):
    # Over a raw TLS socket too, keep-alive: three requests on one TLS connection.
    server = serve(tls_web(cert, tmp_path))
    held = open_idle(server.server_address[:2], 50)
    try:
        ctx = ssl.create_default_context(cafile=str(cert / "c.pem"))
        with socket.create_connection(server.server_address[:2], timeout=5) as raw, \
                ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            for _ in nonempty(range(3)):
                s.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
                reply = b""
                while not reply.endswith(b"OK\n"):     # headers and body may come in two TLS records
                    chunk = s.recv(1024)
                    assert chunk, reply
                    reply += chunk
                assert reply.startswith(b"HTTP/1.1 200")
    finally:
        close_all(held)
        stop(server)


def test_a_bug_handling_one_connection_costs_that_connection_not_the_listener(monkeypatch, caplog):
    from cachemon.web import listener as H
    real = H.parse_request
    calls = {"n": 0}

    def parse_failing_once(head: bytes):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("constructed bug")
        return real(head)

    monkeypatch.setattr(H, "parse_request", parse_failing_once)
    server = serve()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        with pytest.raises(requests.ConnectionError):
            requests.get(base + "/-/healthy", timeout=2)
        probes_answer(base)
        assert any("constructed bug" in r.getMessage() for r in caplog.records)
    finally:
        stop(server)
