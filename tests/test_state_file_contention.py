"""The log state file under contention and faults: a second cachemon on it refuses, a full disk,
a read-only directory and corrupted JSON are counted and visible, and the offsets are kept.
Log lines are CONSTRUCTED gateway lines (logs_support.gw)."""
from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from cachemon.config import ConfigError
from cachemon.expose.render import render
from cachemon.sources.logs import statefile
from helpers import CachemonProcess, free_port
from logs_support import Writer, config, gw, hits, source


def _lines(src, outcome="parsed") -> float:
    return src.entries[0].stream.lines[outcome]


def test_a_second_cachemon_on_the_same_state_file_refuses_and_steals_nothing(tmp_path):
    log = tmp_path / "app.log"
    w = Writer(log)
    w.write("".join(gw(1, seq=i) for i in range(18)))
    first = source(config([log], tmp_path, from_beginning=True))
    first.poll()
    assert (_lines(first), hits(first)) == (18, 18)
    saved = (tmp_path / "state.json").read_bytes()
    with pytest.raises(ConfigError) as refused:
        source(config([log], tmp_path, from_beginning=True))      # the second one, from the beginning
    msg = str(refused.value)
    assert "\n" not in msg and "in use by another cachemon" in msg and f"pid {os.getpid()}" in msg
    assert (tmp_path / "state.json").read_bytes() == saved        # its offsets were not touched
    first.close()
    w.write(gw(2, seq=99))                  # written while it is down
    # a restart of the first: its counters, the line counters too, go on from where it stopped
    again = source(config([log], tmp_path, from_beginning=True))
    assert (_lines(again), hits(again)) == (18, 18)
    again.poll()
    assert (_lines(again), hits(again)) == (19, 20)
    again.close()


@pytest.mark.slow
def test_two_processes_second_exits_2_with_one_line(tmp_path):
    log = tmp_path / "app.log"
    Writer(log).write(gw(1))
    cfg = tmp_path / "c.yaml"
    cfg.write_text("logs:\n  rules:\n    - regex: 'cache_hit=(?P<h>\\d+) cache_miss=(?P<m>\\d+)'\n"
                   "      counters: {hit_tokens: h, miss_tokens: m}\n"
                   "upstreams: []\n")
    state = tmp_path / "state.json"
    args = ("--config", str(cfg), "--log-file", str(log), "--state-file", str(state))
    first = CachemonProcess(*args)          # listening: its stages, the log source, are up
    try:
        assert Path(str(state) + ".lock").read_text().strip() == str(first.proc.pid)
        second = subprocess.run([sys.executable, "-m", "cachemon.cli", "run", "--listen", f"127.0.0.1:{free_port()}",
                                 *args, "--from-beginning"], capture_output=True, text=True, timeout=30)
        assert second.returncode == 2, second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and "in use by another cachemon" in lines[0], lines
        assert str(first.proc.pid) in lines[0], lines
        assert first.proc.poll() is None          # the first one runs on
    finally:
        first.stop()


def _saves_failed(src) -> float:
    text = render([src]).decode()
    return float(next(line.split()[-1] for line in text.splitlines()
                      if line.startswith("cachemon_log_state_save_errors_total")))


def test_disk_full_at_the_write_call_is_counted_and_keeps_the_last_good_offsets(tmp_path, monkeypatch, caplog):
    # SIMULATED: ENOSPC raised by os.write inside statefile.save (the tmpfs test below is the real one)
    w, cfg, src, good = _running(tmp_path, tmp_path)

    w.write(gw(2))
    real_write = os.write

    def full(fd, data):
        if os.readlink(f"/proc/self/fd/{fd}").endswith("state.json.tmp"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)
    monkeypatch.setattr(statefile.os, "write", full)
    with caplog.at_level("WARNING", logger="cachemon.logs"):
        src.poll()
        assert src.save_state() is False
    assert "No space left on device" in caplog.text and _saves_failed(src) == 1
    assert (tmp_path / "state.json").read_bytes() == good           # the last good save stands
    assert not (tmp_path / "state.json.tmp").exists()               # the half-written temp file is gone
    assert hits(src) == 3                                            # and reading goes on
    monkeypatch.undo()
    assert src.save_state() is True
    src.close()
    assert hits(source(cfg)) == 3


