"""Restart without loss or double counting: the state file binds offsets and counters."""
from __future__ import annotations

import hashlib
import json
import os

import pytest

from cachemon import catalog as C
from cachemon.sources.logs import statefile
from logs_support import Clock, Writer, config, gw, hits, kill, source


def test_restart_resumes_without_duplicates(tmp_path):
    log = tmp_path / "app.log"
    w = Writer(log)
    w.write(gw(1) + gw(2))
    cfg = config([log], tmp_path, from_beginning=True)
    src = source(cfg)
    src.poll()
    src.close()
    w.write(gw(4))                       # written while cachemon is down
    src2 = source(cfg)
    assert hits(src2) == 3               # restored before reading anything
    src2.poll()
    assert hits(src2) == 7
    src2.close()


def test_partial_line_across_restart_counted_once(tmp_path):
    log = tmp_path / "app.log"
    w = Writer(log)
    cfg = config([log], tmp_path, from_beginning=True)
    src = source(cfg)
    w.write(gw(1) + "2026 INFO cache_hit=5")
    src.poll()
    src.close()
    w.write("0 cache_miss=1\n")
    src2 = source(cfg)
    src2.poll()
    assert hits(src2) == 51
    src2.close()


def test_kill_after_periodic_save_recounts_nothing_twice(tmp_path):
    log = tmp_path / "app.log"
    w = Writer(log)
    clock = Clock()
    cfg = config([log], tmp_path, from_beginning=True, save_interval=5.0)
    src = source(cfg, clock)
    w.write(gw(1))
    clock.advance(6)
    src.poll()                           # saved: offset after line 1, hits 1
    w.write(gw(2))
    src.poll()                           # read, not yet saved
    assert hits(src) == 3
    kill(src)
    src2 = source(cfg, clock)
    assert hits(src2) == 1               # the snapshot's counters ...
    src2.poll()
    assert hits(src2) == 3               # ... plus the lines after its offset, once


def test_kill_between_temp_file_and_rename(tmp_path, monkeypatch):
    log = tmp_path / "app.log"
    w = Writer(log)
    clock = Clock()
    cfg = config([log], tmp_path, from_beginning=True, save_interval=1.0)
    src = source(cfg, clock)
    w.write(gw(1))
    clock.advance(2)
    src.poll()                           # good save
    w.write(gw(2))

    class Crash(Exception):
        pass

    def crash(*a, **k):
        raise Crash()
    monkeypatch.setattr(statefile, "_replace", crash)
    clock.advance(2)
    with pytest.raises(Crash):
        src.poll()                       # dies after writing and fsyncing the temp file
    monkeypatch.undo()
    assert statefile.tmp_path(tmp_path / "state.json").exists()
    kill(src)
    src2 = source(cfg, clock)
    assert not statefile.tmp_path(tmp_path / "state.json").exists()
    src2.poll()
    assert hits(src2) == 3


def _src(payload: dict) -> dict:
    return payload["sources"]["log0"]


# A valid checksum over content of the wrong type (a bug or a hand edit, re-hashed): restoring it
# used to raise out of LogSource() or restore wrong counters.
WRONG_TYPES = {
    "sources-list": lambda p: p.update(sources=["log0"]),
    "source-str": lambda p: p["sources"].update(log0="text"),
    "stream-list": lambda p: _src(p).update(stream=[]),
    "counters-map": lambda p: _src(p)["stream"].update(counters={"a": 1}),
    "counter-str": lambda p: _src(p)["stream"].update(counters=[[C.HIT_TOKENS.name, ["m", "", "local"], "many"]]),
    "counter-negative": lambda p: _src(p)["stream"].update(counters=[[C.HIT_TOKENS.name, ["m", "", "local"], -5]]),
    "engine-last-list": lambda p: _src(p)["stream"].update(engine_last=[1, 2]),
    "offset-str": lambda p: _src(p)["files"][0].update(offset="12"),
    "files-map": lambda p: _src(p).update(files={"dev": 1}),
}


