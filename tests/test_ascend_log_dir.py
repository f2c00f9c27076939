"""--log-file as a glob or a directory, the way vllm-ascend writes its own log.

vllm-ascend v0.22.1rc1, ``vllm_ascend/logger.py`` (``RotatingAscendFileHandler``): one file per
process start, ``vllm_ascend_<YYYYmmdd_HHMMSS>_<pid>.log`` in ``~/ascend/log/vllm_ascend/``, and
when it reaches 20 MiB (``_LOG_MAX_BYTES``) the handler closes it and opens
``vllm_ascend_<same stamp>_<pid>_002.log``, ``_003.log``, ... (the old file is never renamed).
These tests write files named that way (constructed: no NPU was run) and check that each line is
counted exactly once, across new files, the switch to ``_002.log``, restarts and idle closes,
under one label (the configured path).
"""
from __future__ import annotations

import os

from cachemon import catalog as C
from cachemon.sources.logs import discovery, tailer
from cachemon.sources.logs.paths import effective_glob, is_multi, watch_dir
from cachemon.sources.logs.settings import apply_log_flags, default_name
from logs_support import Clock, Writer, config, gw, hits, source

STAMP = "20261201_201806"


def ascend_name(pid: int, seq: int = 1) -> str:
    return f"vllm_ascend_{STAMP}_{pid}.log" if seq == 1 else f"vllm_ascend_{STAMP}_{pid}_{seq:03d}.log"


def label_values(src, metric: str) -> set[str]:
    out = set()
    for fam in src.collect():
        if fam.name == metric:
            out |= {labels for labels, _ in fam.samples}
    return out


def test_directory_means_its_log_files(tmp_path):
    d = tmp_path / "vllm_ascend"
    assert effective_glob(str(d) + "/") == str(d / "*.log")
    assert is_multi(str(d) + "/")
    d.mkdir()
    assert effective_glob(str(d)) == str(d / "*.log") and is_multi(str(d))
    assert watch_dir(str(d)) == str(d)
    assert not is_multi(str(tmp_path / "server.log"))
    assert effective_glob(str(tmp_path / "server.log")) == str(tmp_path / "server.log")
    # the default label names the directory, not a file in it
    assert default_name(str(d) + "/") == "log:vllm_ascend"


def test_new_file_in_directory_read_from_start_once(tmp_path):
    d = tmp_path / "vllm_ascend"
    d.mkdir()
    first = Writer(d / ascend_name(4711))
    first.write(gw(1, seq=1))                      # before cachemon starts: history
    clock = Clock()
    src = source(config([d], tmp_path), clock)
    src.poll()
    assert hits(src) == 0
    first.write(gw(2, seq=2))
    src.poll()
    assert hits(src) == 2
    # a second process starts (new pid, new file) while the first keeps writing
    second = Writer(d / ascend_name(4712))
    second.write(gw(4, seq=3))
    first.write(gw(8, seq=4))
    src.poll()
    src.poll()
    assert hits(src) == 14
    assert len(src.entries[0].follower.files) == 2
    src.close()


def test_rotation_to_002_counts_every_line_once(tmp_path):
    d = tmp_path / "vllm_ascend"
    d.mkdir()
    clock = Clock()
    src = source(config([str(d) + "/"], tmp_path), clock)
    src.poll()
    w = Writer(d / ascend_name(4711))
    w.write(gw(1, seq=1))
    src.poll()
    w.write(gw(2, seq=2))
    # RotatingAscendFileHandler._rotate: close the stream, open <base>_002.log
    w.close()
    w2 = Writer(d / ascend_name(4711, 2))
    w2.write(gw(4, seq=3))
    src.poll()
    w2.write(gw(8, seq=4))
    w2.close()
    w3 = Writer(d / ascend_name(4711, 3))
    w3.write(gw(16, seq=5))
    src.poll()
    src.poll()
    assert hits(src) == 31
    fo = src.entries[0].follower
    assert fo.rotations == 0 and fo.truncations == 0     # new names, nothing renamed or cut
    src.close()


