"""The tailer's fault cases, one test each, on real files with writers that keep their
descriptors open, real renames and truncations. Polls are explicit (no sleeps) and the
clock is injected."""
from __future__ import annotations

import os

from logs_support import Clock, Writer, config, gw, hits, source


def _src(tmp_path, path, clock=None, **kw):
    kw.setdefault("from_beginning", True)
    return source(config([path], tmp_path, **kw), clock or Clock())


def test_log_rotation_rename_create_reads_old_file_to_its_end(tmp_path):
    log = tmp_path / "app.log"
    w = Writer(log)
    w.write(gw(1))
    src = _src(tmp_path, log)
    src.poll()
    os.rename(log, tmp_path / "app.log.1")
    w.write(gw(10))                     # late write through the old descriptor
    new = Writer(log)
    new.write(gw(100))
    src.poll()
    w.write(gw(1000))                   # still within rotate_wait
    src.poll()
    assert hits(src) == 1111
    assert src.entries[0].follower.rotations == 1


def test_rotated_file_closed_after_rotate_wait(tmp_path):
    log = tmp_path / "app.log"
    w = Writer(log)
    clock = Clock()
    src = _src(tmp_path, log, clock, rotate_wait=5.0)
    src.poll()
    os.rename(log, tmp_path / "app.log.1")
    Writer(log).write(gw(2))
    src.poll()
    assert len(src.entries[0].follower.files) == 2
    clock.advance(6)
    src.poll()
    assert len(src.entries[0].follower.files) == 1
    w.write(gw(5))                      # after rotate_wait: no longer read
    src.poll()
    assert hits(src) == 2


def test_rotated_name_matched_by_glob_is_not_read_twice(tmp_path):
    log = tmp_path / "app.log"
    w = Writer(log)
    w.write(gw(1) + gw(2))
    clock = Clock()
    src = _src(tmp_path, str(tmp_path / "app.log*"), clock, rotate_wait=1.0)
    src.poll()
    os.rename(log, tmp_path / "app.log.1")
    Writer(log).write(gw(4))
    for _ in range(3):
        clock.advance(2)
        src.poll()
    assert hits(src) == 7


def test_copytruncate_starts_over(tmp_path):
    log = tmp_path / "app.log"
    w = Writer(log)
    w.write(gw(1) + gw(2))
    src = _src(tmp_path, log)
    src.poll()
    with open(tmp_path / "app.log.1", "wb") as f:   # copy ...
        f.write(log.read_bytes())
    os.truncate(log, 0)                             # ... truncate
    src.poll()
    w.write(gw(4))
    src.poll()
    assert hits(src) == 7
    assert src.entries[0].follower.truncations == 1


def test_copytruncate_with_stale_writer_skips_nul_hole(tmp_path):
    log = tmp_path / "app.log"
    w = Writer(log, append=False)       # writer without O_APPEND: writes at its old offset
    w.write(gw(1) * 50)
    src = _src(tmp_path, log)
    src.poll()
    os.truncate(log, 0)
    w.write(gw(3))                      # leaves a NUL-filled hole before this line
    assert log.read_bytes()[:1] == b"\x00"
    src.poll()
    e = src.entries[0]
    assert hits(src) == 53
    assert e.follower.truncations == 1
    assert e.stream.lines["malformed"] == 0
    assert next(iter(e.follower.files.values())).framer.nul_bytes > 0


def test_truncate_then_grow_past_offset_between_polls(tmp_path):
    log = tmp_path / "app.log"
    w = Writer(log)
    w.write(gw(1))
    src = _src(tmp_path, log)
    src.poll()
    os.truncate(log, 0)
    w.write(gw(20) * 3)                 # bigger than before: size alone cannot tell
    src.poll()
    assert hits(src) == 61
    assert src.entries[0].follower.truncations == 1


def test_deleted_while_being_read_remaining_lines_read(tmp_path):
    log = tmp_path / "app.log"
    w = Writer(log)
    src = _src(tmp_path, log)
    src.poll()
    w.write(gw(3))
    os.unlink(log)
    w.write(gw(4))
    src.poll()
    assert hits(src) == 7


def test_delete_and_recreate_same_path(tmp_path):
    log = tmp_path / "app.log"
    w = Writer(log)
    w.write(gw(1))
    src = _src(tmp_path, log)
    src.poll()
    os.unlink(log)
    src.poll()
    w.close()
    w = Writer(log)
    w.write(gw(2))
    src.poll()
    assert hits(src) == 3
    assert src.entries[0].follower.rotations == 1


def test_missing_at_start_created_later_read_from_its_start(tmp_path):
    log = tmp_path / "later.log"
    src = _src(tmp_path, log, from_beginning=False)
    src.poll()
    st = src.store.upstreams["log0"]
    assert not st.up and st.last_error[0] == "missing"
    Writer(log).write(gw(5))
    src.poll()
    assert hits(src) == 5               # created after we started: nothing skipped
    assert src.store.upstreams["log0"].up


def test_first_start_from_end_by_default(tmp_path):
    log = tmp_path / "app.log"
    w = Writer(log)
    w.write(gw(1) + "partial line without its end ")
    src = _src(tmp_path, log, from_beginning=False)
    src.poll()
    w.write("cache_hit=999 cache_miss=1\n" + gw(2))    # the tail of the partial line is dropped
    src.poll()
    assert hits(src) == 2


def test_from_beginning_reads_everything(tmp_path):
    log = tmp_path / "app.log"
    Writer(log).write(gw(1) + gw(2))
    src = _src(tmp_path, log, from_beginning=True)
    src.poll()
    assert hits(src) == 3


