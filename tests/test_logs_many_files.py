"""Issue 38 (round 6): a log directory of more than 4 096 files was read twice after a restart
(5 000 lines -> 5 840) with no warning: the tailer remembered at most 4 096 closed files. It now
remembers 16 384, and past the bound each forgotten file is counted
(cachemon_log_files_forgotten_total) and warned of. Log lines are CONSTRUCTED gateway lines."""
from __future__ import annotations

import pytest

from cachemon.expose.render import render
from cachemon.sources.logs import tailer
from helpers import samples, value
from logs_support import config, gw, hits, source


def one_line_files(d, n: int):
    d.mkdir()
    for i in range(n):
        (d / f"f{i:05d}.log").write_text(gw(1, seq=i))
    return d


def read_all(src, polls: int = 3) -> None:
    for _ in range(polls):
        src.poll()


@pytest.mark.slow
def test_a_directory_of_5000_files_is_counted_once_across_a_restart(tmp_path):
    logs = one_line_files(tmp_path / "logs", 5000)
    first = source(config([logs], tmp_path, from_beginning=True))
    read_all(first)
    assert hits(first) == 5000
    first.close()
    again = source(config([logs], tmp_path, from_beginning=True))
    read_all(again)
    assert hits(again) == 5000          # 74d8045: 5840 (840 files forgotten, read again)
    assert value(samples(render([again]).decode()), "cachemon_log_files_forgotten_total", upstream="log0") == 0
    again.close()


def test_files_forgotten_past_the_bound_are_counted_and_warned_of(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(tailer, "HARD_MAX_KNOWN", 100)      # the bound made small, the mechanism the same
    monkeypatch.setattr(tailer, "MAX_KNOWN", 50)
    logs = one_line_files(tmp_path / "logs", 300)
    src = source(config([logs], tmp_path, from_beginning=True))
    with caplog.at_level("WARNING", logger="cachemon.logs"):
        read_all(src)
    forgotten = value(samples(render([src]).decode()), "cachemon_log_files_forgotten_total", upstream="log0")
    # every file closed once read (at most tailer.MAX_OPEN stay open), the remembered ones capped at 100
    assert forgotten == 300 - 100 - len(src.entries[0].follower.files)
    assert any("forgotten" in r.getMessage() and "read again" in r.getMessage() for r in caplog.records)
    src.close()
    again = source(config([logs], tmp_path, from_beginning=True))
    read_all(again)
    # what was counted is exactly what is read again: visible, not silent
    assert hits(again) == 300 + forgotten
    again.close()
