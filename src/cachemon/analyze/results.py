"""What `cachemon analyze` found: the result types the pipeline fills and the outputs read."""
from __future__ import annotations

from array import array
from dataclasses import dataclass, field

from cachemon.analyze.divergence import Cause, CombinedFix, Fix
from cachemon.analyze.requests_io import Skip
from cachemon.analyze.sim.window import SlidingWindow
from cachemon.analyze.tenant_split import TenantReport


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
    lines: array[int] = field(default_factory=lambda: array("q"))
    sources: array[int] = field(default_factory=lambda: array("H"))   # file index per request
    files: list[str] = field(default_factory=list)
    prompt_tokens: array[int] = field(default_factory=lambda: array("q"))
    cached_tokens: array[int] = field(default_factory=lambda: array("q"))
    skipped: list[Skip] = field(default_factory=list)
    skipped_count: int = 0
    log_info_requests: int = 0           # vLLM INFO request-log lines (no prompt: skipped)
    log_other_lines: int = 0             # other vLLM server-log lines (skipped)
    observed_compared: int = 0           # requests whose line carried vLLM's usage
    observed_prompt_match: int = 0
    observed_cached_match: int = 0
    observed_mismatch_lines: list[str] = field(default_factory=list)
    observed_with_details: int = 0       # lines whose usage had prompt_tokens_details
    null_details: int = 0                # lines whose usage had prompt_tokens but details null
    null_details_zero: int = 0           # ... of which we predicted 0 cached
    null_details_mismatch_lines: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)      # "reset_prefix_cache at line N", ...
    events_count: int = 0
    completion_assumed: int = 0          # requests with no usage.completion_tokens (1 assumed)
    unlimited_cached_total: int = 0      # the same stream on one server with an unlimited pool
    replicas: int = 1
    routing: str = "round-robin"
    curve: array[int] | None = None           # cached tokens at pool size C (index C), one server
    # policy -> (cached, prompt) on compare_replicas
    routing_results: dict[str, tuple[int, int]] = field(default_factory=dict[str, tuple[int, int]])
    compare_replicas: int = 0
    routing_spread: dict[str, list[int]] = field(default_factory=dict)   # policy -> requests per replica
    routing_cached: dict[str, list[int]] = field(default_factory=dict)   # policy -> cached tokens per replica
    # the configured fleet (--replicas N): per replica, as its own hits counter would count them
    requests_by_replica: list[int] = field(default_factory=list)
    cached_by_replica: list[int] = field(default_factory=list)
    shortfall: Shortfall | None = None
    default_completion: int = 1
    config_note: str = ""                # where block size / pool size came from
    block_size_assumed: bool = False     # nothing said the block size: the CLI assumed one (and says so)
    block_compare: BlockCompare | None = None   # the same stream under --compare-block-size
    free_order: str = ""                 # the simulated free-queue order (eras.FREE_ORDERS), set by the CLI
    reset_times_unused: int = 0          # --reset-at-time values no line with a `time` reached
    oversized: int = 0
    causes: list[Cause] = field(default_factory=list)
    what_ifs: dict[int, list[WhatIf]] = field(default_factory=dict)   # cause rank (0-based) -> results
    combined: WhatIf | None = None       # all top causes' first fixes at once (when 2+ have one)
    # Where the misses go: the blocks the configured setup stores, by reason (SPLIT_REASONS)
    stored_split: dict[str, int] = field(default_factory=dict)
    stored_split_by_replica: list[dict[str, int]] = field(default_factory=list)   # fleets only
    inferred_generated_blocks: int = 0   # generated blocks whose tokens a later turn showed
    history_dropped: int = 0             # departed content forgotten (bounded history)
    tenants: TenantReport | None = None  # the split per tenant and adapter (tenant_split.py)
    window: SlidingWindow | None = None  # the model's sliding window, when it has one (window_sim.py)

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

    def pool_for(self, fraction: float) -> int | None:
        """Smallest pool (blocks, null block included) reaching `fraction` of the
        unlimited pool's cached tokens, from the one-pass curve."""
        if not self.curve:
            return None
        goal = fraction * self.curve[-1]
        lo, hi = 0, len(self.curve) - 1
        while lo < hi:           # the curve never decreases: binary search
            mid = (lo + hi) // 2
            if self.curve[mid] >= goal:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def curve_points(self) -> list[tuple[int, int]]:
        """The whole curve, losslessly: (pool size, cached tokens) where it changes."""
        c = self.curve or array("q")
        return [(i, c[i]) for i in range(len(c)) if i == 0 or c[i] != c[i - 1]]

    @property
    def cached_reported(self) -> bool:
        """Whether the stream carries vLLM's per-request cached_tokens at all."""
        return self.observed_with_details > 0

    @property
    def mismatch_lines(self) -> list[str]:
        """Lines where prompt_tokens or (when reported) cached_tokens differ, first ones."""
        extra = self.null_details_mismatch_lines if self.cached_reported else []
        return sorted(self.observed_mismatch_lines + extra, key=_line_key)[:20]

    @property
    def cached_compared(self) -> int:
        return self.observed_with_details + (self.null_details if self.cached_reported else 0)

    @property
    def cached_matched(self) -> int:
        return self.observed_cached_match + (self.null_details_zero if self.cached_reported else 0)


