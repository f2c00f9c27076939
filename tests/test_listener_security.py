"""The listener: TLS and basic auth from an exporter-toolkit web-config file, and its errors."""
from __future__ import annotations

import subprocess
import sys

import bcrypt
import pytest
import requests

from cachemon.config import ConfigError
from cachemon.demo.replay import ReplayServer, bundled_pages
from cachemon.web.web_config import load_web_config
from helpers import CachemonProcess, eventually, free_port, self_signed_cert


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    return self_signed_cert(tmp_path_factory.mktemp("tls"))


@pytest.mark.slow
def test_tls_and_basic_auth(cert, tmp_path):
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode().replace("$2b$", "$2y$")
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {cert / 'c.pem'}\n  key_file: {cert / 'k.pem'}\n"
                   f"basic_auth_users:\n  prom: '{hashed}'\n")
    with ReplayServer(bundled_pages()) as replay:
        # CachemonProcess probes plain HTTP; start by hand and probe over TLS.
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "cachemon.cli", "run", "--listen", f"127.0.0.1:{port}",
                                 "--upstream", replay.url, "--web-config-file", str(web)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            url = f"https://127.0.0.1:{port}/metrics"
            (r,) = eventually(lambda: [requests.get(url, verify=str(cert / "c.pem"), auth=("prom", "s3cret"),
                                                    timeout=2)],     # any reply: its status is asserted below
                              10, "cachemon serving TLS", interval=0.1, ignore=(requests.ConnectionError,))
            assert r.status_code == 200 and "cachemon_upstream_up" in r.text
            assert requests.get(url, verify=str(cert / "c.pem"), auth=("prom", "wrong"), timeout=5).status_code == 401
            assert requests.get(url, verify=str(cert / "c.pem"), timeout=5).status_code == 401
            # plain HTTP is refused with Go's 400, not served
            assert requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2).status_code == 400
        finally:
            proc.terminate()
            proc.wait(10)


@pytest.mark.parametrize("text,key", [
    ("tls_server_config:\n  cert_file: nope.pem\n", "web_config.tls_server_config.key_file"),
    ("tls_server_config:\n  cert_file: a\n  key_file: b\n", "web_config.tls_server_config.cert_file"),
    ("tls_server_config:\n  cert_file: a\n  key_file: b\n  cipher_suites: [x]\n", "web_config.tls_server_config.cipher_suites"),
    ("basic_auth_users:\n  bob: plaintext\n", "web_config.basic_auth_users.bob"),
    ("http_server_config:\n  http2: true\n", "web_config.http_server_config.http2"),
    ("rate_limit: {}\n", "web_config.rate_limit"),
])
def test_unsupported_or_broken_web_config_is_rejected(tmp_path, text, key):
    p = tmp_path / "web.yml"
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_web_config(str(p))
    assert e.value.key == key


@pytest.mark.slow
def test_broken_web_config_exits_2(tmp_path):
    p = tmp_path / "web.yml"
    p.write_text("basic_auth_users:\n  bob: plaintext\n")
    r = subprocess.run([sys.executable, "-m", "cachemon.cli", "run", "--listen", "127.0.0.1:0",
                        "--web-config-file", str(p)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "basic_auth_users.bob" in r.stderr


@pytest.mark.slow
def test_custom_headers_are_sent(tmp_path):
    p = tmp_path / "web.yml"
    p.write_text("http_server_config:\n  headers:\n    X-Frame-Options: deny\n")
    with ReplayServer(bundled_pages()) as replay:
        cm = CachemonProcess("--upstream", replay.url, "--web-config-file", str(p))
        try:
            assert requests.get(cm.url, timeout=5).headers["X-Frame-Options"] == "deny"
            assert requests.get(cm.url.replace("/metrics", "/-/healthy"), timeout=5).text == "OK\n"
        finally:
            cm.stop()
