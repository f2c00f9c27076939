"""User rules and the logs: config section: the documented gateway example on its
(constructed) sample, bad rules and bad config named by key, malformed matches counted."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from cachemon import catalog as C
from cachemon.cli import main
from cachemon.config import ConfigError, load_yaml
from cachemon.runconfig import build_config, from_dict
from cachemon.sources.logs.settings import apply_log_flags, parse_log_config
from cachemon.sources.logs.user_rules import derive_needle, parse_rule
from helpers import FIXTURES
from logs_support import Clock, config, source

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "gateway-log-rule.yaml"
GATEWAY = FIXTURES / "logs" / "gateway.log"


def _expected_gateway():
    """Read the sample independently: sum the numeric cache_hit / cache_miss pairs."""
    hit = miss = bad = 0
    for line in GATEWAY.read_text().splitlines():
        if "cache_hit=" not in line:
            continue
        kv = dict(p.split("=", 1) for p in line.split() if "=" in p)
        if kv["cache_hit"].isdigit() and kv["cache_miss"].isdigit():
            hit += int(kv["cache_hit"])
            miss += int(kv["cache_miss"])
        else:
            bad += 1
    return hit, miss, bad


def test_documented_gateway_rule_counts_exact_tokens(tmp_path):
    cfg = from_dict(load_yaml(EXAMPLE)).logs
    log = tmp_path / "access.log"
    shutil.copy(GATEWAY, log)
    cfg.files[0].path = str(log)
    cfg.state_file = ""
    cfg.from_beginning = True
    cfg.watch_events = False
    src = source(cfg, Clock())
    src.poll()
    s = src.entries[0].stream
    hit, miss, bad = _expected_gateway()
    key = ("tiny", "", "local")
    assert s.counters[(C.HIT_TOKENS.name, key)] == hit
    assert s.counters[(C.MISS_TOKENS.name, key)] == miss
    assert s.counters[(C.QUERY_TOKENS.name, key)] == hit + miss
    assert s.lines["malformed"] == bad == 1
    st = src.store.upstreams["gateway"]
    assert st.counters[(C.HIT_TOKENS.name, key)].value == hit      # fed to the store, upstream=gateway
    assert st.info.era == "rules"


def test_check_with_config_rules_reports_series(tmp_path):
    log = tmp_path / "access.log"
    shutil.copy(GATEWAY, log)
    res = CliRunner().invoke(main, ["check", "--config", str(EXAMPLE), "--log-file", str(log), "--format", "json"])
    import json
    rep = json.loads(res.output)
    (row,) = rep["sources"][0]["series"]
    hit, miss, _ = _expected_gateway()
    assert row["hit_tokens"] == hit and row["query_tokens"] == hit + miss
    assert row["hit_ratio_since_start"] == pytest.approx(hit / (hit + miss))
    assert {f["code"] for f in rep["sources"][0]["findings"]} >= {"malformed_lines"}


@pytest.mark.parametrize("rule, key", [
    ({"regex": "(", "counters": {"hit_tokens": "h"}}, "logs.rules[0].regex"),
    ({"regex": r"h=(?P<h>\d+)", "counters": {"hit_tokens": "h"}}, "logs.rules[0].counters"),
    ({"regex": r"h=(?P<h>\d+) m=(?P<m>\d+)", "counters": {"hit_tokens": "h", "miss_tokens": "x"}},
     "logs.rules[0].counters.miss_tokens.group"),
    ({"regex": r"h=(?P<h>\d+)", "counters": {"hits": "h"}}, "logs.rules[0].counters.hits"),
    ({"regex": r"h=(?P<h>\d+)", "gauges": {"kv_cache_usage_ratio": {"group": "h", "scale": -1}}},
     "logs.rules[0].gauges.kv_cache_usage_ratio.scale"),
    ({"regex": r"h=(?P<h>\d+)"}, "logs.rules[0]"),
    ({"regex": r"h=(?P<h>\d+)", "gauges": {"requests_running": "h"}, "labels": {"instance": "x"}},
     "logs.rules[0].labels.instance"),
    ({"regex": r"x", "gauges": {"requests_running": "h"}, "colour": 1}, "logs.rules[0].colour"),
])
def test_bad_rule_names_its_key(rule, key):
    with pytest.raises(ConfigError) as e:
        parse_log_config({"files": ["/x.log"], "rules": [rule]}, "logs")
    assert e.value.key == key


@pytest.mark.parametrize("raw, key", [
    ({"files": [{"name": "a"}]}, "logs.files[0].path"),
    ({"files": ["/a/x.log", "/b/x.log"]}, "logs.files[1].name"),
    ({"files": ["/x.log"], "poll_interval": "fast"}, "logs.poll_interval"),
    ({"files": ["/x.log"], "max_line_bytes": 10}, "logs.max_line_bytes"),
    ({"files": ["/x.log"], "on_state_error": "ignore"}, "logs.on_state_error"),
    ({"files": ["/x.log"], "tail": True}, "logs.tail"),
    ({"files": ["/x.log"], "builtin_parsers": False}, "logs.builtin_parsers"),
    (42, "logs"),
])
def test_bad_logs_config_names_its_key(raw, key):
    with pytest.raises(ConfigError) as e:
        parse_log_config(raw, "logs")
    assert e.value.key == key


def test_cli_bad_config_exits_2(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("logs:\n  files: [/x.log]\n  rules:\n    - regex: '('\n      counters: {hit_tokens: h}\n")
    res = CliRunner().invoke(main, ["run", "--config", str(cfg)])
    assert res.exit_code == 2 and "logs.rules[0].regex" in res.output


def test_flags_merge_with_config(tmp_path):
    cfg = build_config(None, (), None, None, (), None, None, log_files=("/var/log/a.log",), from_beginning=True,
                       state_file=str(tmp_path / "s.json"))
    assert [f.name for f in cfg.logs.files] == ["log:a.log"] and cfg.logs.from_beginning
    assert cfg.upstreams == []           # a log-only sidecar polls no /metrics by default
    merged = apply_log_flags(parse_log_config({"files": [{"path": "/b.log", "name": "b", "model_name": "m"}]}),
                             ["/c.log"], None, "none")
    assert [(f.name, f.model_name) for f in merged.files] == [("b", "m"), ("log:c.log", "")]
    assert merged.state_path() is None


def test_default_state_path_depends_on_the_files():
    a = parse_log_config({"files": ["/a.log"]}).state_path()
    b = parse_log_config({"files": ["/b.log"]}).state_path()
    assert a != b and a.name.startswith("logs-") and a.suffix == ".json"


def test_rule_needle_derivation_never_rejects_a_match():
    assert derive_needle(r"cache_hit=(?P<h>\d+)") == "cache_hit="
    assert derive_needle(r"(?:a|b)=(?P<h>\d+)") == "="
    assert derive_needle(r"(?i)HIT=(?P<h>\d+)") == ""
    r = parse_rule({"regex": r"(?i)HIT=(?P<h>\d+) m=(?P<m>\d+)", "counters": {"hit_tokens": "h", "miss_tokens": "m"}},
                   "r")
    assert r.needles == ()                # no literal: every line is tried


def test_rule_without_literal_scans_every_line(tmp_path):
    log = tmp_path / "a.log"
    log.write_text("x\nHIT=3 m=1\nhit=4 M=1\n")
    rules = [{"regex": r"(?i)HIT=(?P<h>\d+) m=(?P<m>\d+)", "counters": {"hit_tokens": "h", "miss_tokens": "m"}}]
    src = source(config([log], tmp_path, from_beginning=True, rules=rules))
    src.poll()
    s = src.entries[0].stream
    assert sum(v for (m, _), v in s.counters.items() if m == C.HIT_TOKENS.name) == 7
    assert s.lines == {"parsed": 2, "unmatched": 1, "malformed": 0}


def test_rule_gauges_labels_and_label_cardinality_guard(tmp_path):
    log = tmp_path / "a.log"
    lines = [f"eng={i} kv={i}%\n" for i in range(105)]
    log.write_text("".join(lines))
    rules = [{"regex": r"eng=(?P<e>\d+) kv=(?P<kv>\d+)%", "gauges": {"kv_cache_usage_ratio": {"group": "kv", "scale": 0.01}},
              "labels": {"engine": {"group": "e"}}}]
    src = source(config([log], tmp_path, from_beginning=True, rules=rules))
    src.poll()
    s = src.entries[0].stream
    assert s.gauges[(C.KV_CACHE_USAGE.name, ("", "7"))] == pytest.approx(0.07)
    assert len(s.gauges) == 100 and s.lines["malformed"] == 5      # over the guard: counted, not exported