def test_soft_link_change(tmp_path):
    a, b, link = tmp_path / "a.log", tmp_path / "b.log", tmp_path / "current.log"
    Writer(a).write(gw(1))
    os.symlink(a, link)
    src = _src(tmp_path, link)
    src.poll()
    Writer(b).write(gw(2))
    os.symlink(b, tmp_path / "tmp.link")
    os.rename(tmp_path / "tmp.link", link)      # atomic switch
    src.poll()
    assert hits(src) == 3
    assert src.entries[0].follower.rotations == 1


def test_partial_line_buffered_until_newline(tmp_path):
    log = tmp_path / "app.log"
    w = Writer(log)
    src = _src(tmp_path, log)
    src.poll()
    w.write("2026 INFO cache_hit=4")
    src.poll()
    assert hits(src) == 0
    w.write("2 cache_miss=1\n")
    src.poll()
    assert hits(src) == 42


def test_over_long_line_skipped_counted_bounded(tmp_path):
    log = tmp_path / "app.log"
    w = Writer(log)
    src = _src(tmp_path, log, max_line_bytes=1024)
    src.poll()
    w.write("x" * 700)
    src.poll()
    w.write("y" * 700 + " cache_hit=5 cache_miss=1")     # > 1024 while streaming past
    src.poll()
    f = next(iter(src.entries[0].follower.files.values()))
    assert len(f.framer.pending) == 0 and f.framer.discarding
    w.write("z" * 5000 + "\n" + gw(7))
    src.poll()
    assert hits(src) == 7               # the long line's numbers are never used
    assert f.framer.too_long == 1


def test_invalid_utf8_and_crlf(tmp_path):
    log = tmp_path / "app.log"
    w = Writer(log)
    src = _src(tmp_path, log)
    w.write(b"\xff\xfe garbage \xc3 cache_hit=3 cache_miss=1\r\n")
    w.write("INFO 06-01 10:00:00 [loggers.py:118] Engine 000: Avg prompt throughput: 1.0 tokens/s, "
            "Avg generation throughput: 1.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, "
            "GPU KV cache usage: 1.0%, Prefix cache hit rate: 2.0%\r\n")
    src.poll()
    assert hits(src) == 3
    assert src.entries[0].stream.stats_lines == 1


def test_inode_reuse_with_same_first_bytes_is_a_new_file(tmp_path):
    """A remembered (closed) identity whose content changed is read from the start."""
    log = tmp_path / "app.log"
    Writer(log).write(gw(1) * 3)
    clock = Clock()
    src = _src(tmp_path, log, clock, rotate_wait=0.5)
    src.poll()
    os.rename(log, tmp_path / "old")
    clock.advance(1)
    src.poll()
    src.poll()                           # old file closed, remembered with its offset
    os.rename(tmp_path / "old", log)     # same inode comes back ...
    with open(log, "r+b") as f:          # ... but rewritten past the old offset
        f.write((gw(1) + gw(9) * 4).encode())
    src.poll()
    assert hits(src) == 3 + 1 + 36


def test_permission_denied_then_fixed(tmp_path):
    from logs_perm_child import run_permission_scenario
    assert run_permission_scenario() == {"before": 0, "status": "permission", "after": 12}


def test_backlog_larger_than_one_poll_budget_is_read_in_following_polls(tmp_path, monkeypatch):
    from cachemon.sources.logs import tailer
    monkeypatch.setattr(tailer, "POLL_BUDGET", 4096)
    monkeypatch.setattr(tailer, "READ_SIZE", 1024)
    log = tmp_path / "app.log"
    Writer(log).write(gw(1) * 2000)
    src = _src(tmp_path, log)
    polls = 1
    while src.poll():
        polls += 1
    assert hits(src) == 2000
    assert polls > 10


def test_copytruncate_copy_matched_by_glob_fills_the_gap_without_duplicates(tmp_path):
    log = tmp_path / "app.log"
    w = Writer(log)
    w.write(gw(1) + gw(2))
    src = _src(tmp_path, str(tmp_path / "app.log*"))
    src.poll()
    w.write(gw(4))                                   # not read before the truncate ...
    with open(tmp_path / "app.log.1", "wb") as f:    # ... but copied
        f.write(log.read_bytes())
    os.truncate(log, 0)
    w.write(gw(8))
    src.poll()
    src.poll()
    assert hits(src) == 15                           # 1+2 once, 4 from the copy, 8 from the new content


def test_copytruncate_while_stopped_copy_matched_by_glob(tmp_path):
    log = tmp_path / "app.log"
    w = Writer(log)
    w.write(gw(1) + gw(2))
    cfg = config([str(tmp_path / "app.log*")], tmp_path, from_beginning=True)
    src = source(cfg)
    src.poll()
    src.close()
    w.write(gw(4))
    with open(tmp_path / "app.log.1", "wb") as f:
        f.write(log.read_bytes())
    os.truncate(log, 0)
    w.write(gw(8))
    src2 = source(cfg)
    src2.poll()
    assert hits(src2) == 15


def test_copy_in_progress_matched_by_glob_is_not_read_twice(tmp_path):
    """logrotate copytruncate, polled between the copy and the truncate."""
    log = tmp_path / "app.log"
    w = Writer(log)
    w.write(gw(1) + gw(2))
    src = _src(tmp_path, str(tmp_path / "app.log*"))
    src.poll()
    w.write(gw(4))
    with open(tmp_path / "app.log.1", "wb") as f:
        f.write(log.read_bytes())
    src.poll()                                       # copy seen before the truncate
    os.truncate(log, 0)
    w.write(gw(8))
    src.poll()
    src.poll()
    assert hits(src) == 15
