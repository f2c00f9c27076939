"""The demo's Alertmanager receiver: takes Alertmanager's webhook JSON and prints one line per alert.

examples/alertmanager.yml's webhook posts here: `cachemon demo --alert-webhook 0.0.0.0:5001` in the
compose demo (deploy/compose/demo.yaml, the `cachemon` service), scripts/demo_stack.py's own listener on
the host (`make demo-stack`). Alertmanager's payload carries the rules' labels and annotations only
(names, thresholds, causes), never prompt text.
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cachemon.jsontypes import JsonObject


def notification_lines(payload: dict[str, Any], received: float) -> list[str]:
    """One line per alert of an Alertmanager webhook payload (version 4), with the receiving time (UTC)."""
    at = time.strftime("%H:%M:%S", time.gmtime(received))
    out = []
    for a in payload.get("alerts", []):
        lab, ann = a.get("labels", {}), a.get("annotations", {})
        out.append(f"NOTIFICATION {a.get('status')}: {lab.get('alertname')} ({lab.get('severity')}) "
                   f"upstream={lab.get('upstream')} model={lab.get('model_name')}: "
                   f"{ann.get('description', ann.get('summary', ''))} [received {at} UTC]")
    return out


class AlertWebhook:
    """Listens on ``host:port`` (0: any free port); every POST's alerts go to ``say``, one line each.
    A body that is not JSON gets 400 and one line that says so."""

    def __init__(self, host: str, port: int, say: Callable[[str], None]) -> None:
        self.received: list[JsonObject] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
                try:
                    body = json.loads(raw or b"{}")
                    if not isinstance(body, dict):
                        raise ValueError("not a JSON object")
                except ValueError as e:
                    say(f"NOTIFICATION not understood ({len(raw)} bytes from {self.client_address[0]}: {e})")
                    self.send_response(400)
                else:
                    owner.received.append(body)
                    for line in notification_lines(body, time.time()):
                        say(line)
                    self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="alert-webhook", daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
