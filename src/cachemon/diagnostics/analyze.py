"""The `cachemon analyze` pipeline, without the CLI: read -> tokenise -> simulate ->
diagnose, then a second streaming pass that re-simulates the what-if fixes.

Memory stays bounded: requests are read and encoded in small batches; what is kept per
request is three integers (line, prompt tokens, cached tokens) plus a small window of
recent encodings for the diagnosis.
"""
from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from cachemon.diagnostics.divergence import Cause, CombinedFix, DivergenceFinder, Fix
from cachemon.diagnostics.prefix_sim import BlockHasher, PrefixCacheSim, extra_key
from cachemon.diagnostics.requests_io import Request, Skip, iter_requests
from cachemon.diagnostics.tokenize import TemplateError

BATCH = 64


@dataclass
class WhatIf:
    fix: Fix | CombinedFix
    hit_ratio_before: float
    hit_ratio_after: float
    cached_tokens_after: int


@dataclass
class AnalyzeResult:
    path: str
    approximate: bool
    block_size: int
    cache_blocks: int | None
    lines: array = field(default_factory=lambda: array("q"))
    sources: array = field(default_factory=lambda: array("H"))   # file index per request
    files: list[str] = field(default_factory=list)
    prompt_tokens: array = field(default_factory=lambda: array("q"))
    cached_tokens: array = field(default_factory=lambda: array("q"))
    skipped: list[Skip] = field(default_factory=list)
    skipped_count: int = 0
    observed_compared: int = 0           # requests whose line carried vLLM's usage
    observed_prompt_match: int = 0
    observed_cached_match: int = 0
    observed_mismatch_lines: list[str] = field(default_factory=list)
    oversized: int = 0
    causes: list[Cause] = field(default_factory=list)
    what_ifs: dict[int, list[WhatIf]] = field(default_factory=dict)   # cause rank (0-based) -> results
    combined: WhatIf | None = None       # all top causes' first fixes at once (when 2+ have one)

    @property
    def requests(self) -> int:
        return len(self.prompt_tokens)

    @property
    def total_prompt(self) -> int:
        return sum(self.prompt_tokens)

    @property
    def total_cached(self) -> int:
        return sum(self.cached_tokens)

    @property
    def hit_ratio(self) -> float:
        p = self.total_prompt
        return self.total_cached / p if p else 0.0


MAX_SKIPS_KEPT = 1000   # every skip is counted; the first ones keep their line and reason


def _batches(items: Iterable, n: int) -> Iterator[list]:
    batch = []
    for it in items:
        batch.append(it)
        if len(batch) >= n:
            yield batch
            batch = []
    if batch:
        yield batch


def _extra(req: Request, lora_models: frozenset[str]) -> object:
    return extra_key(req.cache_salt, req.model if req.model in lora_models else None)


def analyze(paths: str | list[str], encoder, *, block_size: int = 16, cache_blocks: int | None = None,
            lora_models: Iterable[str] = (), top: int = 3, what_if: bool = True,
            progress: Callable[[int], None] | None = None) -> AnalyzeResult:
    """Simulate `paths` (one stream, in order) and diagnose it.

    `progress(bytes)` is called with bytes read so far, over all files and passes."""
    paths = [paths] if isinstance(paths, str) else list(paths)
    loras = frozenset(lora_models)
    res = AnalyzeResult(", ".join(paths), encoder.approximate, block_size, cache_blocks, files=paths)
    sim = PrefixCacheSim(block_size, cache_blocks)
    finder = DivergenceFinder(block_size)
    hasher = BlockHasher(block_size)

    for batch in _batches(_stream(paths, res, progress), BATCH):
        for req, enc in zip(batch, encoder.encode_many(batch), strict=False):
            if isinstance(enc, TemplateError):
                _skip(res, Skip(req.line, str(enc) if len(paths) == 1 else f"{paths[req.source]}: {enc}"))
                continue
            extra = _extra(req, loras)
            hashes = hasher(enc.ids, extra)
            cached = sim.run(enc.ids, extra, hashes)
            res.lines.append(req.line)
            res.sources.append(req.source)
            res.prompt_tokens.append(len(enc.ids))
            res.cached_tokens.append(cached)
            if not encoder.approximate and (req.observed_prompt_tokens is not None
                                            or req.observed_cached_tokens is not None):
                # vLLM's own numbers in the file: comparable only with exact tokens
                res.observed_compared += 1
                pm = req.observed_prompt_tokens == len(enc.ids)
                cm = req.observed_cached_tokens == cached
                res.observed_prompt_match += pm
                res.observed_cached_match += cm
                if not (pm and cm) and len(res.observed_mismatch_lines) < 20:
                    res.observed_mismatch_lines.append(req.where)
            finder.observe(req, enc, hashes, cached, extra)
    res.oversized = sim.oversized
    res.causes = finder.ranked()

    fixes: list[tuple[int, Fix | CombinedFix]] = (
        [(rank, f) for rank, c in enumerate(res.causes[:top]) for f in c.fixes()] if what_if else [])
    firsts = [c.fixes()[0] for c in res.causes[:top] if c.fixes()]
    if len(firsts) > 1:
        fixes.append((-1, CombinedFix(firsts)))
    if fixes:
        sims = [PrefixCacheSim(block_size, cache_blocks) for _ in fixes]
        base_bytes = _total_bytes(paths)
        second = None if progress is None else (lambda n: progress(base_bytes + n))
        for batch in _batches(_stream(paths, None, second), BATCH):
            # Encode the originals once; re-encode only the requests a fix changed
            # (most fixes touch a fraction of the traffic).
            base = encoder.encode_many(batch)
            rewritten = [[f.apply(r) for r in batch] for _, f in fixes]
            changed = [r for rs in rewritten for r, orig in zip(rs, batch, strict=False) if r is not orig]
            encoded = iter(encoder.encode_many(changed) if changed else ())
            for j, rs in enumerate(rewritten):
                for req, orig, b in zip(rs, batch, base, strict=False):
                    enc = next(encoded) if req is not orig else b
                    if not isinstance(enc, TemplateError):
                        sims[j].run(enc.ids, _extra(req, loras))
        for (rank, f), s in zip(fixes, sims, strict=False):
            w = WhatIf(f, res.hit_ratio, s.hit_ratio, s.cached_tokens)
            if rank < 0:
                res.combined = w
            else:
                res.what_ifs.setdefault(rank, []).append(w)
    return res


def _skip(res: AnalyzeResult, s: Skip) -> None:
    res.skipped_count += 1
    if len(res.skipped) < MAX_SKIPS_KEPT:
        res.skipped.append(s)


def _stream(paths: list[str], res: AnalyzeResult | None, progress) -> Iterator[Request]:
    import os
    done = 0
    for idx, p in enumerate(paths):
        name = os.path.basename(p)
        cb = None if progress is None else (lambda n, done=done: progress(done + n))
        for item in iter_requests(p, cb):
            if isinstance(item, Skip):
                if res is not None:
                    _skip(res, Skip(item.line, item.reason) if len(paths) == 1 else Skip(item.line, f"{p}: {item.reason}"))
                continue
            item.source = idx
            if len(paths) > 1:
                item.where = f"{name}:{item.line}"
            yield item
        done += _total_bytes([p])


def _total_bytes(paths: list[str]) -> int:
    import os
    return sum(os.path.getsize(p) for p in paths)
