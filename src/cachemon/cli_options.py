"""The options several commands share, declared once, and the one way a command refuses its input.

A command's own help text stays its own (``help=``); the name, destination, metavar, default
format and choices are the same everywhere, so `--timeout 5s` means the same to every command.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, NoReturn, Protocol, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


class Decorator(Protocol):
    def __call__(self, f: F, /) -> F: ...


def config_option(help: str, exists: bool = False) -> Decorator:   # noqa: A002 - click's own name
    """``--config FILE`` into ``config_path``."""
    return click.option("--config", "config_path", type=click.Path(dir_okay=False, exists=exists), help=help)


def upstreams_option(help: str) -> Decorator:     # noqa: A002
    """``--upstream [NAME=]URL``, repeatable, into ``upstreams``."""
    return click.option("--upstream", "upstreams", multiple=True, metavar="[NAME=]URL", help=help)


def timeout_option(default: str, help: str | None = None) -> Decorator:     # noqa: A002
    """``--timeout DURATION`` (parsed by the command with config.parse_duration)."""
    return click.option("--timeout", default=default, show_default=True, metavar="DURATION", help=help)


def format_option() -> Decorator:
    """``--format text|json`` into ``fmt``."""
    return click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)


def usage_error(message: object, command: str = "") -> NoReturn:
    """One line on stderr, ``cachemon[ COMMAND]: MESSAGE``, and exit 2 (bad input or config)."""
    click.echo(f"cachemon{' ' + command if command else ''}: {message}", err=True)
    sys.exit(2)
