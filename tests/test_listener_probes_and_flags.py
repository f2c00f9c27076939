"""/-/healthy and /-/ready semantics, IPv6 / dual-stack listening, and the exporter-toolkit flags."""
from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from cachemon.daemon import Daemon
from cachemon.demo.replay import bundled_pages
from cachemon.runconfig import build_config
from helpers import free_port, samples, value, wait_until


class GatedUpstream:
    """A vLLM /metrics that answers only once `gate` is set: the first poll stays in flight."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        page = bundled_pages()[1][1].encode()
        gate = self.gate

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                gate.wait(30)
                body = page if self.path == "/metrics" else b"{}"
                self.send_response(200 if self.path == "/metrics" else 404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"

    def close(self) -> None:
        self.gate.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def test_ready_only_after_every_upstream_was_polled_once_even_if_it_failed():
    gated = GatedUpstream()
    refused = f"http://127.0.0.1:{free_port()}/metrics"     # nothing listens: the poll fails at once
    cfg = build_config(None, (f"slow={gated.url}", f"down={refused}"), "127.0.0.1:0", "100ms", (), None, None)
    daemon = Daemon(cfg)
    try:
        daemon.start()
        base = f"http://127.0.0.1:{daemon.port}"
        assert wait_until(lambda: daemon.store.upstreams["down"].scrapes > 0, 10)
        r = requests.get(base + "/-/ready", timeout=5)
        assert r.status_code == 503 and r.text == "not ready: first poll pending\n"
        assert requests.get(base + "/-/healthy", timeout=5).status_code == 200     # alive all along
        gated.gate.set()
        assert wait_until(lambda: requests.get(base + "/-/ready", timeout=5).status_code == 200, 10)
        # Ready does not mean "vLLM is up": the refused upstream is still down.
        m = samples(requests.get(base + "/metrics", timeout=5).text)
        assert value(m, "cachemon_upstream_up", upstream="down") == 0
        assert value(m, "cachemon_upstream_up", upstream="slow") == 1
    finally:
        daemon.shutdown()
        gated.close()


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


needs_ipv6 = pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback on this machine")


def spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cachemon.cli", "run", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def healthy(url: str) -> bool:
    try:
        return requests.get(url, timeout=1).status_code == 200
    except requests.RequestException:
        return False


def stop(proc: subprocess.Popen) -> str:
    proc.terminate()
    try:
        return proc.communicate(timeout=10)[1]
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate(timeout=5)[1]


def free_port6() -> int:
    with socket.socket(socket.AF_INET6) as s:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        s.bind(("::", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@needs_ipv6
@pytest.mark.parametrize("host,ipv4_too", [("::1", False), ("::", True)])
def test_ipv6_and_dual_stack_addresses(host, ipv4_too):
    port = free_port6()
    proc = spawn("--web.listen-address", f"[{host}]:{port}", "--upstream", f"http://127.0.0.1:{free_port()}/metrics")
    try:
        assert wait_until(lambda: healthy(f"http://[::1]:{port}/-/healthy"), 20)
        assert "cachemon_upstream_up" in requests.get(f"http://[::1]:{port}/metrics", timeout=5).text
        assert healthy(f"http://127.0.0.1:{port}/-/healthy") == ipv4_too     # [::1] is IPv6 only; [::] both
    finally:
        log = stop(proc)
    assert f"http://[{host}]:{port}/metrics" in log


@pytest.mark.slow
def test_two_listen_addresses_are_a_config_error():
    r = subprocess.run([sys.executable, "-m", "cachemon.cli", "run", "--listen", "127.0.0.1:0",
                        "--web.listen-address", "127.0.0.1:0"], capture_output=True, text=True, timeout=30, check=False)
    assert r.returncode == 2
    assert r.stderr.strip() == ("cachemon: config error: --web.listen-address: give one address; "
                                "[::]:PORT listens on IPv6 and IPv4")


@pytest.mark.slow
def test_log_level_warn_and_json_format():
    port = free_port()
    proc = spawn("--web.listen-address", f"127.0.0.1:{port}", "--upstream", f"down=http://127.0.0.1:{free_port()}/metrics",
                 "--log.level", "warn", "--log.format", "json")
    try:
        assert wait_until(lambda: healthy(f"http://127.0.0.1:{port}/-/ready"), 20)
    finally:
        log = stop(proc)
    records = [json.loads(line) for line in log.splitlines()]
    assert records, log
    assert {r["level"] for r in records} <= {"warn", "error"}          # no info: "serving on" is filtered
    assert any(r["logger"] == "cachemon.upstream" and "down" in r["msg"] for r in records)
    assert all(set(r) >= {"ts", "level", "logger", "msg"} for r in records)


@pytest.mark.slow
def test_default_log_format_is_logfmt():
    port = free_port()
    proc = spawn("--listen", f"127.0.0.1:{port}", "--upstream", f"http://127.0.0.1:{free_port()}/metrics")
    try:
        assert wait_until(lambda: healthy(f"http://127.0.0.1:{port}/-/ready"), 20)
    finally:
        log = stop(proc)
    line = next(ln for ln in log.splitlines() if "serving on" in ln)
    assert re.match(r'^ts=\S+Z level=info logger=cachemon msg="cachemon serving on http://127\.0\.0\.1:\d+/metrics;',
                    line), line


@pytest.mark.slow
def test_exporter_toolkit_flag_names_work_beside_the_old_ones(tmp_path):
    web = tmp_path / "web.yml"
    web.write_text("http_server_config:\n  headers:\n    X-Frame-Options: deny\n")
    port = free_port()
    proc = spawn("--web.listen-address", f"127.0.0.1:{port}", "--web.config.file", str(web), "--log.level", "WARN",
                 "--upstream", f"http://127.0.0.1:{free_port()}/metrics")
    try:
        assert wait_until(lambda: healthy(f"http://127.0.0.1:{port}/-/healthy"), 20)
        assert requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).headers["X-Frame-Options"] == "deny"
    finally:
        stop(proc)


def test_dual_stack_falls_back_to_ipv4_when_the_kernel_has_no_ipv6(monkeypatch):
    import errno
    import socketserver

    from cachemon.web.workers import Registry, make_server

    real = socket.socket

    def no_ipv6(family=socket.AF_INET, *args, **kwargs):
        if family == socket.AF_INET6:
            raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol")
        return real(family, *args, **kwargs)

    monkeypatch.setattr(socketserver.socket, "socket", no_ipv6)
    server = make_server("::", 0, Registry())
    monkeypatch.undo()
    try:
        assert server.address_family == socket.AF_INET and server.server_address[0] == "0.0.0.0"
    finally:
        server.server_close()
