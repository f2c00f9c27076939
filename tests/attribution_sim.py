"""CONSTRUCTED traffic for the attribution stage, replayed in time with an injected clock.

Every page this builds is constructed (no vLLM produced it). Its shapes are the real vLLM 0.32.0 CPU
capture's (tests/fixtures/vllm-0.32.0-cpu): 831-token prompts over a 128-token block, so a prompt whose
system prompt is cached hits 768 tokens; vLLM's prompt-length histogram buckets; one engine "0".

``LedgerView`` / ``DynamicPrefix`` are copied field for field from docs/kv-events.md (the contract the
ledger, state/ledger/fleet.FleetLedger.view, is built against), so the stage is tested against the shape it
will receive without importing the ledger.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from cachemon import catalog as C
from cachemon.normalise.server_profile import ServerProfile
from cachemon.normalise.updates import Update
from cachemon.runtime.attribution_stage import AttributionSettings, Attributor
from cachemon.state.events import EventKind, EventLog
from cachemon.state.store import Store

MODEL, ENGINE = "tiny", "0"
PROMPT, HIT, BLOCK = 831.0, 768.0, 128
LES = (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, float("inf"))


@dataclass(frozen=True)
class DynamicPrefix:                           # docs/kv-events.md, verbatim fields
    depth_blocks: int
    since: float
    recomputed_tokens: float


@dataclass(frozen=True)
class LedgerView:                              # docs/kv-events.md, verbatim fields
    model: str
    in_sync: bool
    stored_tokens: dict[str, float]
    cached_blocks: int
    dynamic_prefix: DynamicPrefix | None
    tier_hit_tokens: float = 0.0


@dataclass
class Sim:
    """One vLLM process's cumulative counters, polled every ``poll`` seconds by a real Store and Attributor."""
    poll: float = 2.0
    window: float = 60.0
    short_window: float = 8.0
    hold: int = 2
    hold_down: float = 30.0
    t: float = 1_000_000.0
    q: float = 0.0
    h: float = 0.0
    buckets: dict[float, float] = field(default_factory=lambda: dict.fromkeys(LES, 0.0))
    gauges: dict[str, float] = field(default_factory=dict)
    start_time: float = 999_000.0
    ledger: LedgerView | None = None

    def __post_init__(self) -> None:
        self.store = Store({"1m": 60.0})
        self.events = EventLog()        # what the pollers and change detection publish on in the daemon
        self.att = Attributor(self.store, AttributionSettings(
            window=self.window, short_window=self.short_window, hold=self.hold, hold_down=self.hold_down),
            events=self.events, ledger_view=lambda up: self.ledger)
        self.gauges = {C.BLOCK_SIZE.name: BLOCK, C.PREFIX_CACHING_ENABLED.name: 1.0, C.KV_CACHE_USAGE.name: 0.3}
        self.polls: list[tuple[str, ...]] = []          # active causes after each poll
        self.named: list[tuple[str, ...]] = []          # what the engine named at each poll
        self.ratios: list[float | None] = []            # the interval's hit ratio at each poll

    def request(self, prompt: float = PROMPT, hit: float = HIT) -> None:
        self.q += prompt
        self.h += hit
        for le in LES:
            if prompt <= le:
                self.buckets[le] += 1

    def restart(self) -> None:
        """A new vLLM process: its counters start from 0, its start time changes."""
        self.q = self.h = 0.0
        self.buckets = dict.fromkeys(LES, 0.0)
        self.start_time = self.t

    def step(self) -> tuple[str, ...]:
        self.t += self.poll
        counters = {(C.QUERY_TOKENS.name, (MODEL, ENGINE, "local")): self.q,
                    (C.HIT_TOKENS.name, (MODEL, ENGINE, "local")): self.h}
        for le, n in self.buckets.items():
            counters[(C.PROMPT_LENGTH_REQUESTS.name, (MODEL, ENGINE, "+Inf" if le == float("inf") else f"{le:g}"))] = n
        upd = Update.from_totals(counters, {(k, (MODEL, ENGINE)): v for k, v in self.gauges.items()})
        # the engine's config as the normaliser reads it (the page's cache_config_info): the judge reads it
        # from the profile, the config gauges above are what /metrics exports of it
        labels = {"block_size": f"{self.gauges.get(C.BLOCK_SIZE.name, 0):g}"}
        if C.PREFIX_CACHING_ENABLED.name in self.gauges:
            labels["enable_prefix_caching"] = str(bool(self.gauges[C.PREFIX_CACHING_ENABLED.name]))
        upd.profiles = {(MODEL, ENGINE): ServerProfile.from_cache_config_info(labels)}
        upd.process_start_time = self.start_time
        restart = self.store.apply("vllm", upd, self.t).restart
        if restart:            # as the poller publishes it
            self.events.publish(EventKind.RESTART, "vllm", self.t, restart)
        [res] = self.att.evaluate(self.t)
        self.named.append(res.codes)
        self.ratios.append(res.ratio)
        active = tuple(sorted(k[2] for k in self.att.tracker.since))
        self.polls.append(active)
        return active

    def publish(self, kind: str, at: float, detail: str = "") -> None:
        """An event another stage saw (change detection's change, the log source's reset)."""
        self.events.publish(EventKind(kind), "vllm", at, detail)

    def missed(self) -> dict[tuple[str, str], float]:
        return {(k[2], k[3]): v for k, v in self.att.missed.items()}


def first_poll(polls: list[tuple[str, ...]], cause: str, after: int = 0) -> int | None:
    """Polls (1-based, counted from poll ``after``) until ``cause`` is first active."""
    for i, active in enumerate(polls[after:], start=1):
        if cause in active:
            return i
    return None


class ChangeLog(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
