"""Issue 17 item 8: secrets and output hygiene (urllib3's debug log, upstream reason phrases,
`check`'s text output, error pages, GET bodies, the basic scheme's case, plain HTTP on the TLS port).

The upstreams here are constructed: a raw socket server answering one fixed status line.
"""
from __future__ import annotations

import base64
import logging
import socket
import threading

import bcrypt
import pytest
import requests
from click.testing import CliRunner

from assert_support import nonempty
from cachemon.check import check_command, render_text
from cachemon.demo.replay import ReplayServer, bundled_pages
from cachemon.sources.scrape import FetchError, fetch_text
from cachemon.web.web_config import load_web_config
from helpers import CachemonProcess, eventually, self_signed_cert
from listener_support import raw_exchange, serve, stop

SECRET = "tok3n-s3cret-value"


class FixedStatusUpstream:
    """Constructed upstream: answers every request with one raw status line (a hostile reason phrase)."""

    def __init__(self, status_line: bytes):
        self.status_line = status_line
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    conn.recv(65536)
                    conn.sendall(self.status_line + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def echoing_upstream():
    up = FixedStatusUpstream(f"HTTP/1.1 403 bad token {SECRET}\r\x1b]0;pwned\x07 fake".encode())
    yield up
    up.close()


def test_urllib3_debug_log_shows_the_query_redacted(caplog):
    with ReplayServer(bundled_pages()) as replay, caplog.at_level(logging.DEBUG):
        fetch_text(None, replay.url + f"?token={SECRET}", 5, 1 << 24)
    messages = [r.getMessage() for r in caplog.records]
    assert any("/metrics?token=xxxxx" in m for m in messages), messages
    assert not any(SECRET in m for m in messages)


def test_a_reason_phrase_echoing_the_token_is_scrubbed_and_cleaned(echoing_upstream):
    with pytest.raises(FetchError) as e:
        fetch_text(None, f"http://127.0.0.1:{echoing_upstream.port}/metrics?token={SECRET}", 5, 1 << 20)
    msg = str(e.value)
    assert e.value.reason == "http_status" and "HTTP 403" in msg
    assert SECRET not in msg
    assert "\x1b" not in msg and "\r" not in msg and "\x07" not in msg and msg.isprintable()


def test_check_text_shows_no_secret_and_no_raw_control_characters(echoing_upstream):
    url = f"http://user:{SECRET}@127.0.0.1:{echoing_upstream.port}/metrics"
    r = CliRunner().invoke(check_command, ["--upstream", url, "--interval", "0", "--timeout", "2s"])
    assert r.exit_code == 3
    assert SECRET not in r.output
    assert "\x1b" not in r.output and "\r" not in r.output and "\x07" not in r.output


def test_check_text_escapes_control_characters_from_any_upstream_field():
    # constructed report: a model name and a message carrying CR, LF and a terminal title escape
    report = {"exit_code": 1, "sources": [{
        "kind": "metrics", "name": "a", "url": "http://h/metrics", "up": False,
        "findings": [{"severity": "warning", "code": "x", "message": "ok\r\nFAKE LINE\x1b]0;title\x07"}]}]}
    text = render_text(report)
    assert text.count("\n") == 2
    assert "\x1b" not in text and "\r" not in text and "\\x1b" in text


@pytest.mark.slow
def test_error_pages_do_not_disclose_the_python_version():
    server = serve()
    try:
        port = server.server_address[1]
        for bad in (b"GARBAGE\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n", b"BREW /metrics HTTP/1.1\r\nHost: x\r\n\r\n"):
            out = raw_exchange(port, bad)
            assert out.startswith(b"HTTP/1.1 4") or out.startswith(b"HTTP/1.1 5"), out[:40]
            assert b"Python" not in out
        assert "Python" not in requests.get(f"http://127.0.0.1:{port}/nope", timeout=5).headers.get("Server", "")
    finally:
        stop(server)


@pytest.mark.slow
def test_a_get_body_holding_a_second_request_gets_one_response():
    server = serve()
    try:
        inner = b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n"
        outer = b"GET /-/ready HTTP/1.1\r\nHost: x\r\nContent-Length: " + str(len(inner)).encode() + b"\r\n\r\n"
        out = raw_exchange(server.server_address[1], outer + inner)
        assert out.count(b"HTTP/1.1 ") == 1, out
        assert out.startswith(b"HTTP/1.1 200")
        # a chunked body is not read: the connection is closed after the reply
        chunked = b"GET /-/ready HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" \
                  + hex(len(inner))[2:].encode() + b"\r\n" + inner + b"\r\n0\r\n\r\n"
        assert raw_exchange(server.server_address[1], chunked).count(b"HTTP/1.1 ") == 1
    finally:
        stop(server)


def test_lowercase_basic_scheme_is_accepted(tmp_path):
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode().replace("$2b$", "$2y$")
    p = tmp_path / "web.yml"
    p.write_text(f"basic_auth_users:\n  prom: '{hashed}'\n")
    server = serve(load_web_config(str(p)))
    try:
        token = base64.b64encode(b"prom:pw").decode()
        for scheme in nonempty(("basic", "BASIC", "Basic")):
            r = requests.get(f"http://127.0.0.1:{server.server_address[1]}/metrics",
                             headers={"Authorization": f"{scheme} {token}"}, timeout=5)
            assert r.status_code == 200, scheme
    finally:
        stop(server)


@pytest.mark.slow
def test_plain_http_to_the_tls_port_gets_a_400(tmp_path, caplog):
    cert = self_signed_cert(tmp_path)
    p = tmp_path / "web.yml"
    p.write_text(f"tls_server_config:\n  cert_file: {cert / 'c.pem'}\n  key_file: {cert / 'k.pem'}\n")
    server = serve(load_web_config(str(p)))
    try:
        with caplog.at_level(logging.INFO, logger="cachemon.http"):
            r = requests.get(f"http://127.0.0.1:{server.server_address[1]}/metrics", timeout=5)
        assert r.status_code == 400
        assert "HTTP request to an HTTPS server" in r.text
        (line,) = [r for r in caplog.records if "TLS handshake" in r.getMessage()]
        assert line.exc_info is None and "\n" not in line.getMessage()
    finally:
        stop(server)


@pytest.mark.slow
def test_last_error_info_has_the_reason_and_the_log_the_scrubbed_phrase(echoing_upstream):
    url = f"http://127.0.0.1:{echoing_upstream.port}/metrics?token={SECRET}"
    cm = CachemonProcess("--upstream", f"echo={url}", "--poll-interval", "1s")
    try:
        def page_with_the_error() -> str:
            text = cm.text()
            return text if "cachemon_upstream_last_error_info" in text else ""

        text = eventually(page_with_the_error, 10, "cachemon_upstream_last_error_info on the page", interval=0.1)
        (line,) = [x for x in text.splitlines() if x.startswith("cachemon_upstream_last_error_info")]
        # bounded labels only: the reason; the error's text goes to cachemon's log
        assert 'reason="http_status"' in line and "message=" not in line
        assert SECRET not in text and "\x1b" not in text and "\x07" not in text
    finally:
        out = cm.stop()
    assert SECRET not in out and "HTTP 403 bad token xxxxx" in out
