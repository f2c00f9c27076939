"""Change, restart and cache-reset detection: the daemon component behind `cachemon run`'s events.

Per upstream, every ``events.interval`` (default 30 s, slower than /metrics polling):

* ``/v1/models`` (id, root, max_model_len)       -> MODEL_INFO, CHANGES{kind="model"}
* ``/version`` (as the poller last fetched it)    -> CHANGES{kind="version"}
* the cache config of the last /metrics page     -> CHANGES{kind="cache_config"}
* tokenizer / chat-template fingerprints of the
  directories named in ``models:``               -> TOKENIZER_INFO, CHANGES{kind="tokenizer"|"chat_template"}

The first observation is the baseline, never a change. A failed fetch is not a change
(the last known value is kept). Restarts are detected by the core poller (RESTARTS,
LAST_RESTART) and published on the stages' event log (state/events.py); this component
subscribes to re-check models/version at once, and publishes what it sees (changes, suspected
resets) there, where warm-up and attribution read them. Prefix-cache resets without a restart are inferred from the token
counters by ``ResetDetector`` (see its docstring for the heuristic and its limits).
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict

from cachemon import catalog as C
from cachemon.config.events import EventSettings, ResetSettings
from cachemon.expose.render import Family, format_labels
from cachemon.normalise.normaliser import Normalised
from cachemon.runtime.component import LoopStage
from cachemon.sources.fingerprint import Fingerprinter
from cachemon.sources.scrape import new_session
from cachemon.sources.vllm_api import VllmApi, VllmApiError
from cachemon.state.events import EventKind, EventLog, StageEvent
from cachemon.state.views import StoreReader
from cachemon.urls import redact_url, upstream_text

if TYPE_CHECKING:
    import urllib3

    from cachemon.runtime.poller import UpstreamMeta

log = logging.getLogger("cachemon.changes")


# --- config -------------------------------------------------------------------------------


# --- cache-reset heuristic ------------------------------------------------------------------

class _Candidate(TypedDict):
    t: float                 # the poll that saw the collapse
    baseline_ratio: float
    waited: int              # active intervals since, without recovery


class ResetDetector:
    """Infers a prefix-cache reset (``POST /reset_prefix_cache``) from token counters alone.

    vLLM exposes no reset counter, and a reset does not touch its Prometheus counters. What a
    reset does show: the same traffic that used to hit suddenly misses, then hits again once
    the cache is repopulated. So, per interval between polls (idle intervals, below
    ``min_query_tokens``, are ignored):

    1. baseline: the last ``baseline_polls`` active intervals each had a hit ratio of at least
       ``min_baseline_ratio``;
    2. collapse: an active interval whose hit ratio is at most ``collapse_fraction`` x the
       baseline ratio while the query rate stays within ``volume_band`` of the baseline rate
       (queries continue at the same load);
    3. confirmation: within ``confirm_polls`` active intervals the hit ratio comes back to at
       least ``recovery_fraction`` x the baseline. Only then is the reset counted, dated at the
       poll that saw the collapse.

    Any restart clears the state (a restart is its own event). Traffic that changes for good
    (e.g. a timestamp added to the system prompt) collapses but never recovers: not a reset.
    Limit: a same-volume burst of unrelated traffic between two stretches of the usual
    traffic (A, B, A) looks exactly like a reset in the counters; a reset under light or
    changing traffic is missed. The heuristic prefers missing a reset to inventing one.
    """

    def __init__(self, settings: ResetSettings | None = None):
        self.s = settings or ResetSettings()
        self.baseline: deque[tuple[float, float, float]] = deque(maxlen=self.s.baseline_polls)  # (dq, dh, dt)
        self.last: tuple[float, float, float] | None = None     # (t, q, h) of the previous poll
        self.candidate: _Candidate | None = None
        self.rejected = 0     # collapses that never recovered (traffic changed), for tests and logs

    def clear(self) -> None:
        self.baseline.clear()
        self.candidate = None

    def observe(self, t: float, queries: float, hits: float, restarted: bool = False) -> float | None:
        """Feed one poll's corrected totals; returns the collapse time when a reset is confirmed."""
        prev, self.last = self.last, (t, queries, hits)
        if restarted:
            self.clear()
            return None
        if prev is None or t <= prev[0]:
            return None
        dq, dh, dt = queries - prev[1], hits - prev[2], t - prev[0]
        if dq < 0 or dh < 0:      # should not happen with corrected counters; start over
            self.clear()
            return None
        if dq < self.s.min_query_tokens:
            return None           # idle: neither evidence for nor against
        ratio = dh / dq
        if self.candidate is not None:
            c = self.candidate
            if ratio >= self.s.recovery_fraction * c["baseline_ratio"]:
                self.candidate = None
                self.baseline.clear()
                self.baseline.append((dq, dh, dt))
                return c["t"]
            c["waited"] += 1
            if c["waited"] >= self.s.confirm_polls:
                log.debug("hit-ratio collapse at %.0f never recovered: traffic changed, not a reset", c["t"])
                self.rejected += 1
                self.candidate = None
                self.baseline.clear()
            return None
        if len(self.baseline) == self.s.baseline_polls:
            bq = sum(b[0] for b in self.baseline)
            bh = sum(b[1] for b in self.baseline)
            brate = bq / sum(b[2] for b in self.baseline)
            bratio = bh / bq
            lo, hi = self.s.volume_band
            if ratio <= self.s.collapse_fraction * bratio and lo <= (dq / dt) / brate <= hi:
                self.candidate = {"t": t, "baseline_ratio": bratio, "waited": 0}
                return None
        if ratio >= self.s.min_baseline_ratio:
            self.baseline.append((dq, dh, dt))
        else:
            self.baseline.clear()
        return None


