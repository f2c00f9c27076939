"""A new frontend is rows of data: added here, in the test alone, `run` and `check` follow it.

CONSTRUCTED: "mockfe" is no real frontend. Its log lines are written here, in the shape of a frontend
whose page says nothing of the cache (as vLLM 0.32's Rust frontend): it announces itself, its engine
states its release, the prefix-caching flag, the pool and the block count, and it logs a stats line
of its own layout every interval. Nothing in src/ names it: the test adds one row to each table
(eras.FRONTENDS; log_grammar.GRAMMARS, LOG_KINDS and CONFIG_LINES) and checks what the daemon's
log source exports and what `cachemon check` reports.
"""
from __future__ import annotations

import re

import pytest

from cachemon.check import run_checks
from cachemon.expose.collector import CachemonCollector
from cachemon.expose.render import render
from cachemon.normalise import eras, log_grammar
from cachemon.state.store import Store
from helpers import samples, value
from logs_support import Clock, config, source

LINES = [
    "(MockFE pid=7) INFO 12-06 10:00:00 [launch.py:1] Launching MockFE frontend: port 8000",
    "(EngineCore pid=8) INFO 12-06 10:00:01 [core.py:1] MockFE engine v9.9.0 up: prefix_caching=True",
    "(EngineCore pid=8) INFO 12-06 10:00:02 [kv.py:1] MockFE pool: 3200 tokens in 100 blocks",
    "(MockFE pid=7) INFO 12-06 10:00:10 [stats.py:1] MockFE stats: 12.5 prompt tok/s, running 2, waiting 0, "
    "kv 5.0%, hit 40.0%",
    "(MockFE pid=7) INFO 12-06 10:00:20 [stats.py:1] MockFE stats: 30.0 prompt tok/s, running 1, waiting 3, "
    "kv 7.5%, hit 62.5%",
]


@pytest.fixture
def mockfe_rows(monkeypatch):
    """The rows a contributor would add for this frontend, and nothing else."""
    grammar = log_grammar.StatsGrammar(
        "mockfe", "mockfe", "constructed", re.compile(
            r"(?:^|\] )MockFE stats: (?P<prompt>[0-9.]+) prompt tok/s, running (?P<running>\d+), "
            r"waiting (?P<waiting>\d+), kv (?P<kv>[0-9.]+)%, hit (?P<hit_local>[0-9.]+)%"),
        hit_basis="interval", interval=10.0, evidence="constructed (tests/test_new_frontend_is_rows.py)",
        needle=b"MockFE stats")
    monkeypatch.setattr(log_grammar, "GRAMMARS", log_grammar.GRAMMARS + (grammar,))
    monkeypatch.setitem(log_grammar.LOG_KINDS, "mockfe", log_grammar.LogKind("mockfe", True, "mockfe-log"))
    monkeypatch.setattr(log_grammar, "CONFIG_LINES", log_grammar.CONFIG_LINES + (
        log_grammar.ConfigLine("Launching MockFE", re.compile(r"(?:^|\] )Launching (?P<frontend>MockFE) frontend")),
        log_grammar.ConfigLine("MockFE engine", re.compile(
            r"(?:^|\] )MockFE engine v(?P<version>[\w.]+) up: prefix_caching=(?P<prefix_caching>True|False)")),
        log_grammar.ConfigLine("MockFE pool", re.compile(
            r"(?:^|\] )MockFE pool: (?P<pool>\d+) tokens in (?P<blocks>\d+) blocks")),
    ))
    monkeypatch.setattr(eras, "FRONTENDS", eras.FRONTENDS + (eras.Frontend(
        "mockfe", "constructed", "Prometheus text 0.0.4", "counters going down", "its engine's start-up lines",
        "mockfe", config_on_page=False, start_time_on_page=False, created_on_page=False),))


def _log(tmp_path):
    log = tmp_path / "mockfe.log"
    log.write_text("\n".join(LINES) + "\n")
    return log


def test_without_the_rows_the_lines_say_nothing(tmp_path):
    """The control: today's tables do not read this frontend's lines."""
    src = source(config([_log(tmp_path)], tmp_path, from_beginning=True, rules=()), Clock())
    src.poll()
    s = src.entries[0].stream
    assert s.stats_lines == 0 and s.era == "" and s.config == {}


def test_run_follows_the_rows(tmp_path, mockfe_rows):
    store = Store({"1m": 60.0})
    src = source(config([_log(tmp_path)], tmp_path, from_beginning=True, rules=()), Clock(), store)
    src.poll()
    s = src.entries[0].stream
    assert s.stats_lines == 2 and s.kind == "mockfe" and s.era == "mockfe-log"
    assert s.config["frontend"] == "mockfe"
    page = samples(render([CachemonCollector(store), src]).decode())
    # the newest stats line's ratio, with the row's basis; the block size its engine's lines imply (3200 / 100)
    assert value(page, "cachemon_prefix_cache_reported_hit_ratio", upstream="log0", basis="interval") == 0.625
    assert value(page, "cachemon_upstream_info", upstream="log0", kind="log", era="mockfe-log",
                 vllm_version="9.9.0", prefix_caching="true", block_size="32") == 1
    assert value(page, "cachemon_kv_cache_usage_ratio", upstream="log0") == 0.075


def test_check_follows_the_rows(tmp_path, mockfe_rows):
    cfg = config([_log(tmp_path)], tmp_path, from_beginning=True, rules=(), state=False)
    (rep,) = run_checks([], 0.0, {}, logs=cfg, sleep=lambda _s: None)
    assert rep["kind"] == "log" and rep["era"] == "mockfe-log"
    assert rep["vllm_version"] == "9.9.0"
    assert rep["cache_config"] == {"prefix_caching": "true", "block_size": 32, "hash_algo": ""}
    (ratio,) = rep["reported_hit_ratios"]
    assert ratio["value"] == 0.625 and ratio["basis"] == "interval"


def test_the_analyze_error_names_the_frontends_the_rows_say_serve_no_config(mockfe_rows):
    assert eras.frontends_without_config_on_page() == ["rust", "mockfe"]
