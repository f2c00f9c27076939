"""The one way tests wait for a state: ``eventually(check)`` polls until the check holds and
raises when it does not within the timeout, saying what it waited for (never a bare sleep)."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class NotReached(AssertionError):
    """The awaited state did not come within the timeout."""


def eventually(check: Callable[[], T], timeout: float = 10.0, what: str = "", interval: float = 0.02) -> T:
    """Call ``check`` until it returns a truthy value (returned) or stops raising AssertionError;
    raise NotReached after ``timeout`` seconds with ``what`` and the last value or error."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = check()
        except AssertionError as e:
            last = e
        else:
            if value:
                return value
            last = value
        if time.monotonic() >= deadline:
            raise NotReached(f"not reached within {timeout:g}s: {what or getattr(check, '__name__', 'check')} "
                             f"(last: {last!r})")
        time.sleep(interval)
