"""The ``attribution:`` section of `cachemon run`'s config file."""
from __future__ import annotations

from dataclasses import dataclass

from cachemon.config import DAY, duration, integer, optional, setting


@dataclass
class AttributionConfig:
    """The ``attribution:`` section of `cachemon run`'s file."""
    window: float | None = setting(optional(duration(hi=DAY)), None)   # default: the shortest of `windows`
    lookback: float = setting(duration(hi=DAY), 900.0)      # how long an event explains missed tokens
    # dynamic prefix, short prompts and cold cache are judged over this (default: 4 polls)
    short_window: float | None = setting(optional(duration(hi=DAY)), None)
    hold: int = setting(integer(1, 100), 2)                 # evaluations a cause must hold to become active
    hold_down: float = setting(duration(hi=DAY), 30.0)      # how long a cause stays active after it last held
