"""Chain-head stores of cached blocks: a full-report reuse report, a request that skipped the lookup, or a twin.

A request with ``kv_cache_report_mode="full"`` makes vLLM send its hit blocks as a BlockStored
(``BlockPool.emit_cached_block_events``). On the wire the two are shaped alike: a report is a
BlockStored of the request's hit blocks 0..k-1, parent null, sent at the lookup. A report names only
blocks that are cached at that moment (possibly cached earlier in the same engine step: vLLM caches a
request's blocks when it schedules it, before the next request's lookup), while a real chain-head store
computes blocks the lookup did not find. Reports add no reference, so a block evicted since is not
cached (the real full_report_bursts capture: exact).

A request that skips the lookup (``Request.skip_reading_prefix_cache``: ``prompt_logprobs``, ``echo`` with
``logprobs``; vLLM 0.32.0 ``sampling_params.py:622-629``) recomputes its whole prompt and stores every full
block again from block 0, parent null, cached or not: a copy of each cached one (the real
prompt_logprobs_mixed capture). vLLM counts it in neither its queries nor its hits. Its store is certain
when it also computes a block that is not cached (a report names cached blocks only, a lookup that reads
the cache would have hit block 0). When every block is cached it has a report's very shape: it is read as
a report only on a replica known to send them (``kv_events.full_reports: true``, or, with ``auto``, a
report seen followed in its batch by the same request's computed blocks, below its last block: a shape
only a lookup that stopped there makes), else as a request that skipped the lookup, counted
(``ambiguous_reports``). A single cached block is also a twin's shape (a one-block prompt sent
again: the lookup hits at most prompt - 1 tokens): a report on such a replica, else a twin; counted either
way. On a hybrid
model the other groups decide (state/ledger/groups.py; docs/kv-events.md, "Full report mode").
"""
from __future__ import annotations

from collections.abc import Container, Sequence
from typing import Literal

from cachemon.normalise.kv_batch import Hash

Verdict = Literal["store", "report", "opt_out"]


def judge(hashes: Sequence[Hash], cached: Container[Hash], hybrid: bool, side: bool | None,
          full_reports: bool, child: bool) -> tuple[Verdict, bool]:
    """(what a chain-head store of ``hashes`` is, whether that is ambiguous on the wire).

    ``cached``: the replica's cached hashes; ``hybrid``: the replica follows one group of several;
    ``side``: the other groups' verdict there (None: no window to judge by); ``full_reports``: the replica
    sends reuse reports (declared, or seen); ``child``: the next event of the batch stores blocks below
    this one's last block."""
    if not hashes or hashes[0] not in cached:
        return "store", False             # block 0 was not cached: a lookup would have missed it too
    if not all(h in cached for h in hashes):
        # computes blocks the cache lacks below a cached block 0: no lookup read it (a hybrid model's
        # sliding-window recompute is the other groups' to name, state/ledger/groups.py)
        return ("store" if hybrid else "opt_out"), False
    if hybrid:
        return ("store", True) if side is None else ("report" if side else "store", False)
    if child:
        return "report", False
    if full_reports:
        return "report", len(hashes) == 1
    return ("opt_out" if len(hashes) > 1 else "store"), True
