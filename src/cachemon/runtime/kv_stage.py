"""The KV-event stage of `cachemon run`: one thread per followed stream (``upstreams[].kv_events``),
decoding each payload (``normalise.kv_decode``) and feeding the ledger (docs/kv-events.md).

Nothing here runs, and neither pyzmq nor msgspec is imported, unless a stream is configured: the
daemon's factory (runtime/stages.py, ``kv_stage``) returns None without one. A stream's restarts
(its sequence went back) and cache resets (every block cleared) go to the stages' event log.

A stream's replica is its upstream's name; its model is, in this order, ``kv_events.model`` from
the config, the one ``model_name`` the upstream's /metrics report (re-read every
``MODEL_RECHECK`` seconds: a model change is followed), or the upstream's name.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Protocol

from cachemon import catalog as C
from cachemon.config import KvEventsSettings, Upstream
from cachemon.expose.render import Family
from cachemon.normalise.kv_batch import POOL_MEDIA
from cachemon.normalise.kv_limits import MAX_TIERS
from cachemon.normalise.server_profile import ServerProfile

if TYPE_CHECKING:
    from cachemon.normalise.kv_batch import KvBatch, Stored
    from cachemon.normalise.kv_decode import KvDecoder
    from cachemon.sources.kv_stream import Context, KvStream
    from cachemon.state.ledger.fleet import FleetLedger
    from cachemon.state.store import StoreReader

log = logging.getLogger("cachemon.kv_events")

MODEL_RECHECK = 10.0       # seconds between looks at the model the upstream's metrics report
JOIN_TIMEOUT = 2.0         # how long close() waits for each stream thread


class KvSink(Protocol):
    """Where decoded batches go: the ledger (state/ledger/fleet.FleetLedger). Called from the stream
    threads (one per replica), so an implementation locks what replicas share."""
    def on_batch(self, replica: str, model: str, batch: KvBatch, at: float, /) -> None: ...
    def on_restart(self, replica: str, at: float, /) -> None: ...   # seq went back: a new vLLM process
    def on_lost(self, replica: str, batches: int, at: float, /) -> None: ...   # unrecovered: out of sync


SinkFactory = Callable[[KvEventsSettings], KvSink]


class FamilySource(Protocol):
    """Something that builds families at scrape time (expose/kv_collector.KvLedgerCollector)."""
    def collect(self) -> Iterator[Family]: ...


def ledger_factory(settings: KvEventsSettings) -> KvSink:
    """The real sink: the fleet ledger, bounded by the ``kv_events`` section."""
    return new_fleet_ledger(settings)


def new_fleet_ledger(settings: KvEventsSettings, keep_text: bool = False) -> FleetLedger:
    """The fleet ledger of `run` and `check`, bounded by the ``kv_events`` section."""
    from cachemon.state.ledger.fleet import FleetLedger  # here, so a sidecar without events never loads it
    from cachemon.state.ledger.tenants import TenantLabels
    labels = TenantLabels(settings.tenants, settings.tenant_key.encode() if settings.tenant_key else None,
                          settings.tenant_top_k)
    return FleetLedger(max_blocks=settings.max_blocks, history_blocks=settings.history_blocks, keep_text=keep_text,
                       tenants=labels, isolation=settings.isolation, full_reports=settings.full_reports)


def build_streams(upstreams: Iterable[Upstream], settings: KvEventsSettings, sink: KvSink,
                  store: StoreReader | None = None, context: Context | None = None,
                  feeds: dict[str, StreamFeed] | None = None) -> list[tuple[KvStream, StreamFeed]]:
    """The KV pipeline of every upstream with ``kv_events``: its stream settings, its ``KvStream``
    and the ``StreamFeed`` that decodes into ``sink``. The one builder of `run` (KvStage) and
    `check --kv-events` (check/kv_window.py)."""
    from cachemon.sources.kv_stream import KvStream, StreamSettings
    out: list[tuple[KvStream, StreamFeed]] = []
    for u in upstreams:
        kv = u.kv_events
        if kv is None:
            continue
        feed = StreamFeed(u, sink, store)
        s = StreamSettings(endpoint=kv.endpoint, replay=kv.replay, topic=kv.topic,
                           max_frame_bytes=kv.max_frame_bytes or settings.max_frame_bytes,
                           queue_messages=settings.queue_messages, replay_timeout=settings.replay_timeout)
        out.append((KvStream(u.name, s, feed, clock=time.time, context=context), feed))
        if feeds is not None:     # the feeds' profiles, for whoever judges (StageContext.kv_profile)
            feeds[u.name] = feed
    return out


class StreamFeed:
    """The FrameHandler of one stream: payload -> KvBatch -> sink, counting what it sees."""

    def __init__(self, upstream: Upstream, sink: KvSink, store: StoreReader | None = None,
                 clock: Callable[[], float] = time.monotonic):
        from cachemon.normalise.kv_decode import KvDecoder
        self.replica = upstream.name
        self.configured_model = upstream.kv_events.model if upstream.kv_events else None
        self.sink = sink
        self.store = store
        self.clock = clock
        self.decoder: KvDecoder = KvDecoder()
        self.events = {"stored": 0, "removed": 0, "cleared": 0, "unknown": 0}    # events seen, by kind
        self.lost = {"gap": 0, "decode_error": 0, "oversized": 0, "duplicate": 0, "seq_jump": 0, "handler": 0}
        self.decode_reasons: dict[str, int] = {}
        self.release = ""                  # the release range the payloads fit (KvBatch.release), once known
        # what the events said of the server since its last restart (``profile``)
        self.block_size: int | None = None       # the full-attention group's, the newest store's
        self.sliding_window: int | None = None   # a sliding-window group's window
        self.tiers: tuple[str, ...] = ()         # media other than the pool (replaced whole: read from other threads)
        self._said: tuple[object, ...] = ()      # the last store's (block size, kind, medium, window)
        self._model = ""
        self._model_checked = float("-inf")

    # -- the model a stream belongs to ---------------------------------------------------------
    def model(self) -> str:
        if self.configured_model:
            return self.configured_model
        now = self.clock()
        if now - self._model_checked >= MODEL_RECHECK or not self._model:
            self._model_checked = now
            self._model = self._reported_model() or self._model or self.replica
        return self._model

    def _reported_model(self) -> str | None:
        if self.store is None:
            return None
        with self.store.read() as view:
            st = view.upstreams.get(self.replica)
            models = {ident[0] for ident in st.idents if ident and ident[0]} if st is not None else set()
        return models.pop() if len(models) == 1 else None

    # -- FrameHandler ---------------------------------------------------------------------------
    def on_payload(self, seq: int, payload: bytes, at: float) -> None:
        from cachemon.normalise.kv_batch import Cleared, Removed, Stored
        from cachemon.normalise.kv_decode import KvDecodeError
        try:
            batch = self.decoder.decode(payload, seq)
        except KvDecodeError as e:
            self.decode_reasons[e.reason] = self.decode_reasons.get(e.reason, 0) + 1
            n = self.decode_reasons[e.reason]
            if n in (1, 10, 100) or n % 1000 == 0:       # the reason only: never the payload
                log.warning("kv events %s: batch seq %d does not decode (%s; %d so far)", self.replica, seq,
                            e.reason, n)
            self.on_lost(1, "decode_error", at)
            return
        ev = self.events
        for event in batch.events:
            if isinstance(event, Stored):
                ev["stored"] += 1
                said = (event.block_size, event.kind, event.medium, event.window)
                if said != self._said:      # a store unlike the last: what it says of the server
                    self._said = said
                    self._note_store(event)
            elif isinstance(event, Removed):
                ev["removed"] += 1
            elif isinstance(event, Cleared):
                ev["cleared"] += 1
        ev["unknown"] += batch.unknown
        if batch.release != self.release and self.decoder.layout is not None:
            self.release = batch.release
            who = f"vLLM {batch.release}" if batch.release[:1].isdigit() else batch.release   # or "sglang 0.5.23"
            log.info("kv events %s: the payloads are %s's encoding (%s events)", self.replica, who, self.decoder.layout)
        self.sink.on_batch(self.replica, self.model(), batch, at)

    def _note_store(self, event: Stored) -> None:
        medium = event.medium      # already one tier per medium, whatever its case, and bounded (kv_decode)
        if medium is not None and medium not in POOL_MEDIA:
            if medium not in self.tiers and len(self.tiers) < MAX_TIERS:
                self.tiers = (*self.tiers, medium)
        elif event.kind in (None, "full_attention") and event.block_size >= 1:
            self.block_size = event.block_size
        elif event.kind == "sliding_window" and event.window:
            self.sliding_window = event.window

    def profile(self) -> ServerProfile:
        """What this stream's events said of its server since its last restart (ServerProfile.from_kv_events)."""
        eras = self.decoder.eras if self.decoder.layout is not None else ()
        return ServerProfile.from_kv_events(self.block_size, f"the KV events of {self.replica}",
                                            engine=eras[0].engine if eras else "",
                                            sliding_window=self.sliding_window, tiers=tuple(sorted(self.tiers)))

    def on_restart(self, at: float) -> None:
        self.decoder.reset()
        # a new process may run another --block-size or model: its own stores say it again
        self.block_size = self.sliding_window = None
        self.tiers, self._said = (), ()
        self.sink.on_restart(self.replica, at)

    def on_lost(self, batches: int, reason: str, at: float) -> None:
        # "joined": published before cachemon listened: no loss of the stream's (counting it would report
        # a loss at every start beside a running vLLM), but it leaves the ledger unsure, as every loss does.
        if reason in self.lost:
            self.lost[reason] += batches
        self.sink.on_lost(self.replica, batches, at)


