"""Issue 38 (round 6): the web config fails closed. On 74d8045 an empty file or `basic_auth_users:`
null turned basic auth off: 133 of 133 unauthenticated requests got 200 during empty rewrites, and
torn in-place rewrites let 63 through. Now an empty or user-less rewrite, while auth was on, keeps
the last good config (logged, counted in cachemon_web_config_reloads_total{outcome="refused"}), and
an empty file at start is an error. The files are constructed here; the listener is the real one."""
from __future__ import annotations

import os
import threading
import time

import bcrypt
import pytest
import requests

from cachemon.config import ConfigError
from cachemon.web.web_config import load_web_config
from helpers import one_line_error, samples, value
from listener_support import serve, stop


def hashed(pw: bytes) -> str:
    return bcrypt.hashpw(pw, bcrypt.gensalt(rounds=4)).decode().replace("$2b$", "$2y$")


@pytest.mark.parametrize("text", ["", "\n", "# nothing yet\n", "basic_auth_users:\n", "basic_auth_users: {}\n",
                                  "basic_auth_users: ~\nhttp_server_config:\n  headers: {X-Frame-Options: deny}\n"])
def test_an_empty_web_config_or_empty_users_at_start_is_an_error(tmp_path, text):
    p = tmp_path / "web.yml"
    p.write_text(text)
    with pytest.raises(ConfigError, match="empty"):
        load_web_config(str(p))


def test_cachemon_run_refuses_an_empty_web_config_in_one_line(tmp_path):
    p = tmp_path / "web.yml"
    p.write_text("")
    line = one_line_error(["run", "--web-config-file", str(p)])
    assert line.startswith("cachemon: config error: web_config: web config file") and "is empty" in line, line


@pytest.mark.parametrize("rewrite", ["", "basic_auth_users:\n", "basic_auth_users: ~\n",
                                     "http_server_config:\n  headers: {X-Frame-Options: deny}\n"])
def test_a_rewrite_without_users_keeps_the_last_good_config(tmp_path, rewrite, caplog):
    p = tmp_path / "web.yml"
    p.write_text(f"basic_auth_users:\n  prom: '{hashed(b'pw')}'\n")
    server = serve(load_web_config(str(p)))
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    try:
        p.write_text(rewrite)
        assert requests.get(url, timeout=5).status_code == 401
        page = requests.get(url, auth=("prom", "pw"), timeout=5)
        assert page.status_code == 200
        assert value(samples(page.text), "cachemon_web_config_reloads_total", outcome="refused") == 1
        assert any("refused" in r.getMessage() for r in caplog.records)
        p.write_text(f"basic_auth_users:\n  prom: '{hashed(b'new')}'\n")   # a good rewrite applies again
        assert requests.get(url, auth=("prom", "new"), timeout=5).status_code == 200
        assert requests.get(url, auth=("prom", "pw"), timeout=5).status_code == 401
    finally:
        stop(server)


def test_torn_in_place_rewrites_never_let_an_unauthenticated_request_through(tmp_path):
    """A writer rewrites the file in place (truncate, then a few bytes at a time: what a reader sees
    of a non-atomic rewrite) while four clients without credentials ask for /metrics."""
    p = tmp_path / "web.yml"
    good = (f"http_server_config:\n  headers:\n    X-Frame-Options: deny\n"
            f"basic_auth_users:\n  prom: '{hashed(b'pw')}'\n  other: '{hashed(b'pw2')}'\n").encode()
    p.write_bytes(good)
    server = serve(load_web_config(str(p)))
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    stop_at = time.monotonic() + 4
    codes: list[int] = []
    rewrites = 0

    def writer() -> None:
        nonlocal rewrites
        fd = os.open(p, os.O_WRONLY)
        try:
            while time.monotonic() < stop_at:
                os.ftruncate(fd, 0)
                os.lseek(fd, 0, os.SEEK_SET)
                for i in range(0, len(good), 40):
                    os.write(fd, good[i:i + 40])
                    time.sleep(0.001)
                rewrites += 1
        finally:
            os.close(fd)

    def client() -> None:
        with requests.Session() as s:
            while time.monotonic() < stop_at:
                codes.append(s.get(url, timeout=5).status_code)

    # a refused credential is answered after the listener's refusal delay (1 s): 16 clients keep enough
    # requests in flight to meet the reloads
    threads = [threading.Thread(target=writer)] + [threading.Thread(target=client) for _ in range(16)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert rewrites > 20 and len(codes) > 40, (rewrites, len(codes))
        assert codes.count(200) == 0, f"{codes.count(200)} of {len(codes)} unauthenticated requests got 200"
        assert requests.get(url, auth=("prom", "pw"), timeout=5).status_code == 200
    finally:
        stop(server)
