"""One rule per cause: each reads the snapshot's ``Figures`` and the causes named before it, and returns
its cause or None. A rule reads only the snapshot: no I/O, no clock."""
from __future__ import annotations

from collections.abc import Callable

from cachemon import thresholds as T
from cachemon.judge import figures as F
from cachemon.judge.causes import CAUSES, INFLATING, Cause, CauseCode, Certainty
from cachemon.judge.figures import Figures, ratio
from cachemon.judge.model_snapshot import ModelSnapshot
from cachemon.state.ledger.reasons import NOT_MISSES
from cachemon.state.routers import RouterView

Named = tuple[Cause, ...]
Rule = Callable[[Figures, Named], Cause | None]


def _named(named: Named, code: CauseCode) -> bool:
    return any(x.code == code for x in named)


def caching_disabled(f: Figures, _named: Named) -> Cause | None:
    if f.snapshot.prefix_caching != "false":
        return None
    return Cause(CauseCode.PREFIX_CACHING_DISABLED, "exact",
                 "prefix caching is disabled (enable_prefix_caching=False): start vLLM with --enable-prefix-caching",
                 f.step_missed_tokens or None, "estimated")


def cold_cache(f: Figures, _named: Named) -> Cause | None:
    s = f.snapshot
    if not f.cold or s.prefix_caching == "false":      # with caching off nothing is ever cached
        return None
    if f.ledger:
        first = (f.step_ledger_split or {}).get("first", 0.0) - (s.step_dynamic_prefix_tokens or 0.0)
        if (f.ledger_split or {}).get("first", 0.0) <= 0:
            return None
        return Cause(CauseCode.COLD_CACHE, f.ledger_certainty,
                     "the vLLM process's first traffic: nothing was cached yet (the KV events show never-seen "
                     "content stored)", max(0.0, first), f.ledger_certainty)
    q, h = f.short_query_tokens, f.short_hit_tokens
    if q and q > 0 and h is not None and q - h > 0:
        return Cause(CauseCode.COLD_CACHE, "measured",
                     "the vLLM process's first traffic: nothing was cached yet, so the first request of every "
                     "prefix misses", f.step_missed_tokens, "estimated")
    return None


def short_prompts(f: Figures, _named: Named) -> Cause | None:
    s, share, floor = f.snapshot, f.short_prompt_share, f.floor
    if share is None or not floor or not f.short_buckets or f.short_buckets[-1][1] < F.MIN_REQUESTS:
        return None
    enter = F.SHORT_PROMPT_FRACTION_LEAVE if CauseCode.SHORT_PROMPTS in s.active else F.SHORT_PROMPT_FRACTION
    q, h = f.short_query_tokens, f.short_hit_tokens
    if share < enter or not q or h is None or q - h <= 0:
        return None
    if s.block_size and floor != s.block_size:
        what = f"the match floor ({floor} tokens; the block is {s.block_size}): hits land only on its multiples"
    else:
        what = f"one block ({floor} tokens): only full blocks are cached"
    return Cause(CauseCode.SHORT_PROMPTS, "measured",
                 f"{share:.0%} of prompts are at most {what}, so they cannot hit",
                 min(f.step_missed_tokens, F.short_prompt_tokens(f.step_buckets, floor)), "estimated")


def sliding_window(f: Figures, _named: Named) -> Cause | None:
    """A hybrid model's sliding-window layers cut the hit short of the prefix its full-attention layers held
    (the ledger's ``sliding_window`` reason; vLLM 0.32.0 ``SlidingWindowManager.find_longest_cache_hit``)."""
    if not f.ledger:
        return None
    interval, step = f.ledger_tokens("sliding_window")
    if interval <= 0:
        return None
    return Cause(CauseCode.SLIDING_WINDOW, f.ledger_certainty,
                 f"{interval:.0f} tokens in the last {f.snapshot.interval_seconds or 0:g}s were cached in the "
                 f"full-attention layers but recomputed: the sliding-window layers did not hold the window before "
                 f"the match point (vLLM keeps only each prompt's last window there; KV events). A legitimate "
                 f"miss: the next prompt sharing that prefix hits it (the window before it is kept now)", step,
                 f.ledger_certainty)