@pytest.mark.parametrize("damage", ["garbage", "empty", "checksum", "schema", *WRONG_TYPES])
def test_corrupt_state_file_warns_and_falls_back(tmp_path, caplog, damage):
    log = tmp_path / "app.log"
    w = Writer(log)
    w.write(gw(1))
    cfg = config([log], tmp_path, from_beginning=False)
    src = source(cfg)
    src.poll()
    src.close()
    p = tmp_path / "state.json"
    doc = json.loads(p.read_text())
    if damage == "garbage":
        p.write_bytes(b"\x00{not json")
    elif damage == "empty":
        p.write_bytes(b"")
    elif damage == "checksum":
        doc["payload"]["sources"]["log0"]["files"][0]["offset"] += 7
        p.write_text(json.dumps(doc))
    elif damage == "schema":
        doc["schema"] = "other/9"
        p.write_text(json.dumps(doc))
    else:
        WRONG_TYPES[damage](doc["payload"])
        doc["sha256"] = hashlib.sha256(json.dumps(doc["payload"], sort_keys=True, separators=(",", ":"))
                                       .encode()).hexdigest()
        p.write_text(json.dumps(doc))
    w.write(gw(2))
    with caplog.at_level("WARNING", logger="cachemon.logs"):
        src2 = source(cfg)
    assert "log state file unusable" in caplog.text and "on_state_error: from_end" in caplog.text
    if damage in WRONG_TYPES:
        assert "checksum valid but content unusable" in caplog.text
    fams = {f.name: f for f in src2.collect()}
    assert fams[C.LOG_STATE_LOAD_ERRORS.name].samples == [("", 1)]      # counted, not only logged
    assert hits(src2) == 0               # counters start at 0 (a clean reset for Prometheus)
    src2.poll()
    w.write(gw(4))
    src2.poll()
    assert hits(src2) == 4               # from the end: no line counted twice


def test_corrupt_state_from_beginning_fallback(tmp_path):
    log = tmp_path / "app.log"
    Writer(log).write(gw(1) + gw(2))
    (tmp_path / "state.json").write_text("{")
    src = source(config([log], tmp_path, on_state_error="from_beginning"))
    src.poll()
    assert hits(src) == 3


def test_copytruncate_while_stopped_reads_new_content_only(tmp_path):
    log = tmp_path / "app.log"
    w = Writer(log)
    w.write(gw(1) * 4)
    cfg = config([log], tmp_path, from_beginning=True)
    src = source(cfg)
    src.poll()
    src.close()
    os.truncate(log, 0)
    w.write(gw(8))                       # shorter than the saved offset
    src2 = source(cfg)
    src2.poll()
    assert hits(src2) == 12
    assert src2.entries[0].follower.truncations == 1


def test_replaced_while_stopped_with_same_first_bytes_and_longer(tmp_path):
    log = tmp_path / "app.log"
    w = Writer(log)
    w.write(gw(1))
    cfg = config([log], tmp_path, from_beginning=True)
    src = source(cfg)
    src.poll()
    src.close()
    os.truncate(log, 0)
    w.write(gw(1) + gw(30) + gw(30))      # same first line, grew past the offset
    src2 = source(cfg)
    src2.poll()
    # the bytes up to the saved offset are what we read before (same first line), so the
    # tailer resumes after them: the new lines once, the old one not again
    assert hits(src2) == 61


def test_rotation_while_stopped_finds_the_renamed_file(tmp_path):
    log = tmp_path / "app.log"
    w = Writer(log)
    w.write(gw(1))
    cfg = config([log], tmp_path, from_beginning=True)
    src = source(cfg)
    src.poll()
    w.write(gw(2))
    src.poll()
    kill_path = tmp_path / "app.log.1"
    src.save_state()
    w.write(gw(4))                        # unread when we stop
    kill(src)
    os.rename(log, kill_path)             # rotated while cachemon is down
    Writer(log).write(gw(8))
    src2 = source(cfg)
    src2.poll()
    assert hits(src2) == 1 + 2 + 4 + 8


def test_state_file_holds_no_line_text(tmp_path):
    log = tmp_path / "app.log"
    Writer(log).write("secret prompt text " * 10 + gw(1))
    src = source(config([log], tmp_path, from_beginning=True))
    src.poll()
    src.close()
    assert "secret" not in (tmp_path / "state.json").read_text()


def test_unwritable_state_file_is_a_warning_not_a_crash(tmp_path, caplog):
    log = tmp_path / "app.log"
    Writer(log).write(gw(1))
    (tmp_path / "dir").mkdir()
    cfg = config([log], tmp_path, from_beginning=True)
    cfg.state_file = str(tmp_path / "dir")          # a directory: cannot be replaced by a file
    src = source(cfg)
    with caplog.at_level("WARNING", logger="cachemon.logs"):
        src.poll()                  # the first pass of a run saves at once: fails
        assert src.save_state() is False
    assert "cannot write log state file" in caplog.text
    assert hits(src) == 1
    # ... and visible in the exposition, not only in the log
    from cachemon.expose.render import render
    text = render([src]).decode()
    assert "cachemon_log_state_save_errors_total 2.0" in text


