"""The demo's traffic: a vLLM /metrics page whose counters grow every poll, phase by phase.

The bundled captures are four real pages of one vLLM 0.32.0 process: idle, then after 16 requests
with a static system prompt, then 16 more with a timestamp at the head, then 16 with a request ID
at the head. The difference between consecutive pages is what 16 requests of that kind cost vLLM,
every counter and histogram bucket of it. A phase of the demo serves requests of one kind at a
steady rate (the rate of the matching KV-event capture, about one a second) and every counter grows
by its per-request share of that difference: a continuous miniature of the captured traffic, one
process (no restart), whose ratios are exactly the captured ones (86.6 % static, 0 % at the head).

Gauges (KV usage, running requests) show the phase's own page. Integral counters stay integral
(floored), so histogram buckets stay ordered and ``_count`` equals the ``+Inf`` bucket.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

ACCUMULATING = ("counter", "histogram", "summary")
PER_PHASE_REQUESTS = 16      # each bundled page adds 16 requests of its kind to the previous one


@dataclass(frozen=True)
class Phase:
    scenario: str        # the bundled page whose per-request increments the phase serves
    seconds: float       # real-time length (before the time scale)
    kv: str | None       # the KV-event capture replayed during the phase (demo/kv_replay.py)
    cause: str           # what the phase shows, in words (the cause cachemon should name)


IDLE = Phase("idle", 20, None, "server just started, no traffic")
# One round; the demo plays IDLE once, then rounds for ever. The timestamp phase is long enough
# for the shipped critical alert (5m ratio below 60 % for 5m) to fire: the 5m ratio crosses 60 %
# about 1.5 minutes in, so the alert fires about 6.5-7 minutes into the phase (docs/demo.md).
ROUND = (
    Phase("static-system-prompt", 240, "dynamic_prefix_tail",
          "same system prompt -> hits (86.6 %)"),
    Phase("timestamp-in-system-prompt", 540, "dynamic_prefix_head",
          "timestamp at the head of the system prompt -> 0 hits: dynamic prefix"),
    Phase("request-id-at-head", 120, "dynamic_prefix_head",
          "request ID at the head of the prompt -> 0 hits: dynamic prefix"),
)


def _key_value(line: str) -> tuple[str, str] | None:
    if not line or line.startswith("#"):
        return None
    key, _, value = line.rpartition(" ")
    return (key, value) if key else None


class Traffic:
    """The page at any time: ``page(now)``. Stateless in time (a pure function of ``now - start``),
    so a poll never depends on when the previous one came."""

    def __init__(self, pages: Sequence[tuple[str, str]], rate: float = 1.0, time_scale: float = 1.0,
                 start: float | None = None, clock: Callable[[], float] = time.monotonic,
                 idle: Phase = IDLE, round_: Sequence[Phase] = ROUND, rates: dict[str, float] | None = None):
        if time_scale <= 0:
            raise ValueError("time_scale must be > 0")
        self.clock = clock
        self.start = clock() if start is None else start
        # The page stands still at this time until it is moved on: `cachemon demo` holds it at each
        # phase boundary until it has polled there, so a phase's counters are exactly its own.
        self.hold: float | None = None
        self.idle, self.round = idle, tuple(round_)
        self.time_scale = time_scale
        self.rates = rates or {}
        self.rate = rate
        order = [name for name, _ in pages]
        self.template = pages[-1][1].splitlines()      # the last page has every series (a superset)
        types = {}
        for line in self.template:
            if line.startswith("# TYPE "):
                _, _, fam, kind = line.split(" ", 3)
                types[fam] = kind
        values = {name: {kv[0]: float(kv[1]) for kv in map(_key_value, text.splitlines()) if kv}
                  for name, text in pages}
        self.base = values[order[0]]
        self.gauges: dict[str, dict[str, float]] = {}
        self.per_request: dict[str, dict[str, float]] = {}
        self.integral: set[str] = set()
        self.accumulating: set[str] = set()
        for key, _ in filter(None, map(_key_value, self.template)):
            name = key.split("{", 1)[0]
            fam = max((f for f in types if name == f or name.startswith(f + "_")), key=len, default="")
            if types.get(fam) in ACCUMULATING and not name.endswith("_created"):
                self.accumulating.add(key)
            if all(v.get(key, 0.0).is_integer() for v in values.values()):
                self.integral.add(key)
        for prev, name in zip(order, order[1:], strict=False):
            self.per_request[name] = {k: (values[name].get(k, 0.0) - values[prev].get(k, 0.0)) / PER_PHASE_REQUESTS
                                      for k in self.accumulating}
        self.gauges = {name: values[name] for name in order}
        self.lines = self.template

    # --- the schedule ---------------------------------------------------------------
    def seconds(self, phase: Phase) -> float:
        return phase.seconds * self.time_scale

    def phase_rate(self, phase: Phase) -> float:
        return 0.0 if phase.scenario not in self.per_request else self.rates.get(phase.kv or "", self.rate)

    def position(self, now: float | None = None) -> tuple[int, int, Phase, float, dict[str, float]]:
        """(phase number since start (0 = idle), round (1-based; 0 = idle), the phase, seconds into it,
        requests served so far per scenario)."""
        now = self.clock() if now is None else now
        if self.hold is not None:
            now = min(now, self.hold)
        t = max(0.0, now - self.start)
        done: dict[str, float] = {}
        if t < self.seconds(self.idle):
            return 0, 0, self.idle, t, done
        t -= self.seconds(self.idle)
        round_len = sum(self.seconds(p) for p in self.round)
        rounds = math.floor(t / round_len)
        t -= rounds * round_len
        for p in self.round:
            done[p.scenario] = done.get(p.scenario, 0.0) + rounds * self.seconds(p) * self.phase_rate(p)
        for i, p in enumerate(self.round):
            if t < self.seconds(p) or i == len(self.round) - 1:
                done[p.scenario] = done.get(p.scenario, 0.0) + min(t, self.seconds(p)) * self.phase_rate(p)
                return 1 + rounds * len(self.round) + i, rounds + 1, p, t, done
            done[p.scenario] = done.get(p.scenario, 0.0) + self.seconds(p) * self.phase_rate(p)
            t -= self.seconds(p)
        raise AssertionError("unreachable")

    def next_boundary(self, now: float | None = None) -> float:
        """The clock time at which the phase after the one at ``now`` begins (just after it)."""
        now = self.clock() if now is None else now
        _, _, phase, into, _ = self.position(now)
        return now + max(0.0, self.seconds(phase) - into) + 1e-6

    # --- the page -------------------------------------------------------------------
    def page(self, now: float | None = None) -> str:
        _, _, phase, _, done = self.position(now)
        gauges = self.gauges[phase.scenario]
        out = []
        for line in self.lines:
            kv = _key_value(line)
            if kv is None:
                out.append(line)
                continue
            key = kv[0]
            if key in self.accumulating:
                v = self.base.get(key, 0.0) + sum(n * self.per_request[s].get(key, 0.0) for s, n in done.items())
                if key in self.integral:
                    v = float(math.floor(v + 1e-9))
            else:
                v = gauges.get(key, self.base.get(key, 0.0))
            out.append(f"{key} {v!r}")
        return "\n".join(out) + "\n"
