"""A local HTTP server that plays back recorded vLLM pages.

Used by `cachemon demo`, by the tests and by the integration checks with a real
Prometheus. It serves ``/metrics`` (the current page), ``/version`` and ``/v1/models``
like a vLLM OpenAI server, and can misbehave on purpose (``fault``) so the
exporter's error handling can be tested against real sockets.
"""
from __future__ import annotations

import base64
import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from io import BufferedIOBase
from pathlib import Path
from typing import Any

from cachemon.jsontypes import JsonObject

log = logging.getLogger("cachemon.demo")

DEMO_SCENARIOS = ("idle", "static-system-prompt", "timestamp-in-system-prompt", "request-id-at-head")

FAULTS = ("http500", "garbage", "truncated", "slow", "huge", "hang", "html", "trickle", "trickle_headers")
# trickle*: 5 bytes a second (every read returns something, so only a whole-transfer
# deadline ends the poll), of the body or of the status line and headers.
TRICKLE_BYTES_PER_S = 5


def bundled_pages() -> list[tuple[str, str]]:
    """(scenario, page) of the real vLLM 0.32.0 captures shipped in the package, in traffic order."""
    base = resources.files("cachemon") / "data" / "captures" / "vllm-0.32.0-cpu"
    return [(s, (base / f"metrics-{s}.txt").read_text(encoding="utf-8")) for s in DEMO_SCENARIOS]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    owner: ReplayServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hung up mid-response (a scrape timed out, Ctrl-C) is no error of the fake
        # vLLM: no traceback in the demo's terminal. Anything else keeps the default's.
        if isinstance(sys.exc_info()[1], ConnectionError):
            log.debug("replay: %s left: %s", client_address, sys.exc_info()[1])
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    """vLLM's GET endpoints as the replay serves them: /version, /v1/models and /metrics (with its fault)."""
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, code: int, body: bytes, ctype: str = "text/plain; version=0.0.4; charset=utf-8",
              length: int | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        owner = self.server.owner
        with owner.lock:
            owner.requests += 1
            fault = owner.fault
            _name, page = owner.pages[owner.index] if owner.live is None else owner.live()
            version, models = owner.version, owner.models
            owner.requested[self.path.split("?", 1)[0]] = self.path
        if owner.authorization and self.headers.get("Authorization") != owner.authorization:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="vllm"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        path = self.path.split("?", 1)[0]
        if path == "/version" and version is not None:
            self._send(200, json.dumps({"version": version}).encode(), "application/json")
        elif path == "/v1/models":
            data = {"object": "list", "data": [dict({"object": "model", "owned_by": "vllm"}, **m) for m in models]}
            self._send(200, json.dumps(data).encode(), "application/json")
        elif path != "/metrics":
            self._send(404, b'{"detail":"Not Found"}', "application/json")
        else:
            self._metrics(fault, page.encode())

    def _metrics(self, fault: str | None, body: bytes) -> None:
        """The page, or the fault the test set: an error, garbage, a cut, a slow or stalled body, a huge one."""
        if fault == "http500":
            self._send(500, b"Internal Server Error")
        elif fault == "garbage":
            self._send(200, b"\x00\x01\x02 this is not an exposition \xff\n")
        elif fault == "html":
            self._send(200, b"<html><body>login</body></html>\n", "text/html")
        elif fault == "truncated":
            # Declares the full length, sends half, closes: a cut connection.
            self._send(200, body[: len(body) // 2], length=len(body))
            self.close_connection = True
        elif fault == "slow":
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            for i in range(0, len(body), 512):
                self.wfile.write(body[i:i + 512])
                self.wfile.flush()
                time.sleep(0.05)
        elif fault in ("trickle", "trickle_headers"):
            head = (f"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n").encode()
            if fault == "trickle":
                self.wfile.write(head)
                self.server.owner._trickle(self.wfile, body)
            else:
                self.server.owner._trickle(self.wfile, head + body)
            self.close_connection = True
        elif fault == "hang":
            time.sleep(30)
        else:
            self._send(200, body * 400 if fault == "huge" else body)


class ReplayServer:
    def __init__(self, pages: list[tuple[str, str]], host: str = "127.0.0.1", port: int = 0,
                 version: str | None = "0.32.0", models: list[JsonObject] | None = None,
                 basic_auth: tuple[str, str] | None = None):
        self.pages = list(pages)
        self.index = 0
        self.version = version
        self.models = models if models is not None else [{"id": "tiny", "root": "/models/tiny", "max_model_len": 4096}]
        self.fault: str | None = None
        self.live: Callable[[], tuple[str, str]] | None = None   # (scenario, page) now: the demo's traffic
        self.requests = 0
        # (user, password) every request must carry as basic auth; None: no auth
        self.authorization = None if basic_auth is None else \
            "Basic " + base64.b64encode(":".join(basic_auth).encode()).decode()
        self.requested: dict[str, str] = {}     # path -> the last request target for it (with its query)
        self.lock = threading.Lock()
        self.httpd = _Server((host, port), _Handler)
        self.httpd.owner = self
        self.thread: threading.Thread | None = None

    def _trickle(self, out: BufferedIOBase, data: bytes) -> None:
        """Send ``data`` a few bytes at a time until done, the fault changes or the client leaves."""
        # one byte at a time: a read never waits long, whatever its timeout
        for i in range(len(data)):
            with self.lock:
                if self.fault not in ("trickle", "trickle_headers"):
                    return
            try:
                out.write(data[i:i + 1])
                out.flush()
            except OSError:
                return
            time.sleep(1.0 / TRICKLE_BYTES_PER_S)

    @property
    def url(self) -> str:
        host, port = str(self.httpd.server_address[0]), self.httpd.server_address[1]
        return f"http://{host}:{port}/metrics"

    @property
    def base_url(self) -> str:
        host, port = str(self.httpd.server_address[0]), self.httpd.server_address[1]
        return f"http://{host}:{port}"

    @property
    def scenario(self) -> str:
        return self.pages[self.index][0] if self.live is None else self.live()[0]

    def show(self, index: int) -> None:
        with self.lock:
            self.index = index % len(self.pages)

    def serve(self, page: str, name: str = "page") -> None:
        """Serve this one page from now on (tests that script an upstream page by page)."""
        with self.lock:
            self.pages, self.index = [(name, page)], 0

    def advance(self) -> str:
        with self.lock:
            self.index = (self.index + 1) % len(self.pages)
            return self.pages[self.index][0]

    def set_fault(self, fault: str | None) -> None:
        assert fault is None or fault in FAULTS, fault
        with self.lock:
            self.fault = fault

    def start(self) -> ReplayServer:
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="replay", daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> ReplayServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def load_pages(paths: list[str]) -> list[tuple[str, str]]:
    return [(Path(p).stem, Path(p).read_text(encoding="utf-8")) for p in paths]


def main(argv: list[str] | None = None) -> None:   # `python -m cachemon.demo.replay PAGE... --port N --dwell S`
    import argparse
    ap = argparse.ArgumentParser(prog="python -m cachemon.demo.replay", description=__doc__)
    ap.add_argument("pages", nargs="*", help="exposition files to serve in order (default: the bundled 0.32.0 captures)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=18000)
    ap.add_argument("--dwell", type=float, default=0, help="seconds per page; 0 = stay on the first page")
    ap.add_argument("--loop", action="store_true", help="start over after the last page (looks like a restart)")
    args = ap.parse_args(argv)
    srv = ReplayServer(load_pages(args.pages) if args.pages else bundled_pages(), args.host, args.port).start()
    print(f"replaying on {srv.url}", flush=True)
    try:
        while True:
            if args.dwell > 0:
                time.sleep(args.dwell)
                if srv.index == len(srv.pages) - 1 and not args.loop:
                    continue
                srv.advance()
            else:
                time.sleep(3600)
    except KeyboardInterrupt:
        srv.stop()


if __name__ == "__main__":
    main()
