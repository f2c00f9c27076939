"""`cachemon run` live on a REAL hybrid sliding-window vLLM 0.32.0 (tests/fixtures/vllm-0.32.0-cpu-hybrid-swa/
live_cachemon, recorded by scripts/e2e/kv_window_live.py: the model config constructed, window 512; the
server, its events and cachemon's pages real). What the running daemon exported is held to what the
recorder's own subscription to the same events implies, replayed through the ledger here."""
from __future__ import annotations

import json
import re

import pytest

from cachemon.state.ledger.fleet import FleetLedger
from helpers import FIXTURES
from kv_support import messages

LIVE = FIXTURES / "vllm-0.32.0-cpu-hybrid-swa" / "live_cachemon"
pytestmark = pytest.mark.skipif(not (LIVE / "cachemon-polls.json").is_file(), reason="live capture not recorded")
_LINE = re.compile(r'^(\w+)\{([^}]*)\} (\S+)$')


def _page() -> list[tuple[str, dict[str, str], float]]:
    out = []
    for line in (LIVE / "cachemon-final.txt").read_text().splitlines():
        m = _LINE.match(line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
            out.append((m.group(1), labels, float(m.group(3))))
    return out


def _replayed(t_final: float):
    fleet = FleetLedger()
    msgs = [m for m in messages(LIVE) if m["t"] <= t_final]
    for m in msgs:
        fleet.on_batch(m["replica"], "tiny", m["batch"], m["t"])
    view = fleet.view(msgs[0]["replica"])
    assert view is not None and view.in_sync
    return view


def test_the_daemon_exported_the_window_the_split_and_the_cause_the_events_imply():
    saved = json.loads((LIVE / "cachemon-polls.json").read_text())
    view = _replayed(saved["t_final"])
    page = _page()
    window = json.loads((LIVE / "model-config.json").read_text())["sliding_window"]
    assert [v for n, lab, v in page if n == "cachemon_kv_sliding_window_tokens"] == [float(window)] == [512.0]
    stored = {lab["reason"]: v for n, lab, v in page if n == "cachemon_kv_stored_tokens_total"}
    assert {k: v for k, v in stored.items() if v} == {k: v for k, v in view.stored_tokens.items() if v}
    assert stored["sliding_window"] > 0
    missed = {(lab["cause"], lab["certainty"]): v for n, lab, v in page if n == "cachemon_cause_missed_tokens_total"}
    assert missed[("sliding_window", "exact")] == view.stored_tokens["sliding_window"]
    assert [v for n, lab, v in page if n == "cachemon_kv_ledger_in_sync"] == [1.0]
    active = {(c, ce) for s in saved["samples"] for _u, c, ce in s["active"]}
    assert ("sliding_window", "exact") in active
    assert not {c for c, _ in active} & {"dynamic_prefix", "dynamic_prefix_suspected"}