def test_restart_after_a_nul_hole_resumes_at_the_line_start(tmp_path):
    log = tmp_path / "app.log"
    w = Writer(log, append=False)
    w.write(gw(1) * 3)
    cfg = config([log], tmp_path, from_beginning=True)
    src = source(cfg)
    src.poll()
    os.truncate(log, 0)
    w.write("cache_hit=2 ")               # after the hole, no newline yet: pending starts past the NULs
    src.poll()
    src.close()
    w.write("cache_miss=1\n" + gw(4))
    src2 = source(cfg)
    src2.poll()
    assert hits(src2) == 3 + 2 + 4


def test_files_created_and_rotated_away_since_the_last_save_are_read_after_a_kill(tmp_path):
    log = tmp_path / "app.log"
    w = Writer(log)
    w.write(gw(1, seq=1))
    cfg = config([log], tmp_path, from_beginning=True, save_interval=3600.0)
    src = source(cfg)
    src.poll()                        # the first pass of a run saves: A at its end
    w.write(gw(2, seq=2))             # read, but not saved
    src.poll()
    for n, v in ((1, 4), (2, 8)):     # two rotations since the save, never polled: A -> .2, B -> .1
        for p in sorted(tmp_path.glob("app.log.*"), reverse=True):
            os.rename(p, p.with_suffix(f".{int(p.suffix[1:]) + 1}"))
        os.rename(log, tmp_path / "app.log.1")
        w.write(gw(16, seq=10 + n))   # a late write through the old descriptor
        w.reopen()
        w.write(gw(v, seq=20 + n))
    kill(src)
    src2 = source(cfg)
    src2.poll()
    src2.poll()
    # A resumed at its saved offset (found by inode as app.log.2), B (created and rotated
    # away since the save) read whole under its rotated name, C (app.log) whole
    assert hits(src2) == 1 + 2 + 16 + 4 + 16 + 8


def test_a_file_rotated_away_before_the_first_poll_is_read(tmp_path):
    log = tmp_path / "app.log"
    w = Writer(log)
    src = source(config([log], tmp_path))          # a first start, from the end
    w.write(gw(3, seq=1))                          # written after the start ...
    os.rename(log, tmp_path / "app.log.1")         # ... and rotated away before the first poll
    w.reopen()
    w.write(gw(5, seq=2))
    src.poll()
    # the rotated file is read whole; the live file, present at the first poll, from its end
    assert hits(src) == 3


def _rotate_numbered(log, upto: int = 1) -> None:
    """Shift app.log.N -> N+1 for N >= upto, newest last (as the crash-loop writer and
    logrotate do): stopping early leaves the cascade half done, with a gap at upto + 1."""
    for p in sorted(log.parent.glob(log.name + ".*"), key=lambda p: -int(p.suffix[1:])):
        if int(p.suffix[1:]) >= upto:
            os.rename(p, p.with_suffix(f".{int(p.suffix[1:]) + 1}"))