def capacity(f: Figures, _named: Named) -> Cause | None:
    s = f.snapshot
    if f.ledger:
        interval, step = f.ledger_tokens("capacity")
        if interval > 0:
            total = sum(v for k, v in (f.ledger_split or {}).items() if k not in NOT_MISSES) or interval
            return Cause(CauseCode.CAPACITY, f.ledger_certainty,
                         f"{interval:.0f} tokens ({interval / total:.0%} of the stored tokens) in the last "
                         f"{s.interval_seconds or 0:g}s were cached here before and evicted (KV events"
                         f"{'' if s.kv_in_sync else '; events lost: a lower bound'}): give vLLM more KV memory "
                         f"or offload", step, f.ledger_certainty)
        if s.kv_in_sync:
            return None
    low = f.low_for(CauseCode.CAPACITY)
    iq, ih = s.interval_query_tokens, s.interval_hit_tokens
    preempt = s.interval_preemptions or 0.0
    pressure: list[str] = []
    kv_high = T.KV_CACHE_USAGE_HIGH if CauseCode.CAPACITY not in s.active else F.KV_USAGE_LEAVE
    if s.kv_usage is not None and s.kv_usage >= kv_high:
        pressure.append(f"KV cache {s.kv_usage:.0%} full")
    if s.interval_seconds and preempt / s.interval_seconds >= T.PREEMPTIONS_PER_SECOND_HIGH:
        pressure.append(f"{preempt:.0f} preemptions in {s.interval_seconds:g}s")
    if s.interval_evictions:
        pressure.append(f"{s.interval_evictions:.0f} sampled block evictions (--kv-cache-metrics)")
    tier = s.interval_tier_hit_tokens or 0.0      # missed by the pool but loaded from another tier: no loss
    if (low and f.traffic and s.pool_tokens and iq is not None and ih is not None
            and iq - ih - tier > F.POOL_OVERRUN * s.pool_tokens):
        besides = f" (besides {tier:.0f} loaded from other tiers)" if tier else ""
        pressure.append(f"{iq - ih - tier:.0f} missed tokens in the interval{besides} against a pool of "
                        f"{s.pool_tokens:.0f}: the working set does not fit")
    if not low or not pressure:
        return None
    certainty: Certainty = "measured" if (s.interval_evictions or preempt or (s.kv_usage or 0) >= kv_high) \
        else "heuristic"
    return Cause(CauseCode.CAPACITY, certainty, "; ".join(pressure) +
                 ": cached prefixes are evicted before reuse (more KV memory, fewer concurrent requests)",
                 None, "estimated")


def preemption_inflated(f: Figures, _named: Named) -> Cause | None:
    s = f.snapshot
    preempt = s.interval_preemptions or 0.0
    finished = s.interval_prompt_buckets[-1][1] if s.interval_prompt_buckets else 0.0
    if f.low or f.ratio is None or finished <= 0 or preempt / finished < F.PREEMPTIONS_PER_REQUEST:
        return None
    return Cause(CauseCode.PREEMPTION_INFLATED, "measured",
                 f"{preempt:.0f} preemptions for {finished:.0f} finished requests: recomputed prefills of "
                 f"preempted requests count as hits, so this ratio overstates real reuse")


def parallel_sampling_inflated(f: Figures, _named: Named) -> Cause | None:
    """n > 1: vLLM runs each of the n sequences as a request of its own, so the prompt is queried n times
    and the copies hit the first one (vllm#56923)."""
    s = f.snapshot
    requests, sequences = s.interval_sampling_requests, s.interval_sampling_sequences
    if not f.traffic or requests is None or sequences is None or requests <= 0 or sequences <= 0:
        return None
    copies = sequences - requests
    if copies / sequences < F.PARALLEL_COPIES_SHARE:
        return None
    return Cause(CauseCode.PARALLEL_SAMPLING_INFLATED, "measured",
                 f"{sequences:.0f} sequences for {requests:.0f} finished requests (parallel sampling, n > 1): "
                 f"each prompt was queried n times and its {copies:.0f} extra copies hit the first one, so this "
                 f"ratio overstates reuse across requests")


