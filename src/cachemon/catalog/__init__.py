"""The one list of every metric cachemon exports.

The collector, the docs/metrics.md table and the monitoring generator (alerts, recording
rules, dashboards) all read this package, so a name is spelled in exactly one place.
Names follow Prometheus conventions: base units, ``_total`` on counters, ``_ratio``
for 0..1 values, ``_info`` for metadata, no colons.

Each module of the package holds one section of the list (spec.py the type and the shared label
names); this one re-exports every name, so ``catalog.QUERY_TOKENS`` reads the same as before, and
builds ALL in the order of _SECTIONS, each section in its own order.
"""
from __future__ import annotations

from typing import NamedTuple

# The star imports re-export every section's names; the names this module uses are imported by name too.
from cachemon.catalog import attribution, changes, data, kv_events, logs, routers, upstream
from cachemon.catalog.attribution import *  # noqa: F403
from cachemon.catalog.changes import *  # noqa: F403
from cachemon.catalog.changes import COST_SAVING_FACTOR
from cachemon.catalog.data import *  # noqa: F403
from cachemon.catalog.data import HIT_RATIO, PROMPT_LENGTH_REQUESTS
from cachemon.catalog.kv_events import *  # noqa: F403
from cachemon.catalog.logs import *  # noqa: F403
from cachemon.catalog.routers import *  # noqa: F403
from cachemon.catalog.spec import *  # noqa: F403
from cachemon.catalog.spec import SERIES_LABELS, MetricSpec
from cachemon.catalog.upstream import *  # noqa: F403

_SECTIONS = (data, attribution, kv_events, upstream, logs, changes, routers)

# dict.fromkeys: a spec one section imports from an earlier one is listed once, where it is declared.
ALL: tuple[MetricSpec, ...] = tuple(dict.fromkeys(
    v for section in _SECTIONS for v in vars(section).values() if isinstance(v, MetricSpec)))
_SPECS: dict[str, MetricSpec] = {s.name: s for s in ALL}

# Ratios cachemon computes itself. Convenience series only: the shipped rules, alerts and dashboards
# never query them (tests/test_monitoring_generate.py holds that); they divide the counters instead.
CONVENIENCE: tuple[MetricSpec, ...] = (HIT_RATIO, COST_SAVING_FACTOR)

# The state keeps a re-exported histogram as counters: one per bucket, keyed by the histogram's name
# with its labels plus ``le``, and its sum under this name (labels without ``le``). Not exported by
# itself (so not in ALL): the collector folds both back into the one histogram family.
PROMPT_LENGTH_SUM = MetricSpec(PROMPT_LENGTH_REQUESTS.name + "_sum", "counter", "tokens", SERIES_LABELS,
                               "Sum of the prompt lengths (internal part of the histogram).",
                               "vllm:request_prompt_tokens_sum")
_SPECS[PROMPT_LENGTH_SUM.name] = PROMPT_LENGTH_SUM


class SeriesKey(NamedTuple):
    """One exported series: a catalog metric and its label values in the spec's order,
    without the leading ``upstream`` label (the state adds it). Every layer keys series by it
    (sources' log rules, normalise, state, expose), so it lives with the specs it is bound to.

    A NamedTuple so it hashes at C speed on the polling path and compares equal to the
    plain ``(name, labels)`` pair older call sites build.
    """

    metric: str
    labels: tuple[str, ...]

    @classmethod
    def of(cls, spec: MetricSpec, labels: tuple[str, ...]) -> SeriesKey:
        if len(labels) != len(spec.labels) - 1:
            raise ValueError(f"{spec.name} takes {spec.labels[1:]}, got {labels!r}")
        return cls(spec.name, labels)

    @property
    def spec(self) -> MetricSpec:
        return _SPECS[self.metric]

    @property
    def ident(self) -> tuple[str, str]:
        """(model_name, engine): the unit the cardinality guard counts."""
        return self.labels[0], self.labels[1]


def by_name(name: str) -> MetricSpec:
    for spec in ALL:
        if spec.name == name or spec.sample_name == name:
            return spec
    raise KeyError(name)
