"""One log source's parsed lines -> the state's ``Update`` (the log half of normalise).

The /metrics path maps vLLM's metric names onto catalog series in ``normaliser.py``; this
module does the same for the log layouts, so both sources hand the state the same type
and the era knowledge of both lives in ``normalise/``. The logged hit rate stays a gauge
(REPORTED_HIT_RATIO): it is a ratio over vLLM's recent-request window (V1), block lookups since
start (V0) or the last interval (the Rust frontend), and no token count can be recovered from it.
"""
from __future__ import annotations

from cachemon import catalog as C
from cachemon.normalise.log_grammar import StatsLine, hit_basis
from cachemon.normalise.log_stream import LogStream
from cachemon.normalise.server_profile import ServerProfile
from cachemon.normalise.updates import SeriesKey, Update, UpstreamInfo


def stats_gauges(model: str, lines: list[StatsLine]) -> dict[SeriesKey, float]:
    """Current gauges from the newest stats line of each (engine, layout)."""
    g: dict[SeriesKey, float] = {}
    for s in lines:
        ident = (model, s.engine)
        if s.kv_usage is not None or s.running is not None:
            if s.kv_usage is not None:
                g[SeriesKey(C.KV_CACHE_USAGE.name, ident)] = s.kv_usage
            if s.running is not None:
                g[SeriesKey(C.REQUESTS_RUNNING.name, ident)] = float(s.running)
            if s.waiting is not None:
                g[SeriesKey(C.REQUESTS_WAITING.name, ident)] = float(s.waiting)
        basis = hit_basis(s.kind)
        if basis is not None:
            # A V1 line carries every ratio defined now (>= 0.31 omits an empty window), so
            # the newest line alone says which are current.
            for cache, v in s.hit_rates.items():
                g[SeriesKey(C.REPORTED_HIT_RATIO.name, ident + (cache, basis))] = v
    return g


def log_profile(stream: LogStream) -> ServerProfile:
    """What the start-up lines stated of the engine (ServerProfile.from_log_config): the prefix-caching flag,
    the pool, the block size where the pool and the block count are both logged, the release and frontend."""
    return ServerProfile.from_log_config(stream.config, f"the start-up lines of log {stream.name}")


def log_gauges(stream: LogStream) -> dict[SeriesKey, float]:
    """What the log says now: stats-line gauges, the start-up config, and rule gauges."""
    gauges = stats_gauges(stream.model_name, list(stream.stats.values()))
    gauges.update(log_profile(stream).config_gauges((stream.model_name, "")))
    gauges.update(stream.gauges)
    return gauges


def log_info(stream: LogStream) -> UpstreamInfo:
    """The log upstream's info: its era and what the start-up lines said of the engine."""
    p = log_profile(stream)
    return UpstreamInfo(kind="log", era=stream.era, engine="vllm" if stream.era else "",
                        vllm_version=stream.config.get("version", ""),
                        prefix_caching=p.prefix_caching, block_size=str(p.block_size) if p.block_size else "")


def log_update(stream: LogStream) -> Update:
    """The next update for the state: current gauges, and the totals of the counters the log
    mentioned since the previous update (consumes them)."""
    upd = Update.from_totals(stream.take_changed(), log_gauges(stream), trusted_monotonic=True)
    upd.info = log_info(stream)
    upd.profiles = {(stream.model_name, ""): log_profile(stream)}
    return upd
