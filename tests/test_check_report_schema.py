"""The cachemon-check/1 JSON that `cachemon check` prints has exactly the keys its TypedDicts
(check/report.py) declare: the schema is the code, not a docstring. Real 0.32.0 captures, read
twice with the interval between them, and a real vLLM log."""
from __future__ import annotations

import json
from typing import get_type_hints

from click.testing import CliRunner

from cachemon.check import check_command
from cachemon.check import report as R
from cachemon.demo.replay import ReplayServer, bundled_pages
from helpers import FIXTURES


def keys(td: type) -> tuple[frozenset[str], frozenset[str]]:
    return td.__required_keys__, td.__optional_keys__


def conforms(obj: dict, td: type, where: str) -> None:
    required, optional = keys(td)
    assert required <= obj.keys(), (where, sorted(required - obj.keys()))
    assert obj.keys() <= required | optional, (where, sorted(obj.keys() - required - optional))


def test_the_json_report_of_a_page_and_a_log_has_exactly_the_declared_keys():
    with ReplayServer(bundled_pages()) as srv:
        srv.show(1)
        r = CliRunner().invoke(check_command, ["--upstream", f"vllm={srv.url}", "--interval", "0",
                                               "--log-file", str(FIXTURES / "vllm-0.32.0-cpu" / "server.log"),
                                               "--format", "json"])
    rep = json.loads(r.stdout)
    conforms(rep, R.CheckReport, "report")
    assert rep["schema"] == R.SCHEMA and r.exit_code == rep["exit_code"]
    kinds = [s["kind"] for s in rep["sources"]]
    assert kinds == ["metrics", "log"]
    hints = get_type_hints(R.SourceReport)
    for s in rep["sources"]:
        conforms(s, R.SourceReport, s["kind"])
        assert "text_extra" not in s and "kv_extra" not in s        # text output only
        conforms(s["cache_config"], R.ReportedConfig, "cache_config")
        assert s["series"] if s["kind"] == "metrics" else s["log"]["lines"]["parsed"] > 0
        for row in s["series"]:
            conforms(row, R.SeriesRow, "series")
        for f in s["findings"]:
            conforms(f, R.Finding, "finding")
            assert f["severity"] in ("info", "warning", "critical")
        assert s["attribution"], s["kind"]
        for a in s["attribution"]:
            conforms(a, R.AttributionRow, "attribution")
            for c in a["causes"]:
                conforms(c, R.CauseRow, "cause")
        for g in s["gauges"]:
            conforms(g, R.GaugeRow, "gauge")
    log = rep["sources"][1]["log"]
    conforms(log, R.LogInfo, "log")
    assert "kv_events" in hints and "log" in hints
