"""What a stage of `cachemon run` is handed: ``StageContext``, narrow and typed.

Each stage factory (runtime/stages.py) reads its config section, the store (through its read
API), the pollers and the event log from here, and nothing else of the daemon. The one thing
one stage hands another, the KV-event ledger, goes through a typed slot (``KvSlot``): the KV
stage fills it, attribution reads it when it evaluates, so the order of the factories does
not matter.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from cachemon.config import KvEventsSettings, Upstream
from cachemon.runtime.attribution_stage import AttributionConfig
from cachemon.runtime.changes import EventsConfig, ModelTokenizer
from cachemon.runtime.cost import CostModel
from cachemon.runtime.events import EventLog
from cachemon.runtime.kv_stage import SinkFactory
from cachemon.runtime.poller import UpstreamPoller
from cachemon.runtime.snapshots import LedgerViewLike
from cachemon.runtime.warmup import WarmupConfig
from cachemon.sources.logs.config import LogConfig
from cachemon.state.store import Store

if TYPE_CHECKING:
    from cachemon.state.kv_ledger import FleetLedger


class StageConfig(Protocol):
    """The parts of the run config (runconfig.Config) the stages read."""

    @property
    def upstreams(self) -> Sequence[Upstream]: ...
    @property
    def poll_interval(self) -> float: ...
    @property
    def windows(self) -> Mapping[str, float]: ...
    @property
    def logs(self) -> LogConfig | None: ...
    @property
    def models(self) -> Sequence[ModelTokenizer]: ...
    @property
    def events(self) -> EventsConfig: ...
    @property
    def warmup(self) -> WarmupConfig | None: ...
    @property
    def cost(self) -> CostModel | None: ...
    @property
    def attribution(self) -> AttributionConfig: ...
    @property
    def kv_events(self) -> KvEventsSettings: ...


@dataclass
class KvSlot:
    """The KV-event ledger, once the KV stage has built it (None: no events followed)."""

    ledger: FleetLedger | None = None

    def view(self, upstream: str) -> LedgerViewLike | None:
        """The ledger's view of one upstream (docs/kv-events.md: FleetLedger.view), or None."""
        return self.ledger.view(upstream) if self.ledger is not None else None

    @property
    def filled(self) -> bool:
        return self.ledger is not None


@dataclass(frozen=True)
class StageContext:
    config: StageConfig
    store: Store
    pollers: tuple[UpstreamPoller, ...]
    events: EventLog
    kv: KvSlot = field(default_factory=KvSlot)
    kv_sink_factory: SinkFactory | None = None     # what the KV stage feeds (default: the fleet ledger); tests
