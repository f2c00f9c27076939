"""The ``events:`` and ``models:`` sections: change detection's interval, the cache-reset heuristic's
settings, and the served models (tokenizer directories, per-model thresholds)."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from cachemon.config import (
    HOUR,
    ConfigError,
    boolean,
    duration,
    integer,
    list_of,
    load_section,
    number,
    optional,
    section,
    setting,
    text,
)

DEFAULT_INTERVAL = 30.0


def _volume_band(v: object, key: str) -> tuple[float, float]:
    if (not isinstance(v, list) or len(v) != 2
            or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in v)
            or not 0 < v[0] <= 1 <= v[1]):
        raise ConfigError(key, "expected [LOW, HIGH] with 0 < LOW <= 1 <= HIGH, e.g. [0.5, 2]")
    return (float(v[0]), float(v[1]))


@dataclass
class ResetSettings:
    enabled: bool = setting(boolean, True)
    # an interval with fewer query tokens is idle: ignored
    min_query_tokens: float = setting(number(lo=1), 2000.0)
    # active intervals in a row with a good hit ratio before ...
    baseline_polls: int = setting(integer(lo=1, hi=10_000), 3)
    # ... each at least this hit ratio
    min_baseline_ratio: float = setting(number(0, 1), 0.5)
    # collapse: hit ratio <= this x the baseline ratio
    collapse_fraction: float = setting(number(0, 1), 0.1)
    # collapse query rate / baseline query rate
    volume_band: tuple[float, float] = setting(_volume_band, (0.5, 2.0))
    # confirmation: hit ratio back >= this x baseline ...
    recovery_fraction: float = setting(number(0, 1), 0.7)
    # ... within this many active intervals
    confirm_polls: int = setting(integer(lo=1, hi=10_000), 3)


def _tokenizer_dir(v: object, key: str) -> str:
    path = text(v, key)
    if not os.path.isdir(path):
        raise ConfigError(key, f"{path!r} is not a directory")
    return path


@dataclass
class ModelEntry:
    """One ``models:`` entry. Without a tokenizer there is nothing to fingerprint."""
    name: str = setting(text)                                    # served model name (the model_name label)
    # directory with tokenizer.json / tokenizer_config.json / chat template
    tokenizer: str | None = setting(optional(_tokenizer_dir), None)
    upstreams: tuple[str, ...] = setting(lambda v, k: tuple(list_of(text)(v, k)), ())   # empty = every upstream
    # per-model hit-ratio thresholds for the attribution engine and `cachemon check` (None: thresholds.py)
    hit_ratio_warning: float | None = setting(optional(number(0, 1)), None)
    hit_ratio_critical: float | None = setting(optional(number(0, 1)), None)


@dataclass
class EventsConfig:
    """The ``events:`` section."""
    interval: float = setting(duration(hi=HOUR), DEFAULT_INTERVAL)
    cache_reset: ResetSettings = setting(section(ResetSettings), default_factory=ResetSettings)


@dataclass
class EventSettings:
    """What the change detector runs with: ``events:`` plus the models that have a tokenizer."""
    interval: float = DEFAULT_INTERVAL
    reset: ResetSettings = field(default_factory=ResetSettings)
    models: list[ModelEntry] = field(default_factory=list)

    @classmethod
    def of(cls, events: EventsConfig, models: list[ModelEntry]) -> EventSettings:
        return cls(events.interval, events.cache_reset, [m for m in models if m.tokenizer])


def parse_event_settings(events: object, models: object) -> EventSettings:
    """``events:`` and ``models:`` as read from YAML (None when absent)."""
    return EventSettings.of(load_section(EventsConfig, events, "events"),
                            list_of(section(ModelEntry))([] if models is None else models, "models"))