def _ledger_event(f: Figures, reason: str, code: CauseCode, what: str) -> tuple[bool, Cause | None]:
    """With the ledger, a restart or a reset is its `restart` / `reset` tokens (exact in sync). Returns
    (handled, cause): handled when the ledger names the cause, or is in sync (the counters' rule stays silent)."""
    if not f.ledger:
        return False, None
    interval, step = f.ledger_tokens(reason)
    if interval > 0:
        return True, Cause(code, f.ledger_certainty,
                           f"{interval:.0f} tokens in the last {f.snapshot.interval_seconds or 0:g}s were {what} "
                           f"and recomputed (KV events)", step, f.ledger_certainty)
    return bool(f.snapshot.kv_in_sync), None


def _event(f: Figures, named: Named, kind: str, code: CauseCode, certainty: Certainty, text: str) -> Cause | None:
    """An event of ``kind`` within the lookback names ``code`` while it costs tokens (or the ratio is low),
    or while a restart it came with is named. Its token count is set once every event is named
    (``attribution.share_event_excess``)."""
    hits = [e for e in f.recent if e.kind == kind]
    if not hits:
        return None
    last = max(hits, key=lambda e: e.at)
    if f.excess <= 0 and not f.low_for(code) and not _came_with_a_named_restart(f, named, last.at):
        return None
    details = ", ".join(sorted({e.detail for e in hits if e.detail})) or kind
    return Cause(code, certainty, text.format(ago=f"{f.snapshot.now - last.at:.0f}s ago", detail=details),
                 0.0, "estimated", event_at=last.at)


def _came_with_a_named_restart(f: Figures, named: Named, at: float) -> bool:
    """A change seen with a restart that is named (a template changed across the restart): the new process
    runs the changed template, so both explain the misses, even once the ledger counts the restart's."""
    if not _named(named, CauseCode.RESTART):
        return False
    restarts = [e.at for e in f.recent if e.kind == "restart"]
    return any(abs(at - r) <= F.JOINED_EVENT_SECONDS for r in restarts)


def _with_the_floor(f: Figures, kind: str) -> bool:
    """The latest event of ``kind`` came with a raised match floor (one restart with another block size)."""
    m = f.snapshot.floor_move
    at = max((e.at for e in f.recent if e.kind == kind), default=None)
    return f.floor_raised and m is not None and at is not None and abs(at - m.at) <= F.JOINED_EVENT_SECONDS


def restart(f: Figures, named: Named) -> Cause | None:
    floor = _with_the_floor(f, "restart")
    if floor and f.snapshot.floor_move.settled:      # type: ignore[union-attr]
        return None    # the refill is over: what the step still misses is the raised floor's (below)
    # the ledger's content ids are per block size: after a moved floor every block is new content, none `restart`
    handled, cause = (False, None) if floor else _ledger_event(f, "restart", CauseCode.RESTART,
                                                                 "cached by an earlier vLLM process")
    if handled:
        return cause
    return _event(f, named, "restart", CauseCode.RESTART, "exact", "the upstream restarted {ago}: the cache starts empty")


def cache_reset(f: Figures, named: Named) -> Cause | None:
    handled, cause = _ledger_event(f, "reset", CauseCode.CACHE_RESET, "cleared by a prefix-cache reset")
    if handled:
        return cause
    return _event(f, named, "cache_reset", CauseCode.CACHE_RESET, "exact",
                  "the prefix cache was reset {ago} (vLLM logged it)")


def cache_reset_suspected(f: Figures, named: Named) -> Cause | None:
    if f.ledger and f.snapshot.kv_in_sync:
        return None        # the ledger's `reset` tokens say it exactly
    if any(e.kind == "cache_reset" for e in f.recent) or _named(named, CauseCode.CACHE_RESET):
        return None        # vLLM's log (or the ledger) says exactly what the heuristic guesses
    return _event(f, named, "cache_reset_suspected", CauseCode.CACHE_RESET_SUSPECTED, "heuristic",
                  "a prefix-cache reset is suspected {ago} (hits collapsed while queries continued)")