# --- per-upstream watch ------------------------------------------------------------------

# per engine: (engine, ServerProfile.cache_key()): what, when it changes, leaves cached prefixes unmatched
EngineCacheKeys = tuple[tuple[str, tuple[str, int, str, int]], ...]


@dataclass
class Watch:
    name: str
    models: tuple[tuple[str, str, str], ...] | None = None    # (id, root, max_model_len), sorted
    version: str = ""
    cache_config: EngineCacheKeys | None = None
    tokenizers: dict[str, tuple[str, str]] = field(default_factory=dict)   # model -> (tokenizer, template)
    changes: dict[str, int] = field(default_factory=dict)
    last_change: dict[str, float] = field(default_factory=dict)
    cache_resets: int = 0
    last_cache_reset: float | None = None
    detector: ResetDetector = field(default_factory=ResetDetector)
    seen_restarts: int = 0
    seen_success: float | None = None
    models_error: str | None = None


CHANGE_KINDS = ("model", "version", "cache_config", "tokenizer", "chat_template")


def _cache_config_of(n: Normalised | None) -> EngineCacheKeys | None:
    """The cache config per engine. Keyed by engine only: vllm:cache_config_info carries no
    model_name (V0 and V1), and the normaliser attaches one only once a data series names the
    model, so keying by model turned a V0 server's first traffic into spurious changes."""
    if n is None or not n.engines:
        return None
    return tuple(sorted({(e, c.cache_key()) for (_, e), c in n.engines.items()}))


def _describe_cache_config(cfg: EngineCacheKeys | None) -> str:
    if not cfg:
        return "unknown"
    return "; ".join(f"engine {e or '-'}: prefix_caching={p} block_size={b} hash={h}"
                     + (f" match_floor={f}" if f and f != b else "") for e, (p, b, h, f) in cfg)


