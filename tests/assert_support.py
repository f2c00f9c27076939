"""``nonempty``: the loop a test asserts in has something to check (a loop over nothing passes)."""
from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

T = TypeVar("T")


def nonempty(items: Iterable[T]) -> list[T]:
    """``items`` as a list, failing the test when there is none."""
    out = list(items)
    assert out, "the loop this test asserts in has nothing to check"
    return out
