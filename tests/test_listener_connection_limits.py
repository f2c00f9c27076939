"""The listener under hostile or unlucky clients: idle, silent, trickling, vanishing, too many.

The server runs in-process with short deadlines (Limits) so each case ends in about a second;
the assertions are on what the server does (closes, serves, logs), not on how fast.
"""
from __future__ import annotations

import logging
import shutil
import socket
import ssl
import struct
import subprocess
import time
from collections.abc import Iterator

import pytest
import requests

from cachemon.expose.render import Family
from cachemon.web.web_config import WebConfig
from cachemon.web.workers import Limits, Registry, make_server, serve_in_thread
from helpers import self_signed_cert, wait_until

SHORT = Limits(handshake_timeout=0.5, request_timeout=0.8, write_timeout=2.0, max_connections=8)


class _Static:
    def __init__(self, samples: int = 3):
        self.samples = samples

    def collect(self) -> Iterator[Family]:
        f = Family("test_rows", "gauge", "Rows.")
        for i in range(self.samples):
            f.add(f'row="{i}"', float(i))
        yield f


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    return self_signed_cert(tmp_path_factory.mktemp("tls"))


def serve(limits: Limits = SHORT, web: WebConfig | None = None, samples: int = 3):
    reg = Registry()
    reg.register(_Static(samples))
    server = make_server("127.0.0.1", 0, reg, web, limits=limits)
    serve_in_thread(server)
    return server


def stop(server) -> None:
    server.shutdown()
    server.server_close()


def closed_by_server(sock: socket.socket, within: float) -> bool:
    """True once the server closes the connection (recv sees EOF or a reset)."""
    sock.settimeout(within)
    try:
        while sock.recv(4096):
            pass
        return True
    except (ConnectionResetError, ssl.SSLError):
        return True
    except TimeoutError:
        return False


def tls_context(cert) -> WebConfig:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert / "c.pem"), str(cert / "k.pem"))
    return WebConfig(ssl_context=ctx)


def test_idle_connection_is_closed_after_the_request_timeout():
    server = serve()
    try:
        with socket.create_connection(server.server_address[:2]) as s:
            assert closed_by_server(s, within=10)
    finally:
        stop(server)


@pytest.mark.slow
def test_trickling_client_is_cut_at_the_request_deadline_not_per_byte():
    # One byte every 0.2 s keeps each read under any per-read timeout; the deadline is for the
    # whole request (0.8 s), so the server must hang up long before the 40 bytes are sent.
    server = serve()
    try:
        with socket.create_connection(server.server_address[:2]) as s:
            sent = 0
            try:
                for b in b"GET /metrics HTTP/1.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaa":
                    s.sendall(bytes([b]))
                    sent += 1
                    time.sleep(0.2)
            except (BrokenPipeError, ConnectionResetError):
                pass
            assert closed_by_server(s, within=5)
            assert sent < 30
    finally:
        stop(server)


def test_keep_alive_serves_several_requests_on_one_connection():
    server = serve()
    try:
        with requests.Session() as sess:
            url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
            for _ in range(3):
                r = sess.get(url, timeout=5)
                assert r.status_code == 200 and 'test_rows{row="2"} 2.0' in r.text
            assert len(sess.get_adapter(url).poolmanager.pools) == 1
    finally:
        stop(server)


def test_silent_tls_client_is_dropped_at_the_handshake_deadline_with_one_log_line(cert, caplog):
    server = serve(web=tls_context(cert))
    try:
        with caplog.at_level(logging.DEBUG, logger="cachemon.http"), \
                socket.create_connection(server.server_address[:2]) as s:
            assert closed_by_server(s, within=10)
            assert wait_until(lambda: any("TLS handshake" in r.getMessage() for r in caplog.records), 5)
        lines = [r for r in caplog.records if "TLS handshake" in r.getMessage()]
        assert len(lines) == 1 and "timed out" in lines[0].getMessage()
        assert lines[0].exc_info is None
    finally:
        stop(server)


