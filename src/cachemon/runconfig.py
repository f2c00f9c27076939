"""`cachemon run`'s configuration: the YAML file, then command-line flags on top (flags win).

Laid out like a pipeline (sources -> normalise -> sinks -> the runtime stages)::

    upstreams:                 # sources: vLLM /metrics endpoints
      - name: vllm-0
        url: http://127.0.0.1:8000/metrics
        timeout: 3s
    logs: {...}                # sources: log files (see docs/log-source.md)
    poll_mode: background      # or scrape: poll on each scrape of cachemon's /metrics
    poll_interval: 5s          # background mode: how often each upstream is polled
    scrape_mode:               # scrape mode only
      min_gap: 1s              # a poll that ended less than this ago is reused by a scrape
      background_interval: 30s # the slow poll that still sees restarts and resets between scrapes
    normalise:
      max_series_per_upstream: 256
      evict_after: 10m         # a label set the upstream stopped reporting is dropped after this
    windows: [1m, 5m]
    listen:                    # sink: cachemon's own /metrics
      address: 0.0.0.0
      port: 9867
      web_config_file: null    # exporter-toolkit web config, loaded and checked here too
    models: [...]              # runtime: tokenizer fingerprints (cachemon.runtime.change_detector)
    events: {...}              # runtime: change and cache-reset detection
    warmup: {...}              # runtime: warm-up after a restart or model change
    cost: {...}                # runtime: estimated cost counters
    attribution: {...}         # runtime: why the hit ratio is low (window, lookback)
    kv_events: {...}           # sources + state: bounds of the KV-event streams and the ledger
                               # (upstreams[].kv_events says where a replica publishes them)
    routers: [...]             # runtime: the routers in front of the upstreams (their /metrics, kind, fronts)

Each section is a typed definition (``cachemon.config.setting``) owned by the module that uses
it; this module only lists them, so the whole file is checked before anything starts and every
error is one line naming its key (exit code 2).
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cachemon.config import (
    DEFAULT_UPSTREAM,
    DEFAULT_WINDOWS,
    HOUR,
    MINUTE,
    ConfigError,
    KvEventsEndpoint,
    KvEventsSettings,
    Listen,
    Upstream,
    check_kv_event_deps,
    check_unique_names,
    choice,
    duration,
    integer,
    list_of,
    load_section,
    load_yaml,
    optional,
    parse_kv_events_spec,
    parse_listen,
    parse_upstream_spec,
    parse_windows,
    section,
    section_parsers,
    setting,
    upstream,
)
from cachemon.config.attribution import AttributionConfig
from cachemon.config.cost import CostModel, parse_cost_config
from cachemon.config.events import EventsConfig, ModelEntry
from cachemon.config.routers import RouterEntry, check_routers, router_entry
from cachemon.config.warmup import WarmupConfig, parse_warmup_config
from cachemon.sources.logs.settings import LogConfig, apply_log_flags, parse_log_config
from cachemon.web.web_config import WebConfig, load_web_config

# Polling faster than this only burns CPU; slower than an hour outlives Prometheus' staleness.
POLL_INTERVAL_BOUNDS = (0.01, HOUR)
# The default background poll: one /metrics render costs vLLM's API server about 9 ms of CPU
# (scripts/e2e/poll_cost.py, vLLM 0.32.0), 0.18 % of a core at 5 s; see README, "Polling cost and mode".
DEFAULT_POLL_INTERVAL = 5.0
POLL_MODES = ("background", "scrape")


def _flag(section_cls: type, key: str, value: object, flag: str) -> Any:
    """A command-line flag read through the same typed definition as its YAML key."""
    return section_parsers(section_cls)[key](value, flag)


@dataclass
class Normalise:
    # (model_name, engine) label sets kept per upstream over time (cardinality guard)
    max_series_per_upstream: int = setting(integer(lo=1, hi=1_000_000), 256)
    # a label set the upstream stopped reporting is evicted with its series after this
    evict_after: float = setting(duration(1.0, 30 * 24 * HOUR), 600.0)


@dataclass
class ScrapeMode:
    """``scrape_mode:``, read when ``poll_mode: scrape``."""
    # a scrape reuses a poll that ended less than this ago (concurrent scrapes cost one poll)
    min_gap: float = setting(duration(0.001, MINUTE), 1.0)
    # the background poll between scrapes: it only polls when no scrape did for this long
    background_interval: float = setting(duration(1.0, HOUR), 30.0)


def _windows() -> dict[str, float]:
    return parse_windows(list(DEFAULT_WINDOWS), "windows")


@dataclass
class Config:
    upstreams: list[Upstream] = setting(list_of(upstream, what="a list of upstreams"), default_factory=list)
    logs: LogConfig | None = setting(optional(parse_log_config), None)
    poll_interval: float = setting(duration(*POLL_INTERVAL_BOUNDS), DEFAULT_POLL_INTERVAL)
    poll_mode: str = setting(choice(*POLL_MODES), "background")
    scrape_mode: ScrapeMode = setting(section(ScrapeMode), default_factory=ScrapeMode)
    normalise: Normalise = setting(section(Normalise), default_factory=Normalise)
    windows: dict[str, float] = setting(parse_windows, default_factory=_windows)
    listen: Listen = setting(section(Listen), default_factory=Listen)
    models: list[ModelEntry] = setting(list_of(section(ModelEntry)), default_factory=list)
    events: EventsConfig = setting(section(EventsConfig), default_factory=EventsConfig)
    warmup: WarmupConfig | None = setting(optional(parse_warmup_config), None)
    cost: CostModel | None = setting(optional(parse_cost_config), None)
    attribution: AttributionConfig = setting(section(AttributionConfig), default_factory=AttributionConfig)
    kv_events: KvEventsSettings = setting(section(KvEventsSettings), default_factory=KvEventsSettings)
    routers: list[RouterEntry] = setting(list_of(router_entry), default_factory=list)
    # Not read from YAML: the web config named by listen.web_config_file, loaded by ``build_config``.
    web: WebConfig = field(default_factory=WebConfig)

    @property
    def max_series_per_upstream(self) -> int:
        return self.normalise.max_series_per_upstream

    @property
    def evict_after(self) -> float:
        return self.normalise.evict_after


def from_dict(data: dict[str, object]) -> Config:
    """Every section of a parsed file, checked; source names must be unique across kinds."""
    cfg = load_section(Config, data, "")
    check_unique_names(cfg.upstreams, "upstreams")
    if cfg.logs is not None:
        check_unique_names(cfg.logs.files, "logs.files", {u.name for u in cfg.upstreams})
    from cachemon.normalise.routers import KINDS
    check_routers(cfg.routers, {u.name for u in cfg.upstreams}, tuple(KINDS))
    return cfg


def build_config(config_path: str | None, upstreams: Sequence[str] = (), listen: str | None = None,
                 poll_interval: str | None = None, windows: Sequence[str] = (), web_config_file: str | None = None,
                 max_series: int | None = None, log_files: Sequence[str] = (), from_beginning: bool | None = None,
                 state_file: str | None = None, kv_events: Sequence[str] = (), poll_mode: str | None = None) -> Config:
    """YAML file first, then flags on top (flags win); the web config file is loaded last."""
    cfg = from_dict(load_yaml(config_path) if config_path else {})
    if upstreams:
        cfg.upstreams = [parse_upstream_spec(s, f"--upstream[{i}]") for i, s in enumerate(upstreams)]
        check_unique_names(cfg.upstreams, "--upstream")
    if listen:
        cfg.listen.address, cfg.listen.port = parse_listen(listen)
    if poll_interval:
        cfg.poll_interval = _flag(Config, "poll_interval", poll_interval, "--poll-interval")
    if poll_mode is not None:
        cfg.poll_mode = _flag(Config, "poll_mode", poll_mode, "--poll-mode")
    if windows:
        cfg.windows = _flag(Config, "windows", list(windows), "--window")
    if web_config_file:
        cfg.listen.web_config_file = web_config_file
    if max_series is not None:
        cfg.normalise.max_series_per_upstream = _flag(Normalise, "max_series_per_upstream", max_series, "--max-series")
    if log_files or from_beginning is not None or state_file:
        cfg.logs = apply_log_flags(cfg.logs, log_files, from_beginning, state_file)
        check_unique_names(cfg.logs.files, "--log-file", {u.name for u in cfg.upstreams})
    if not cfg.upstreams and cfg.logs is None:
        cfg.upstreams = [parse_upstream_spec(DEFAULT_UPSTREAM, "--upstream")]
    for i, spec in enumerate(kv_events):
        apply_kv_events_flag(cfg.upstreams, spec, f"--kv-events[{i}]")
    if cfg.listen.web_config_file:
        cfg.web = load_web_config(os.path.expanduser(cfg.listen.web_config_file))
    return cfg


def apply_kv_events_flag(upstreams: Sequence[Upstream], spec: str, key: str) -> None:
    """``--kv-events [NAME=]ENDPOINT``: the stream of upstream NAME (default: the only upstream).
    An endpoint the file set for that upstream is replaced; its other kv_events settings stay."""
    name, endpoint = parse_kv_events_spec(spec, key)
    if not name:
        if len(upstreams) != 1:
            names = ", ".join(u.name for u in upstreams) or "none"
            raise ConfigError(key, f"say which upstream the stream belongs to as NAME={endpoint} "
                                   f"(upstreams: {names})")
        target = upstreams[0]
    else:
        found = [u for u in upstreams if u.name == name]
        if not found:
            raise ConfigError(key, f"no upstream named {name!r} (upstreams: {', '.join(u.name for u in upstreams) or 'none'})")
        target = found[0]
    check_kv_event_deps(key)
    if target.kv_events is None:
        target.kv_events = KvEventsEndpoint(endpoint=endpoint)
    else:
        target.kv_events.endpoint = endpoint


__all__ = ["Config", "ConfigError", "Normalise", "ScrapeMode", "build_config", "from_dict"]