def change(f: Figures, named: Named) -> Cause | None:
    if _with_the_floor(f, "change") and f.snapshot.floor_move.settled:    # type: ignore[union-attr]
        return None    # the refill is over: the raised floor names what is still missed
    return _event(f, named, "change", CauseCode.CHANGE, "exact",
                  "{detail} changed {ago}: cached prefixes no longer match")


def match_floor_changed(f: Figures, named: Named) -> Cause | None:
    """The shortest prefix that can hit rose (a restart with another ``--block-size``, an upgrade that moved the
    default, vLLM 0.34 on GPUs: 16 -> 64): prefixes shorter than the new floor never hit again and every hit
    is a multiple of it, a loss that lasts, where a restart's refill passes. Its tokens: the step's misses above
    the miss ratio before the move, shared with the restart and change it came with until the cache refilled."""
    m = f.snapshot.floor_move
    if m is None or not f.floor_raised:
        return None
    code = CauseCode.MATCH_FLOOR_CHANGED
    if f.floor_excess <= 0 and not f.low_for(code):
        return None
    joined = any(x.event_at is not None and abs(x.event_at - m.at) <= F.JOINED_EVENT_SECONDS for x in named)
    return Cause(code, "exact",
                 f"the match floor rose from {m.before} to {m.after} tokens {f.snapshot.now - m.at:.0f}s ago (the KV "
                 f"block size or match unit: another --block-size, an upgrade that moved the default, another "
                 f"attention backend): a shared prefix shorter than {m.after} tokens never hits, and every hit is a "
                 f"multiple of {m.after}. A lasting loss, not a refill: serve with --block-size {m.before} where the "
                 f"backend takes it, or make shared prefixes longer than {m.after} tokens",
                 f.floor_excess, "estimated", event_at=m.at if joined else None)


def _by_router(s: ModelSnapshot, routed: float) -> str:
    """The reconciliation: what one cache holding every replica's content would have hit here, and what the
    router believed over the window."""
    q, h = s.interval_query_tokens or 0.0, s.interval_hit_tokens or 0.0
    one = f" (one cache holding every replica's content would have hit {(h + routed) / q:.0%}, this replica {h / q:.0%})" \
        if q > 0 else ""
    r = s.router
    if r is None:
        return "route by prefix" + one
    believed = ", ".join(f"{k} {v:.0f}" for k, v in sorted(r.decisions.items()) if v) or "no prefix decision"
    return f"router {r.router} ({r.kind}, policy {r.policy or 'unknown'}; its decisions: {believed}) sent them here{one}"


def routing(f: Figures, _named: Named) -> Cause | None:
    s, thr = f.snapshot, f.snapshot.thresholds
    if f.ledger:
        interval, step = f.ledger_tokens("routing")
        if interval > 0:
            return Cause(CauseCode.ROUTING_SKEW, f.ledger_certainty,
                         f"{interval:.0f} tokens in the last {s.interval_seconds or 0:g}s were cached on another "
                         f"replica of the model at that moment (KV events): {_by_router(s, interval)}", step,
                         f.ledger_certainty)
        if s.kv_in_sync:
            return None
    fleet = ratio(s.fleet_hit_tokens, s.fleet_query_tokens)
    drop = T.SKEW_DROP * (0.75 if CauseCode.ROUTING_SKEW in s.active else 1.0)
    if not f.traffic or f.ratio is None or fleet is None or fleet < thr.warning or f.ratio >= fleet - drop:
        return None
    return Cause(CauseCode.ROUTING_SKEW, "measured",
                 f"this replica {f.ratio:.0%} against {fleet:.0%} on the model's other replicas: the router sends "
                 f"this replica traffic whose prefixes live elsewhere",
                 min(f.step_missed_tokens, f.step_query_tokens * (fleet - f.ratio)), "estimated")