def test_plain_http_to_the_tls_port_logs_one_warning_not_a_traceback(cert, caplog, capfd):
    server = serve(web=tls_context(cert))
    try:
        with caplog.at_level(logging.DEBUG, logger="cachemon.http"):
            # Go answers 400 "Client sent an HTTP request to an HTTPS server" (issue 17 item 8)
            assert requests.get(f"http://127.0.0.1:{server.server_address[1]}/metrics", timeout=5).status_code == 400
            assert wait_until(lambda: any("TLS handshake" in r.getMessage() for r in caplog.records), 5)
        (line,) = [r for r in caplog.records if "TLS handshake" in r.getMessage()]
        assert line.levelno == logging.WARNING and line.exc_info is None
        assert "\n" not in line.getMessage()
        # a good client is still served afterwards
        r = requests.get(f"https://127.0.0.1:{server.server_address[1]}/metrics", verify=str(cert / "c.pem"),
                         timeout=5)
        assert r.status_code == 200
    finally:
        stop(server)
    assert "Traceback" not in capfd.readouterr().err


def test_client_that_vanishes_mid_reply_is_one_info_line(caplog, capfd):
    server = serve(samples=200_000)   # ~5 MB: more than the socket buffers hold
    try:
        with caplog.at_level(logging.DEBUG, logger="cachemon.http"):
            s = socket.create_connection(server.server_address[:2])
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            s.recv(1024)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))   # close with RST
            s.close()
            assert wait_until(lambda: any("ended" in r.getMessage() for r in caplog.records), 10)
        (line,) = [r for r in caplog.records if "ended" in r.getMessage()]
        assert line.levelno == logging.INFO and line.exc_info is None
    finally:
        stop(server)
    assert "Traceback" not in capfd.readouterr().err


def test_connections_beyond_the_limit_close_the_oldest_idle_one_not_the_new_one():
    # Issue 17: the limit is on open connections, not threads; a new client is always served.
    server = serve(Limits(max_connections=2, request_timeout=30))
    addr = server.server_address[:2]
    probe = b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n"
    held = []
    try:
        for _ in range(2):     # two keep-alive connections, each answered once, then idle
            s = socket.create_connection(addr, timeout=5)
            s.sendall(probe)
            assert s.recv(1024).startswith(b"HTTP/1.1 200")
            held.append(s)
        with socket.create_connection(addr, timeout=5) as third:
            third.sendall(probe)
            assert third.recv(1024).startswith(b"HTTP/1.1 200")
        assert closed_by_server(held[0], within=5)      # the one idle the longest made room
    finally:
        for s in held:
            s.close()
        stop(server)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("ss") is None, reason="ss (iproute2) is not installed")
def test_listen_backlog_is_sized_for_many_scrapers():
    server = serve()
    try:
        port = server.server_address[1]
        out = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True, timeout=10, check=False)
        if out.returncode != 0:
            pytest.skip(f"ss failed: {out.stderr.strip()}")
        # For a listening socket, ss reports the backlog as Send-Q (capped by net.core.somaxconn).
        _state, _recvq, sendq, *_ = out.stdout.split()
        with open("/proc/sys/net/core/somaxconn") as f:
            somaxconn = int(f.read())
        assert int(sendq) == min(SHORT.backlog, somaxconn) and int(sendq) > 5
    finally:
        stop(server)


def test_client_that_never_reads_the_reply_is_cut_at_the_write_deadline(caplog):
    server = serve(Limits(write_timeout=0.5), samples=200_000)   # ~5 MB: the send blocks once buffers fill
    try:
        with caplog.at_level(logging.DEBUG, logger="cachemon.http"), \
                socket.create_connection(server.server_address[:2]) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            assert wait_until(lambda: any("ended" in r.getMessage() for r in caplog.records), 10)
        (line,) = [r for r in caplog.records if "ended" in r.getMessage()]
        assert line.getMessage().endswith("reply not read within 0.5s") and line.exc_info is None
    finally:
        stop(server)
