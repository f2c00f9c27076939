"""The `cachemon analyze` pipeline, without the CLI: read -> tokenise -> simulate ->
diagnose, then a second streaming pass that re-simulates the what-if fixes.

Memory stays bounded: requests are read and encoded in small batches; what is kept per
request is three integers (line, prompt tokens, cached tokens) plus a small window of
recent encodings for the diagnosis.
"""
from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, replace

from cachemon.analyze.divergence import Cause, CombinedFix, DivergenceFinder, Fix
from cachemon.analyze.reply_inference import ReplyInference
from cachemon.analyze.request_stream import ResetPlan, batches, skip, stream, total_bytes
from cachemon.analyze.requests_io import Event, Request, Skip
from cachemon.analyze.results import AnalyzeResult, BlockCompare, Shortfall, WhatIf
from cachemon.analyze.sim.block_hash import BlockHasher, BlockKey, extra_key, raw_bytes
from cachemon.analyze.sim.fleet import ROUTING_POLICIES, Fleet
from cachemon.analyze.sim.pool_curve import PoolCurve
from cachemon.analyze.sim.prefix import PrefixCacheSim
from cachemon.analyze.sim.window import SlidingWindow, WindowedPrefixCacheSim
from cachemon.analyze.sim.window_pool import WindowedPoolSim
from cachemon.analyze.tenant_split import TenantOptions, TenantSplit, adapter_of
from cachemon.analyze.tokenize import Encoded, Encoder, TemplateError

BATCH = 64


def _extra(req: Request, lora_models: frozenset[str]) -> object:
    return extra_key(req.cache_salt, adapter_of(req, lora_models))


