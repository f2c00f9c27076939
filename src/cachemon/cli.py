"""The `cachemon` command line.

Subcommands are imported lazily (``LAZY``), so `cachemon run` never imports the
analyzer's tokenizer stack and each command lives beside the stage it drives.
"""
from __future__ import annotations

import importlib
import sys

import click

from cachemon import __version__
from cachemon.cli_options import config_option, upstreams_option, usage_error
from cachemon.config import DEFAULT_UPSTREAM, ConfigError
from cachemon.logformat import FORMATS, LEVELS, setup_logging

# name -> "module:attribute" of a click command
LAZY = {
    "check": "cachemon.check.command:check_command",
    "demo": "cachemon.demo.command:demo_command",
    "analyze": "cachemon.analyze.command:analyze_command",
    "fingerprint": "cachemon.tools.fingerprint_command:fingerprint_command",
    "warmup": "cachemon.tools.warmup_command:warmup_command",
    "report": "cachemon.tools.cost_report:report_command",
    "capture": "cachemon.tools.capture:capture_command",
    "monitoring": "cachemon.monitoring.generate:monitoring_command",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(LAZY))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        cmd = super().get_command(ctx, name)
        if cmd is not None or name not in LAZY:
            return cmd
        module, _, attr = LAZY[name].partition(":")
        try:
            cmd = getattr(importlib.import_module(module), attr)
            assert isinstance(cmd, click.Command)
            return cmd
        except (ImportError, AttributeError) as e:
            missing = getattr(e, "name", None) or str(e)
            reason = f"'cachemon {name}' is unavailable: {e}"    # `e` is unbound once the except ends
            return click.Command(name, help=f"(unavailable: {missing})", callback=lambda: usage_error(reason))


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="cachemon")
def main() -> None:
    """Prefix-cache hit-rate monitoring and diagnostics for vLLM."""


@main.command("run")
@config_option("YAML config file (flags win over it).")
@upstreams_option(f"vLLM /metrics URL to poll; repeatable. Default {DEFAULT_UPSTREAM}.")
@click.option("--listen", "--web.listen-address", "listen_flags", multiple=True, metavar="[ADDRESS]:PORT",
              help="Where cachemon serves its /metrics (default 0.0.0.0:9867; [::]:9867 for IPv6 and IPv4).")
@click.option("--poll-interval", metavar="DURATION", help="How often each upstream is polled (default 5s).")
@click.option("--poll-mode", metavar="background|scrape",
              help="background (default): poll every --poll-interval; scrape: poll on each scrape of "
                   "cachemon's /metrics, plus a slow background poll (scrape_mode.background_interval, 30s).")
@click.option("--window", "windows", multiple=True, metavar="DURATION",
              help="Hit-ratio window computed by cachemon; repeatable (default 1m and 5m).")
@click.option("--web-config-file", "--web.config.file", "web_config_file", type=click.Path(dir_okay=False),
              help="TLS / basic-auth settings in the Prometheus exporter-toolkit format.")
@click.option("--max-series", type=int, help="Max (model_name, engine) label sets per upstream (default 256).")
@click.option("--log-file", "log_files", multiple=True, metavar="PATH",
              help="vLLM log file to tail: a path, a glob, or a directory (its *.log files, e.g. vllm-ascend's "
                   "~/ascend/log/vllm_ascend/); repeatable.")
@click.option("--from-beginning/--from-end", default=None,
              help="Read log files from their start on first sight (default: from the end).")
@click.option("--state-file", type=click.Path(dir_okay=False), help="Where the log tailer persists offsets and counters.")
@click.option("--kv-events", "kv_events", multiple=True, metavar="[NAME=]ENDPOINT",
              help="Follow upstream NAME's vLLM KV-cache events at ENDPOINT (tcp://HOST:PORT; default NAME: "
                   "the only upstream); repeatable. Needs the kv-events extra.")
@click.option("--log-level", "--log.level", "log_level", default="info", show_default=True,
              type=click.Choice(LEVELS, case_sensitive=False), help="cachemon's own log level.")
@click.option("--log-format", "--log.format", "log_format", default="logfmt", show_default=True,
              type=click.Choice(FORMATS), help="cachemon's own log lines: logfmt or JSON.")
def run_command(config_path: str | None, upstreams: tuple[str, ...], listen_flags: tuple[str, ...],
                poll_interval: str | None, poll_mode: str | None, windows: tuple[str, ...], web_config_file: str | None,
                max_series: int | None, log_files: tuple[str, ...], from_beginning: bool | None, state_file: str | None,
                kv_events: tuple[str, ...], log_level: str, log_format: str) -> None:
    """Run the sidecar exporter next to `vllm serve`."""
    setup_logging(log_level, log_format)
    from cachemon.daemon import Daemon
    from cachemon.runconfig import build_config
    try:
        if len(listen_flags) > 1:
            raise ConfigError("--web.listen-address", "give one address; [::]:PORT listens on IPv6 and IPv4")
        listen = listen_flags[0] if listen_flags else None
        cfg = build_config(config_path, upstreams, listen, poll_interval, windows, web_config_file, max_series,
                           log_files, from_beginning, state_file, kv_events, poll_mode)
        daemon = Daemon(cfg)
        daemon.run_forever()
    except ConfigError as e:
        usage_error(f"config error: {e}")
    except OSError as e:
        click.echo(f"cachemon: {e}", err=True)
        sys.exit(1)


if __name__ == "__main__":   # pragma: no cover
    main()