def _grouped(n: int) -> str:
    return f"{n:,}".replace(",", " ")


@dataclass(frozen=True)
class BlockCompare:
    """The configured setup's cached tokens under another block size (the pool in tokens as near today's as
    whole blocks allow: ``pool``)."""
    block_size: int
    cache_blocks: int | None
    cached_tokens: int
    today_cached_tokens: int

    @property
    def cost(self) -> int:
        """Tokens the other block size would lose (negative: gain) against today's."""
        return self.today_cached_tokens - self.cached_tokens

    def pool(self, today_block_size: int, today_cache_blocks: int | None) -> str:
        """How the simulated pool compares with today's in tokens: "" when they are equal (or unlimited), else
        the sentence that says so (thousands grouped by spaces, as the report's numbers). Whole blocks round a
        pool down, and vLLM needs 2 blocks at least (one is its null block): a small pool under a large block
        size is not the same memory, and is never called so."""
        if today_cache_blocks is None or self.cache_blocks is None:
            return ""
        today, other = today_cache_blocks * today_block_size, self.cache_blocks * self.block_size
        if other == today:
            return ""
        if today // self.block_size < 2:
            return (f"today's pool of {_grouped(today)} tokens cannot hold one {self.block_size}-token block besides vLLM's "
                    f"null block: simulated with the smallest pool vLLM runs, {self.cache_blocks} blocks = "
                    f"{_grouped(other)} tokens ({other / today:.1f}x today's), not the same pool")
        return (f"today's pool of {_grouped(today)} tokens is {today / self.block_size:.2f} blocks of {self.block_size}: "
                f"simulated with {_grouped(self.cache_blocks)} whole blocks = {_grouped(other)} tokens "
                f"({100 * other / today:.0f} % of today's)")


@dataclass
class Shortfall:
    """Cached tokens after removing each loss in turn (unlimited pool, then one replica,
    then no resets, then the top causes fixed). Each step's gain is one cause's share,
    so the shares add up to ``fixed - observed`` exactly."""
    prompt_tokens: int
    observed: int | None        # vLLM's own cached tokens, when every line reports them
    predicted: int              # the configured setup (pool, replicas, resets)
    unlimited_pool: int
    one_replica: int
    no_events: int
    fixed: int                  # the ideal: all of the above and the top causes fixed

    def parts(self) -> list[tuple[str, int]]:
        out = []
        if self.observed is not None:
            out.append(("not explained by the simulation", self.predicted - self.observed))
        out += [("capacity (finite KV pool)", self.unlimited_pool - self.predicted),
                ("routing (several replicas)", self.one_replica - self.unlimited_pool),
                ("events (resets, restarts)", self.no_events - self.one_replica),
                ("workload (varying segments)", self.fixed - self.no_events)]
        return out

    @property
    def start(self) -> int:
        return self.observed if self.observed is not None else self.predicted


def _line_key(where: str) -> tuple[str, int]:
    f, _, n = where.rpartition(":")
    return (f, int(n)) if n.isdigit() else (where, 0)
