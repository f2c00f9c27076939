"""Issue 37: `cachemon run --log-file` on a path that matches nothing said nothing at all (not even
at debug) while `check` says "no file matches". Now one WARNING at start, and again only when that
changes; the metrics already showed it (cachemon_upstream_up 0, last error reason "missing").
Log lines are CONSTRUCTED gateway lines (logs_support.gw)."""
from __future__ import annotations

from cachemon.expose.collector import CachemonCollector
from cachemon.expose.render import render
from cachemon.state.store import Store
from helpers import samples, value
from logs_support import Clock, config, gw, hits, source


def test_a_log_path_that_matches_nothing_is_said_once_at_start(tmp_path, caplog):
    d = tmp_path / "logs"
    store, clock = Store({"1m": 60.0}), Clock()
    src = source(config([d / "*.log"], tmp_path), clock=clock, store=store)
    with caplog.at_level("WARNING", logger="cachemon.logs"):
        for _ in range(5):
            src.poll()
            clock.advance(1.0)
    said = [r.getMessage() for r in caplog.records if "no file matches" in r.getMessage()]
    assert len(said) == 1 and str(d / "*.log") in said[0], said
    page = samples(render([CachemonCollector(store)]).decode())
    assert value(page, "cachemon_upstream_up", upstream="log0") == 0
    assert value(page, "cachemon_upstream_last_error_info", upstream="log0", reason="missing") == 1
    d.mkdir()
    (d / "a.log").write_text(gw(1))      # it appears: read, and no new warning
    caplog.clear()
    with caplog.at_level("WARNING", logger="cachemon.logs"):
        src.poll()
    assert hits(src) == 1 and not [r for r in caplog.records if "no file matches" in r.getMessage()]
    src.close()