def dynamic_prefix_exact(f: Figures, _named: Named) -> Cause | None:
    s, d = f.snapshot, f.snapshot.dynamic_prefix
    if d is None:
        return None
    if s.interval_dynamic_prefix_tokens is not None and s.interval_dynamic_prefix_tokens <= 0:
        return None    # found earlier (the ledger holds a finding 5 min), but it cost nothing in the window:
        #                as for the ledger's other reasons, no cost, no cause (the user may have moved the value)
    return Cause(CauseCode.DYNAMIC_PREFIX_EXACT, f.ledger_certainty,
                 f"a per-request value at block depth {d.depth_blocks} (token {d.depth_blocks * (s.block_size or 0)}"
                 f" on): one cached parent with many distinct children each stored once, the shared content after "
                 f"it recomputed under each (KV events, since {s.now - d.since:.0f}s). Move the per-request value "
                 f"after the shared part", s.step_dynamic_prefix_tokens or 0.0, f.ledger_certainty)


def dynamic_prefix_suspected(f: Figures, named: Named) -> Cause | None:
    s = f.snapshot
    if s.dynamic_prefix is not None or (f.ledger and s.kv_in_sync):
        return None    # the ledger named it exactly, or sees every stored chain: no signature, no dynamic prefix
    limit = F.NEAR_ZERO_RATIO_LEAVE if CauseCode.DYNAMIC_PREFIX in s.active else F.NEAR_ZERO_RATIO
    explaining = [x for x in named if x.code not in INFLATING]
    # Prompts must be certainly longer than the floor: prompts that cannot hit are no dynamic prefix,
    # whether or not they are enough of them to name the short-prompt cause.
    long_enough = f.long_prompt_share is not None and f.long_prompt_share >= F.LONG_PROMPT_FRACTION
    if (not f.short_traffic or f.short_ratio is None or f.short_ratio > limit or s.prefix_caching == "false"
            or f.cold or explaining or not long_enough):
        return None
    hint = s.analyze_hint or "cachemon analyze REQUESTS.jsonl --tokenizer DIR --redact"
    return Cause(CauseCode.DYNAMIC_PREFIX, "heuristic",
                 f"caching is on, prompts are longer than the match floor ({f.floor} tokens), not a cold cache, no "
                 f"eviction and no event, yet hits are near zero: something at the head of the prompt changes per "
                 f"request. Run: {hint}", None, "estimated")


def _blind_why(r: RouterView) -> str | None:
    """How the router shows it made no prefix decision in the window (None: it made some)."""
    made = sum(v for k, v in r.decisions.items() if k != "blind")
    if r.decisions.get("blind", 0.0) > 0 and made <= 0:
        return f"all {r.decisions['blind']:.0f} of its prefix decisions had no prompt tokens to look up"
    if r.lookups.get("miss", 0.0) > 0 and r.lookups.get("hit", 0.0) <= 0:
        return f"every lookup of its KV index missed ({r.lookups['miss']:.0f})"
    if r.credited_tokens is not None and r.credited_tokens <= 0 and r.requests_total > 0:
        return f"it credited 0 cached tokens on {r.requests_total:.0f} requests"
    return None


def router_blind(f: Figures, _named: Named) -> Cause | None:
    s, r = f.snapshot, f.snapshot.router
    hits = s.interval_hit_tokens or 0.0
    if r is None or hits <= 0:
        return None
    why = _blind_why(r)
    if why is None:
        return None
    fix = f": {r.blind_fix}" if r.blind_fix else ""
    return Cause(CauseCode.ROUTER_BLIND, "measured",
                 f"router {r.router} ({r.kind}, policy {r.policy or 'unknown'}) routes blind: {why} in the last "
                 f"{r.seconds:.0f}s, while this replica hit {hits:.0f} tokens{fix}")


