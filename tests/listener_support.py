"""One listener under test, shared by the listener tests: a registry with one constant row, served
on a free port of 127.0.0.1, and a raw exchange for what an HTTP client would not send."""
from __future__ import annotations

import socket
from collections.abc import Iterator

from cachemon.expose.render import Family
from cachemon.web.workers import Limits, Registry, Server, make_server, serve_in_thread


class StaticRows:
    def collect(self) -> Iterator[Family]:
        f = Family("test_rows", "gauge", "Rows.")
        f.add('row="1"', 1.0)
        yield f


# A refused credential is answered Limits.refusal_delay (1 s) late; tests/test_listener_password_flood.py
# tests that delay with limits of its own. Elsewhere a refusal's wait is only wall time, so the default here is short.
TEST_REFUSAL_DELAY = 0.05


def serve(web=None, limits: Limits | None = None) -> Server:
    reg = Registry()
    reg.register(StaticRows())
    server = make_server("127.0.0.1", 0, reg, web, limits=limits or Limits(refusal_delay=TEST_REFUSAL_DELAY))
    serve_in_thread(server)
    return server


def stop(server: Server) -> None:
    server.shutdown()
    server.server_close()


def raw_exchange(port: int, data: bytes, wait: float = 1.0) -> bytes:
    """Send raw bytes, read until the peer closes or is silent for ``wait`` seconds."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        s.settimeout(wait)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except TimeoutError:
            pass
    return out
