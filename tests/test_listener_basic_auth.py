"""Basic auth the way exporter-toolkit does it, and web-config errors caught at load.

Timing equality is tested through its mechanism (an unknown user costs a bcrypt check of the
same cost as a known one), never with a stopwatch.
"""
from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import threading
import time

import bcrypt
import pytest
import requests

from cachemon.config import ConfigError
from cachemon.web.connection import Limits
from cachemon.web.web_config import load_web_config
from cachemon.web.workers import Registry, make_server, serve_in_thread
from helpers import free_port, self_signed_cert
from listener_support import TEST_REFUSAL_DELAY


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.fixture
def counted(monkeypatch):
    """bcrypt.checkpw, counting calls, the cost of each hash checked and the peak concurrency."""
    real = bcrypt.checkpw
    stats = {"calls": 0, "costs": [], "active": 0, "peak": 0}
    lock = threading.Lock()

    def checkpw(password: bytes, hashed: bytes) -> bool:
        with lock:
            stats["calls"] += 1
            stats["costs"].append(int(hashed[4:6]))
            stats["active"] += 1
            stats["peak"] = max(stats["peak"], stats["active"])
        try:
            time.sleep(0.02)    # hold the check open so that overlapping calls would show
            return real(password, hashed)
        finally:
            with lock:
                stats["active"] -= 1

    monkeypatch.setattr(bcrypt, "checkpw", checkpw)
    return stats


def auth_file(tmp_path, rounds: int = 5):
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=rounds)).decode().replace("$2b$", "$2y$")
    p = tmp_path / "web.yml"
    p.write_text(f"basic_auth_users:\n  prom: '{hashed}'\n")
    return load_web_config(str(p))


def test_unknown_user_costs_one_bcrypt_check_of_the_same_cost_as_a_known_user(tmp_path, counted):
    web = auth_file(tmp_path, rounds=5)
    assert not web.authorized(basic("prom", "wrong"))
    assert not web.authorized(basic("mallory", "wrong"))
    assert counted["calls"] == 2
    assert counted["costs"] == [5, 5]


def test_cached_outcomes_are_keyed_by_a_secret_digest_not_a_plain_hash_of_the_password(tmp_path):
    # 74d8045 keyed them by sha256(user, hash, password): from a memory dump, guesses could be
    # tested at SHA-256 speed instead of bcrypt's
    web = auth_file(tmp_path)
    assert web.auth is not None
    assert web.authorized(basic("prom", "s3cret")) and not web.authorized(basic("prom", "wrong"))
    for password, cache in ((b"s3cret", web.auth._ok), (b"wrong", web.auth._bad)):
        plain = hashlib.sha256(b"\0".join((b"prom", web.auth.users["prom"], password))).digest()
        assert len(cache) == 1 and plain not in cache


def test_good_and_bad_outcomes_are_cached(tmp_path, counted):
    web = auth_file(tmp_path)
    for _ in range(3):
        assert web.authorized(basic("prom", "s3cret"))
        assert not web.authorized(basic("prom", "wrong"))
        assert not web.authorized(basic("mallory", "s3cret"))
    assert counted["calls"] == 3          # one per distinct (user, password)


