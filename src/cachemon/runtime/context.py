"""What a stage of `cachemon run` is handed: ``StageContext``, narrow, typed and lazy.

A stage factory (runtime/stages.py) reads its config section and three read ports, and nothing
else of the daemon: the store's read API (``StoreReader``: ``with store.read() as view``), the
event log every stage publishes on (state/events.py), and the upstreams' metadata as their
pollers last read it (runtime/poller.UpstreamMeta: the config entry, the /version the poller
fetched, the last page). A source stage (the log source) also gets the store's write API. The one thing two stages
share, the KV-event ledger, is built on first ask (``kv_ledger``), by whichever stage asks first.

Importing this module imports no stage: the config types the protocols name are read by mypy only.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from cachemon.config import KvEventsSettings, Upstream
from cachemon.runtime.poller import UpstreamMeta
from cachemon.state.events import EventLog
from cachemon.state.views import StoreReader, StoreWriter

if TYPE_CHECKING:
    from cachemon.config.attribution import AttributionConfig
    from cachemon.config.cost import CostModel
    from cachemon.config.events import EventsConfig, ModelEntry
    from cachemon.config.routers import RouterEntry
    from cachemon.config.warmup import WarmupConfig
    from cachemon.normalise.server_profile import ServerProfile
    from cachemon.runtime.kv_stage import KvSink, SinkFactory, StreamFeed
    from cachemon.sources.logs.settings import LogConfig
    from cachemon.state.ledger.fleet import FleetLedger
    from cachemon.state.routers import RouterBook


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
    def models(self) -> Sequence[ModelEntry]: ...
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
    @property
    def routers(self) -> Sequence[RouterEntry]: ...


@dataclass(frozen=True)
class StageContext:
    config: StageConfig
    store: StoreReader
    events: EventLog
    upstreams: Mapping[str, UpstreamMeta]           # the polled upstreams, by name, in config order
    writer: StoreWriter | None = None               # the store's write API, for a source stage
    kv_sink_factory: SinkFactory | None = None      # what the KV stage feeds (default: the fleet ledger); tests
    _built: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def kv_sink(self) -> KvSink | None:
        """The KV-event sink, built once on first ask; None (and no import of the KV modules) when no
        upstream has ``kv_events``."""
        if "kv_sink" not in self._built:
            sink = None
            if any(u.kv_events is not None for u in self.config.upstreams):
                from cachemon.runtime.kv_stage import ledger_factory
                sink = (self.kv_sink_factory or ledger_factory)(self.config.kv_events)
            self._built["kv_sink"] = sink
        sink_: KvSink | None = self._built["kv_sink"]
        return sink_

    def kv_ledger(self) -> FleetLedger | None:
        """The fleet ledger the KV stage feeds (docs/kv-events.md: FleetLedger.view), or None."""
        sink = self.kv_sink()
        if sink is None:
            return None
        from cachemon.runtime.kv_stage import fleet_ledger
        return fleet_ledger(sink)

    def kv_feeds(self) -> dict[str, StreamFeed]:
        """Each followed KV stream's feed by upstream, filled by the KV stage when it builds them (empty
        until then, and without ``kv_events``)."""
        feeds: dict[str, StreamFeed] = self._built.setdefault("kv_feeds", {})
        return feeds

    def kv_profile(self) -> Callable[[str], ServerProfile | None] | None:
        """upstream -> what its KV events said of its server (StreamFeed.profile), for the judge to merge
        with its page and log; None when no upstream has ``kv_events``."""
        if not any(u.kv_events is not None for u in self.config.upstreams):
            return None
        feeds = self.kv_feeds()

        def profile(upstream: str) -> ServerProfile | None:
            feed = feeds.get(upstream)
            return feed.profile() if feed is not None else None
        return profile

    def router_book(self) -> RouterBook | None:
        """What the routers believed (state/routers.py), built once on first ask; None without ``routers:``."""
        if "router_book" not in self._built:
            book = None
            if self.config.routers:
                from cachemon.state.routers import RouterBook
                book = RouterBook()
            self._built["router_book"] = book
        book_: RouterBook | None = self._built["router_book"]
        return book_
