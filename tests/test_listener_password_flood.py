"""A flood of wrong passwords (issue 38, the soak): what it may cost the listener.

On 74d8045 100 wrong-password clients got their 429s and 401s as fast as the event loop could
refuse them (3 400 a second, 85 % of the loop thread, profiled in the soak) and kept the bcrypt
thread busy (a whole core, the shipped 500m CPU limit's whole quota). Now a refusal of credentials
is answered `refusal_delay` later, and one client address's wrong passwords are checked at
`auth_failure_rate` a second after a burst; beyond it they get 429 without a bcrypt.
Passwords here are CONSTRUCTED; the hashes are real bcrypt (cost 4, the lowest, for speed).
"""
from __future__ import annotations

import base64
import dataclasses
import socket
import time

import bcrypt
import requests

from cachemon.web.web_config import load_web_config
from cachemon.web.workers import Limits
from listener_support import serve, stop


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def limits(**settings: object) -> Limits:
    """Limits with the settings this tree has (the same tests run unchanged against 74d8045)."""
    known = {f.name for f in dataclasses.fields(Limits)}
    return Limits(**{k: v for k, v in settings.items() if k in known})     # type: ignore[arg-type]


def web(tmp_path):
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode().replace("$2b$", "$2y$")
    p = tmp_path / "web.yml"
    p.write_text(f"basic_auth_users:\n  prom: '{hashed}'\n")
    return load_web_config(str(p))


def status_after(port: int, request: bytes) -> tuple[int, float]:
    """(the reply's status, seconds from the request to the first byte of the reply)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        t0 = time.monotonic()
        s.sendall(request)
        head = s.recv(64)
        return int(head.split()[1]), time.monotonic() - t0


def test_a_refused_password_is_answered_after_the_refusal_delay_not_at_once(tmp_path):
    server = serve(web(tmp_path), limits(refusal_delay=0.5))
    port = server.server_address[1]
    try:
        # no credentials, then a wrong password (bcrypt, then cached as wrong): both 401, both held
        for auth in ("", f"Authorization: {basic('prom', 'wrong')}\r\n", f"Authorization: {basic('prom', 'wrong')}\r\n"):
            code, waited = status_after(port, f"GET /metrics HTTP/1.1\r\nHost: x\r\n{auth}\r\n".encode())
            assert code == 401 and waited >= 0.45
        # the probes and the right password are not held
        code, waited = status_after(port, b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
        assert code == 200 and waited < 0.45
        r = requests.get(f"http://127.0.0.1:{port}/metrics", auth=("prom", "s3cret"), timeout=5)
        assert r.status_code == 200 and r.elapsed.total_seconds() < 0.45
    finally:
        stop(server)


def test_one_address_wrong_passwords_beyond_its_budget_get_429_without_a_bcrypt(tmp_path, monkeypatch):
    checks = []
    real = bcrypt.checkpw
    monkeypatch.setattr(bcrypt, "checkpw", lambda pw, h: checks.append(pw) or real(pw, h))
    server = serve(web(tmp_path), limits(auth_failure_burst=3, auth_failure_rate=0.01, refusal_delay=0.0))
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with requests.Session() as scraper:       # verified before the flood: cached, never throttled
            assert scraper.get(base + "/metrics", auth=("prom", "s3cret"), timeout=5).status_code == 200
            codes = [requests.get(base + "/metrics", headers={"Authorization": basic("prom", f"wrong-{i}")},
                                  timeout=5).status_code for i in range(8)]
            assert codes == [401, 401, 401] + [429] * 5
            assert len(checks) == 1 + 3
            assert server.refused["auth_throttled"] == 5
            assert scraper.get(base + "/metrics", auth=("prom", "s3cret"), timeout=5).status_code == 200
            text = scraper.get(base + "/metrics", auth=("prom", "s3cret"), timeout=5).text
            assert 'cachemon_http_refused_total{reason="auth_throttled"} 5.0' in text
    finally:
        stop(server)