def test_a_file_renamed_while_the_rotated_names_are_listed_is_read_after_a_kill(tmp_path, monkeypatch):
    """The loss behind tests/test_logs_crash_loop.py failing on a loaded machine (seeds
    2480805513, 765884545): the directory is listed while the writer is half-way through
    its rename cascade (app.log.2 -> .3 done, .1 -> .2 not yet), so the file that then
    moves into the gap (B, created and rotated away while cachemon was down) is in no
    listing. The save after that scan used to mark everything older than the scan as
    accounted for, so B was never read. By identity, B (unknown) is read by the next
    scan, after the next kill here. Clocks injected: no sleeps."""
    from cachemon.runtime.logsource import LogSource
    from cachemon.sources.logs import discovery
    from cachemon.state.store import Store

    log = tmp_path / "app.log"
    wall = Clock(1_700_000_000.0)          # the file system's clock: mtimes are set on it
    t0 = wall.t

    def stamp(at: float) -> None:
        os.utime(log, (at, at))

    w = Writer(log)
    w.write(gw(1, seq=1))                  # A
    stamp(t0)
    cfg = config([log], tmp_path, from_beginning=True, save_interval=3600.0)

    def start() -> LogSource:
        return LogSource(cfg, Store({"1m": 60.0}), clock=Clock(), wall=wall)

    src = start()
    src.poll()                             # the first pass saves: A read to its end
    kill(src)
    # down: two rotations (A -> .1 -> .2; B written, rotated to .1; C live) and a third begun
    wall.advance(0.5)
    _rotate_numbered(log)
    os.rename(log, tmp_path / "app.log.1")
    w.reopen()
    w.write(gw(2, seq=2))                  # B
    stamp(wall.t)
    wall.advance(0.1)
    _rotate_numbered(log)
    os.rename(log, tmp_path / "app.log.1")
    w.reopen()
    w.write(gw(4, seq=3))                  # C
    stamp(wall.t)
    os.rename(tmp_path / "app.log.2", tmp_path / "app.log.3")      # the third rotation, half done
    wall.advance(5.0)                      # a slow restart on a loaded machine

    real_glob = discovery.globmod.glob
    armed = [True]

    def listing_then_rename(pattern, *a, **kw):
        names = real_glob(pattern, *a, **kw)
        if armed[0] and pattern.endswith("*"):
            armed[0] = False               # the writer finishes its rotation after our listing
            os.rename(tmp_path / "app.log.1", tmp_path / "app.log.2")       # B into the gap
            os.rename(log, tmp_path / "app.log.1")
            w.reopen()
            w.write(gw(8, seq=4))          # D
            stamp(wall.t)
        return names

    monkeypatch.setattr(discovery.globmod, "glob", listing_then_rename)
    src2 = start()
    src2.poll()                            # the first pass saves (B in no listing)
    assert armed == [False]
    assert hits(src2) == 1 + 4 + 8
    kill(src2)
    wall.advance(5.0)
    src3 = start()
    src3.poll()
    assert hits(src3) == 1 + 2 + 4 + 8
    # still running (no kill): the next rotation's scan reads nothing twice
    wall.advance(1.0)
    _rotate_numbered(log)
    os.rename(log, tmp_path / "app.log.1")
    w.reopen()
    w.write(gw(16, seq=5))
    src3.poll()
    src3.poll()
    assert hits(src3) == 1 + 2 + 4 + 8 + 16
    src3.close()
    src4 = start()                         # and a clean restart reads nothing twice either
    src4.poll()
    assert hits(src4) == 1 + 2 + 4 + 8 + 16
    src4.close()


def test_a_file_missed_by_a_listing_is_read_by_the_next_scan_of_the_same_run(tmp_path, monkeypatch):
    """The same race without a kill: B, missed by the listing of the first poll, is read by
    the scan that the next rotation triggers, although it was written long before that."""
    from cachemon.runtime.logsource import LogSource
    from cachemon.sources.logs import discovery
    from cachemon.state.store import Store

    log = tmp_path / "app.log"
    wall = Clock(1_700_000_000.0)
    w = Writer(log)
    w.write(gw(1, seq=1))                  # A
    cfg = config([log], tmp_path, from_beginning=True, save_interval=3600.0)
    src = LogSource(cfg, Store({"1m": 60.0}), clock=Clock(), wall=wall)
    src.poll()
    wall.advance(0.5)
    os.rename(log, tmp_path / "app.log.1")
    w.reopen()
    w.write(gw(2, seq=2))                  # B, written at t0 + 0.5
    os.utime(log, (wall.t, wall.t))
    real_glob = discovery.globmod.glob

    def listing_without_b(pattern, *a, **kw):
        # listed just before B's rename: B is in no listing of this scan
        return [n for n in real_glob(pattern, *a, **kw) if n != str(tmp_path / "app.log.1")]

    monkeypatch.setattr(discovery.globmod, "glob", listing_without_b)
    os.rename(tmp_path / "app.log.1", tmp_path / "app.log.2")
    os.rename(log, tmp_path / "app.log.1")
    w.reopen()
    w.write(gw(4, seq=3))                  # C
    wall.advance(5.0)                      # a poll stalled for 5 s
    src.poll()                             # rotation seen: scan, B not listed
    assert hits(src) == 1 + 4
    monkeypatch.setattr(discovery.globmod, "glob", real_glob)
    wall.advance(0.05)
    os.rename(tmp_path / "app.log.2", tmp_path / "app.log.3")
    os.rename(tmp_path / "app.log.1", tmp_path / "app.log.2")
    os.rename(log, tmp_path / "app.log.1")
    w.reopen()
    w.write(gw(8, seq=4))                  # D
    src.poll()                             # the next rotation's scan lists B
    assert hits(src) == 1 + 2 + 4 + 8
    src.close()
