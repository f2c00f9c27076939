"""`cachemon demo` replays the bundled real captures through the same Daemon as `cachemon run`.

Its output, not on a terminal (a pipe here): one status line per phase, printed when the phase
ends, with the phase's own hit ratio (counter deltas since it began), events in plain words, and
what to do next once the captures wrap around.
"""
from __future__ import annotations

import re
import socket
import struct
import subprocess
import sys
import time
import urllib.request

import pytest

from helpers import free_port

# "HH:MM:SS [n/4 scenario] ...": the wall-clock time the phase began, then the phase
PHASE_LINE = re.compile(r"^(\d\d:\d\d:\d\d) \[([^\]]*)\]")


@pytest.mark.slow
def test_demo_prints_one_line_per_phase_with_phase_ratios_plain_events_and_next_steps():
    port = free_port()
    r = subprocess.run([sys.executable, "-m", "cachemon.cli", "demo", "--listen", f"127.0.0.1:{port}",
                        "--vllm-listen", "127.0.0.1:0", "--dwell", "3s", "--poll-interval", "200ms",
                        "--duration", "14s"],
                       capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "\r" not in out                               # not a terminal: no carriage-return updates
    assert f"cachemon metrics: http://127.0.0.1:{port}/metrics" in out
    assert "KV-cache events: tcp://127.0.0.1:" in out
    phases = [line for line in out.splitlines() if PHASE_LINE.match(line)]
    labels = [PHASE_LINE.match(line).group(2) for line in phases]
    # one line per phase, in order; idle once, then the rounds start over WITHOUT a restart
    assert labels[:5] == ["1/4 idle", "2/4 static-system-prompt", "3/4 timestamp-in-system-prompt",
                          "4/4 request-id-at-head", "2/4 static-system-prompt, round 2"]
    by = dict(zip(labels, phases, strict=True))
    # the ratio of the phase itself: the captured 11520 hits of 13296 query tokens per 16 requests
    # (86.6 %, a little less while the floored integer counters catch up), 0 hits at the head
    static = float(re.search(r"this phase: ([0-9.]+)% of", by["2/4 static-system-prompt"]).group(1))
    assert 85.0 <= static <= 86.7, by["2/4 static-system-prompt"]
    assert "this phase: 0.0% of" in by["3/4 timestamp-in-system-prompt"]
    # one vLLM process for the whole demo: counters never drop, so no restart is ever reported
    assert "restarted" not in out
    assert "went down" not in out + r.stderr and "prefix_cache_queries" not in out + r.stderr
    # what to do next, once: 3 s phases never collapse far enough for a cause, so when the first round ends
    assert out.count("What next:") == 1
    assert f"Point Prometheus at http://127.0.0.1:{port}/metrics" in out
    assert "dashboards/*.json" in out and "alerts/cachemon-alerts.yaml" in out
    assert phases[-1].endswith("(stopped)")


def test_on_a_terminal_the_status_line_is_rewritten_in_place_and_cut_at_the_width(capsys):
    from cachemon.demo.command import StatusLine
    s = StatusLine(tty=True, width=20)
    s.update("[1/4 idle] a longer first text")     # constructed texts
    s.update("[1/4 idle] b")
    s.finish("[1/4 idle] done")
    # each rewrite blanks what the longer text before it left on the line
    assert capsys.readouterr().out == "\r[1/4 idle] a longer\r[1/4 idle] b       \r[1/4 idle] done\n"


@pytest.mark.slow
def test_phase_lines_carry_the_clock_and_the_causes_the_exporter_names_and_what_next_follows_the_collapse():
    """At 1/20 speed (static 12 s, timestamp 27 s): the timestamp phase's 0 % is explained by what the
    exporter's cachemon_cause_active series name (the KV ledger's exact dynamic_prefix, about 11 s in),
    and "What next" follows that collapse, before the phase ends, not after a whole round."""
    port = free_port()
    before = time.strftime("%H:%M:%S")
    r = subprocess.run([sys.executable, "-m", "cachemon.cli", "demo", "--listen", f"127.0.0.1:{port}",
                        "--vllm-listen", "127.0.0.1:0", "--time-scale", "0.05", "--poll-interval", "500ms",
                        "--duration", "38s"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    phases = [(i, PHASE_LINE.match(line)) for i, line in enumerate(lines) if PHASE_LINE.match(line)]
    # the clock: every phase began at or after the run began (the same day; a run across midnight would fail)
    assert all(before <= m.group(1) for _, m in phases), lines
    by = {m.group(2): lines[i] for i, m in phases}
    assert "cachemon names: cold_cache" in by["2/4 static-system-prompt"], r.stdout   # the first traffic of a process
    timestamp = [lines[i] for i, m in phases if m.group(2) == "3/4 timestamp-in-system-prompt"]
    assert "this phase: 0.0% of" in timestamp[0] and "cachemon names: dynamic_prefix" in timestamp[0], r.stdout
    # "What next" once, right after the collapse's line, and before the phase's last ("stopped") line
    assert r.stdout.count("What next:") == 1, r.stdout
    told = lines.index("What next:")
    assert lines[told - 1] == timestamp[0] and timestamp[-1].endswith("(stopped)") and len(timestamp) == 2, r.stdout
    assert "Traceback" not in r.stdout + r.stderr


def test_a_client_that_hangs_up_mid_response_prints_no_traceback(capfd):
    """A scrape that times out (or Ctrl-C) resets the fake vLLM's connection while it writes: the server
    says nothing in the terminal (it used to print socketserver's traceback)."""
    from cachemon.demo.replay import ReplayServer, bundled_pages
    replay = ReplayServer(bundled_pages()).start()
    replay.set_fault("slow")                       # the page in 512-byte pieces: the reset lands mid-write
    try:
        client = socket.create_connection(("127.0.0.1", replay.httpd.server_address[1]), timeout=5)
        client.sendall(b"GET /metrics HTTP/1.1\r\nHost: demo\r\n\r\n")
        assert client.recv(64).startswith(b"HTTP/1.1 200")
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))   # close = RST
        client.close()
        time.sleep(0.5)                            # the handler's next write meets the reset
        replay.set_fault(None)                     # and the server still serves
        assert urllib.request.urlopen(replay.url, timeout=5).status == 200
    finally:
        replay.stop()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "ConnectionResetError" not in err, err


def test_a_notification_line_takes_the_status_lines_place_and_the_status_line_is_drawn_again_below(capsys):
    from cachemon.demo.command import StatusLine
    s = StatusLine(tty=True, width=80)
    s.update("[3/4 timestamp] 0.0%")                 # constructed texts
    s.say("NOTIFICATION firing: X")
    s.update("[3/4 timestamp] 0.0%")
    assert capsys.readouterr().out == "\r[3/4 timestamp] 0.0%\rNOTIFICATION firing: X\n\r[3/4 timestamp] 0.0%"
    piped = StatusLine(tty=False)
    piped.say("NOTIFICATION firing: X")
    assert capsys.readouterr().out == "NOTIFICATION firing: X\n"