@pytest.mark.slow
def test_a_flood_of_wrong_passwords_runs_one_bcrypt_at_a_time_and_keeps_good_credentials_cached(tmp_path, counted):
    web = auth_file(tmp_path)
    assert web.authorized(basic("prom", "s3cret"))
    threads = [threading.Thread(target=web.authorized, args=(basic("prom", f"guess-{i}"),)) for i in range(100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counted["calls"] == 101 and counted["peak"] == 1
    assert web.authorized(basic("prom", "s3cret"))
    assert counted["calls"] == 101        # still cached despite 100 failures


@pytest.mark.parametrize("header", [
    None, "Bearer x", "Basic !!!", basic("prom", "x" * 73), "Basic " + base64.b64encode(b"no-colon").decode(),
])
def test_malformed_or_oversized_credentials_are_refused_without_bcrypt(tmp_path, counted, header):
    web = auth_file(tmp_path)
    assert not web.authorized(header)
    assert counted["calls"] == 0


def test_probes_answer_without_credentials_and_metrics_does_not(tmp_path):
    reg = Registry()
    server = make_server("127.0.0.1", 0, reg, auth_file(tmp_path), limits=Limits(refusal_delay=TEST_REFUSAL_DELAY))
    serve_in_thread(server)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert requests.get(base + "/-/healthy", timeout=5).status_code == 200
        assert requests.get(base + "/-/ready", timeout=5).status_code == 200
        r = requests.get(base + "/metrics", timeout=5)
        assert r.status_code == 401 and r.headers["WWW-Authenticate"] == 'Basic realm="cachemon"'
        assert requests.get(base + "/", timeout=5).status_code == 401
        assert requests.get(base + "/metrics", auth=("prom", "s3cret"), timeout=5).status_code == 200
    finally:
        server.shutdown()
        server.server_close()


GOOD = "$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi"


@pytest.mark.parametrize("hashed", [
    GOOD[:-1],                          # truncated
    GOOD + "x",                         # too long
    GOOD.replace("$10$", "$03$"),       # cost below bcrypt's minimum
    GOOD.replace("$10$", "$32$"),       # cost above bcrypt's maximum
    GOOD.replace("$2y$", "$2x$"),       # unknown variant
    GOOD[:-1] + "!",                    # not bcrypt's base64 alphabet
])
def test_malformed_bcrypt_hash_is_rejected_at_load(tmp_path, hashed):
    p = tmp_path / "web.yml"
    p.write_text(f"basic_auth_users:\n  prom: '{hashed}'\n")
    with pytest.raises(ConfigError) as e:
        load_web_config(str(p))
    assert e.value.key == "web_config.basic_auth_users.prom"


def test_a_well_formed_hash_loads(tmp_path):
    p = tmp_path / "web.yml"
    p.write_text(f"basic_auth_users:\n  prom: '{GOOD}'\n")
    assert load_web_config(str(p)).auth is not None


@pytest.mark.parametrize("headers", [
    "X-Test: \"ok\\r\\nSet-Cookie: injected=1\"",
    "X-Test: \"ok\\nX-Other: 1\"",
    "\"Bad Name\": x",
])
def test_header_with_line_break_or_bad_name_is_rejected_at_load(tmp_path, headers):
    p = tmp_path / "web.yml"
    p.write_text(f"http_server_config:\n  headers:\n    {headers}\n")
    with pytest.raises(ConfigError) as e:
        load_web_config(str(p))
    assert e.value.key.startswith("web_config.http_server_config.headers")


def run_with_web_config(tmp_path, text: str) -> subprocess.CompletedProcess:
    p = tmp_path / "web.yml"
    p.write_text(text)
    return subprocess.run([sys.executable, "-m", "cachemon.cli", "run", "--web.listen-address",
                           f"127.0.0.1:{free_port()}", "--web.config.file", str(p)],
                          capture_output=True, text=True, timeout=30, check=False)


@pytest.mark.slow
def test_min_version_above_max_version_is_a_config_error(tmp_path):
    d = self_signed_cert(tmp_path)
    r = run_with_web_config(tmp_path, f"tls_server_config:\n  cert_file: {d / 'c.pem'}\n  key_file: {d / 'k.pem'}\n"
                                      "  min_version: TLS13\n  max_version: TLS12\n")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "cachemon: config error: web_config.tls_server_config.min_version: TLS13 is above max_version TLS12"]


@pytest.mark.slow
def test_malformed_hash_exits_2_with_one_line(tmp_path):
    r = run_with_web_config(tmp_path, f"basic_auth_users:\n  prom: '{GOOD[:-1]}'\n")
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("cachemon: config error: web_config.basic_auth_users.prom: expected a bcrypt hash")
