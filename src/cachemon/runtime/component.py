"""The shape of every stage `cachemon run` starts (pollers, log source, change detection, cost).

The daemon starts each component, registers it as a collector of /metrics, and closes it
on shutdown; it needs nothing else from a stage.
"""
from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Component(Protocol):
    def start(self, stop_event: threading.Event) -> None:
        """Start the stage's threads; return at once. ``stop_event`` is set on shutdown."""

    def close(self) -> None:
        """Finish: flush and persist what the stage holds (called after ``stop_event`` is set)."""

    def collect(self) -> Iterable[Any]:
        """The stage's own metric families (expose.render.Family), read at scrape time."""
