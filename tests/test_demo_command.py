"""`cachemon demo` replays the bundled real captures through the same Daemon as `cachemon run`."""
from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import free_port


@pytest.mark.slow
def test_demo_prints_where_to_scrape_and_a_live_summary():
    port = free_port()
    r = subprocess.run([sys.executable, "-m", "cachemon.cli", "demo", "--listen", f"127.0.0.1:{port}",
                        "--dwell", "1s", "--poll-interval", "200ms", "--duration", "9s"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert f"cachemon metrics: http://127.0.0.1:{port}/metrics" in out
    # It walks through the real scenarios and reads vLLM's counters through the exporter:
    assert "[static-system-prompt" in out and "[timestamp-in-system-prompt" in out
    assert "query_tokens=13296 hit_tokens=11520" in out
    assert "query_tokens=26880 hit_tokens=11520" in out
    assert "era=v1-prefix-cache" in out
    # After the last capture it starts over: an upstream restart, corrected counters keep growing.
    assert "restarts=1" in out
    assert "query_tokens=40627" in out
