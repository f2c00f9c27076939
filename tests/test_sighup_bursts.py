"""Issue 38 (round 6): bursts of SIGHUP (a reloader that signals once per changed file: cert, key,
CA) must neither hang `cachemon run` nor make it deaf to SIGTERM. On 74d8045 the handler re-read
the web config under a lock, in the handler: a second SIGHUP during that re-read waited for a lock
its own thread held, for ever (3 SIGHUPs 1 ms apart hung it in 4 of 15 trials).

A real `cachemon run` subprocess with a real TLS + basic-auth web config (a certificate made by
openssl; the 1 000 users are constructed, to make each re-read last long enough for the race)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import bcrypt
import pytest

from helpers import eventually, free_port, self_signed_cert

pytestmark = pytest.mark.slow


def web_config(tmp_path) -> str:
    self_signed_cert(tmp_path)
    h = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode().replace("$2b$", "$2y$")
    users = "".join(f"  user{i}: '{h}'\n" for i in range(1000))
    p = tmp_path / "web.yml"
    p.write_text(f"tls_server_config:\n  cert_file: c.pem\n  key_file: k.pem\nbasic_auth_users:\n{users}")
    return str(p)


class Run:
    """One `cachemon run`, its log lines collected by a thread."""

    def __init__(self, web: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "cachemon.cli", "run", "--listen",
                                      f"127.0.0.1:{free_port()}", "--web-config-file", web],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(iter(self.proc.stdout.readline, "")),
                                       daemon=True)
        self.reader.start()
        eventually(lambda: any("cachemon serving on" in line for line in self.lines), 30, "the start-up line")

    def reloads(self) -> int:
        return sum("received SIGHUP" in line for line in self.lines)

    def burst(self, n: int, gap: float) -> None:
        for _ in range(n):
            os.kill(self.proc.pid, signal.SIGHUP)
            if gap:
                time.sleep(gap)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.reader.join(10)


@pytest.mark.parametrize(("bursts", "n", "gap"), [(15, 3, 0.001), (3, 1000, 0.0)], ids=["3x1ms", "1000-back-to-back"])
def test_bursts_of_sighup_are_each_answered_and_sigterm_still_ends_the_process(tmp_path, bursts, n, gap):
    run = Run(web_config(tmp_path))
    try:
        for i in range(bursts):
            before = run.reloads()
            run.burst(n, gap)
            # the main thread is alive: it logs a re-read for the burst (several signals may be one)
            eventually(lambda before=before: run.reloads() > before, 15, f"a re-read logged after burst {i + 1} of {n} SIGHUPs")
            assert run.proc.poll() is None, "a SIGHUP ended the process"
        run.proc.send_signal(signal.SIGTERM)
        try:
            code = run.proc.wait(15)
        except subprocess.TimeoutExpired:
            pytest.fail("SIGTERM after the SIGHUP bursts did not end the process within 15 s")
        assert code == 0, "".join(run.lines[-20:])
        assert any("shutting down" in line for line in run.lines)
    finally:
        run.kill()
