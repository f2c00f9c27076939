"""The `cachemon check` command: its options, their checks, and the report in text or JSON.

Exit codes: 0 healthy (info findings only), 1 warning findings, 2 usage or config error, 3
critical findings (upstream unreachable, prefix caching disabled, hit ratio below the critical
threshold), 143 stopped by SIGTERM before the report (one line on stderr).
"""
from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import click

from cachemon import __version__
from cachemon.check.kv_window import KvWindow, load_text_decoder
from cachemon.check.log_report import log_config
from cachemon.check.report import SCHEMA, CheckReport, SourceReport, exit_code
from cachemon.check.run import parse_upstreams, run_checks
from cachemon.check.text import render_text
from cachemon.cli_options import (
    config_option,
    format_option,
    stopped_by_sigterm,
    timeout_option,
    upstreams_option,
    usage_error,
)
from cachemon.config import ConfigError, KvEventsSettings, check_unique_names, load_yaml, parse_duration
from cachemon.runconfig import from_dict
from cachemon.runtime.attribution_stage import model_thresholds


@click.command("check")
@upstreams_option("vLLM /metrics URL; repeatable.")
@click.option("--interval", default="5s", show_default=True, metavar="DURATION",
              help="Read each upstream twice this far apart to get a current rate; 0 reads once.")
@timeout_option("5s")
@click.option("--log-file", "log_files", multiple=True, metavar="PATH",
              help="Parse a vLLM log file too (a path, glob or directory).")
@click.option("--from-beginning/--from-end", default=True, show_default=True,
              help="For --log-file: read the whole file (default) or only what is appended during --interval.")
@config_option("YAML config with log rules.")
@format_option()
@click.option("--kv-events", "kv_events", multiple=True, metavar="[NAME=]ENDPOINT",
              help="Also follow upstream NAME's vLLM KV-cache events (tcp://HOST:PORT) during --interval: the "
                   "stored tokens by reason, divergence, exact causes. NAME defaults to the only upstream; "
                   "repeatable. Needs the kv-events extra.")
@click.option("--show-text", is_flag=True, default=False,
              help="With --kv-events and --tokenizer: PRINT THE DECODED PROMPT TEXT of a few blocks where "
                   "requests diverge (prompt content; opt-in, never in metrics or logs).")
@click.option("--tokenizer", "tokenizer", metavar="DIR", help="The model's tokenizer directory (for --show-text).")
def check_command(upstreams: tuple[str, ...], interval: str, timeout: str, log_files: tuple[str, ...],
                  from_beginning: bool, config_path: str | None, fmt: str, kv_events: tuple[str, ...] = (),
                  show_text: bool = False, tokenizer: str | None = None) -> None:
    """One-shot diagnosis: detected era, unified numbers and plain-language findings.

    Exit codes: 0 healthy, 1 warnings, 2 usage/config error, 3 critical findings, 143 stopped by SIGTERM.
    """
    try:
        with stopped_by_sigterm("check", "no report"), quiet_logs():
            sources = _check(upstreams, interval, timeout, log_files, from_beginning, config_path, kv_events,
                             show_text, tokenizer)
    except ConfigError as e:
        usage_error(f"config error: {e}")
    code = exit_code(sources)
    report: CheckReport = {"schema": SCHEMA, "cachemon_version": __version__, "exit_code": code, "sources": sources}
    if fmt == "json":
        for s in sources:
            s.pop("text_extra", None)
            s.pop("kv_extra", None)
        click.echo(json.dumps(report, indent=2, sort_keys=True))
    else:
        click.echo(render_text(report))
    sys.exit(code)


@contextmanager
def quiet_logs() -> Iterator[None]:
    """The daemon's stages log what a report of check says (an upstream down, a restart): only the report speaks."""
    logger = logging.getLogger("cachemon")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _check(upstreams: tuple[str, ...], interval: str, timeout: str, log_files: tuple[str, ...],
           from_beginning: bool, config_path: str | None, kv_events: tuple[str, ...], show_text: bool,
           tokenizer: str | None) -> list[SourceReport]:
    seconds = 0.0 if str(interval).strip() in ("0", "0s") else parse_duration(interval, "--interval")
    tmo = parse_duration(timeout, "--timeout")
    if not upstreams and not log_files:
        upstreams = ("http://127.0.0.1:8000/metrics",)
    cfg = from_dict(load_yaml(config_path)) if config_path else None
    thresholds = model_thresholds(cfg.models) if cfg is not None else {}
    if show_text and not kv_events:
        raise ConfigError("--show-text", "needs --kv-events (the text comes from the events' token ids)")
    if show_text and not tokenizer:
        raise ConfigError("--show-text", "needs --tokenizer DIR (the model's tokenizer, to decode the token ids)")
    if kv_events and seconds <= 0:
        raise ConfigError("--kv-events", "needs an --interval above 0: events are followed during it")
    ups = parse_upstreams(upstreams, kv_events, tmo)
    logs = log_config(log_files, from_beginning, cfg) if log_files else None
    if logs is not None:
        check_unique_names(logs.files, "--log-file", {u.name for u in ups})
    window = decode = None
    if kv_events:
        decode = load_text_decoder(tokenizer) if show_text and tokenizer else None
        window = KvWindow(ups, cfg.kv_events if cfg is not None else KvEventsSettings(), keep_text=show_text)
    return run_checks(ups, seconds, thresholds, logs=logs, window=window, decode=decode,
                      routers=cfg.routers if cfg is not None else ())
