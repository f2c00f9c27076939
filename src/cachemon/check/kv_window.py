"""`cachemon check --kv-events` (docs/kv-events.md): the fleet ledger over check's window, built by
`cachemon run`'s own KV pipeline builder (runtime/kv_stage.py), and --show-text's decoded samples."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from cachemon import catalog as C
from cachemon.check.report import Finding, KvEventsReport, SourceReport, TextSamples, finding
from cachemon.config import ConfigError, KvEventsSettings, Upstream
from cachemon.normalise.normaliser import Normalised
from cachemon.normalise.server_profile import ServerProfile

if TYPE_CHECKING:
    from cachemon.runtime.kv_stage import StreamFeed
    from cachemon.sources.kv_stream import KvStream

TEXT_SAMPLES_SHOWN = 4          # --show-text: example blocks printed
TEXT_CONTEXT_CHARS = 48         # ... of the shared start, shown before the first difference
TEXT_SHOWN_CHARS = 160          # ... of each block from the first difference on


class KvWindow:
    """`check --kv-events`: one KvStream per followed upstream, feeding one FleetLedger while check's
    window runs: the daemon's own StreamFeed and ledger (runtime/kv_stage.py), without the daemon.
    Every stream's model is the one model its upstream's /metrics report (``set_model``), so replicas
    of one model share the fleet index (the routing reason) as they do in `cachemon run`."""

    def __init__(self, upstreams: Sequence[Upstream], settings: KvEventsSettings, keep_text: bool = False):
        from cachemon.runtime.kv_stage import build_streams, new_fleet_ledger
        self.ledger = new_fleet_ledger(settings, keep_text=keep_text)
        self.stop_event = threading.Event()
        self.feeds: dict[str, StreamFeed] = {}
        self.streams: dict[str, tuple[KvStream, StreamFeed]] = {
            stream.name: (stream, feed) for stream, feed in build_streams(upstreams, settings, self.ledger,
                                                                          feeds=self.feeds)}
        self.t0 = self.t1 = 0.0

    def set_model(self, name: str, n: Normalised | None) -> None:
        """The stream's model: the one model_name the upstream's page reports (else its name)."""
        entry = self.streams.get(name)
        if entry is None or n is None or entry[1].configured_model:
            return
        models = {key[0] for (metric, key) in n.counters if metric == C.QUERY_TOKENS.name and key[0]}
        if len(models) == 1:
            entry[1].configured_model = models.pop()

    def profile(self, name: str) -> ServerProfile | None:
        """What upstream ``name``'s KV events said of its server in the window (None: not followed)."""
        feed = self.feeds.get(name)
        return feed.profile() if feed is not None else None

    def start(self) -> None:
        self.t0 = time.monotonic()
        for stream, _ in self.streams.values():
            stream.start(self.stop_event)

    def stop(self) -> None:
        self.stop_event.set()
        self.t1 = time.monotonic()
        for stream, _ in self.streams.values():
            stream.join(2.0)

    @property
    def seconds(self) -> float:
        return round((self.t1 or time.monotonic()) - self.t0, 3)

    def report(self, name: str) -> tuple[KvEventsReport, list[Finding], list[str]] | None:
        """(``kv_events`` of the source report, findings, text lines) of one followed upstream."""
        entry = self.streams.get(name)
        if entry is None:
            return None
        stream, feed = entry
        st = stream.stats
        view = self.ledger.view(name)
        snap = next((x for x in self.ledger.snapshot() if x.replica == name), None)
        secs = self.seconds
        dp = view.dynamic_prefix if view is not None else None
        lost = dict(feed.lost)         # by reason, as cachemon_kv_lost_batches_total
        rep: KvEventsReport = {
            "endpoint": stream.s.endpoint, "replay": stream.s.replay, "window_seconds": secs,
            "connected": st.connects > 0, "messages": st.messages, "recovered": st.recovered,
            "lost_batches": lost, "restarts": st.restarts, "events": dict(feed.events),
            "release": feed.release, "model": view.model if view is not None else None,
            "in_sync": view.in_sync if view is not None else None,
            "stored_tokens": view.stored_tokens if view is not None else {},
            "cached_blocks": view.cached_blocks if view is not None else 0,
            # the divergence-depth histogram as on /metrics: cumulative count per upper bound ("le"), +Inf last
            "divergence_depth_blocks": {("+Inf" if le == float("inf") else f"{le:g}"): n
                                        for le, n in snap.depth.cumulative()} if snap is not None else {},
            "dynamic_prefix": None if dp is None else {"depth_blocks": dp.depth_blocks,
                                                       "recomputed_tokens": dp.recomputed_tokens},
            "sliding_window": view.sliding_window if view is not None else None,
        }
        where = f"KV events of {name} ({stream.s.endpoint})"
        findings: list[Finding] = []
        lines: list[str] = []
        if not st.connects:
            findings.append(finding("kv_events_unreachable", "warning",
                                    f"{where}: no connection in the {secs:g}s window. Is vLLM started with "
                                    f"--kv-events-config (publisher zmq, this endpoint's port) and the port reachable?"))
            return rep, findings, lines
        if not st.messages:
            findings.append(finding("kv_events_none", "info",
                                    f"{where}: connected, but no event in the {secs:g}s window: an idle server "
                                    f"publishes nothing, and neither does a request that hits every block."))
            return rep, findings, lines
        bad = sum(lost.values())
        if bad:
            findings.append(finding("kv_events_lost", "warning",
                                    f"{where}: {bad} batch(es) lost or undecodable in the window "
                                    f"({', '.join(f'{k} {v}' for k, v in lost.items() if v)}); the split below is a "
                                    f"lower bound of the reasons other than first."))
        if view is not None and not view.in_sync:
            findings.append(finding("kv_ledger_out_of_sync", "info",
                                    f"{where}: the ledger is not sure what is cached (joined a running server "
                                    f"whose replay buffer did not reach its start, a gap, or a full ledger)."))
        split = rep["stored_tokens"]
        total = sum(split.values())
        enc = f", vLLM {feed.release} encoding" if feed.release else ""
        lines.append(f"KV events ({secs:g}s window, {st.messages} batches, {st.recovered} of them from the replay "
                     f"socket{enc}): {total:.0f} tokens stored = " + ", ".join(
                         f"{r} {v:.0f}" for r, v in split.items()) +
                     f"; ledger {'in sync' if rep['in_sync'] else 'NOT in sync'}, {rep['cached_blocks']} blocks cached")
        if rep["sliding_window"]:
            findings.append(finding(
                "sliding_window_model", "info",
                f"{where}: the model has a sliding-window KV-cache group (window {rep['sliding_window']} tokens). "
                f"The page's match floor bounds resent prompts only: a hit needs the window before it cached in "
                f"that group, which vLLM keeps only before each prompt's end and before a shared prefix seen "
                f"once, so the first prompt sharing a prefix with another can miss it (stored as sliding_window, "
                f"{split.get('sliding_window', 0.0):.0f} tokens in the window). `cachemon analyze` simulates it "
                f"with --model-config (the model's config.json) or --sliding-window {rep['sliding_window']}."))
        if dp is not None:
            lines.append(f"KV events: dynamic prefix at block depth {dp.depth_blocks}: one cached parent with many "
                         f"distinct children each stored once; {dp.recomputed_tokens:.0f} shared tokens recomputed "
                         f"below it")
        return rep, findings, lines

    def samples(self, name: str) -> list[tuple[int, ...]]:
        return self.ledger.text_samples(name)