def router_stale(f: Figures, _named: Named) -> Cause | None:
    s, r = f.snapshot, f.snapshot.router
    if r is None or r.credited_tokens is None or r.requests_here <= 0 or r.requests_total <= 0:
        return None
    credited_here = r.credited_tokens * r.requests_here / r.requests_total
    hits = s.interval_hit_tokens or 0.0
    if credited_here - hits <= 0:
        return None
    step = min(f.step_missed_tokens, credited_here - hits)    # the window's excess, capped by the step's misses
    return Cause(CauseCode.ROUTER_STALE, "measured",
                 f"router {r.router} credited {credited_here:.0f} cached tokens on the requests it sent here in the "
                 f"last {r.seconds:.0f}s, this replica hit {hits:.0f}: its index held blocks the engine no longer "
                 f"had (evicted before the request arrived)", step, "measured")


def load_over_locality(f: Figures, _named: Named) -> Cause | None:
    r = f.snapshot.router
    if r is None or r.decisions.get("load", 0.0) <= 0 or r.requests_here <= 0:
        return None
    cost = f.ledger_tokens("routing")[0] if f.ledger else None
    what = f"; {cost:.0f} tokens cached on another replica were stored again here" if cost else ""
    return Cause(CauseCode.LOAD_OVER_LOCALITY, "measured",
                 f"router {r.router} chose a colder replica for balance on {r.decisions['load']:.0f} decisions in "
                 f"the last {r.seconds:.0f}s (policy {r.policy or 'unknown'}){what}")


def replica_load_skew(f: Figures, _named: Named) -> Cause | None:
    s = f.snapshot
    here, others = s.interval_query_tokens or 0.0, s.fleet_query_tokens
    # a few requests are no load pattern (round-robin's first request lands on one replica alone): the
    # requests vLLM finished here (its histogram), or the router sent here
    finished = max(s.interval_prompt_buckets[-1][1] if s.interval_prompt_buckets else 0.0,
                   s.router.requests_here if s.router is not None else 0.0)
    if others is None or here < F.MIN_QUERY_TOKENS or finished < F.COLD_REQUESTS:
        return None
    share = here / (here + others)
    if share < F.LOAD_SKEW_SHARE:
        return None
    r = s.router
    policy = (f"; router {r.router} ({r.kind}) policy {r.policy or 'unknown'}, {r.requests_here:.0f} of "
              f"{r.requests_total:.0f} requests here" if r is not None else "")
    return Cause(CauseCode.REPLICA_LOAD_SKEW, "measured",
                 f"this replica served {share:.0%} of the model's prompt tokens in the last "
                 f"{s.interval_seconds or 0:g}s while its other replicas idled{policy}")


# One rule per cause, in the order the causes are reported; each reads the causes named before it.
RULES: dict[CauseCode, Rule] = {
    CauseCode.PREFIX_CACHING_DISABLED: caching_disabled,
    CauseCode.COLD_CACHE: cold_cache,
    CauseCode.SHORT_PROMPTS: short_prompts,
    CauseCode.SLIDING_WINDOW: sliding_window,
    CauseCode.CAPACITY: capacity,
    CauseCode.PREEMPTION_INFLATED: preemption_inflated,
    CauseCode.PARALLEL_SAMPLING_INFLATED: parallel_sampling_inflated,
    CauseCode.RESTART: restart,
    CauseCode.CACHE_RESET: cache_reset,
    CauseCode.CACHE_RESET_SUSPECTED: cache_reset_suspected,
    CauseCode.CHANGE: change,
    CauseCode.MATCH_FLOOR_CHANGED: match_floor_changed,
    CauseCode.ROUTING_SKEW: routing,
    CauseCode.DYNAMIC_PREFIX_EXACT: dynamic_prefix_exact,
    CauseCode.DYNAMIC_PREFIX: dynamic_prefix_suspected,
    CauseCode.ROUTER_BLIND: router_blind,
    CauseCode.ROUTER_STALE: router_stale,
    CauseCode.LOAD_OVER_LOCALITY: load_over_locality,
    CauseCode.REPLICA_LOAD_SKEW: replica_load_skew,
}
assert tuple(RULES) == CAUSES, "one rule per cause, in CAUSES order"
# Counter-judged causes that share the misses nobody else explains.
RESIDUAL = frozenset((CauseCode.CAPACITY, CauseCode.DYNAMIC_PREFIX))
