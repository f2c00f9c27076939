"""Why a stored block had to be computed: the reasons of the miss ledger, in one order.

The live ledger (state/ledger/fleet.py) and analyze's simulation (analyze/sim/prefix.py) both
split stored tokens by these reasons; the label values of ``cachemon_kv_stored_tokens_total{reason}``
are their names. The codes are packed in the ledger's departure records (state/ledger/records.py):
the reasons a content can *leave* a replica by (capacity, reset, restart) fit in two bits.
"""
from __future__ import annotations

from enum import IntEnum

__all__ = ["DEFAULT_HISTORY_BLOCKS", "NOT_MISSES", "REASONS", "Reason"]


class Reason(IntEnum):
    """docs/kv-events.md, "Classification of stored blocks" (checked in this order:
    RECOMPUTE_LAST_BLOCK or SLIDING_WINDOW (still cached), RESTART / RESET / CAPACITY (this replica's
    history), ROUTING, ISOLATION, FIRST)."""
    FIRST = 0                    # never cached before here, not cached anywhere in the fleet now
    CAPACITY = 1                 # cached here, left by a BlockRemoved (eviction)
    RESET = 2                    # cached here, left at an AllBlocksCleared
    RESTART = 3                  # cached here by an earlier vLLM process
    ROUTING = 4                  # cached now on another replica of the model
    RECOMPUTE_LAST_BLOCK = 5     # still cached here: a prompt of whole blocks recomputes its last one
    ISOLATION = 6                # its token content is cached now, but under another cache_salt / adapter
    SLIDING_WINDOW = 7           # still cached in the full-attention group, recomputed because the model's
    #                              sliding-window group did not hold the window before the hit point
    CACHE_OPT_OUT = 8            # still cached here, recomputed by a request that skips the prefix lookup
    #                              (prompt_logprobs, echo + logprobs; 0.34's prefix_cache_hit_limit): not a miss,
    #                              vLLM counts such requests in neither its queries nor its hits

    @property
    def label(self) -> str:
        return self.name.lower()


# Label values, indexed by code.
REASONS: tuple[str, ...] = tuple(r.label for r in Reason)
# Stored tokens that are no miss of vLLM's: the block was still cached (a whole-block prompt's last block
# recomputed, or a request that does not read the cache).
NOT_MISSES: frozenset[str] = frozenset((Reason.RECOMPUTE_LAST_BLOCK.label, Reason.CACHE_OPT_OUT.label))

# Departed contents remembered per replica (two generations: between half of it and all of it); the
# live ledger's default and analyze's, so that both forget the same content on long streams. A fleet
# of 64 replicas x 50 000 cached blocks with every history full stays under the 1 GB target
# (benchmarks/bench_kv_ledger.py measures the worst case: distinct content on every replica).
DEFAULT_HISTORY_BLOCKS = 32_768
