"""`cachemon demo` replays the bundled real captures through the same Daemon as `cachemon run`.

Its output, not on a terminal (a pipe here): one status line per phase, printed when the phase
ends, with the phase's own hit ratio (counter deltas since it began), events in plain words, and
what to do next once the captures wrap around.
"""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from helpers import free_port


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
    phases = [line for line in out.splitlines() if line.startswith("[")]
    labels = [re.match(r"\[([^\]]*)\]", line).group(1) for line in phases]
    # one line per phase, in order; idle once, then the rounds start over WITHOUT a restart
    assert labels[:5] == ["1/4 idle", "2/4 static-system-prompt", "3/4 timestamp-in-system-prompt",
                          "4/4 request-id-at-head", "2/4 static-system-prompt, round 2"]
    by = dict(zip(labels, phases, strict=True))
    # the ratio of the phase itself: the captured 11520 hits of 13296 query tokens per 16 requests
    # (86.6 %, a little less while the floored integer counters catch up), 0 hits at the head
    static = float(re.search(r"this phase: ([0-9.]+)% of", by["2/4 static-system-prompt"]).group(1))
    assert 85.0 <= static <= 86.7, by["2/4 static-system-prompt"]
    assert "this phase: 0.0% of" in by["3/4 timestamp-in-system-prompt"]
    assert "dynamic prefix" in by["3/4 timestamp-in-system-prompt"]
    # one vLLM process for the whole demo: counters never drop, so no restart is ever reported
    assert "restarted" not in out
    assert "went down" not in out + r.stderr and "prefix_cache_queries" not in out + r.stderr
    # what to do next, once, when the first round ends
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
