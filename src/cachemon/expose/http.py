"""cachemon's own HTTP listener: /metrics, /-/healthy, /-/ready and a landing page."""
from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cachemon.expose.render import CONTENT_TYPE, render
from cachemon.expose.webconfig import WebConfig

log = logging.getLogger("cachemon.http")

class Registry:
    """The collectors served on /metrics (cachemon's own plus those of optional stages)."""

    def __init__(self):
        self.collectors: list = []

    def register(self, collector) -> None:
        self.collectors.append(collector)

    def render(self) -> bytes:
        return render(self.collectors)


_LANDING = b"""<html><head><title>cachemon</title></head><body>
<h1>cachemon</h1><p>vLLM prefix-cache exporter. <a href="/metrics">Metrics</a></p>
</body></html>
"""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def make_server(address: str, port: int, registry: Registry, web: WebConfig | None = None, ready=lambda: True):
    web_cfg = web or WebConfig()   # a non-optional name the handler's methods close over

    class Handler(BaseHTTPRequestHandler):
        server_version = "cachemon"

        def log_message(self, fmt, *args):   # quiet: Prometheus scrapes every 15 s
            log.debug("%s - %s", self.address_string(), fmt % args)

        def _send(self, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8", extra=()):
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for k, v in web_cfg.headers.items():
                self.send_header(k, v)
            for k, v in extra:
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_GET(self):
            if not web_cfg.authorized(self.headers.get("Authorization")):
                self._send(401, b"Unauthorized\n", extra=[("WWW-Authenticate", 'Basic realm="cachemon"')])
                return
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                try:
                    body = render(registry.collectors)
                except Exception as e:   # a collector bug must not take the listener down
                    log.exception("collect failed")
                    self._send(500, f"collect failed: {e}\n".encode())
                    return
                self._send(200, body, CONTENT_TYPE)
            elif path == "/-/healthy":
                self._send(200, b"OK\n")
            elif path == "/-/ready":
                self._send(200 if ready() else 503, b"OK\n" if ready() else b"not ready\n")
            elif path == "/":
                self._send(200, _LANDING, "text/html; charset=utf-8")
            else:
                self._send(404, b"Not Found\n")

        do_HEAD = do_GET

    try:
        server = _Server((address, port), Handler)
    except OSError as e:
        raise OSError(f"cannot listen on {address}:{port}: {e.strerror or e}") from e
    if web_cfg.ssl_context is not None:
        # Handshake in the handler thread, so one slow client cannot stall accept().
        server.socket = web_cfg.ssl_context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    return server


def serve_in_thread(server) -> threading.Thread:
    t = threading.Thread(target=server.serve_forever, name="cachemon-http", daemon=True)
    t.start()
    return t
