"""Issue 17 item 7: the web config file is re-read like exporter-toolkit's (users per request,
TLS per connection), SIGHUP does not kill the process, and only exporter-toolkit's security
headers may be set."""
from __future__ import annotations

import signal
import socket
import ssl
import subprocess
import sys
import threading

import bcrypt
import pytest
import requests

from cachemon.config import ConfigError
from cachemon.web.web_config import load_web_config
from helpers import eventually, free_port, self_signed_cert, wait_until
from listener_support import serve, stop


def hashed(pw: bytes) -> str:
    return bcrypt.hashpw(pw, bcrypt.gensalt(rounds=4)).decode().replace("$2b$", "$2y$")


def test_a_changed_password_hash_takes_effect_on_the_next_request(tmp_path):
    p = tmp_path / "web.yml"
    p.write_text(f"basic_auth_users:\n  prom: '{hashed(b'old')}'\n")
    server = serve(load_web_config(str(p)))
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    try:
        with requests.Session() as s:
            assert s.get(url, auth=("prom", "old"), timeout=5).status_code == 200
            p.write_text(f"basic_auth_users:\n  prom: '{hashed(b'new')}'\n")
            # the same keep-alive connection, the next request: the old password stops working
            assert s.get(url, auth=("prom", "old"), timeout=5).status_code == 401
            assert s.get(url, auth=("prom", "new"), timeout=5).status_code == 200
    finally:
        stop(server)


def test_a_broken_rewrite_fails_closed_for_metrics_and_recovers(tmp_path, caplog):
    p = tmp_path / "web.yml"
    p.write_text(f"basic_auth_users:\n  prom: '{hashed(b'pw')}'\n")
    server = serve(load_web_config(str(p)))
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        p.write_text("basic_auth_users:\n  prom: plaintext\n")
        # exporter-toolkit answers 500 when the file cannot be read (web/handler.go ServeHTTP)
        assert requests.get(base + "/metrics", auth=("prom", "pw"), timeout=5).status_code == 500
        assert requests.get(base + "/-/healthy", timeout=5).status_code == 200
        assert any("basic_auth_users.prom" in r.getMessage() for r in caplog.records)
        p.write_text(f"basic_auth_users:\n  prom: '{hashed(b'pw')}'\n")
        assert requests.get(base + "/metrics", auth=("prom", "pw"), timeout=5).status_code == 200
    finally:
        stop(server)


def served_cert(port: int) -> bytes:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, ctx.wrap_socket(raw) as s:
        der = s.getpeercert(binary_form=True)
    assert der is not None
    return der


@pytest.mark.slow
def test_a_changed_certificate_is_served_on_the_next_connection(tmp_path):
    a = self_signed_cert((tmp_path / "a").mkdir() or tmp_path / "a")
    b = self_signed_cert((tmp_path / "b").mkdir() or tmp_path / "b")
    live = tmp_path / "live"
    live.mkdir()
    (live / "c.pem").write_bytes((a / "c.pem").read_bytes())
    (live / "k.pem").write_bytes((a / "k.pem").read_bytes())
    p = tmp_path / "web.yml"
    p.write_text("tls_server_config:\n  cert_file: live/c.pem\n  key_file: live/k.pem\n")
    server = serve(load_web_config(str(p)))
    port = server.server_address[1]
    try:
        first = served_cert(port)
        assert first == ssl.PEM_cert_to_DER_cert((a / "c.pem").read_text())
        (live / "c.pem").write_bytes((b / "c.pem").read_bytes())
        (live / "k.pem").write_bytes((b / "k.pem").read_bytes())
        assert served_cert(port) == ssl.PEM_cert_to_DER_cert((b / "c.pem").read_text())
        r = requests.get(f"https://127.0.0.1:{port}/metrics", verify=str(b / "c.pem"), timeout=5)
        assert r.status_code == 200
    finally:
        stop(server)


@pytest.mark.slow
def test_sighup_reloads_with_a_log_line_and_does_not_kill_the_process(tmp_path):
    p = tmp_path / "web.yml"
    p.write_text(f"basic_auth_users:\n  prom: '{hashed(b'pw')}'\n")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "cachemon.cli", "run", "--listen", f"127.0.0.1:{port}",
                             "--web-config-file", str(p)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}/-/healthy"

        def up() -> bool:
            try:
                return requests.get(url, timeout=1).status_code == 200
            except requests.RequestException:
                return False
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
        reader.start()
        assert wait_until(up, 20)
        proc.send_signal(signal.SIGHUP)
        eventually(lambda: any("SIGHUP" in line for line in lines), 10, "the reload's log line")
        assert proc.poll() is None, "SIGHUP killed the process"
        assert up()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        reader.join(timeout=10)


@pytest.mark.parametrize("header", ["Content-Length: '0'", "Transfer-Encoding: chunked", "X-Test: x",
                                    "X-Frame-Options: allow", "X-Content-Type-Options: sniff"])
def test_only_exporter_toolkits_security_headers_may_be_set(tmp_path, header):
    p = tmp_path / "web.yml"
    p.write_text(f"http_server_config:\n  headers:\n    {header}\n")
    with pytest.raises(ConfigError) as e:
        load_web_config(str(p))
    assert e.value.key.startswith("web_config.http_server_config.headers")
    assert "\n" not in str(e.value)


def test_exporter_toolkits_security_headers_are_sent(tmp_path):
    p = tmp_path / "web.yml"
    p.write_text("http_server_config:\n  headers:\n    X-Frame-Options: deny\n    X-Content-Type-Options: nosniff\n"
                 "    Content-Security-Policy: default-src 'none'\n    Strict-Transport-Security: max-age=31536000\n"
                 "    X-XSS-Protection: '1; mode=block'\n")
    server = serve(load_web_config(str(p)))
    try:
        r = requests.get(f"http://127.0.0.1:{server.server_address[1]}/metrics", timeout=5)
        assert r.headers["X-Frame-Options"] == "deny" and r.headers["X-Content-Type-Options"] == "nosniff"
        assert r.headers["Content-Security-Policy"] == "default-src 'none'"
        assert r.headers["X-XSS-Protection"] == "1; mode=block"
    finally:
        stop(server)
