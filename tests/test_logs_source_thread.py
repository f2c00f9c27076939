"""LogSource's own thread: file-system events wake the poll early; without them the
poll loop alone finds new lines; close() reads what is left and saves the state."""
from __future__ import annotations

import threading

from cachemon.runtime.logsource import LogSource
from cachemon.state.store import Store
from helpers import eventually
from logs_support import Writer, config, gw, hits


def _run(tmp_path, **kw):
    log = tmp_path / "app.log"
    w = Writer(log)
    cfg = config([log], tmp_path, from_beginning=True, **kw)
    src = LogSource(cfg, Store({"1m": 60.0}))
    stop = threading.Event()
    src.start(stop)
    return src, w, stop


def _first_poll_done(src: LogSource) -> None:
    eventually(lambda: src.entries and all(e.last_apply > float("-inf") for e in src.entries), 10.0,
               "the first poll")


def test_watchdog_event_wakes_the_poll_before_the_interval(tmp_path):
    src, w, stop = _run(tmp_path, poll_interval=30.0, watch_events=True)
    try:
        _first_poll_done(src)            # now waiting up to 30 s
        w.write(gw(5))
        # far sooner than poll_interval: only an event can have woken it
        eventually(lambda: hits(src) == 5, 10.0, "5 hits read")
    finally:
        stop.set()
        src.close()


def test_poll_loop_alone_finds_new_lines(tmp_path):
    src, w, stop = _run(tmp_path, poll_interval=0.05, watch_events=False)
    try:
        w.write(gw(3))
        eventually(lambda: hits(src) == 3, 10.0, "3 hits read")
    finally:
        stop.set()
        src.close()


def test_close_reads_the_rest_and_saves(tmp_path):
    src, w, stop = _run(tmp_path, poll_interval=30.0, watch_events=False)
    _first_poll_done(src)
    w.write(gw(7))
    stop.set()
    src.close()
    assert hits(src) == 7
    assert (tmp_path / "state.json").exists()