@dataclass(frozen=True)
class _Setup:
    """The configured setup the traffic ran on, as given to `analyze`."""
    block_size: int
    cache_blocks: int | None
    replicas: int
    routing: str
    seed: int
    default_completion: int
    loras: frozenset[str]
    reset_at: tuple[str, ...]
    reset_times: tuple[float, ...]
    tenants: TenantOptions | None = None
    window: SlidingWindow | None = None
    uncached_first: bool = True     # the release's free-queue order (normalise/eras.FREE_ORDERS)

    def with_block_size(self, tokens: int) -> _Setup:
        """The same setup under another block size, with the same pool in tokens (the KV memory a GPU
        has does not change with the block size)."""
        blocks = None if self.cache_blocks is None else max(2, self.cache_blocks * self.block_size // tokens)
        return replace(self, block_size=tokens, cache_blocks=blocks)

    def configured(self) -> PrefixCacheSim | Fleet:
        """A fresh simulation of the configured setup (pool, fleet)."""
        return self.fleet(self.replicas, self.routing, self.cache_blocks) if self.replicas > 1 else self.one(self.cache_blocks)

    def one(self, cache_blocks: int | None) -> PrefixCacheSim:
        """One server's simulation; a sliding-window model's: window_sim.py (unlimited), window_pool.py."""
        if self.window is not None and cache_blocks is not None:
            return WindowedPoolSim(self.block_size, self.window.tokens, cache_blocks, self.window.hybrid,
                                   uncached_first=self.uncached_first)
        if self.window is not None:
            return WindowedPrefixCacheSim(self.block_size, self.window.tokens, self.window.hybrid)
        return PrefixCacheSim(self.block_size, cache_blocks, self.uncached_first)

    def fleet(self, replicas: int, routing: str, cache_blocks: int | None) -> Fleet:
        return Fleet(replicas, routing, self.block_size, cache_blocks, self.seed,
                     make=lambda: self.one(cache_blocks))

    def completion(self, req: Request) -> int:
        return self.default_completion if req.completion_tokens is None else req.completion_tokens

    def resets(self) -> ResetPlan:
        return ResetPlan(self.reset_at, self.reset_times)


def _run(sm: PrefixCacheSim | Fleet, ids: Sequence[int], extra: Hashable, hashes: list[int], out: int,
         out_ids: Sequence[int] | None,
         session: str | None, gen: list[BlockKey] | None) -> int:
    """One request through one simulation (a fleet routes by session)."""
    if isinstance(sm, Fleet):
        return sm.run(ids, extra, hashes, out, out_ids, session, gen)
    return sm.run(ids, extra, hashes, out, out_ids, gen)


class _FirstPass:
    """The configured setup and its twins, fed the stream once, request by request.

    Twins for the shortfall split, each removing one loss: the same fleet with an unlimited
    pool (capacity), one unlimited server (routing), and one unlimited server that never
    resets (events). The one-server twin is also what the diagnosis compares against, so a
    miss caused by eviction is never blamed on the text."""

    def __init__(self, setup: _Setup, res: AnalyzeResult, encoder: Encoder, paths: list[str],
                 compare_routing: int, curve: bool, compare_block_size: int | None = None) -> None:
        bs, cb = setup.block_size, setup.cache_blocks
        self.setup, self.res, self.encoder, self.paths = setup, res, encoder, paths
        self.sim = setup.configured()
        self.finder = DivergenceFinder(bs)
        self.hasher = BlockHasher(bs)
        multi = setup.replicas > 1
        self.routed = setup.fleet(setup.replicas, setup.routing, None) if multi and cb is not None else None
        self.ideal = setup.one(None) if (cb is not None or multi) else None
        self.calm = setup.one(None)
        self.fleets = {p: setup.fleet(compare_routing, p, cb) for p in ROUTING_POLICIES} \
            if compare_routing > 1 else {}
        self.pool = PoolCurve(bs) if curve and setup.window is None else None     # the curve has no window rule
        # the same stream under another block size: its own hashes and its own reply inference
        self.other = setup.with_block_size(compare_block_size) if compare_block_size else None
        self.other_sim = self.other.configured() if self.other is not None else None
        self.other_infer = ReplyInference(compare_block_size) if compare_block_size else None
        self.with_events = [x for x in (self.sim, self.routed, self.ideal, self.pool, *self.fleets.values(),
                                        self.other_sim) if x is not None]
        self.renamed = [*self.with_events, self.calm]
        self.sim.track_split()
        self.tenants = None if setup.tenants is None else TenantSplit(self.sim, setup.tenants.namer, setup.tenants.by)
        self.infer = ReplyInference(bs)
        self.resets = setup.resets()
        self.obs_prompt = self.obs_cached = 0

    def empty_cache(self, where: str, kind: str) -> None:
        for x in self.with_events:
            x.reset(kind)
        self.res.events_count += 1
        if len(self.res.events) < 100:
            self.res.events.append(f"{kind} at {where}")

    def batch(self, batch: list[Request | Event]) -> None:
        reqs = [r for r in batch if isinstance(r, Request)]
        encs = iter(self.encoder.encode_many(reqs))
        for req in batch:
            if isinstance(req, Event):
                self.empty_cache(req.where, req.kind)
                continue
            why = self.resets.before(req)
            if why:
                self.empty_cache(req.where, why)
            enc = next(encs)
            if isinstance(enc, TemplateError):
                paths = self.paths
                skip(self.res, Skip(req.line, str(enc) if len(paths) == 1 else f"{paths[req.source]}: {enc}"))
                continue
            self.request(req, enc)

    def request(self, req: Request, enc: Encoded) -> None:
        res = self.res
        ids = enc.ids
        extra = _extra(req, self.setup.loras)
        raw = raw_bytes(ids)                    # one conversion for the hasher and the tenant split
        hashes = self.hasher(raw, extra)
        if req.completion_tokens is None:
            res.completion_assumed += 1
        out = self.setup.completion(req)
        out_ids = req.completion_ids
        mapping, gen = self.infer.step(req, ids, hashes, out, out_ids)
        if mapping:
            for x in self.renamed:
                x.rename(mapping)
        if self.tenants is None:
            cached = _run(self.sim, ids, extra, hashes, out, out_ids, req.session, gen)
        else:
            fed = out_ids[:max(out - 1, 0)] if out_ids is not None and len(out_ids) >= out - 1 else ()
            cached = self.tenants.request(req, adapter_of(req, self.setup.loras), extra, ids, hashes, fed,
                                          lambda: _run(self.sim, ids, extra, hashes, out, out_ids, req.session, gen),
                                          raw)
        text_cached = cached if self.ideal is None else self.ideal.run(ids, extra, hashes, out, out_ids, gen)
        self.calm.run(ids, extra, hashes, out, out_ids, gen)
        for f in (self.routed, *self.fleets.values()):
            if f is not None:
                f.run(ids, extra, hashes, out, out_ids, req.session, gen)
        if self.other is not None and self.other_sim is not None and self.other_infer is not None:
            _replay_fixed(self.other, self.other_sim, self.other_infer, req, enc, req)
        if self.pool is not None:
            known = gen
            if out_ids is not None:
                known = self.calm.generated_hashes(ids, hashes, out, out_ids, extra)
            self.pool.run(len(ids), hashes, out, known)
        res.lines.append(req.line)
        res.sources.append(req.source)
        res.prompt_tokens.append(len(ids))
        res.cached_tokens.append(cached)
        if not self.encoder.approximate:
            _compare(res, req, len(ids), cached)
            if req.observed_prompt_tokens is not None:
                self.obs_prompt += req.observed_prompt_tokens
                self.obs_cached += req.observed_cached_tokens or 0
        self.finder.observe(req, enc, hashes, text_cached, extra)

    def finish(self) -> None:
        res, sim = self.res, self.sim
        res.oversized = sim.oversized
        res.stored_split = dict(sim.split or {})
        if isinstance(sim, Fleet):
            res.stored_split_by_replica = [dict(s.split or {}) for s in sim.sims]
            res.requests_by_replica, res.cached_by_replica = list(sim.routed), sim.cached_by_replica
        res.inferred_generated_blocks = self.infer.inferred_blocks
        res.history_dropped = sim.history_dropped
        if self.tenants is not None and self.setup.tenants is not None:
            res.tenants = self.tenants.report(self.setup.tenants.top, self.setup.tenants.naming)
        res.reset_times_unused = len(self.resets.times) - self.resets.next_time
        res.causes = self.finder.ranked()
        res.unlimited_cached_total = self.ideal.cached_tokens if self.ideal is not None else sim.cached_tokens
        if self.pool is not None:
            res.curve = self.pool.curve()
        res.routing_results = {p: (f.cached_tokens, f.prompt_tokens) for p, f in self.fleets.items()}
        res.routing_spread = {p: list(f.routed) for p, f in self.fleets.items()}
        res.routing_cached = {p: f.cached_by_replica for p, f in self.fleets.items()}
        if self.other is not None and self.other_sim is not None:
            res.block_compare = BlockCompare(self.other.block_size, self.other.cache_blocks,
                                             self.other_sim.cached_tokens, sim.cached_tokens)

    def shortfall(self, best: int | None) -> Shortfall:
        res, sim, routed = self.res, self.sim, self.routed
        observed = None
        if res.cached_reported and res.cached_compared == res.requests and self.obs_prompt == res.total_prompt:
            observed = self.obs_cached
        return Shortfall(
            prompt_tokens=res.total_prompt, observed=observed, predicted=sim.cached_tokens,
            unlimited_pool=routed.cached_tokens if routed is not None else (
                sim.cached_tokens if self.setup.cache_blocks is None else res.unlimited_cached_total),
            one_replica=res.unlimited_cached_total, no_events=self.calm.cached_tokens,
            fixed=best if best is not None else self.calm.cached_tokens)


# A what-if's rank: the cause's (0-based), or one of these for the combined fixes.
_COMBINED = -1      # all top causes' first fixes at once, on the configured setup
_IDEAL = -2         # the ideal's last step: one unlimited server, no resets, the top causes fixed


def _fix_plan(causes: list[Cause], top: int, what_if: bool) -> list[tuple[int, Fix | CombinedFix]]:
    fixes: list[tuple[int, Fix | CombinedFix]] = \
        [(rank, f) for rank, c in enumerate(causes[:top]) for f in c.fixes()] if what_if else []
    firsts = [c.fixes()[0] for c in causes[:top] if c.fixes()]
    if len(firsts) > 1:
        fixes.append((_COMBINED, CombinedFix(firsts)))
    if firsts and what_if:
        fixes.append((_IDEAL, CombinedFix(firsts)))
    return fixes


def _encode_fixed(encoder: Encoder, reqs: list[Request],
                  fixes: list[tuple[int, Fix | CombinedFix]]
                  ) -> tuple[list[list[Request]], list[list[Encoded | TemplateError]]]:
    """Each fix's rewritten requests and their encodings. The originals are encoded once;
    only the requests a fix changed are re-encoded (most fixes touch a fraction of the traffic)."""
    base = encoder.encode_many(reqs)
    rewritten = [[f.apply(r) for r in reqs] for _, f in fixes]
    changed = [r for rs in rewritten for r, orig in zip(rs, reqs, strict=False) if r is not orig]
    encoded = iter(encoder.encode_many(changed) if changed else ())
    encs = [[next(encoded) if r is not orig else b for r, orig, b in zip(rs, reqs, base, strict=True)]
            for rs in rewritten]
    return rewritten, encs


def _replay_fixed(setup: _Setup, sm: PrefixCacheSim | Fleet, infer: ReplyInference, req: Request,
                  enc: Encoded | TemplateError, original: Request) -> None:
    if isinstance(enc, TemplateError):
        return
    # the output of a rewritten prompt is unknown: its length is kept, its ids not (the
    # next turn may show it, as in the first pass)
    out = setup.completion(req)
    out_ids = req.completion_ids if req is original else None
    ex = _extra(req, setup.loras)
    hs = sm.hasher(enc.ids, ex)
    mapping, gen = infer.step(req, enc.ids, hs, out, out_ids)
    if mapping:
        sm.rename(mapping)
    _run(sm, enc.ids, ex, hs, out, out_ids, req.session, gen)


def _what_ifs(res: AnalyzeResult, setup: _Setup, encoder: Encoder, paths: list[str],
              fixes: list[tuple[int, Fix | CombinedFix]], progress: Callable[[int], None] | None) -> int | None:
    """The second streaming pass: every fix re-simulated; the results go into `res`.
    Returns the ideal's cached tokens (None when there is no ideal step)."""
    # what-ifs run on the configured setup (pool, fleet); the ideal's last step on one
    # unlimited server
    sims = [setup.one(None) if rank == _IDEAL else setup.configured() for rank, _ in fixes]
    base_bytes = total_bytes(paths)
    second = None if progress is None else (lambda n: progress(base_bytes + n))
    resets = setup.resets()
    infers = [ReplyInference(setup.block_size) for _ in fixes]
    for batch in batches(stream(paths, None, second), BATCH):
        rewritten, encs = _encode_fixed(encoder, [r for r in batch if isinstance(r, Request)], fixes)
        k = 0
        for item in batch:
            if isinstance(item, Event) or resets.before(item):
                for (rank, _), sm in zip(fixes, sims, strict=False):
                    if rank != _IDEAL:
                        sm.reset()
            if isinstance(item, Event):
                continue
            for j, sm in enumerate(sims):
                _replay_fixed(setup, sm, infers[j], rewritten[j][k], encs[j][k], item)
            k += 1
    best = None
    for (rank, fix), done in zip(fixes, sims, strict=False):
        w = WhatIf(fix, res.hit_ratio, done.hit_ratio, done.cached_tokens)
        if rank == _IDEAL:
            best = done.cached_tokens
        elif rank < 0:
            res.combined = w
        else:
            res.what_ifs.setdefault(rank, []).append(w)
    return best


def analyze(paths: str | list[str], encoder: Encoder, *, block_size: int, cache_blocks: int | None = None,
            lora_models: Iterable[str] = (), top: int = 3, what_if: bool = True,
            reset_at: Iterable[str] = (), reset_times: Iterable[float] = (), default_completion: int = 1,
            replicas: int = 1, routing: str = "round-robin", compare_routing: int = 0, curve: bool = True,
            seed: int = 0, progress: Callable[[int], None] | None = None,
            tenants: TenantOptions | None = None, window: SlidingWindow | None = None,
            uncached_first: bool = True, compare_block_size: int | None = None) -> AnalyzeResult:
    """Simulate `paths` (one stream, in order) and diagnose it.

    `replicas`/`routing`: the fleet the traffic ran on (the prediction is the fleet's).
    `compare_routing`: also simulate that many replicas under every routing policy.
    `curve`: compute the hit ratio for every pool size (one server).
    `progress(bytes)` is called with bytes read so far, over all files and passes.
    `tenants`: also split the configured setup's numbers per tenant and adapter.
    `window`: the model's sliding window (window_sim.py): hits need the window before them.
    `uncached_first`: the server's release frees uncached blocks to the free queue's front (eras.FREE_ORDERS).
    `block_size` has no default: vLLM's depends on the release and platform (normalise/eras.BLOCK_SIZE_DEFAULTS).
    `compare_block_size`: also replay the stream on the configured setup under that block size."""
    paths = [paths] if isinstance(paths, str) else list(paths)
    setup = _Setup(block_size, cache_blocks, replicas, routing, seed, default_completion, frozenset(lora_models),
                   tuple(reset_at), tuple(reset_times), tenants, window, uncached_first)
    res = AnalyzeResult(", ".join(paths), encoder.approximate, block_size, cache_blocks, files=paths,
                        default_completion=default_completion, replicas=replicas, routing=routing, window=window)
    first = _FirstPass(setup, res, encoder, paths, compare_routing, curve, compare_block_size)
    for batch in batches(stream(paths, res, progress), BATCH):
        first.batch(batch)
    first.finish()
    res.compare_replicas = compare_routing if first.fleets else 0
    fixes = _fix_plan(res.causes, top, what_if)
    best = _what_ifs(res, setup, encoder, paths, fixes, progress) if fixes else None
    res.shortfall = first.shortfall(best)
    return res


def _compare(res: AnalyzeResult, req: Request, prompt_tokens: int, cached: int) -> None:
    """Compare with vLLM's own usage numbers on the line (exact mode only)."""
    if req.observed_prompt_tokens is None and req.observed_cached_tokens is None:
        return
    res.observed_compared += 1
    pm = req.observed_prompt_tokens == prompt_tokens
    res.observed_prompt_match += pm
    if req.observed_cached_tokens is not None:
        res.observed_with_details += 1
        cm = req.observed_cached_tokens == cached
        res.observed_cached_match += cm
    elif req.observed_details_null:
        # vLLM sends "prompt_tokens_details": null when nothing was cached (and always
        # without --enable-prompt-tokens-details): 0 if the stream reports details at all.
        res.null_details += 1
        cm = cached == 0
        res.null_details_zero += cm
        if not cm and len(res.null_details_mismatch_lines) < 20:
            res.null_details_mismatch_lines.append(req.where)
        cm = True     # judged at the end, once we know whether details are reported
    else:
        cm = True
    if not (pm and cm) and len(res.observed_mismatch_lines) < 20:
        res.observed_mismatch_lines.append(req.where)
