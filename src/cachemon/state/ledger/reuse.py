"""Full-report reuse reports: telling vLLM's report of the blocks a request *reused* from a store.

A request with ``kv_cache_report_mode="full"`` makes vLLM send its hit blocks as a BlockStored
(``BlockPool.emit_cached_block_events``). On the wire the two are shaped alike: a report is a
BlockStored of the request's hit blocks 0..k-1, parent null, sent at the lookup. A report names only
blocks that are cached at that moment (possibly cached earlier in the same engine step: vLLM caches a
request's blocks when it schedules it, before the next request's lookup), while a real chain-head store
computes blocks the lookup did not find. Reports add no reference, so a block evicted since is not
cached (the real full_report_bursts capture: exact).

The exceptions are twins, a copy computed while the hash is cached: a prompt of exactly one block sent
again (the lookup hits at most prompt - 1 tokens), or a request that skips the lookup (prompt
logprobs). A twin of a longer prompt's last block has a parent, so only a single block is ambiguous:
counted (``ambiguous_reports``), read as a report once the replica has sent an unambiguous one (two or
more blocks, all cached), else as a twin. On a hybrid model the other groups decide
(state/ledger/groups.py; docs/kv-events.md, "Full report mode").
"""
from __future__ import annotations

from collections.abc import Container, Sequence

from cachemon.normalise.kv_batch import Hash


def judge(hashes: Sequence[Hash], cached: Container[Hash], hybrid: bool, side: bool | None,
          seen_unambiguous: bool) -> tuple[bool, bool]:
    """(whether a chain-head store of ``hashes`` is a reuse report, whether it is ambiguous).

    ``cached``: the replica's cached hashes; ``hybrid``: the replica follows one group of several;
    ``side``: the other groups' verdict there (None: no window to judge by); ``seen_unambiguous``: the
    replica has sent a report of two or more blocks before."""
    for h in hashes:
        if h not in cached:
            return False, False           # it computed a block the lookup did not find: a store
    if hybrid:
        return (False, True) if side is None else (side, False)
    if len(hashes) > 1:
        return True, False
    return seen_unambiguous, True
