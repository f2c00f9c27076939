"""Re-warm the prefix cache: send the stable prefixes again, gently.

`cachemon warmup --api URL --prompts FILE` (tools/warmup_command.py) and the daemon's ``warmup.warmup_on`` share
``run_warmup``: read the server's load from /metrics and refuse above ``max_load``
(running + waiting requests) unless forced; send each prompt with ``max_tokens`` (default 1)
at most ``rate`` requests/s with ``concurrency`` in flight; report every failed prompt and
the hit ratio before and after from /metrics.

Prompts file: JSONL, one OpenAI request body per line, either bare
(``{"model": ..., "messages": [...]}``) or wrapped like the analyzer's captures
(``{"request": {...}, ...}``). ``messages`` go to /v1/chat/completions, ``prompt`` to
/v1/completions. Blank lines and ``#`` comments are ignored; any other bad line is skipped,
counted and reported by line number. Prompt text is never printed.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cachemon import catalog as C
from cachemon.config.warmup import DEFAULT_MAX_LOAD, Prompts, WarmupError, api_base
from cachemon.jsontypes import JsonObject
from cachemon.sources.exposition import ExpositionError
from cachemon.sources.scrape import USER_AGENT, FetchError, fetch_text
from cachemon.sources.vllm_api import VllmApi, VllmApiError
from cachemon.urls import escape_controls, redact_url

if TYPE_CHECKING:   # requests is imported where a warm-up runs: the sidecar without `warmup:` never loads it
    import requests

log = logging.getLogger("cachemon.warmup")

RESULTS = ("done", "refused_load", "failed")


# --- prompts file -----------------------------------------------------------------------------


def prepare_body(body: JsonObject, max_tokens: int, model: str | None) -> JsonObject:
    b = dict(body)
    b["max_tokens"] = max_tokens
    b.pop("max_completion_tokens", None)
    b["stream"] = False
    b.pop("stream_options", None)
    b["n"] = 1
    if model and not b.get("model"):
        b["model"] = model
    return b


# --- server load and counters -------------------------------------------------------------------

@dataclass
class ServerStats:
    running: float | None
    waiting: float | None
    query_tokens: float | None
    hit_tokens: float | None

    @property
    def load(self) -> float | None:
        if self.running is None and self.waiting is None:
            return None
        return (self.running or 0.0) + (self.waiting or 0.0)

    @property
    def hit_ratio(self) -> float | None:
        if not self.query_tokens:
            return None
        return (self.hit_tokens or 0.0) / self.query_tokens


def read_stats(metrics_url: str, timeout: float = 5.0) -> ServerStats:
    """Running/waiting requests and local prefix-cache counters from one /metrics page
    (read through the sources' shared bounded-fetch pool)."""
    from cachemon.normalise.normaliser import normalise_text
    body = fetch_text(None, metrics_url, timeout, 16 * 1024 * 1024)
    n = normalise_text(body)

    def total(metric: str, cache: str | None = None) -> float | None:
        vals = [v for (m, k), v in (n.counters if cache else n.gauges).items()
                if m == metric and (cache is None or k[-1] == cache)]
        return sum(vals) if vals else None

    return ServerStats(total(C.REQUESTS_RUNNING.name), total(C.REQUESTS_WAITING.name),
                       total(C.QUERY_TOKENS.name, "local"), total(C.HIT_TOKENS.name, "local"))


# --- the run ----------------------------------------------------------------------------------

class RateLimiter:
    """Start times at least 1/rate apart, shared by every worker."""

    def __init__(self, rate: float | None, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.gap = 1.0 / rate if rate else 0.0
        self.next: float | None = None
        self.lock = threading.Lock()
        self.clock, self.sleep = clock, sleep

    def wait(self, stop: threading.Event | None = None) -> None:
        with self.lock:
            now = self.clock()
            at = now if self.next is None else max(now, self.next)
            self.next = at + self.gap
        delay = at - self.clock()
        if delay > 0:
            if stop is not None:
                stop.wait(delay)
            else:
                self.sleep(delay)


@dataclass
class PromptResult:
    index: int
    line: int
    ok: bool
    status: int | None = None
    error: str = ""
    seconds: float = 0.0
    cached_tokens: int | None = None
    prompt_tokens: int | None = None
    started: float = 0.0


@dataclass
class WarmupResult:
    api: str
    prompts: int
    skipped: list[tuple[int, str]]
    duplicates: int
    refused: str | None = None
    results: list[PromptResult] = field(default_factory=list)
    before: ServerStats | None = None
    after: ServerStats | None = None
    seconds: float = 0.0
    max_load: float = DEFAULT_MAX_LOAD
    rate: float | None = None
    concurrency: int = 1
    stopped: bool = False

    @property
    def ok(self) -> int:
        return sum(r.ok for r in self.results)

    @property
    def failed(self) -> list[PromptResult]:
        return [r for r in self.results if not r.ok]

    @property
    def delta_ratio(self) -> float | None:
        b, a = self.before, self.after
        if (not b or not a or b.query_tokens is None or a.query_tokens is None
                or b.hit_tokens is None or a.hit_tokens is None):
            return None
        dq = a.query_tokens - b.query_tokens
        return (a.hit_tokens - b.hit_tokens) / dq if dq > 0 else None

    def to_json(self) -> JsonObject:
        def stats(s: ServerStats | None) -> JsonObject | None:
            return None if s is None else {"running": s.running, "waiting": s.waiting, "query_tokens": s.query_tokens,
                                           "hit_tokens": s.hit_tokens, "hit_ratio": s.hit_ratio}
        return {
            "api": self.api, "prompts": self.prompts, "skipped_lines": [{"line": n, "reason": r} for n, r in self.skipped],
            "duplicates": self.duplicates, "refused": self.refused, "sent": len(self.results), "ok": self.ok,
            "failed": [{"index": r.index, "line": r.line, "status": r.status, "error": r.error} for r in self.failed],
            "seconds": round(self.seconds, 3), "rate": self.rate, "concurrency": self.concurrency,
            "before": stats(self.before), "after": stats(self.after), "warmup_hit_ratio": self.delta_ratio,
            "cached_tokens": [r.cached_tokens for r in self.results],
            "stopped": self.stopped,
        }


def _error_text(resp: requests.Response) -> str:
    try:
        data = resp.json()
        msg = data.get("message") or (data.get("error") or {}).get("message") or data.get("detail")
    except (ValueError, AttributeError):
        msg = None
    text = str(msg) if msg else (resp.text or resp.reason or "")
    # the upstream's free text: one line, and no terminal escapes when `cachemon warmup` prints it
    return escape_controls(" ".join(text.split())[:200])


def _send(session: requests.Session, url: str, body: JsonObject, timeout: float, r: PromptResult) -> None:
    import requests
    t0 = time.monotonic()
    r.started = time.time()
    try:
        resp = session.post(url, json=body, timeout=(min(timeout, 10.0), timeout),
                            headers={"User-Agent": USER_AGENT})
    except requests.exceptions.Timeout:
        r.error = f"timed out after {timeout:g}s"
    except requests.exceptions.RequestException as e:
        r.error = f"request failed: {str(e)[:200]}"
    else:
        r.status = resp.status_code
        if resp.status_code != 200:
            r.error = f"HTTP {resp.status_code}: {_error_text(resp)}"
        else:
            try:
                usage = resp.json().get("usage") or {}
                r.prompt_tokens = usage.get("prompt_tokens")
                r.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
                r.ok = True
            except (ValueError, AttributeError):
                r.error = "HTTP 200 but the body is not a JSON completion"
    r.seconds = time.monotonic() - t0


def _default_model(base: str, timeout: float) -> str | None:
    try:
        models = VllmApi(base).models(timeout)
    except VllmApiError:
        return None
    return models[0].id if models else None


def run_warmup(api: str, prompts: Prompts, *, concurrency: int = 1, rate: float | None = 1.0, max_tokens: int = 1,
               max_load: float = DEFAULT_MAX_LOAD, force: bool = False, timeout: float = 60.0,
               metrics_url: str | None = None, model: str | None = None,
               progress: Callable[[int, int], object] | None = None,
               stop: threading.Event | None = None, session: requests.Session | None = None) -> WarmupResult:
    base = api_base(api)
    import requests
    session = session or requests.Session()
    metrics_url = metrics_url or base + "/metrics"
    res = WarmupResult(redact_url(base), len(prompts.items), prompts.skipped, prompts.duplicates, max_load=max_load,
                       rate=rate, concurrency=concurrency)
    try:
        res.before = read_stats(metrics_url, min(timeout, 10.0))
    except (FetchError, ExpositionError) as e:
        if not force:
            res.refused = f"cannot read the server's load from {redact_url(metrics_url)}: {e} (use --force to warm up anyway)"
            return res
    load = res.before.load if res.before else None
    if not force:
        if load is None:
            res.refused = (f"{redact_url(metrics_url)} shows no running/waiting request gauges, so the load is unknown "
                           "(use --force to warm up anyway)")
            return res
        if load > max_load:
            res.refused = (f"server is busy: {load:g} requests running + waiting, above the limit of {max_load:g}; "
                           "warming up at peak slows real users down (use --force, or retry later)")
            return res
    if any(not p.body.get("model") for p in prompts.items) and not model:
        model = _default_model(base, min(timeout, 10.0))
        if model is None:
            raise WarmupError(f"some prompts name no model and {redact_url(base)}/v1/models did not give one: pass --model")
    limiter = RateLimiter(rate)
    results = [PromptResult(i, p.line, False) for i, p in enumerate(prompts.items)]
    done_lock = threading.Lock()
    finished = [0]
    t0 = time.monotonic()

    def work(i: int) -> None:
        if stop is not None and stop.is_set():
            return
        limiter.wait(stop)
        if stop is not None and stop.is_set():
            return
        p = prompts.items[i]
        _send(session, base + p.endpoint, prepare_body(p.body, max_tokens, model), timeout, results[i])
        with done_lock:
            finished[0] += 1
            if progress:
                progress(finished[0], len(results))

    pool = ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="warmup")
    try:
        list(pool.map(work, range(len(results))))
    finally:    # not ``with``: an exception (the CLI's SIGTERM) must not wait for the requests in flight
        pool.shutdown(wait=False, cancel_futures=True)
    res.seconds = time.monotonic() - t0
    res.stopped = bool(stop is not None and stop.is_set())
    res.results = [r for r in results if r.started] if res.stopped else results
    try:
        res.after = read_stats(metrics_url, min(timeout, 10.0))
    except (FetchError, ExpositionError) as e:
        log.warning("cannot read %s after the warm-up: %s", redact_url(metrics_url), e)
    return res


def pct_text(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f} %"