class KvStage:
    """The Component: streams, their threads, and the source's metric families."""

    def __init__(self, upstreams: Iterable[Upstream], settings: KvEventsSettings, sink: KvSink,
                 store: StoreReader | None = None, context: Context | None = None,
                 collectors: Iterable[FamilySource] = (), feeds: dict[str, StreamFeed] | None = None):
        self.settings = settings
        self.sink = sink
        self.collectors = list(collectors)
        self.streams = build_streams(upstreams, settings, sink, store, context, feeds)

    def start(self, stop_event: threading.Event) -> None:
        for stream, _ in self.streams:
            stream.start(stop_event)
            log.info("following KV events of %s at %s%s", stream.name, stream.s.endpoint,
                     f" (replay {stream.s.replay})" if stream.s.replay else " (no replay endpoint: gaps are not recovered)")
        if self.streams and self.settings.isolation:
            from cachemon.state.ledger.index import implementation
            kind = implementation()
            log.info("KV events: the isolation index is %s%s", kind, "" if kind == "compiled" else
                     " (cachemon-native is not installed: the ledger spends ~+36 % CPU per event on tenants, not ~+18 %; "
                     "see native/README.md)")

    def close(self) -> None:
        for stream, _ in self.streams:
            stream.join(JOIN_TIMEOUT)

    def collect(self) -> Iterator[Family]:
        events, lost = Family.of(C.KV_EVENTS), Family.of(C.KV_LOST_BATCHES)
        recovered, up = Family.of(C.KV_RECOVERED_BATCHES), Family.of(C.KV_STREAM_UP)
        disconnects, protocol = Family.of(C.KV_STREAM_DISCONNECTS), Family.of(C.KV_STREAM_PROTOCOL_ERRORS)
        last_message = Family.of(C.KV_STREAM_LAST_MESSAGE)
        for stream, feed in self.streams:
            name, st = stream.name, stream.stats
            for t, n in feed.events.items():
                events.put(C.KV_EVENTS, (name, t), n)
            for reason, n in feed.lost.items():      # frames the stream could not take + payloads that do not decode
                lost.put(C.KV_LOST_BATCHES, (name, reason), n)
            recovered.put(C.KV_RECOVERED_BATCHES, (name,), st.recovered)
            up.put(C.KV_STREAM_UP, (name,), 1.0 if st.connected else 0.0)
            disconnects.put(C.KV_STREAM_DISCONNECTS, (name,), st.disconnects)
            protocol.put(C.KV_STREAM_PROTOCOL_ERRORS, (name,), st.protocol_errors)
            if st.last_message:                          # absent until the first message: no age to tell
                last_message.put(C.KV_STREAM_LAST_MESSAGE, (name,), st.last_message)
        yield from (events, lost, recovered, up, disconnects, protocol, last_message)
        for collector in self.collectors:                # the ledger's families (expose/kv_collector.py)
            yield from collector.collect()


def fleet_ledger(sink: KvSink) -> FleetLedger | None:
    """The sink as the fleet ledger (whose views attribution reads), or None for another sink (tests)."""
    from cachemon.state.ledger.fleet import FleetLedger
    return sink if isinstance(sink, FleetLedger) else None


def ledger_collectors(sink: KvSink, new_series_hold: float = 0.0) -> list[FamilySource]:
    """The ledger's families on /metrics, built at scrape time by expose/kv_collector.KvLedgerCollector,
    when the sink is the fleet ledger (this stage is their one place on /metrics: nothing else
    registers them). Another sink (tests) exports nothing more. ``new_series_hold``: seconds a new group
    of the ledger's counters (a replica's, a tier's, a tenant's) is served at 0 (``kv_events.new_series_hold``,
    expose/new_series.py)."""
    from cachemon.expose.kv_collector import KvLedgerCollector
    from cachemon.expose.new_series import NewSeriesHold
    from cachemon.state.ledger.fleet import FleetLedger
    return [KvLedgerCollector(sink, NewSeriesHold(new_series_hold))] if isinstance(sink, FleetLedger) else []