def _running(tmp_path: Path, state_dir: Path):
    """A log source that has read one line and saved: (writer, config, source, the saved bytes)."""
    w = Writer(tmp_path / "app.log")
    w.write(gw(1))
    cfg = config([tmp_path / "app.log"], state_dir, from_beginning=True)
    src = source(cfg)
    src.poll()
    return w, cfg, src, (state_dir / "state.json").read_bytes()


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, timeout=20)


@contextmanager
def tmpfs(path: Path, size: str):
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a tmpfs needs root and mount(8)")
    path.mkdir()
    try:
        _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path))
    except (subprocess.CalledProcessError, OSError) as e:
        pytest.skip(f"cannot mount a tmpfs here: {getattr(e, 'stderr', e)!r}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=20)


@pytest.mark.slow
def test_disk_full_on_a_tiny_tmpfs(tmp_path):
    with tmpfs(tmp_path / "small", "16k") as d:
        w, cfg, src, good = _running(tmp_path, d)
        fd = os.open(d / "filler", os.O_WRONLY | os.O_CREAT)     # fill the rest of the disk
        try:
            while True:
                os.write(fd, b"\0" * 1024)
        except OSError as e:
            assert e.errno == errno.ENOSPC
        finally:
            os.close(fd)
        w.write("".join(gw(2, seq=i) for i in range(40)))
        src.poll()
        assert src.save_state() is False and _saves_failed(src) >= 1
        assert (d / "state.json").read_bytes() == good
        assert hits(src) == 81
        os.unlink(d / "filler")
        assert src.save_state() is True
        src.close()
        assert hits(source(cfg)) == 81


@pytest.mark.slow
def test_read_only_directory_is_counted_and_keeps_the_offsets(tmp_path):
    with tmpfs(tmp_path / "ro", "1m") as d:
        w, cfg, src, good = _running(tmp_path, d)
        _mount("-o", "remount,ro", str(d))
        w.write(gw(2))
        src.poll()
        assert src.save_state() is False and _saves_failed(src) >= 1
        assert (d / "state.json").read_bytes() == good and hits(src) == 3
        src.close()
        # a restart on the read-only directory resumes from the last good save
        again = source(cfg)
        assert hits(again) == 1
        again.poll()
        assert hits(again) == 3
        assert _saves_failed(again) >= 1
        again.close()


def test_corrupted_json_is_counted_visible_and_set_aside(tmp_path, caplog):
    _, cfg, src, _ = _running(tmp_path, tmp_path)
    src.close()
    state = tmp_path / "state.json"
    good = json.loads(state.read_text())
    damaged = state.read_text()[:-7]                 # a torn write
    state.write_text(damaged)
    with caplog.at_level("WARNING", logger="cachemon.logs"):
        again = source(cfg)
    assert "not valid JSON" in caplog.text and "state.json.corrupt" in caplog.text
    text = render([again]).decode()
    assert "cachemon_log_state_load_errors_total 1.0" in text
    # the damaged file is kept beside, so the next save does not overwrite what it holds
    assert (tmp_path / "state.json.corrupt").read_text() == damaged
    assert good["payload"]["sources"]["log0"]["files"][0]["offset"] > 0
    again.close()


def test_close_reads_at_most_the_shutdown_budget_and_saves_offsets_that_match_the_counters(tmp_path):
    # a backlog far above what a shutdown may still read (SIGTERM must end `run` in seconds)
    from cachemon.sources.logs.tailer import SHUTDOWN_BUDGET
    w, cfg, src, _ = _running(tmp_path, tmp_path)
    line = gw(2, seq=7)
    w.write(line * (3 * SHUTDOWN_BUDGET // len(line)))
    src.close()
    payload = statefile.load(tmp_path / "state.json")
    offset = payload["sources"]["log0"]["files"][0]["offset"]
    first = len(gw(1))
    assert first < offset <= first + SHUTDOWN_BUDGET + 64 * 1024      # read on, but no more than the budget
    assert (offset - first) % len(line) == 0                             # whole lines
    again = source(cfg)
    assert hits(again) == 1 + 2 * ((offset - first) // len(line))        # counters saved with that offset
    again.close()
