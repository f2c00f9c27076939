"""Issue 38 (round 6): `cachemon check` and `cachemon warmup` under SIGTERM end with one line on
stderr and exit code 143 (128 + 15, as a shell reports it); on 74d8045 they died by the signal
(returncode -15) without a word. The server serves a real vLLM 0.32.0 /metrics page and the real
static-system-prompt requests are the prompts; its completions never answer (constructed: a server
busy for longer than the test waits)."""
from __future__ import annotations

import signal
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from helpers import eventually

pytestmark = pytest.mark.slow

REAL_032 = Path(__file__).resolve().parent / "fixtures" / "vllm-0.32.0-cpu"


class SlowVllm:
    """/metrics and /v1/models answer at once; a completion waits until the test ends."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.release = threading.Event()
        owner = self
        page = (REAL_032 / "metrics-idle.txt").read_bytes()

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _send(self, body: bytes, ctype: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                owner.seen.append("GET " + self.path)
                if self.path == "/hang/metrics":
                    owner.release.wait(60)
                elif self.path == "/v1/models":
                    self._send(b'{"object": "list", "data": [{"id": "tiny"}]}', "application/json")
                else:
                    self._send(page, "text/plain; version=0.0.4")

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                owner.seen.append("POST " + self.path)
                owner.release.wait(60)

        class S(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                pass

        self.httpd = S(("127.0.0.1", 0), H)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("case", ["check", "check-hanging-read", "warmup"])
def test_sigterm_ends_a_one_shot_command_with_one_line_and_143(tmp_path, case):
    server = SlowVllm()
    command = case.split("-")[0]
    args = {"check": ["check", "--upstream", server.url + "/metrics", "--interval", "60s"],
            "check-hanging-read": ["check", "--upstream", server.url + "/hang/metrics", "--timeout", "60s"],
            "warmup": ["warmup", "--api", server.url, "--prompts",
                       str(REAL_032 / "requests-static-system-prompt.jsonl"), "--force", "--timeout", "60s"]}[case]
    proc = subprocess.Popen([sys.executable, "-m", "cachemon.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        # in the middle of its work: between its two reads or in a read (check), a completion waiting (warmup)
        busy = {"check": "GET /metrics", "check-hanging-read": "GET /hang/", "warmup": "POST /v1/"}[case]
        eventually(lambda: any(s.startswith(busy) for s in server.seen), 30, f"{case} at work")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
        assert proc.returncode == 143, (proc.returncode, err)
        lines = err.strip().splitlines()
        assert lines and lines[-1].startswith(f"cachemon {command}: stopped by SIGTERM"), err
        assert "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
        server.close()
