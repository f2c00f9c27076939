"""The custom collector: builds cachemon's families from the store at scrape time.

Nothing on the polling path touches metric objects; values live as plain floats in
``cachemon.state`` and become families only when Prometheus asks (read through the store's
one read API, ``Store.read()``) (the pattern of
prometheus_client's own process collector). Formatted label sets are cached per
series, so a scrape costs little more than the string joins.
"""
from __future__ import annotations

import platform
from collections.abc import Iterable, Iterator

import cachemon
from cachemon import __version__
from cachemon import catalog as C
from cachemon.expose.render import Family, format_labels
from cachemon.state.store import Store, UpstreamView

# Families fed from the normalised upstream values, in exposition order.
_DATA = (C.QUERY_TOKENS, C.HIT_TOKENS, C.MISS_TOKENS, C.PROMPT_TOKENS, C.GENERATION_TOKENS,
         C.PROMPT_TOKENS_BY_SOURCE, C.HIT_TOKENS_BY_SOURCE, C.PROMPT_CACHED_TOKENS, C.PREEMPTIONS,
         C.SAMPLING_REQUESTS, C.SAMPLING_SEQUENCES,
         C.KV_EVICTED_BLOCKS, C.LOG_CACHE_RESETS, C.KV_CACHE_USAGE, C.KV_CACHE_CAPACITY, C.REQUESTS_RUNNING,
         C.REQUESTS_WAITING, C.REPORTED_HIT_RATIO, C.PREFIX_CACHING_ENABLED, C.BLOCK_SIZE,
         C.MATCH_FLOOR)
_HEALTH = (C.UPSTREAM_UP, C.SCRAPE_DURATION, C.SCRAPES, C.SCRAPE_ERRORS, C.REJECTED_SAMPLES, C.LAST_SUCCESS,
           C.RESTARTS, C.LAST_RESTART, C.MULTIPLE_PROCESSES, C.SERIES_OVERFLOW, C.SERIES_EVICTED, C.UPSTREAM_INFO, C.LAST_ERROR)


# A histogram the state keeps as counters (catalog.PROMPT_LENGTH_SUM says how), folded back here.
_HISTOGRAM_PARTS = (C.PROMPT_LENGTH_REQUESTS.name, C.PROMPT_LENGTH_SUM.name)


def histogram_family(spec: C.MetricSpec, parts: Iterable[tuple[str, tuple[str, ...], float]]) -> Family:
    """One histogram family from (upstream, labels, value) rows of its bucket counters (labels end
    with ``le``) and sum counters (no ``le``): cumulative buckets sorted by bound, count = +Inf."""
    buckets: dict[tuple[str, ...], list[tuple[float, float]]] = {}
    sums: dict[tuple[str, ...], float] = {}
    n = len(spec.labels)
    for upstream, labels, value in parts:
        ident = (upstream,) + labels[: n - 1]
        if len(labels) == n:
            try:
                buckets.setdefault(ident, []).append((float(labels[-1]), value))
            except ValueError:
                continue
        else:
            sums[ident] = value
    fam = Family.of(spec)
    for ident, rows in sorted(buckets.items()):
        rows.sort()
        if not rows or rows[-1][0] != float("inf"):
            continue            # no +Inf bucket: not a histogram to re-export
        fam.add_histogram(format_labels(spec.labels, ident), rows, sums.get(ident), rows[-1][1])
    return fam


class CachemonCollector:
    def __init__(self, store: Store):
        self.store = store
        self._labels: dict[tuple[tuple[str, ...], tuple[str, ...]], str] = {}

    def labels(self, spec: C.MetricSpec, values: tuple[str, ...]) -> str:
        key = (spec.labels, values)
        s = self._labels.get(key)
        if s is None:
            if len(self._labels) > 65536:      # series churn: start over rather than grow
                self._labels.clear()
            s = self._labels[key] = format_labels(spec.labels, values)
        return s

    def collect(self) -> Iterator[Family]:
        fams = {spec.name: Family.of(spec) for spec in _DATA}
        ratio = Family.of(C.HIT_RATIO)
        health = {spec.name: Family.of(spec) for spec in _HEALTH}
        hist: list[tuple[str, tuple[str, ...], float]] = []
        with self.store.read() as view:
            windows = list(view.windows.items())
            for name, st in view.upstreams.items():
                self._data(name, st, fams, hist)
                if st.up:
                    self._ratios(name, st, windows, ratio)
                self._health(name, st, health)

        yield from (f for f in fams.values() if f.samples)
        prompt_lengths = histogram_family(C.PROMPT_LENGTH_REQUESTS, hist)
        if prompt_lengths.histograms:
            yield prompt_lengths
        if ratio.samples:
            yield ratio
        yield from health.values()
        build = Family.of(C.BUILD_INFO)
        build.put(C.BUILD_INFO, (__version__, getattr(cachemon, "__revision__", "unknown"),
                                 platform.python_version()), 1.0)
        yield build

    def _data(self, name: str, st: UpstreamView, fams: dict[str, Family],
              hist: list[tuple[str, tuple[str, ...], float]]) -> None:
        """One upstream's counters and gauges, as vLLM's series map onto the catalog's."""
        lab = self.labels
        for key, series in st.counters.items():
            fam = fams.get(key.metric)
            if fam is not None:
                fam.add(lab(key.spec, (name,) + key.labels), series.value)
            elif key.metric in _HISTOGRAM_PARTS:
                hist.append((name, key.labels, series.value))
        for key, v in st.gauges.items():
            fam = fams.get(key.metric)
            if fam is not None:
                fam.add(lab(key.spec, (name,) + key.labels), v)

    def _ratios(self, name: str, st: UpstreamView, windows: list[tuple[str, float]], ratio: Family) -> None:
        for labels, win in st.windows.items():
            for wname, seconds in windows:
                r = win.ratio(seconds)
                if r is not None:
                    ratio.add(self.labels(C.HIT_RATIO, (name,) + labels + (wname,)), r[0] / r[1])

    def _health(self, name: str, st: UpstreamView, health: dict[str, Family]) -> None:
        """One upstream's scrape health and identity (the message of its last error goes to the log)."""
        def put(spec: C.MetricSpec, values: tuple[str, ...], value: float) -> None:
            health[spec.name].add(self.labels(spec, values), value)

        up1 = (name,)
        put(C.UPSTREAM_UP, up1, 1.0 if st.up else 0.0)
        put(C.SCRAPES, up1, st.scrapes)
        for reason, n in sorted(st.errors.items()):
            put(C.SCRAPE_ERRORS, (name, reason), n)
        for reason, n in sorted(st.rejected.items()):
            put(C.REJECTED_SAMPLES, (name, reason), n)
        for spec, value in ((C.SCRAPE_DURATION, st.last_duration), (C.LAST_SUCCESS, st.last_success)):
            if value is not None:
                put(spec, up1, value)
        put(C.RESTARTS, up1, st.restarts)
        if st.last_restart is not None:
            put(C.LAST_RESTART, up1, st.last_restart)
        put(C.MULTIPLE_PROCESSES, up1, 1.0 if st.multiple_processes else 0.0)
        put(C.SERIES_OVERFLOW, up1, st.overflow_total)
        put(C.SERIES_EVICTED, up1, st.evicted_total)
        i = st.info
        put(C.UPSTREAM_INFO, (name, i.kind, i.era, i.vllm_version, i.prefix_caching, i.block_size,
                              i.hash_algo, i.counter_unit), 1.0)
        if st.last_error is not None:
            put(C.LAST_ERROR, (name, st.last_error[0]), 1.0)