def test_restart_across_the_switch_reads_nothing_twice(tmp_path):
    d = tmp_path / "vllm_ascend"
    d.mkdir()
    pattern = str(d / "vllm_ascend_*.log")
    cfg = config([pattern], tmp_path)
    clock = Clock()
    src = source(cfg, clock)
    src.poll()
    w = Writer(d / ascend_name(4711))
    w.write(gw(1, seq=1))
    src.poll()
    w.write(gw(2, seq=2))
    src.close()                                    # saves offsets + counters
    # while cachemon is down: the file fills up and the handler switches to _002.log
    w.write(gw(4, seq=3))
    w.close()
    w2 = Writer(d / ascend_name(4711, 2))
    w2.write(gw(8, seq=4))
    src2 = source(cfg, clock)
    assert hits(src2) == 3
    src2.poll()
    src2.poll()
    assert hits(src2) == 15
    w2.write(gw(16, seq=5))
    src2.poll()
    assert hits(src2) == 31
    src2.close()


def test_idle_files_are_closed_and_resumed_when_they_grow(tmp_path):
    d = tmp_path / "vllm_ascend"
    d.mkdir()
    clock = Clock()
    src = source(config([d], tmp_path), clock)
    src.poll()
    writers = [Writer(d / ascend_name(4000 + i)) for i in range(5)]
    for i, w in enumerate(writers):
        w.write(gw(1 << i, seq=i))
    src.poll()
    fo = src.entries[0].follower
    assert len(fo.files) == 5 and hits(src) == 31
    clock.advance(tailer.IDLE_CLOSE + 1)
    src.poll()
    assert fo.files == {} and fo.idle_closes == 5     # nothing written: all closed
    for _ in range(3):
        src.poll()                                    # closed files are not reopened while unchanged
    assert fo.files == {} and hits(src) == 31
    writers[2].write(gw(32, seq=10))
    src.poll()
    assert hits(src) == 31                            # closed files are stat'ed every IDLE_RESTAT only
    clock.advance(tailer.IDLE_RESTAT)
    src.poll()
    assert hits(src) == 63 and len(fo.files) == 1     # resumed at its offset
    # the rotated-name scan (every RESCAN_INTERVAL) does not reread the closed ones either
    clock.advance(tailer.RESCAN_INTERVAL + 1)
    src.poll()
    assert hits(src) == 63
    src.close()
    src2 = source(config([d], tmp_path), clock)      # and neither does a restart
    src2.poll()
    assert hits(src2) == 63
    src2.close()


def test_labels_stay_those_of_the_configured_path(tmp_path):
    d = tmp_path / "vllm_ascend"
    d.mkdir()
    clock = Clock()
    cfg = apply_log_flags(None, [str(d) + "/"], None, str(tmp_path / "state.json"))
    cfg.builtin_parsers = True
    src = source(cfg, clock)
    src.poll()
    stats = ("INFO 12-01 20:18:{s:02d} [loggers.py:248] Engine 000: Avg prompt throughput: 1.0 tokens/s, "
             "Avg generation throughput: 1.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, "
             "GPU KV cache usage: 1.0%, Prefix cache hit rate: 50.0%\n")
    before: set = set()
    for seq in range(1, 4):
        w = Writer(d / ascend_name(4711, seq))
        w.write(stats.format(s=seq))
        w.close()
        clock.advance(1)
        src.poll()
        now = label_values(src, C.LOG_STATS_AGE.name) | label_values(src, C.LOG_LINES.name)
        assert not before or now == before
        before = now
    assert label_values(src, C.LOG_STATS_AGE.name) == {f'upstream="log:vllm_ascend",file="{d}/"'}
    assert src.entries[0].stream.lines["parsed"] == 3
    src.close()


def test_directory_created_after_start(tmp_path):
    d = tmp_path / "later"
    clock = Clock()
    src = source(config([str(d) + "/"], tmp_path), clock)
    src.poll()
    assert src.entries[0].follower.status[0] == "missing"
    os.mkdir(d)
    w = Writer(d / ascend_name(1))
    w.write(gw(5, seq=1))
    src.poll()
    assert hits(src) == 5
    src.close()


