"""What the prefix-cache hit rate is worth: the cost arithmetic, the `cost:` config, its collector.

Two pricing models, one per config:

* per-token prices (an API or an internal charge-back): uncached input, cached input and
  output tokens, each per million tokens;
* GPU hours: a GPU-hour price and the *measured* prefill throughput of one GPU (tokens/s);
  optionally the decode throughput, so output tokens cost GPU time too.

"Without cache" prices every prompt token as uncached (per-token model) or as prefilled
(GPU-hour model); "with cache" prices hit tokens as cached (per-token) or as free prefill
(GPU-hour: a hit skips the prefill compute). The saving factor is without / with.

Worked examples reproduced by the tests (docs/changes-warmup-cost.md):

* 96 % hit rate -> 3.2x: prices $3.00 / $0.30 / $15.00 per million tokens (uncached input /
  cached input / output), 20 input tokens per output token: with cache
  0.04*3 + 0.96*0.3 + 15/20 = 1.158 per 20 input tokens' worth, without 3 + 0.75 = 3.75 -> 3.238x.
* 22 -> 3.5 GPU-hours -> 6.3x: 10,000 prompt tokens/s of prefill per GPU, 792 M prompt tokens
  of which 666 M hit (84.1 %): 792e6/10000/3600 = 22 GPU-h without cache, 126e6/10000/3600 = 3.5
  GPU-h with cache -> 6.29x.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from cachemon import catalog as C
from cachemon.config.cost import CostModel
from cachemon.expose.render import Family, format_labels
from cachemon.state.store import CounterView, StoreReader

MILLION = 1_000_000.0
# Output cost at or above this share of the with-cache cost: the cache cannot help much.
OUTPUT_DOMINATES_SHARE = 0.5


@dataclass(frozen=True)
class Estimate:
    hit_tokens: float
    miss_tokens: float
    output_tokens: float
    input_with_cache: float
    input_without_cache: float
    output_cost: float
    with_cache_gpu_hours: float | None = None
    without_cache_gpu_hours: float | None = None

    @property
    def with_cache(self) -> float:
        return self.input_with_cache + self.output_cost

    @property
    def without_cache(self) -> float:
        return self.input_without_cache + self.output_cost

    @property
    def saving_factor(self) -> float | None:
        """without / with; None when nothing was spent (no traffic or all prices zero)."""
        return self.without_cache / self.with_cache if self.with_cache > 0 else None

    @property
    def output_share(self) -> float | None:
        """Share of the with-cache cost that is output tokens (the cache cannot reduce it)."""
        return self.output_cost / self.with_cache if self.with_cache > 0 else None

    @property
    def output_dominates(self) -> bool:
        s = self.output_share
        return s is not None and s >= OUTPUT_DOMINATES_SHARE


def gpu_hours(tokens: float, tokens_per_second: float) -> float:
    return tokens / tokens_per_second / 3600.0


def estimate(model: CostModel, hit_tokens: float, miss_tokens: float, output_tokens: float = 0.0) -> Estimate:
    """Cost of ``hit + miss`` prompt tokens and ``output`` tokens, with and without the prefix cache."""
    if min(hit_tokens, miss_tokens, output_tokens) < 0:
        raise ValueError("token counts must not be negative")
    prompt = hit_tokens + miss_tokens
    if model.tokens is not None:
        p = model.tokens
        return Estimate(
            hit_tokens, miss_tokens, output_tokens,
            input_with_cache=(miss_tokens * p.uncached_input + hit_tokens * p.cached_input) / MILLION,
            input_without_cache=prompt * p.uncached_input / MILLION,
            output_cost=output_tokens * p.output / MILLION,
        )
    g = model.gpu
    if g is None:
        raise ValueError("cost model has neither per-token prices nor a GPU-hour price")
    with_h = gpu_hours(miss_tokens, g.prefill_tokens_per_second)
    without_h = gpu_hours(prompt, g.prefill_tokens_per_second)
    out_h = gpu_hours(output_tokens, g.decode_tokens_per_second) if g.decode_tokens_per_second else 0.0
    return Estimate(
        hit_tokens, miss_tokens, output_tokens,
        input_with_cache=with_h * g.price, input_without_cache=without_h * g.price,
        output_cost=out_h * g.price,
        with_cache_gpu_hours=with_h + out_h, without_cache_gpu_hours=without_h + out_h,
    )


# --- config -------------------------------------------------------------------------------


# --- exported counters ------------------------------------------------------------------

TOKEN_SERIES = frozenset((C.QUERY_TOKENS.name, C.HIT_TOKENS.name, C.GENERATION_TOKENS.name))


def series_tokens(counters: Mapping[C.SeriesKey, CounterView | float]) -> dict[tuple[str, str], tuple[float, float, float]]:
    """(model_name, engine) -> (hit, miss, output) tokens from one upstream's corrected counters
    (the store's series, or plain values).

    Hits are local + external (a KV-connector hit skips prefill too); misses are the local
    queries minus all hits. Series without prefix-cache counters (V0 gauge eras) are absent.
    """
    q: dict[tuple[str, str], float] = {}
    h: dict[tuple[str, str], float] = {}
    out: dict[tuple[str, str], float] = {}
    for (metric, labels), c in counters.items():
        if metric not in TOKEN_SERIES:
            continue      # e.g. a log's reset counter, which names no (model_name, engine)
        v = c if isinstance(c, (int, float)) else c.value
        ident = (labels[0], labels[1])
        if metric == C.QUERY_TOKENS.name and labels[2] == "local":
            q[ident] = v
        elif metric == C.HIT_TOKENS.name:
            h[ident] = h.get(ident, 0.0) + v
        elif metric == C.GENERATION_TOKENS.name:
            out[ident] = v
    res = {}
    for ident, queries in q.items():
        hits = min(h.get(ident, 0.0), queries)
        res[ident] = (hits, queries - hits, out.get(ident, 0.0))
    return res


class CostCollector:
    """The cost stage: ESTIMATED_COST{scenario} and COST_SAVING_FACTOR from the store's corrected
    token counters. Nothing runs: ``start`` and ``close`` have nothing to do.

    Derived at scrape time from the exported token counters, so the cost counters share their
    base (vLLM's totals at first sight, corrected across restarts) and never go down.
    """

    def __init__(self, store: StoreReader, model: CostModel) -> None:
        self.store = store
        self.model = model

    def start(self, stop_event: threading.Event) -> None:
        pass

    def close(self) -> None:
        pass

    def collect(self) -> Iterator[Family]:
        cost = Family.of(C.ESTIMATED_COST)
        factor = Family.of(C.COST_SAVING_FACTOR)
        with self.store.read() as view:
            snap = {name: series_tokens(st.counters) for name, st in view.upstreams.items()}
        for name, per in snap.items():
            for (model, engine), (hit, miss, out) in sorted(per.items()):
                e = estimate(self.model, hit, miss, out)
                base = (name, model, engine)
                cost.add(format_labels(C.ESTIMATED_COST.labels, base + ("with_cache",)), e.with_cache)
                cost.add(format_labels(C.ESTIMATED_COST.labels, base + ("without_cache",)), e.without_cache)
                if e.saving_factor is not None:
                    factor.add(format_labels(C.COST_SAVING_FACTOR.labels, base), e.saving_factor)
        yield cost
        yield factor
