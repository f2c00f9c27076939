"""`make demo-stack` (scripts/demo_stack.py) with the Debian Prometheus and Alertmanager: the shipped
critical hit-ratio alert reaches examples/alertmanager.yml's webhook receiver during the demo's
timestamp phase, naming the phase's real cause (dynamic_prefix), not a restart.

Played 15 times as fast (``--time-scale 0.0667``): the demo's phases AND copies of the rules'
windows and ``for:`` are scaled (the script's documented test mode), so the 5m window is 20 s and
``for: 5m`` is 20 s. At full speed the same run fires about 7 minutes into the phase (docs/demo.md).
"""
from __future__ import annotations

import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers import free_port, require_binary

ROOT = Path(__file__).resolve().parents[1]
SCALE = 1 / 15


@pytest.mark.slow
@pytest.mark.alertmanager
def test_the_critical_alert_reaches_the_webhook_in_the_timestamp_phase_with_its_cause():
    require_binary("prometheus", "prometheus")
    require_binary("alertmanager", "prometheus-alertmanager", "prometheus-alertmanager")
    ports = [free_port() for _ in range(5)]
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "demo_stack.py"), f"--time-scale={SCALE}",
         f"--cachemon-port={ports[0]}", f"--vllm-port={ports[1]}", f"--prometheus-port={ports[2]}",
         f"--alertmanager-port={ports[3]}", f"--webhook-port={ports[4]}", "--duration=120"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue[tuple[float, str]] = queue.Queue()
    threading.Thread(target=lambda: [lines.put((time.monotonic(), ln)) for ln in proc.stdout], daemon=True).start()
    seen: list[tuple[float, str]] = []

    def eventually(pattern: str, timeout: float) -> tuple[float, str]:
        deadline = time.monotonic() + timeout
        for t, ln in seen:
            if re.search(pattern, ln):
                return t, ln
        while time.monotonic() < deadline:
            try:
                t, ln = lines.get(timeout=0.5)
            except queue.Empty:
                continue
            seen.append((t, ln))
            if re.search(pattern, ln):
                return t, ln
        raise AssertionError(f"no line matching {pattern!r} in {timeout}s:\n" + "".join(x for _, x in seen))

    try:
        eventually(r"^demo-stack: where to look", 30)
        # the static phase's line is printed when it ends: the timestamp phase starts then
        t_phase, _ = eventually(r"^\[2/4 static-system-prompt\]", 60)
        t_alert, alert = eventually(r"^NOTIFICATION firing: CachemonPrefixCacheHitRatioLow \(critical\)", 60)
        t_end, _ = eventually(r"^\[3/4 timestamp-in-system-prompt\]", 60)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    # fired within the timestamp phase, after its (scaled) `for:` held, near the documented time
    into = (t_alert - t_phase) / SCALE / 60
    print(f"critical notification {into:.1f} min (scaled back) into the timestamp phase")
    assert t_alert < t_end
    assert 5.0 <= into <= 8.5, into
    assert "Active cause(s): dynamic_prefix" in alert and "restart" not in alert
