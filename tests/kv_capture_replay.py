"""Replay a real KV-event capture's metrics in time through the attribution stage (injected clock).

The captures (tests/fixtures/vllm-0.32.0-cpu-kv-events/<scenario>/, recorded by scripts/e2e/kv_record.py
from real vLLM 0.32.0 CPU servers) hold every server's /metrics polled every second (``metrics.jsonl``),
the requests with their send/receive times, and reset / restart markers. Each poll is fed to a real
Store and Attributor at its recorded time, as `cachemon run --poll-interval 1s` would have seen it.

Two things are DERIVED, because the recorder reduced the pages (README there: "no histograms"):
- vLLM's prompt-length histogram (``vllm:request_prompt_tokens``): rebuilt from requests.jsonl, each
  request counted in its bucket (vLLM 0.32.0's bounds) from its receive time on, per process;
- a vLLM-logged reset: the capture's ``reset_prefix_cache`` marker becomes the ``cache_reset`` event a
  log linked to the upstream would give (vLLM logs 'Successfully reset prefix cache' at that second).
Everything else is the real pages, unedited.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from cachemon import catalog as C
from cachemon.normalise.normaliser import normalise_text, to_update
from cachemon.normalise.updates import CounterSample
from cachemon.runtime.attribution_stage import AttributionSettings, Attributor
from cachemon.state.events import EventKind, EventLog
from cachemon.state.store import Store

ROOT = Path(__file__).resolve().parent / "fixtures" / "vllm-0.32.0-cpu-kv-events"
# vLLM 0.32.0's request_prompt_tokens buckets at max_model_len 4096 (as in tests/fixtures/vllm-0.32.0-cpu)
LES = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0)


def capture_dir() -> Path | None:
    """The fixture folder (or CACHEMON_KV_CAPTURES, to measure from a capture outside the repo)."""
    for p in (os.environ.get("CACHEMON_KV_CAPTURES"), ROOT):
        if p and Path(p).is_dir():
            return Path(p)
    return None


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@dataclass
class Replay:
    polls: dict[str, list[tuple[float, tuple[str, ...]]]] = field(default_factory=dict)  # replica -> (t, active)
    named: dict[str, list[tuple[float, tuple[str, ...]]]] = field(default_factory=dict)
    ratios: dict[str, list[float | None]] = field(default_factory=dict)
    missed: dict[tuple[str, str, str], float] = field(default_factory=dict)
    first_request: dict[str, float] = field(default_factory=dict)
    markers: list[dict] = field(default_factory=list)

    def polls_to(self, replica: str, cause: str, after: float) -> int | None:
        """Polls from the first one after ``after`` until ``cause`` is first active (1 = that poll)."""
        n = 0
        for t, active in self.polls[replica]:
            if t < after:
                continue
            n += 1
            if cause in active:
                return n
        return None

    def ever(self, replica: str, cause: str) -> int:
        return sum(cause in a for _, a in self.polls[replica])


def _every_other(metrics: list[dict], stride: int) -> list[dict]:
    """Every ``stride``-th poll of each replica."""
    kept: list[dict] = []
    seen: dict[str, int] = {}
    for m in metrics:
        k = seen[m["replica"]] = seen.get(m["replica"], -1) + 1
        if m.get("unchanged") and k % stride == 0:
            # an "unchanged" line repeats the replica's previous page, which may be one left out
            m = dict(m, text=next(x["text"] for x in reversed(metrics[:metrics.index(m)])
                                  if x["replica"] == m["replica"] and "text" in x))
            m.pop("unchanged")
        if k % stride == 0:
            kept.append(m)
    return kept


def _prompt_lengths(requests: list[dict], replica: str, restarts: list[float], t: float) -> list[CounterSample]:
    """DERIVED: the prompt-length histogram of this process (requests received since its start)."""
    start = max([x for x in restarts if x <= t], default=0.0)
    counts = dict.fromkeys(LES + (float("inf"),), 0.0)
    for r in requests:
        if r["replica"] == replica and start <= r["t_recv"] <= t:
            for le in counts:
                if r["usage"]["prompt_tokens"] <= le:
                    counts[le] += 1
    return [CounterSample.direct(C.SeriesKey(C.PROMPT_LENGTH_REQUESTS.name,
                                             ("tiny", "0", "+Inf" if le == float("inf") else f"{le:g}")), c)
            for le, c in counts.items()]


def _router_book(folder: Path):
    """The capture's router (scripts/e2e/router_record.py: router-metrics.jsonl, vllm-router's page every
    second) as `cachemon run` with a ``routers:`` entry of kind vllm-router fronting both replicas would
    hold it: a RouterBook and the pages to feed it, in time order. Workers are named by the replicas' ports
    in metadata.json."""
    from cachemon.normalise.routers import KINDS, read_page
    from cachemon.state.routers import RouterBook
    meta = json.loads((folder / "metadata.json").read_text(encoding="utf-8"))
    workers = {f"http://127.0.0.1:{r['api_port']}": name for name, r in meta["replicas"].items()}
    book = RouterBook()
    book.add("router", KINDS["vllm-router"], workers, tuple(meta["replicas"]))
    pages, last = [], ""
    for line in _lines(folder / "router-metrics.jsonl"):
        last = last if line.get("unchanged") else line["text"]
        pages.append((line["t"], read_page(KINDS["vllm-router"], last)))
    return book, pages


def replay(folder: Path, short_window: float = 4.0, hold: int = 2, hold_down: float = 30.0,
           window: float = 60.0, stride: int = 1, kv_events: bool = False, router: bool = False) -> Replay:
    """``stride`` 2 keeps every other poll of each replica: a 2 s poll interval (`cachemon run`'s default
    until issue 19, now 5 s), then pass short_window=8.0 (the default short window is 4 polls).
    ``kv_events``: the capture's KV events also feed a ledger (decoded by cachemon, in arrival order, each
    before the first poll after it), whose view attribution reads as `cachemon run` wires it.
    ``router``: the capture's router pages feed a RouterBook, each before the first poll after it
    (captures of scripts/e2e/router_record.py)."""
    metrics = sorted(_lines(folder / "metrics.jsonl"), key=lambda d: d["t"])
    if stride > 1:
        metrics = _every_other(metrics, stride)
    rows = _lines(folder / "requests.jsonl")
    requests = sorted((r for r in rows if "usage" in r), key=lambda r: r["t_recv"])
    out = Replay(markers=[r for r in rows if "event" in r])
    resets = [(r["time"], r["replica"]) for r in out.markers if r["event"] == "reset_prefix_cache"]
    restarts = {r["replica"]: [] for r in requests}
    for m in out.markers:
        if m["event"] == "restart":
            restarts.setdefault(m["replica"], []).append(m["time"])
    for r in requests:
        out.first_request.setdefault(r["replica"], r["t_send"])
    now = [0.0]
    store = Store({"1m": 60.0})
    events = EventLog()
    ledger, kv = None, []
    if kv_events:
        from cachemon.state.ledger.fleet import FleetLedger
        from kv_support import messages
        ledger, kv = FleetLedger(), messages(folder)
    book, pages = _router_book(folder) if router else (None, [])
    att = Attributor(store, AttributionSettings(window=window, short_window=short_window, hold=hold,
                                                hold_down=hold_down), events=events,
                     ledger_view=None if ledger is None else ledger.view,
                     router_view=None if book is None else (lambda up, t: book.view(up, t, window)))
    pending = sorted(resets)      # published on the event log once the replay's clock reaches them
    last_text: dict[str, str] = {}
    for m in metrics:
        replica, t = m["replica"], m["t"]
        text = last_text[replica] if m.get("unchanged") else m["text"]
        last_text[replica] = text
        n = normalise_text(text)
        upd = to_update(n)
        upd.counters += _prompt_lengths(requests, replica, restarts.get(replica, []), t)
        restart = store.apply(replica, upd, t).restart
        if restart:            # as the poller publishes it
            events.publish(EventKind.RESTART, replica, t, restart)
        now[0] = t
        while ledger is not None and kv and kv[0]["t"] <= t:
            msg = kv.pop(0)
            ledger.on_batch(msg["replica"], "tiny", msg["batch"], msg["t"])
        while book is not None and pages and pages[0][0] <= t:
            at, reading = pages.pop(0)
            book.record("router", at, reading)
        while pending and pending[0][0] <= t:
            at, rep = pending.pop(0)
            events.publish(EventKind.CACHE_RESET, rep, at, "vLLM log")
        results = att.evaluate(t)
        for res in results:
            if res.upstream == replica:
                out.named.setdefault(replica, []).append((t, res.codes))
                out.ratios.setdefault(replica, []).append(res.ratio)
        active = tuple(sorted(k[2] for k in att.tracker.since if k[0] == replica))
        out.polls.setdefault(replica, []).append((t, active))
    out.missed = {(k[0], k[2], k[3]): v for k, v in att.missed.items()}
    return out
