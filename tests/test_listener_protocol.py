
"""The event-loop listener's HTTP/1.1 handling, byte for byte over raw sockets: pipelining, HEAD,
methods, oversized or malformed heads, HTTP/1.0. Requests here are constructed."""
from __future__ import annotations

import re

import pytest

from assert_support import nonempty
from cachemon.web.workers import Limits
from listener_support import raw_exchange, serve


def status_lines(out: bytes) -> list[bytes]:
    return re.findall(rb"HTTP/1\.1 \d{3} [A-Za-z ]+(?=\r\n)", out)


@pytest.mark.slow
def test_pipelined_requests_are_answered_in_order():
    server = serve()
    try:
        out = raw_exchange(server.server_address[1],
                           b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\nGET /nope HTTP/1.1\r\nHost: x\r\n\r\n"
                           b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status_lines(out) == [b"HTTP/1.1 200 OK", b"HTTP/1.1 404 Not Found", b"HTTP/1.1 200 OK"]
        assert out.endswith(b'test_rows{row="1"} 1.0\n')
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow
def test_head_has_the_headers_but_no_body_and_other_methods_get_405():
    server = serve()
    try:
        out = raw_exchange(server.server_address[1], b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 200") and out.endswith(b"\r\n\r\n") and b"Content-Length: " in out
        out = raw_exchange(server.server_address[1], b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 405") and b"Allow: GET, HEAD" in out
    finally:
        server.shutdown()
        server.server_close()


def test_malformed_or_oversized_heads_get_a_4xx_and_the_connection_ends():
    server = serve(limits=Limits(max_header_bytes=1024))
    try:
        cases = {
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 2000 + b"\r\n\r\n": b"431",
            b"GET /metrics HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n": b"400",
            b"GET /metrics HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n": b"400",
            b"GET /metrics HTTP/1.1\r\nContent-Length: -1\r\n\r\n": b"400",
            b"GET /metrics HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n": b"400",
            b"GET /metrics HTTP/2.0\r\n\r\n": b"505",
        }
        for request, code in nonempty(cases.items()):
            out = raw_exchange(server.server_address[1], request, wait=3)
            assert out.startswith(b"HTTP/1.1 " + code), (request[:60], out[:60])
            assert b"Connection: close" in out
    finally:
        server.shutdown()
        server.server_close()


def test_http_1_0_gets_one_reply_then_close():
    server = serve()
    try:
        out = raw_exchange(server.server_address[1], b"GET /-/healthy HTTP/1.0\r\n\r\n", wait=3)
        assert out.startswith(b"HTTP/1.1 200") and b"Connection: close" in out and out.endswith(b"OK\n")
    finally:
        server.shutdown()
        server.server_close()
