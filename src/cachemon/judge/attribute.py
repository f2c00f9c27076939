"""Why is the hit ratio low, and what did each cause cost? One engine for the exporter and `cachemon check`.

The engine is a pure function of a ``ModelSnapshot`` (judge/model_snapshot.py): what one upstream
reported for one served model over a recent interval (and a short trailing window, and the step since
the previous evaluation), the events (restart, cache reset, change) known to have happened lately,
and, where vLLM's KV-cache events are followed, the ledger's split of the stored tokens by reason
(docs/kv-events.md). Snapshots are built at one place (judge/snapshots.py), from the store, for
both callers: the exporter's ``Attributor`` and `cachemon check` (which polls into a store of its
own); the rules live only in judge/cause_rules.py, so the metric and the command can never
disagree.

- The vocabulary (the causes, what each rests on): judge/causes.py.
- A cause is named whenever it cost tokens, not only while the ratio is below the warning threshold
  (alerts still gate on the thresholds); each named cause carries the tokens it cost in the step
  (``Cause.tokens``): exact from the ledger, an estimate from the counters otherwise.
- A vLLM process's first traffic is ``cold_cache``, never a dynamic prefix; dynamic prefix and short
  prompts are judged on the short trailing window, so they are named within a few polls.
- With KV events in sync, capacity, routing, reset, restart and the dynamic prefix come from the
  ledger (certainty ``exact``; ``measured`` when the ledger lost events: its split is then a lower bound).

How sure each cause is (``certainty``): ``exact`` when vLLM states it (cache config, a log line, a
counter that went down, a KV event), ``measured`` when it follows from vLLM's counters and histograms
by a fixed rule, ``heuristic`` when it is a best guess from counters alone. How sure its token count is
(``tokens_certainty``): ``exact`` (ledger in sync), ``measured`` (ledger out of sync: a lower bound) or
``estimated`` (counters; each cause's row in ``CAUSE_SOURCES`` says how).

Hysteresis: the snapshot carries the causes active before this evaluation (``active``); inputs that flap
(KV usage, the ratio, the short-prompt share, the near-zero ratio) enter at one level and leave at a
lower one. The hold-down is ``CauseTracker``'s (judge/cause_tracker.py).
"""
from __future__ import annotations

from dataclasses import replace

from cachemon.judge.cause_rules import RESIDUAL, RULES
from cachemon.judge.cause_tracker import CauseTracker
from cachemon.judge.causes import CAUSE_SOURCES, CAUSES, Cause, CauseBasis, CauseCode, cause_table
from cachemon.judge.figures import (
    COLD_REQUESTS,
    JOINED_EVENT_SECONDS,
    MIN_QUERY_TOKENS,
    Figures,
    short_prompt_fraction,
)
from cachemon.judge.model_snapshot import (
    Attribution,
    Basis,
    DynamicPrefixLike,
    Event,
    ModelSnapshot,
    Severity,
    Thresholds,
)

__all__ = ["CAUSES", "CAUSE_SOURCES", "COLD_REQUESTS", "MIN_QUERY_TOKENS", "Attribution", "Cause", "CauseBasis",
           "CauseCode", "CauseTracker", "DynamicPrefixLike", "Event", "ModelSnapshot", "Thresholds", "attribute",
           "cause_table", "short_prompt_fraction"]


def attribute(s: ModelSnapshot, lookback: float = 900.0) -> Attribution:
    """Judge one snapshot and name every cause that holds. ``lookback`` (seconds): how long an
    event (restart, reset, change) still explains missed tokens (the cache refills after it)."""
    f = Figures(s, lookback)
    named: list[Cause] = []
    for rule in RULES.values():
        cause = rule(f, tuple(named))
        if cause is not None:
            named.append(cause)
    causes = share_residual(f, share_event_excess(f, named))
    severity = _severity(f, causes)
    causes.sort(key=lambda x: CAUSES.index(x.code))
    summary = _summary(s, f.basis, f.ratio, severity, causes)
    return Attribution(s.upstream, s.model, f.basis, f.traffic, f.ratio, severity, tuple(causes), summary)


def share_event_excess(f: Figures, causes: list[Cause]) -> list[Cause]:
    """The step's excess misses go to the most recent event named from the counters, shared evenly with
    the events that came with it (within JOINED_EVENT_SECONDS: a template changed across a restart):
    one count for them all."""
    times = [x.event_at for x in causes if x.event_at is not None]
    if not times:
        return causes
    latest = max(times)
    joined = [i for i, x in enumerate(causes)
              if x.event_at is not None and latest - x.event_at <= JOINED_EVENT_SECONDS]
    # a raised match floor among them: its baseline was kept from before the move (the event's is cut with the
    # window when the restart came after a pause)
    floor = any(causes[i].code == CauseCode.MATCH_FLOOR_CHANGED for i in joined)
    share = (f.floor_excess if floor else f.excess) / len(joined)
    return [replace(x, tokens=share) if i in joined else x for i, x in enumerate(causes)]


def share_residual(f: Figures, causes: list[Cause]) -> list[Cause]:
    """Estimated tokens of the counter-judged causes without an estimate of their own: the step's
    missed tokens not attributed to another cause, shared evenly between them."""
    open_ = [i for i, x in enumerate(causes) if x.code in RESIDUAL and x.tokens is None]
    if not open_:
        return causes
    taken = sum(x.tokens or 0.0 for x in causes if x.tokens is not None)
    share = max(0.0, f.step_missed_tokens - taken) / len(open_)
    return [replace(x, tokens=share) if i in open_ else x for i, x in enumerate(causes)]


def _severity(f: Figures, causes: list[Cause]) -> Severity | None:
    """The ratio's severity; disabled caching is critical whatever the ratio, and a measured routing skew
    a warning at least."""
    if any(x.code == CauseCode.PREFIX_CACHING_DISABLED for x in causes):
        return "critical"
    if f.severity is None and any(x.code == CauseCode.ROUTING_SKEW and x.certainty == "measured" and not f.ledger
                                  for x in causes):
        return "warning"
    return f.severity


def _summary(s: ModelSnapshot, basis: Basis, ratio: float | None, severity: Severity | None,
             causes: list[Cause]) -> str:
    where = f"model {s.model or '?'}"
    if ratio is None:
        head = f"{where}: no prefix-cache traffic yet"
    elif basis == "interval":
        head = f"{where}: hit ratio {ratio:.1%} over the last {s.interval_seconds or 0:g}s"
    elif basis == "since_start":
        head = f"{where}: no traffic in the interval; hit ratio since the upstream started {ratio:.1%}"
    else:
        head = (f"{where}: no token counters on this era; vLLM reports a hit ratio of {ratio:.1%} (its own "
                f"measure: since start on V0, over recent requests or its last interval in a log)")
    if severity:
        head += (f", below the {s.thresholds.warning:.0%} warning / {s.thresholds.critical:.0%} critical "
                 f"thresholds" if ratio is not None and s.thresholds.severity(ratio) else "")
    if causes:
        head += ". Causes: " + "; ".join(f"{c.code} ({c.certainty}): {c.message}" for c in causes)
    elif severity:
        head += ". No cause identified from the metrics"
    return head


def __getattr__(name: str) -> CauseCode:
    """A cause code by its member name (``attribution.CAPACITY``), for callers that read the codes off
    this module; new code reads ``CauseCode``."""
    try:
        return CauseCode[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
