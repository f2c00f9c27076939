"""Issue 38 (round 6): the state file's lock held against a symlink and against removal (item 6), and
a deeply nested state file read as a counted reset. On
74d8045 a symlinked lock path ran without the lock, and a lock file or state directory removed
under a running cachemon let a second one start beside it, both writing the state (double and lost
counts). Log lines are CONSTRUCTED gateway lines (logs_support.gw)."""
from __future__ import annotations

import json
import shutil

import pytest

from cachemon.config import ConfigError
from cachemon.expose.render import render
from logs_support import Writer, config, gw, hits, source


def saved_hits(state) -> float:
    doc = json.loads(state.read_text())
    counters = doc["payload"]["sources"]["log0"]["stream"]["counters"]
    return sum(v for metric, _labels, v in counters if metric.endswith("hit_tokens"))


def test_a_symlinked_lock_path_is_refused(tmp_path):
    log = tmp_path / "app.log"
    Writer(log).write(gw(1))
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / "state.json.lock").symlink_to(tmp_path / "shared.lock")
    with pytest.raises(ConfigError) as refused:
        source(config([log], state_dir, from_beginning=True))
    assert "symlink" in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("remove", ["lock file", "state directory"])
def test_a_lock_removed_under_a_running_cachemon_is_taken_back_before_anyone_else(tmp_path, remove):
    log = tmp_path / "app.log"
    Writer(log).write("".join(gw(1, seq=i) for i in range(5)))
    state_dir = tmp_path / "state"
    first = source(config([log], state_dir, from_beginning=True))
    first.poll()
    if remove == "lock file":
        (state_dir / "state.json.lock").unlink()
    else:
        shutil.rmtree(state_dir)
    assert first.save_state()                 # the save re-creates the lock and holds it again
    with pytest.raises(ConfigError, match="in use by another cachemon"):
        source(config([log], state_dir, from_beginning=True))
    first.close()


def test_a_second_cachemon_that_locked_a_new_lock_file_is_the_only_writer(tmp_path, caplog):
    log = tmp_path / "app.log"
    w = Writer(log)
    w.write("".join(gw(1, seq=i) for i in range(5)))
    state_dir = tmp_path / "state"
    state = state_dir / "state.json"
    first = source(config([log], state_dir, from_beginning=True))
    first.poll()
    (state_dir / "state.json.lock").unlink()
    second = source(config([log], state_dir, from_beginning=True))   # started beside it: cannot be told
    second.poll()
    w.write("".join(gw(1, seq=10 + i) for i in range(3)))
    second.poll()
    assert second.save_state()
    assert hits(second) == 8 and saved_hits(state) == 8
    first.poll()
    # the first one found its lock gone and another holder: it counts on but writes nothing
    assert not first.save_state()
    assert saved_hits(state) == 8
    assert any("not writing log state file" in r.getMessage() and "another process" in r.getMessage()
               for r in caplog.records)
    first.close()
    assert saved_hits(state) == 8
    second.close()
    assert saved_hits(state) == 8


@pytest.mark.parametrize("junk", ["[" * 1000, '{"a":' * 5000, "[" * 100_000])
def test_a_deeply_nested_state_file_is_a_counted_visible_reset_not_a_traceback(tmp_path, caplog, junk):
    """Issue 38: a state file of 1 000 `[` (constructed) exited with a 47-line RecursionError."""
    log = tmp_path / "app.log"
    Writer(log).write(gw(1))
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / "state.json").write_text(junk)
    with caplog.at_level("WARNING", logger="cachemon.logs"):
        src = source(config([log], state_dir, from_beginning=True))
    assert "nested too deeply" in caplog.text and "state.json.corrupt" in caplog.text
    assert "cachemon_log_state_load_errors_total 1.0" in render([src]).decode()
    assert (state_dir / "state.json.corrupt").read_text() == junk
    src.close()
