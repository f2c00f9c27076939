"""LogSource's own thread: file-system events wake the poll early; without them the
poll loop alone finds new lines; close() reads what is left and saves the state."""
from __future__ import annotations

import threading
import time

from cachemon.runtime.logsource import LogSource
from cachemon.state.store import Store
from logs_support import Writer, config, gw, hits


def _wait(pred, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


def _run(tmp_path, **kw):
    log = tmp_path / "app.log"
    w = Writer(log)
    cfg = config([log], tmp_path, from_beginning=True, **kw)
    src = LogSource(cfg, Store({"1m": 60.0}))
    stop = threading.Event()
    src.start(stop)
    return src, w, stop


def test_watchdog_event_wakes_the_poll_before_the_interval(tmp_path):
    src, w, stop = _run(tmp_path, poll_interval=30.0, watch_events=True)
    try:
        assert _wait(lambda: src.saved_this_run, 10.0)     # first poll done (it saves), then waits up to 30 s
        w.write(gw(5))
        # far sooner than poll_interval: only an event can have woken it
        assert _wait(lambda: hits(src) == 5, 10.0)
    finally:
        stop.set()
        src.close()


def test_poll_loop_alone_finds_new_lines(tmp_path):
    src, w, stop = _run(tmp_path, poll_interval=0.05, watch_events=False)
    try:
        w.write(gw(3))
        assert _wait(lambda: hits(src) == 3, 10.0)
    finally:
        stop.set()
        src.close()


def test_close_reads_the_rest_and_saves(tmp_path):
    src, w, stop = _run(tmp_path, poll_interval=30.0, watch_events=False)
    assert _wait(lambda: src.saved_this_run, 10.0)         # first poll done: the lines below are left for close()
    w.write(gw(7))
    stop.set()
    src.close()
    assert hits(src) == 7
    assert (tmp_path / "state.json").exists()
