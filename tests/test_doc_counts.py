"""The counts the docs state about the generated bundle follow it: panels and panel queries of the
dashboards, the panels the demo leaves empty (tests/test_demo_stack.py's list, each checked there on a
real Prometheus), the alerts docs/deploy.md names, the rule count it gives, the test-suite time.

A doc count that drifts from the generated files fails here; test_demo_stack.py checks the measured
numerator (queries answered on the demo) against docs/demo.md.
"""
from __future__ import annotations

import re
from pathlib import Path

from cachemon.monitoring import dashboards, prometheus_rules
from cachemon.monitoring import site as mconfig
from test_demo_stack import EMPTY_ON_THE_DEMO

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
DEMO = (ROOT / "docs" / "demo.md").read_text(encoding="utf-8")
DEPLOY = (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")
CFG = mconfig.DEFAULT


def counts() -> tuple[int, int]:
    """(panels, panel queries) of the shipped dashboards."""
    panels = [p for d in dashboards.dashboards(CFG).values() for p in d["panels"] if p["type"] != "row"]
    return len(panels), sum(len(p["targets"]) for p in panels)


def test_the_panel_counts_in_readme_and_demo_doc_are_the_dashboards():
    panels, queries = counts()
    empty = len(EMPTY_ON_THE_DEMO)
    assert f"({panels - empty} of {panels} panels; the other {empty} need" in README, (panels, empty)
    assert f"of {queries}, {panels - empty} of the {panels} panels" in DEMO, (queries, panels)
    assert f"the {empty} empty ones" in DEMO


def test_deploy_doc_names_every_alert_and_counts_the_rules():
    alerting = prometheus_rules.alert_group(CFG)["rules"]
    recording = prometheus_rules.recording_group(CFG)["rules"]
    missing = sorted({r["alert"] for r in alerting} - set(re.findall(r"`(Cachemon\w+)`", DEPLOY)))
    assert not missing, f"docs/deploy.md does not name {missing}"
    assert f"# {len(recording)} + {len(alerting)} rules" in DEPLOY


def test_the_suite_time_is_stated_once_the_same():
    minutes = set(re.findall(r"`make test` takes about (\d+) minutes", README))
    minutes |= set(re.findall(r"the whole suite \(about (\d+) minutes",
                              (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")))
    assert len(minutes) == 1, minutes
