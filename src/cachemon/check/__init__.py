"""`cachemon check`: one-shot diagnosis of upstreams, logs and KV events, judged as `cachemon run` judges.

- command.py: the click command, its options and the output;
- run.py: the reads (`cachemon run`'s store, pollers and log source) and the verdict;
- report.py: the JSON schema ``cachemon-check/1`` as types, the report builder, the findings;
- logs.py, kv.py: what a log source and a KV-event window add;
- text.py: the terminal rendering.
"""
from __future__ import annotations

from cachemon.check.command import check_command
from cachemon.check.log_report import log_config, log_reset_events
from cachemon.check.report import SCHEMA, diagnose, exit_code, multiprocess_findings
from cachemon.check.run import JUDGED_KINDS, check_upstream, check_upstreams, parse_upstreams, run_checks
from cachemon.check.text import render_text

__all__ = ["JUDGED_KINDS", "SCHEMA", "check_command", "check_upstream", "check_upstreams", "diagnose", "exit_code",
           "log_config", "log_reset_events", "multiprocess_findings", "parse_upstreams", "render_text", "run_checks"]