def _compare(w: Watch, models: tuple[tuple[str, str, str], ...] | None, version: str, cache_cfg: EngineCacheKeys | None,
             seen: list[tuple[str, str, str]]) -> None:
    """The served models, the release and the cache config against what the watch last saw: each change
    into ``seen`` as (kind, old, new); what is known now becomes the watch's."""
    if models is not None:
        if w.models is not None and models != w.models:
            seen.append(("model", str([m[0] for m in w.models]), str([m[0] for m in models])))
        w.models = models
    if version:
        if w.version and version != w.version:
            seen.append(("version", w.version, version))
        w.version = version
    if cache_cfg is not None:
        if w.cache_config is not None and cache_cfg != w.cache_config:
            seen.append(("cache_config", _describe_cache_config(w.cache_config), _describe_cache_config(cache_cfg)))
        w.cache_config = cache_cfg


class ChangeDetector(LoopStage):
    """The change-detection stage. ``check_metadata`` and ``sample`` are the whole job; ``start`` repeats them.

    Reads the store through its read API and each upstream's metadata (``UpstreamMeta``: the
    version and the last page its poller read), hears restarts on ``events`` and publishes the
    changes and suspected resets it sees there."""
    thread_name = "changes"

    def __init__(self, pollers: Sequence[UpstreamMeta], store: StoreReader, settings: EventSettings,
                 sample_interval: float = 2.0, clock: Callable[[], float] = time.time,
                 events: EventLog | None = None, session: urllib3.PoolManager | None = None) -> None:
        self.pollers = list(pollers)
        self.store = store
        self.settings = settings
        self.sample_interval = sample_interval
        self.clock = clock
        self.events = events if events is not None else EventLog()
        self.session = session or new_session()
        self.lock = threading.Lock()
        self.watches = {p.upstream.name: Watch(p.upstream.name, detector=ResetDetector(settings.reset))
                        for p in self.pollers}
        self.fingerprint = Fingerprinter()
        self._recheck = threading.Event()
        self.events.subscribe((EventKind.RESTART,), self._on_restart)

    # -- events from the pollers --------------------------------------------------------------
    def _on_restart(self, event: StageEvent) -> None:
        if event.upstream in self.watches:
            self._recheck.set()        # an upgrade is a restart: look at models and version now

    # -- change bookkeeping ------------------------------------------------------------------
    def _change(self, w: Watch, kind: str, now: float, old: str, new: str) -> None:
        w.changes[kind] = w.changes.get(kind, 0) + 1
        w.last_change[kind] = now
        log.warning("upstream %s: %s changed: %s -> %s", w.name, kind, old, new)

    def check_metadata(self) -> None:
        """One round of /v1/models, /version, cache config and tokenizer checks for every upstream."""
        for p in self.pollers:
            self._check_upstream(p)

    def _fetch_models(self, p: UpstreamMeta) -> tuple[tuple[tuple[str, str, str], ...] | None, str | None]:
        """(served models, why they could not be read) of one upstream; None where unknown."""
        base = p.upstream.base_url
        timeout = min(p.upstream.timeout, 5.0)
        models = None
        try:
            models = tuple(sorted((m.id[:200], m.root[:200], str(m.max_model_len or ""))
                                  for m in VllmApi(base, self.session).models(timeout)))
            err = None
        except VllmApiError as e:
            # the upstream's text, redacted of the configured URL's secrets (an upstream may echo them)
            err = upstream_text(f"{redact_url(base)}/v1/models: {e}", p.upstream.url, 300)
        return models, err

    def _check_upstream(self, p: UpstreamMeta) -> None:
        name = p.upstream.name
        models, err = self._fetch_models(p)
        version = p.vllm_version       # the poller's: "" on older servers, other engines
        cache_cfg = _cache_config_of(p.last)
        tok = self._tokenizers(name)
        now = self.clock()
        seen: list[tuple[str, str, str]] = []      # (kind, old, new), published once the lock is released
        with self.lock:
            w = self.watches[name]
            if err != w.models_error:
                if err:
                    log.warning("upstream %s: cannot read served models (%s); keeping the last known list", name, err)
                w.models_error = err
            _compare(w, models, version, cache_cfg, seen)
            for model, (th, ch) in tok.items():
                old = w.tokenizers.get(model)
                if old is not None:
                    if th != old[0]:
                        seen.append(("tokenizer", old[0][:12], th[:12]))
                    if ch != old[1]:
                        seen.append(("chat_template", old[1][:12], ch[:12]))
                w.tokenizers[model] = (th, ch)
            for kind, before, after in seen:
                self._change(w, kind, now, before, after)
        for kind, _, _ in seen:
            self.events.publish(EventKind.CHANGE, name, now, kind)

    def _tokenizers(self, name: str) -> dict[str, tuple[str, str]]:
        """Model -> (tokenizer, chat template) fingerprints of the models served by upstream ``name``."""
        tok: dict[str, tuple[str, str]] = {}
        for m in self.settings.models:
            if m.tokenizer and (not m.upstreams or name in m.upstreams):
                fp = self.fingerprint(m.tokenizer)
                if fp is not None:
                    tok[m.name] = fp
        return tok

    def sample(self) -> None:
        """Feed each upstream's newest poll (if any) to its reset detector."""
        if not self.settings.reset.enabled:
            return
        for p in self.pollers:
            name = p.upstream.name
            with self.store.read() as view:
                st = view.upstreams.get(name)
                if st is None:
                    continue
                t, restarts = st.last_success, st.restarts
                q, h = st.local_totals()
            with self.lock:
                w = self.watches[name]
                if t is None or t == w.seen_success:
                    continue
                w.seen_success = t
                restarted = restarts != w.seen_restarts
                w.seen_restarts = restarts
                at = w.detector.observe(t, q, h, restarted)
                if at is not None:
                    w.cache_resets += 1
                    w.last_cache_reset = at
                    log.warning("upstream %s: prefix cache reset detected (hit ratio collapsed at %s while queries "
                                "continued, then recovered; no restart)", w.name,
                                time.strftime("%H:%M:%S", time.localtime(at)))
            if at is not None:
                self.events.publish(EventKind.CACHE_RESET_SUSPECTED, name, at)

    # -- thread --------------------------------------------------------------------------------
    def _loop(self, stop: threading.Event) -> None:
        next_meta = 0.0
        while not stop.is_set():
            now = time.monotonic()
            try:
                self.sample()
                if now >= next_meta or self._recheck.is_set():
                    self._recheck.clear()
                    self.check_metadata()
                    next_meta = now + self.settings.interval
            except Exception:      # never let one bad round kill event detection
                log.exception("change detection: unexpected error")
            stop.wait(min(self.sample_interval, max(0.05, next_meta - time.monotonic())))

    # -- the daemon's Component protocol -------------------------------------------------------

    def collect(self) -> Iterator[Family]:
        fam = Family.of
        models, toks, changes, last_change = fam(C.MODEL_INFO), fam(C.TOKENIZER_INFO), fam(C.CHANGES), fam(C.LAST_CHANGE)
        resets, last_reset = fam(C.CACHE_RESETS), fam(C.LAST_CACHE_RESET)
        with self.lock:
            for name, w in sorted(self.watches.items()):
                for mid, root, mlen in w.models or ():
                    models.add(format_labels(C.MODEL_INFO.labels, (name, mid, root, mlen)), 1.0)
                for model, (th, ch) in sorted(w.tokenizers.items()):
                    toks.add(format_labels(C.TOKENIZER_INFO.labels, (name, model, th, ch)), 1.0)
                for kind in CHANGE_KINDS:     # zeros too, so increase() sees the first change
                    changes.add(format_labels(C.CHANGES.labels, (name, kind)), w.changes.get(kind, 0))
                    if kind in w.last_change:
                        last_change.add(format_labels(C.LAST_CHANGE.labels, (name, kind)), w.last_change[kind])
                resets.add(format_labels(C.CACHE_RESETS.labels, (name,)), w.cache_resets)
                if w.last_cache_reset is not None:
                    last_reset.add(format_labels(C.LAST_CACHE_RESET.labels, (name,)), w.last_cache_reset)
        out = [models, toks, changes, last_change, resets, last_reset]
        yield from (f for f in out if f.samples or f.type == "counter")
