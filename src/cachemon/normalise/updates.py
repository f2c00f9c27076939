"""The typed series model that normalise, state and expose share.

A *series* is one exported label set of one catalog metric (``catalog.SeriesKey``, re-exported
here). A *source
series* is one label set as the upstream reported it (``SourceId``): several source
series can land on one exported series (Ray replicas, label sets that differ only in
labels cachemon drops), so reset detection runs per source series and the exported
value is the sum of the corrected sources. ``Update`` is what every source (scrape,
log) hands to the state after normalising: the same type for both.
"""
from __future__ import annotations

from collections import Counter as Tally
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from cachemon.catalog import SeriesKey
from cachemon.normalise.server_profile import ServerProfile

__all__ = ["CounterSample", "SeriesKey", "SourceId", "SourceKind", "Update", "UpstreamInfo"]

# Why a sample was refused (the `reason` label of cachemon_upstream_rejected_samples_total).
REJECT_DUPLICATE = "duplicate_series"   # the page repeats a label set: an invalid exposition
REJECT_NAN = "nan"
REJECT_INFINITE = "infinite"
REJECT_NEGATIVE = "negative"            # a counter below 0 is not a count
# a counter at or above 2**53: a float can no longer count single increments there, and no
# server counts that many tokens (over 285 years at a million a second)
REJECT_IMPLAUSIBLE = "implausible_value"
MAX_COUNTER = float(2 ** 53)
# samples of label sets past the poller's label-set budget, not read (sources.exposition.LabelBudget)
REJECT_BUDGET = "label_set_budget"
REJECT_OUT_OF_RANGE = "out_of_range"    # a gauge outside its unit's range (a ratio above 1, a count below 0)
# a hit counter above its own page's query counter: no cache hits more tokens than were queried
REJECT_HITS_AHEAD = "hits_above_queries"
# a wanted sample whose label values had non-printable characters or were over 256 characters: rewritten
# (sources/wire_label.py), the sample kept
REJECT_REWRITTEN = "label_rewritten"


class SourceId(NamedTuple):
    """One series as the upstream exposes it: its stem and its full label set, so series
    that collapse onto one ``SeriesKey`` are still told apart."""

    stem: str
    labels: tuple[tuple[str, str], ...]


@dataclass(slots=True)
class CounterSample:
    """A raw counter value of one source series, already in cachemon's unit (tokens)."""

    key: SeriesKey
    source: SourceId
    value: float
    # the series' *_created timestamp: a change means this series' process restarted
    created: float | None = None
    # a derived series (miss tokens): the (queries, hits) source series it is the difference of;
    # the state derives its value from their corrected values
    pair: tuple[SourceId, SourceId] | None = None

    @classmethod
    def direct(cls, key: SeriesKey, value: float) -> CounterSample:
        """A sample whose source is the exported series itself (log totals, benchmarks)."""
        names = key.spec.labels[1:]
        if len(key.labels) > len(names):      # a histogram's bucket series: its labels end with le
            names += ("le",)
        return cls(key, SourceId(key.metric, tuple(zip(names, key.labels, strict=False))), value)


# What an upstream is read from: a /metrics page (a scrape) or a vLLM log file (the log source).
SourceKind = Literal["metrics", "log"]


@dataclass
class UpstreamInfo:
    kind: SourceKind = "metrics"
    era: str = ""
    engine: str = ""            # the engines.ENGINES row the era belongs to ("" unknown)
    vllm_version: str = ""
    prefix_caching: str = ""
    block_size: str = ""
    hash_algo: str = ""
    counter_unit: str = ""


@dataclass
class Update:
    """One successful observation of a source, normalised to raw token values."""

    counters: list[CounterSample] = field(default_factory=list)
    gauges: dict[SeriesKey, float] = field(default_factory=dict)
    # restart evidence for every series of the process
    process_start_time: float | None = None
    info: UpstreamInfo | None = None
    # samples refused by reason (duplicate_series, nan, infinite, negative)
    rejected: Tally[str] = field(default_factory=Tally)
    # counters that are exact running totals kept by cachemon itself (log sources):
    # they never reset, so no reset detection on them
    trusted_monotonic: bool = False
    # what each (model_name, engine) said of its cache (the page's cache_config_info rows, the log's
    # start-up lines): the profiles the exported config gauges were written from
    profiles: dict[tuple[str, str], ServerProfile] = field(default_factory=dict)

    @classmethod
    def from_totals(cls, counters: dict[SeriesKey, float], gauges: dict[SeriesKey, float] | None = None,
                    trusted_monotonic: bool = False) -> Update:
        """An update whose counters each have one source: the series itself."""
        return cls(counters=[CounterSample.direct(SeriesKey(*k), v) for k, v in counters.items()],
                   gauges=dict(gauges or {}), trusted_monotonic=trusted_monotonic)
