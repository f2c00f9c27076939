"""Turn one parsed vLLM page into cachemon's unified, era-independent values.

Output values are *raw* (as vLLM reports them, converted to tokens); reset
correction happens later in ``cachemon.state``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from cachemon import catalog as C
from cachemon.normalise import eras as E
from cachemon.sources.exposition import Exposition, parse

# (metric name, label values in the spec's order without `upstream`)
Key = tuple[str, tuple[str, ...]]

WANTED = E.wanted_stems()
HELP_WANTED = E.help_stems()


@dataclass
class EngineConfig:
    prefix_caching: str = ""     # "true" | "false" | ""
    block_size: int | None = None
    hash_algo: str = ""


@dataclass
class Normalised:
    era: E.Era
    counters: dict[Key, float] = field(default_factory=dict)
    gauges: dict[Key, float] = field(default_factory=dict)
    # series -> *_created timestamp (a change means the upstream restarted)
    created: dict[str, float] = field(default_factory=dict)
    process_start_time: float | None = None
    engines: dict[tuple[str, str], EngineConfig] = field(default_factory=dict)
    prefix: str | None = None
    overflow: int = 0
    problems: list[str] = field(default_factory=list)   # plain-language, for check/logs

    @property
    def block_size(self) -> int | None:
        sizes = {c.block_size for c in self.engines.values() if c.block_size}
        return sizes.pop() if len(sizes) == 1 else (max(sizes) if sizes else None)

    @property
    def prefix_caching(self) -> str:
        vals = {c.prefix_caching for c in self.engines.values() if c.prefix_caching}
        return "mixed" if len(vals) > 1 else (vals.pop() if vals else "")

    @property
    def hash_algo(self) -> str:
        vals = {c.hash_algo for c in self.engines.values() if c.hash_algo}
        return ",".join(sorted(vals))


def _bool_label(v: str | None) -> str:
    if v is None:
        return ""
    return {"true": "true", "false": "false"}.get(v.strip().lower(), "")


def _int_label(v: str | None) -> int | None:
    try:
        return int(float(v)) if v not in (None, "", "None") else None
    except ValueError:
        return None


class _Guard:
    """Bounds the number of (model_name, engine) pairs one upstream may create."""

    def __init__(self, limit: int):
        self.limit = limit
        self.seen: set[tuple[str, str]] = set()
        self.dropped: set[tuple[str, str]] = set()

    def admit(self, model: str, engine: str) -> bool:
        key = (model, engine)
        if key in self.seen:
            return True
        if len(self.seen) >= self.limit:
            self.dropped.add(key)
            return False
        self.seen.add(key)
        return True


def _ident(labels: dict[str, str]) -> tuple[str, str]:
    return labels.get("model_name", ""), labels.get("engine", "")


def select_era(page: Exposition) -> E.Era:
    for era in E.ERAS:
        if era.detect not in page.samples:
            continue
        if era.help_contains:
            text = page.help.get(era.detect, "")
            if era.help_contains.lower() not in text.lower():
                continue
        return era
    return E.NO_PREFIX_CACHE_METRICS


def normalise(page: Exposition, max_series: int = 256) -> Normalised:
    era = select_era(page)
    out = Normalised(era=era, process_start_time=page.process_start_time, prefix=page.prefix)
    guard = _Guard(max_series)

    # cache_config_info carries no model_name on V1 (one row per engine): not guarded,
    # or it would use up the slots the data series need.
    for labels, _ in page.samples.get(E.CACHE_CONFIG, ())[:max_series]:
        out.engines[_ident(labels)] = EngineConfig(
            prefix_caching=_bool_label(labels.get("enable_prefix_caching")),
            block_size=_int_label(labels.get("block_size")),
            hash_algo=labels.get("prefix_caching_hash_algo", ""),
        )

    def block_size_for(ident: tuple[str, str]) -> int | None:
        cfg = out.engines.get(ident) or out.engines.get(("", ident[1])) or out.engines.get(("", ""))
        if cfg and cfg.block_size:
            return cfg.block_size
        return out.block_size

    def add(metric: str, key: tuple[str, ...], value: float, into: dict) -> None:
        # Series that collapse onto one key (e.g. per-worker series under Ray) are summed.
        k = (metric, key)
        into[k] = into.get(k, 0.0) + value

    def read_counter(stem: str, metric: str, extra=(), scale_blocks=False, extra_label=None) -> bool:
        rows = page.samples.get(stem)
        if rows is None:
            return False
        for labels, value in rows:
            ident = _ident(labels)
            if not guard.admit(*ident):
                continue
            if scale_blocks:
                bs = block_size_for(ident)
                if bs is None:
                    out.problems.append(
                        f"{stem} counts blocks but no block_size is known (vllm:cache_config_info missing): not converted")
                    continue
                value *= bs
            key = ident + tuple(extra) + ((labels.get(extra_label, ""),) if extra_label else ())
            add(metric, key, value, out.counters)
        created = page.samples.get(E.created_stem(stem), ())
        for labels, value in created:
            sig = stem + "|" + "|".join(f"{k}={v}" for k, v in sorted(labels.items()))
            out.created[sig] = value
        return True

    # Local prefix cache: the era decides which names and which unit.
    if era.queries:
        blocks = era.unit == "blocks"
        has_q = read_counter(era.queries, C.QUERY_TOKENS.name, ("local",), scale_blocks=blocks)
        has_h = era.hits is not None and read_counter(era.hits, C.HIT_TOKENS.name, ("local",), scale_blocks=blocks)
        if has_q and not has_h:
            out.problems.append(f"{era.hits} is missing although {era.queries} is present: hits cannot be counted")
    for stem, cache in era.ratio_gauges:
        for labels, value in page.samples.get(stem, ()):
            ident = _ident(labels)
            if not guard.admit(*ident):
                continue
            if value < 0:     # V0 sets -1 when prefix caching is disabled
                cfg = out.engines.setdefault(ident, EngineConfig())
                if cache == "local":
                    cfg.prefix_caching = "false"
                continue
            add(C.REPORTED_HIT_RATIO.name, ident + (cache, "since_start_blocks"), value, out.gauges)

    # KV-connector tier.
    read_counter(E.EXTERNAL_QUERIES, C.QUERY_TOKENS.name, ("external",))
    read_counter(E.EXTERNAL_HITS, C.HIT_TOKENS.name, ("external",))

    for metric, cands in (
        (C.PROMPT_TOKENS.name, E.COMMON_COUNTERS["prompt_tokens"]),
        (C.GENERATION_TOKENS.name, E.COMMON_COUNTERS["generation_tokens"]),
        (C.PREEMPTIONS.name, E.COMMON_COUNTERS["preemptions"]),
        (C.PROMPT_CACHED_TOKENS.name, E.COMMON_COUNTERS["prompt_cached_tokens"]),
    ):
        for stem in cands:
            if read_counter(stem, metric):
                break
    read_counter(E.PROMPT_TOKENS_BY_SOURCE, C.PROMPT_TOKENS_BY_SOURCE.name, extra_label="source")

    for metric, cands in (
        (C.KV_CACHE_USAGE.name, E.COMMON_GAUGES["kv_cache_usage"]),
        (C.REQUESTS_RUNNING.name, E.COMMON_GAUGES["requests_running"]),
        (C.REQUESTS_WAITING.name, E.COMMON_GAUGES["requests_waiting"]),
    ):
        for stem in cands:
            rows = page.samples.get(stem)
            if rows is None:
                continue
            for labels, value in rows:
                ident = _ident(labels)
                if guard.admit(*ident):
                    k = (metric, ident)
                    # Usage and queue gauges of collapsed series: the fullest one matters.
                    out.gauges[k] = max(value, out.gauges.get(k, value))
            break

    # Fill in miss tokens from the converted counters.
    for (metric, key), q in list(out.counters.items()):
        if metric == C.QUERY_TOKENS.name:
            h = out.counters.get((C.HIT_TOKENS.name, key))
            if h is not None:
                out.counters[(C.MISS_TOKENS.name, key)] = max(q - h, 0.0)

    # V1's cache_config_info has an engine label but no model_name: with a single served
    # model (the usual case) attribute the config to it, so the series join on model_name.
    models = {key[0] for (_, key) in list(out.counters) + list(out.gauges)}
    if len(models) == 1:
        model = models.pop()
        out.engines = {((model if m == "" else m), e): cfg for (m, e), cfg in out.engines.items()}

    out.overflow = len(guard.dropped)
    return out


def normalise_text(body: str, max_series: int = 256) -> Normalised:
    return normalise(parse(body, WANTED, HELP_WANTED), max_series)
