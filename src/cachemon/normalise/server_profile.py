"""One description of a server's prefix cache, whatever said it: ``ServerProfile``.

A server tells its cache config in up to three places, each partly: the page's
``vllm:cache_config_info`` labels (the Python frontend), the engine's start-up log lines (every
frontend; the only place on vLLM 0.32's Rust frontend), and its KV events (each BlockStored's
``block_size``, a sliding-window group's window, the media stored on, the engine whose wire it is). Each
source gives a profile (``from_cache_config_info``, ``from_log_config``, ``from_kv_events``); ``combine``
makes one of a page's several engines, and ``merge`` takes, field by field, the first source that knows
it, recording where each field was read (``sources``), so `run`, `check`, `analyze`, `capture` and
`warmup` say the same thing of one server. The exported config gauges (``config_gauges``) and `check`'s
``cache_config`` (``to_report``) are written from a profile, nowhere else.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from typing import TypedDict

from cachemon import catalog as C
from cachemon.catalog import SeriesKey
from cachemon.normalise import eras as E

# Sizes a float holds exactly (updates.MAX_COUNTER's bound; not imported: an Update carries profiles)
_MAX_SIZE = float(2 ** 53)

# The fields merge() takes from the first profile that knows them (the others say where a value came from).
_MERGED = ("engine", "frontend", "version", "prefix_caching", "block_size", "hash_algo", "num_blocks",
           "pool_tokens", "match_floor", "match_floor_source", "mamba_cache_mode", "offloading",
           "sliding_window", "tiers")


class ReportedConfig(TypedDict):
    """`cachemon check`'s ``cache_config`` (schema cachemon-check/1): written by ``ServerProfile.to_report``."""
    prefix_caching: str                       # "true" | "false" | "mixed" (engines disagree) | "" (unknown)
    block_size: int | None
    hash_algo: str


def _known(v: object) -> bool:
    return v is not None and v != "" and v != ()


@dataclass(frozen=True)
class ServerProfile:
    """What one engine of a server says of its cache ("" / None: not said)."""
    engine: str = ""                # the engine row (engines.ENGINES): "vllm", "sglang", ...; "" where nothing said it
    frontend: str = ""              # a Frontend row's name (eras.FRONTENDS): "python" | "rust" | ""
    version: str = ""               # the release, as the server states it
    prefix_caching: str = ""        # "true" | "false" | ""
    block_size: int | None = None
    hash_algo: str = ""
    num_blocks: int | None = None   # KV pool size in blocks (num_gpu_blocks)
    pool_tokens: int | None = None  # kv_cache_size_tokens: group-aware, right for hybrid models too
    match_floor: int | None = None  # the shortest prefix that can hit (eras.MATCH_FLOOR_LABELS)
    match_floor_source: str = ""    # the label it was read from
    mamba_cache_mode: str = ""      # "align" | "none" | "" (hybrid Mamba models: align with caching on)
    offloading: str = ""            # kv_offloading_backend, only when kv_offloading_size turns it on
    sliding_window: int | None = None   # a sliding-window group's window in tokens (KV events only: the page's
                                        # sliding_window label is never set, docs/vllm-eras.md)
    tiers: tuple[str, ...] = ()     # media other than the GPU pool the KV events stored on ("CPU", ...)
    # (field, where it was read) for each field set: "the page's vllm:cache_config_info", "the start-up
    # lines of PATH", "KV events"
    sources: tuple[tuple[str, str], ...] = ()

    @property
    def pool(self) -> int | None:
        """The pool in tokens: stated, else blocks x block size."""
        if self.pool_tokens:
            return self.pool_tokens
        return self.num_blocks * self.block_size if self.num_blocks and self.block_size else None

    def source_of(self, name: str) -> str:
        """Where ``name`` was read ("" when no source said it)."""
        return dict(self.sources).get(name, "")

    @property
    def source(self) -> str:
        """Where the block size was read, else where anything was."""
        return self.source_of("block_size") or (self.sources[0][1] if self.sources else "")

    def cache_key(self) -> tuple[str, int, str, int]:
        """What a cache-config change compares: the flag, the block size, the hash and the match floor.
        A different key means cached prefixes no longer match."""
        return (self.prefix_caching, self.block_size or 0, self.hash_algo, self.match_floor or 0)

    def to_report(self) -> ReportedConfig:
        """`cachemon check`'s ``cache_config`` of this profile."""
        return {"prefix_caching": self.prefix_caching, "block_size": self.block_size, "hash_algo": self.hash_algo}

    def config_gauges(self, ident: tuple[str, str]) -> dict[SeriesKey, float]:
        """The exported engine-config gauges of this profile, for one (model_name, engine)."""
        g: dict[SeriesKey, float] = {}
        if self.prefix_caching:
            g[SeriesKey(C.PREFIX_CACHING_ENABLED.name, ident)] = 1.0 if self.prefix_caching == "true" else 0.0
        if self.block_size:
            g[SeriesKey(C.BLOCK_SIZE.name, ident)] = float(self.block_size)
        if self.pool:
            g[SeriesKey(C.KV_CACHE_CAPACITY.name, ident)] = float(self.pool)
        if self.match_floor:
            g[SeriesKey(C.MATCH_FLOOR.name, ident)] = float(self.match_floor)
        return g

    # -- the sources --------------------------------------------------------------------------------
    @classmethod
    def from_cache_config_info(cls, labels: dict[str, str],
                               where: str = "the page's vllm:cache_config_info") -> ServerProfile:
        floor, floor_source = match_floor(labels)
        offload_size = labels.get("kv_offloading_size", "None")
        return cls._said(
            where,
            prefix_caching=bool_label(labels.get("enable_prefix_caching")),
            block_size=int_label(labels.get("block_size")),
            hash_algo=labels.get("prefix_caching_hash_algo", ""),
            num_blocks=int_label(labels.get("num_gpu_blocks")),
            pool_tokens=int_label(labels.get("kv_cache_size_tokens")),
            match_floor=floor, match_floor_source=floor_source,
            mamba_cache_mode=labels.get("mamba_cache_mode", ""),
            # vLLM offloads only when kv_offloading_size is set (config/vllm.py); the backend label says
            # "native" by default either way
            offloading=labels.get("kv_offloading_backend", "") if offload_size not in ("", "None") else "",
        )

    @classmethod
    def from_log_config(cls, config: dict[str, str], where: str = "the log's start-up lines") -> ServerProfile:
        """What an engine's start-up lines stated (normalise/log_grammar.CONFIG_LINES): the flag, the pool,
        the block count with an override, the release and the frontend. The block size is the pool over
        the block count, as vLLM sizes the pool; it bounds the shortest hit too."""
        pool, blocks = _positive(config.get("pool")), _positive(config.get("blocks"))
        block = pool // blocks if pool and blocks and pool % blocks == 0 else None
        started = "version" in config      # an engine start-up line: the frontend is known
        return cls._said(
            where,
            frontend=config.get("frontend", "") if started else "",
            version=config.get("version", ""),
            prefix_caching={"True": "true", "False": "false"}.get(config.get("prefix_caching", ""), ""),
            block_size=block, num_blocks=blocks, pool_tokens=pool,
            match_floor=block, match_floor_source="block_size" if block else "",
        )

    @classmethod
    def from_kv_events(cls, block_size: int | None, where: str = "KV events", *, engine: str = "",
                       sliding_window: int | None = None, tiers: tuple[str, ...] = ()) -> ServerProfile:
        """What a KV stream said (runtime/kv_stage.StreamFeed): the full-attention group's block size (each
        BlockStored's), a sliding-window group's window, the media other than the GPU pool, and the engine
        whose wire the payloads are (normalise/kv_schema.KvEra.engine)."""
        return cls._said(where, engine=engine, block_size=block_size or None, sliding_window=sliding_window or None,
                         tiers=tuple(tiers))

    @classmethod
    def _said(cls, where: str, **values: object) -> ServerProfile:
        said = tuple((k, where) for k, v in values.items() if _known(v))
        return cls(**values, sources=said)  # type: ignore[arg-type]


