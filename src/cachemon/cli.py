"""The `cachemon` command line.

Subcommands are imported lazily (``LAZY``), so `cachemon run` never imports the
analyzer's tokenizer stack and each command lives beside the stage it drives.
"""
from __future__ import annotations

import importlib
import logging
import sys

import click

from cachemon import __version__
from cachemon.config import (DEFAULT_UPSTREAM, Config, ConfigError, check_unique_names, from_dict, load_yaml,
                             parse_duration, parse_listen, parse_upstream_spec, parse_windows)

# name -> "module:attribute" of a click command
LAZY = {
    "check": "cachemon.check:check_command",
    "demo": "cachemon.demo:demo_command",
    "analyze": "cachemon.diagnostics.analyze_cli:analyze_command",
    "fingerprint": "cachemon.diagnostics.fingerprint_cli:fingerprint_command",
    "warmup": "cachemon.diagnostics.warmup_cli:warmup_command",
    "report": "cachemon.diagnostics.report:report_command",
    "capture": "cachemon.diagnostics.capture:capture_command",
    "monitoring": "cachemon.monitoring.generate:monitoring_command",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(LAZY))

    def get_command(self, ctx, name):
        cmd = super().get_command(ctx, name)
        if cmd is not None or name not in LAZY:
            return cmd
        module, _, attr = LAZY[name].partition(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            missing = getattr(e, "name", None) or str(e)
            reason = f"'cachemon {name}' is unavailable: {e}"    # `e` is unbound once the except ends
            return click.Command(name, help=f"(unavailable: {missing})", callback=lambda: _fail(reason, 2))


def _fail(message: str, code: int) -> None:
    click.echo(f"cachemon: {message}", err=True)
    sys.exit(code)


def setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="cachemon")
def main():
    """Prefix-cache hit-rate monitoring and diagnostics for vLLM."""


def build_config(config_path, upstreams, listen, poll_interval, windows, web_config_file, max_series,
                 log_files=(), from_beginning=None, state_file=None) -> Config:
    """YAML file first, then flags on top (flags win)."""
    data = load_yaml(config_path) if config_path else {}
    cfg = from_dict(data)
    if upstreams:
        cfg.upstreams = [parse_upstream_spec(s, f"--upstream[{i}]", i) for i, s in enumerate(upstreams)]
        check_unique_names(cfg.upstreams, "--upstream")
    if listen:
        cfg.listen.address, cfg.listen.port = parse_listen(listen)
    if poll_interval:
        cfg.poll_interval = parse_duration(poll_interval, "--poll-interval")
    if windows:
        cfg.windows = parse_windows(list(windows), "--window")
    if web_config_file:
        cfg.listen.web_config_file = web_config_file
    if max_series is not None:
        if max_series < 1:
            raise ConfigError("--max-series", "must be at least 1")
        cfg.max_series_per_upstream = max_series
    if log_files or from_beginning is not None or state_file:
        from cachemon.sources.logs.config import apply_log_flags
        cfg.logs = apply_log_flags(cfg.logs, log_files, from_beginning, state_file)
        check_unique_names(cfg.logs.files, "--log-file", {u.name for u in cfg.upstreams})
    if not cfg.upstreams and cfg.logs is None:
        cfg.upstreams = [parse_upstream_spec(DEFAULT_UPSTREAM, "--upstream", 0)]
    return cfg


@main.command("run")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="YAML config file (flags win over it).")
@click.option("--upstream", "upstreams", multiple=True, metavar="[NAME=]URL",
              help=f"vLLM /metrics URL to poll; repeatable. Default {DEFAULT_UPSTREAM}.")
@click.option("--listen", metavar="[ADDRESS]:PORT", help="Where cachemon serves its /metrics (default 0.0.0.0:9867).")
@click.option("--poll-interval", metavar="DURATION", help="How often each upstream is polled (default 2s).")
@click.option("--window", "windows", multiple=True, metavar="DURATION",
              help="Hit-ratio window computed by cachemon; repeatable (default 1m and 5m).")
@click.option("--web-config-file", type=click.Path(dir_okay=False),
              help="TLS / basic-auth settings in the Prometheus exporter-toolkit format.")
@click.option("--max-series", type=int, help="Max (model_name, engine) label sets per upstream (default 256).")
@click.option("--log-file", "log_files", multiple=True, metavar="PATH",
              help="vLLM log file to tail (globs allowed); repeatable.")
@click.option("--from-beginning/--from-end", default=None,
              help="Read log files from their start on first sight (default: from the end).")
@click.option("--state-file", type=click.Path(dir_okay=False), help="Where the log tailer persists offsets and counters.")
@click.option("--log-level", default="info", type=click.Choice(["debug", "info", "warning", "error"]))
def run_command(config_path, upstreams, listen, poll_interval, windows, web_config_file, max_series,
                log_files, from_beginning, state_file, log_level):
    """Run the sidecar exporter next to `vllm serve`."""
    setup_logging(log_level)
    from cachemon.daemon import Daemon
    try:
        cfg = build_config(config_path, upstreams, listen, poll_interval, windows, web_config_file, max_series,
                           log_files, from_beginning, state_file)
        daemon = Daemon(cfg)
        daemon.run_forever()
    except ConfigError as e:
        _fail(f"config error: {e}", 2)
    except OSError as e:
        _fail(str(e), 1)


if __name__ == "__main__":   # pragma: no cover
    main()
