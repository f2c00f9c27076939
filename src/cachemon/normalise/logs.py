"""The log source's running totals and latest gauges -> the state's ``Update``.

Both sources hand the state the same type; log counters are totals kept by cachemon
(persisted with the read offsets), so they are marked trusted-monotonic.
"""
from __future__ import annotations

from cachemon.normalise.series import SeriesKey, Update, UpstreamInfo
from cachemon.sources.logs.accumulate import LogStream


def log_update(stream: LogStream) -> Update:
    upd = Update.from_totals({SeriesKey(*k): v for k, v in stream.counters.items()},
                             {SeriesKey(*k): v for k, v in stream.gauges.items()}, trusted_monotonic=True)
    upd.info = UpstreamInfo(kind="log", era=stream.era)
    return upd