def merge(*profiles: ServerProfile | None) -> ServerProfile:
    """Field by field, the first profile that knows it (pass them most trusted first: the page, the log,
    KV events); ``sources`` says where each field came from."""
    got: dict[str, object] = {}
    where: dict[str, str] = {}
    for p in profiles:
        if p is None:
            continue
        said = dict(p.sources)
        for name in _MERGED:
            v = getattr(p, name)
            if name not in got and _known(v):
                got[name] = v
                if name in said:
                    where[name] = said[name]
    return ServerProfile(**got, sources=tuple(where.items()))  # type: ignore[arg-type]


def combine(engines: Iterable[ServerProfile]) -> ServerProfile | None:
    """One profile of a server's engines (a page's cache_config_info rows), None without any: the caching
    flag "mixed" where they disagree, the largest block size and floor (the floor that bounds every hit),
    the pools in tokens summed, every hash named; the rest from the first engine that says it."""
    ps = list(engines)
    if not ps:
        return None
    first = merge(*ps)
    flags = {p.prefix_caching for p in ps if p.prefix_caching}
    pools = [p.pool for p in ps if p.pool]
    floors = [p for p in ps if p.match_floor]
    top = max(floors, key=lambda p: p.match_floor or 0) if floors else None
    return replace(
        first,
        prefix_caching="mixed" if len(flags) > 1 else first.prefix_caching,
        block_size=max((p.block_size for p in ps if p.block_size), default=None),
        match_floor=top.match_floor if top else None, match_floor_source=top.match_floor_source if top else "",
        hash_algo=",".join(sorted({p.hash_algo for p in ps if p.hash_algo})),
        # the pool as each engine states it (its tokens, else blocks x block size), so a later source's
        # block size never multiplies this page's block count
        pool_tokens=sum(pools) if pools else None, num_blocks=first.num_blocks if len(ps) == 1 else None,
        sources=first.sources + ((("pool_tokens", first.source),)
                                 if pools and not first.source_of("pool_tokens") else ()))


# -- label readers (shared with the normaliser) ---------------------------------------------------------

def bool_label(v: str | None) -> str:
    if v is None:
        return ""
    return {"true": "true", "false": "false"}.get(v.strip().lower(), "")


def int_label(v: str | None) -> int | None:
    """A positive integer label (block_size, num_gpu_blocks), or None: "inf", "-4", "1.5", "None" are not sizes."""
    try:
        f = float(v) if v not in (None, "", "None") else math.nan
    except ValueError:
        return None
    return int(f) if math.isfinite(f) and f >= 1 and f == int(f) and f < _MAX_SIZE else None


def match_floor(labels: dict[str, str]) -> tuple[int | None, str]:
    """The shortest prefix that can hit, from a cache_config_info label set, and the label it came from."""
    for name in E.MATCH_FLOOR_LABELS:
        v = int_label(labels.get(name))
        if v is not None:
            return v, name
    return None, ""


def _positive(v: str | None) -> int | None:
    # a log line's digits: int() refuses more than 4 300 of them, and no pool is 16 digits long
    return int(v) if v and v.isdigit() and len(v) < 16 and int(v) > 0 else None


assert set(_MERGED) | {"sources"} == {f.name for f in fields(ServerProfile)}
assert set(ReportedConfig.__annotations__) <= set(_MERGED)     # check's cache_config: profile fields only