def load_text_decoder(tokenizer: str) -> Callable[[Sequence[int]], str]:
    """--show-text: the model's tokenizer, loaded as `cachemon analyze` loads it (analyze/tokenize.py)."""
    from cachemon.analyze.tokenize import MissingExtraError, ModelTokenizer, TokenizerDirError
    try:
        tok = ModelTokenizer(tokenizer).tok
    except (TokenizerDirError, MissingExtraError) as e:
        raise ConfigError("--tokenizer", str(e)) from None
    return lambda ids: tok.decode(list(ids), skip_special_tokens=False)


def text_report(samples: list[tuple[int, ...]], decode: Callable[[Sequence[int]], str],
                depth: int | None) -> tuple[TextSamples, list[str]]:
    """--show-text: the decoded example blocks where requests diverge (PROMPT CONTENT, opt-in), the full
    text for JSON and, for the terminal, each block from its first difference with the others on."""
    texts = [decode(t) for t in samples[-TEXT_SAMPLES_SHOWN:]]
    at = f"block depth {depth} (the dynamic prefix)" if depth is not None else \
        "the most recent divergence point (no dynamic prefix named)"
    data: TextSamples = {"prompt_content": True, "depth_blocks": depth, "samples": texts}
    if not texts:
        return data, ["--show-text: no divergence sample in the window (no store looked like a per-request value)"]
    common = 0
    if len(texts) > 1:
        shortest = min(len(t) for t in texts)
        while common < shortest and len({t[common] for t in texts}) == 1:
            common += 1
    lines = [f"!! PROMPT CONTENT (--show-text): decoded tokens of {len(texts)} example block(s) at {at}",
             f"   shared start: ...{texts[0][max(0, common - TEXT_CONTEXT_CHARS):common]!r}"]
    lines += [f"   [{i + 1}] {t[common:common + TEXT_SHOWN_CHARS]!r}" for i, t in enumerate(texts)]
    return data, lines


def add_kv_reports(sources: list[SourceReport], window: KvWindow, decode: Callable[[Sequence[int]], str] | None) -> None:
    """Each followed upstream's window in its source report (the engine reads the ledger's view through
    the snapshot builder, as the daemon does)."""
    for rep in sources:
        got = window.report(rep["name"])
        if got is None:
            continue
        kv, findings, lines = got
        rep["kv_events"] = kv
        rep["findings"].extend(findings)
        rep["kv_extra"] = lines
        if decode is not None:
            dp = kv["dynamic_prefix"]
            kv["text"], text_lines = text_report(window.samples(rep["name"]), decode,
                                                 dp["depth_blocks"] if dp else None)
            rep["kv_extra"] = lines + text_lines
