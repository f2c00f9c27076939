"""The metric spec type, the name prefix and the label names the catalog's sections share."""
from __future__ import annotations

from dataclasses import dataclass

PREFIX = "cachemon_"

# Label names shared by the data series.
UPSTREAM = "upstream"      # configured name of the source (a /metrics URL or a log file)
MODEL = "model_name"       # vLLM's served model name
ENGINE = "engine"          # vLLM's data-parallel engine index ("" where the era has none)
CACHE = "cache"            # "local" (vLLM's own KV cache) or "external" (KV connector)
WINDOW = "window"          # duration string of a cachemon-computed window, e.g. "5m"

SERIES_LABELS = (UPSTREAM, MODEL, ENGINE)
CACHE_LABELS = SERIES_LABELS + (CACHE,)


@dataclass(frozen=True)
class MetricSpec:
    name: str            # full exported name; for counters without the _total suffix
    type: str            # counter | gauge | info | histogram
    unit: str            # tokens, seconds, ratio, requests, events, bytes, lines, ""
    labels: tuple[str, ...]
    help: str
    source: str          # where the value comes from, for the docs/metrics.md table

    @property
    def sample_name(self) -> str:
        """The name of the exposed sample (what PromQL queries)."""
        if self.type == "counter":
            return self.name + "_total"
        if self.type == "info":
            return self.name + "_info"
        if self.type == "histogram":
            return self.name + "_bucket"
        return self.name

    @property
    def openmetrics_unit(self) -> str:
        """The unit of the family's OpenMetrics ``# UNIT`` line: the catalog's unit where the name ends
        with it (OpenMetrics requires that), else none. Units such as requests or events say what a
        count counts; they are not name suffixes, so those families carry no UNIT line."""
        return self.unit if self.unit and self.name.endswith("_" + self.unit) else ""


def _m(name: str, type_: str, unit: str, labels: tuple[str, ...], help_: str, source: str) -> MetricSpec:
    return MetricSpec(PREFIX + name, type_, unit, tuple(labels), help_, source)
