"""The options several commands share, declared once, and the one way a command refuses its input.

A command's own help text stays its own (``help=``); the name, destination, metavar, default
format and choices are the same everywhere, so `--timeout 5s` means the same to every command.
"""
from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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


class Terminated(BaseException):
    """SIGTERM arrived (a BaseException, like KeyboardInterrupt: no ``except Exception`` swallows it)."""


# A shell reports a process ended by signal N as 128 + N; a handled SIGTERM exits with that code.
EXIT_SIGTERM = 128 + signal.SIGTERM


@contextmanager
def stopped_by_sigterm(command: str, what: str) -> Iterator[None]:
    """A one-shot command under SIGTERM (``timeout``, a CI job cancelled, a pod deleted) ends with one
    line on stderr, ``cachemon COMMAND: stopped by SIGTERM; WHAT``, and exit code 143, instead of
    dying by the signal (-15) without a word. Threads still waiting on a request are not waited for."""
    def stop(_signum: int, _frame: object) -> None:
        raise Terminated

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    except Terminated:
        click.echo(f"cachemon {command}: stopped by SIGTERM; {what}", err=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_SIGTERM)      # sys.exit would wait for worker threads' in-flight requests
    finally:
        signal.signal(signal.SIGTERM, previous)