def test_many_files_never_hold_many_descriptors(tmp_path, monkeypatch):
    monkeypatch.setattr(tailer, "MAX_OPEN", 3)
    monkeypatch.setattr(tailer, "MAX_KNOWN", 5)      # remembered files past it: still never read twice
    d = tmp_path / "vllm_ascend"
    d.mkdir()
    old = [Writer(d / ascend_name(5000 + i)) for i in range(8)]
    for i, w in enumerate(old):
        w.write(gw(1000, seq=i))                   # before the first start: history
    clock = Clock()
    cfg = config([d], tmp_path)
    src = source(cfg, clock)
    fo = src.entries[0].follower
    src.poll()
    assert len(fo.files) <= 3 and hits(src) == 0
    total = 0
    for i, w in enumerate(old):                    # every one of them grows again, one per poll
        w.write(gw(1 << i, seq=100 + i))
        total += 1 << i
        clock.advance(tailer.IDLE_RESTAT)
        src.poll()
        assert len(fo.files) <= 3
    assert hits(src) == total
    new = [Writer(d / ascend_name(6000 + i)) for i in range(6)]
    for i, w in enumerate(new):                    # 6 new files at once, from their start
        w.write(gw(1 << (10 + i), seq=200 + i))
        total += 1 << (10 + i)
    src.poll()
    src.poll()
    assert len(fo.files) <= 3 and hits(src) == total
    src.close()
    # a restart over 14 known files opens none of them while they stay unchanged
    src2 = source(cfg, clock)
    fo2 = src2.entries[0].follower
    assert fo2.files == {} and hits(src2) == total
    old[3].write(gw(1 << 20, seq=300))
    src2.poll()
    src2.poll()
    assert hits(src2) == total + (1 << 20) and len(fo2.files) <= 3
    src2.close()


def test_kill_after_a_save_across_the_switch_counts_each_line_once(tmp_path):
    from logs_support import kill
    d = tmp_path / "vllm_ascend"
    d.mkdir()
    clock = Clock()
    cfg = config([d], tmp_path, save_interval=5.0)
    src = source(cfg, clock)
    src.poll()
    w = Writer(d / ascend_name(4711))
    w.write(gw(1, seq=1))
    clock.advance(6)
    src.poll()                                     # saved: first file at 1 line, hits 1
    w.write(gw(2, seq=2))
    w.close()
    w2 = Writer(d / ascend_name(4711, 2))          # the switch, read but not saved
    w2.write(gw(4, seq=3))
    src.poll()
    assert hits(src) == 7
    kill(src)
    src2 = source(cfg, clock)
    assert hits(src2) == 1                         # the snapshot
    src2.poll()
    src2.poll()
    assert hits(src2) == 7                         # first file from its saved offset, _002 whole
    src2.close()


def test_directory_listed_again_only_when_it_changes(tmp_path, monkeypatch):
    d = tmp_path / "vllm_ascend"
    d.mkdir()
    w = Writer(d / ascend_name(1))
    past = os.stat(d).st_mtime - 10
    os.utime(d, (past, past))                     # a directory quiet for 10 s: its listing is reused
    calls = []
    real_glob = discovery.globmod.glob
    monkeypatch.setattr(discovery.globmod, "glob", lambda p, *a, **k: calls.append(p) or real_glob(p, *a, **k))
    clock = Clock()
    src = source(config([d], tmp_path), clock)
    src.poll()
    listed = sum(1 for p in calls if p.endswith("*.log"))
    for _ in range(3):
        src.poll()
    assert sum(1 for p in calls if p.endswith("*.log")) == listed
    w.write(gw(1, seq=1))                          # a write does not change the directory
    src.poll()
    assert hits(src) == 1
    w2 = Writer(d / ascend_name(2))                # a new file does: listed again, read from its start
    w2.write(gw(2, seq=2))
    src.poll()
    assert hits(src) == 3
    src.close()
