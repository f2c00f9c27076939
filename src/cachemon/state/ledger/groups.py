"""A hybrid model's other KV-cache groups, held only to read its reuse reports.

The ledger follows one group (kv_replica.ReplicaLedger._followed). On a hybrid model a full-report
request's reuse report comes once per group (the real hybrid_swa_full capture: the sliding-window
group's report first, then the full-attention group's, the same hashes), and the full-attention group
also recomputes cached blocks from block 0 whenever the sliding-window group lacks the window before
the hit point: a store shaped exactly like that group's report. What tells them apart is the
sliding-window group: vLLM 0.32.0 (``v1/core/single_type_kv_cache_manager.py``,
``SlidingWindowManager.find_longest_cache_hit``) hits k blocks only when that group holds the
``cdiv(window - 1, block_size)`` blocks before block k, so its parent-null event is a report exactly
when it holds them. The verdict is handed to the followed group's event with the same hashes. A
sliding-window group caches only the blocks before the request's replay point and shared-prefix
junction (``reachable_block_mask``), so its store of the same request may name only part of the
followed group's blocks, or hang below a parent: either way a store, and so is the followed group's.
A group that names no window (mamba, an older release) gives no verdict: the ledger counts the event
as ambiguous. ``window`` (the widest a group named) tells the ledger that the followed group's held
blocks stored again are the window's cost (``Reason.SLIDING_WINDOW``). Bounded like the ledger: at most
``max_blocks`` hashes per group.
"""
from __future__ import annotations

from collections.abc import Iterable

from cachemon.normalise.kv_batch import Hash, Stored


class SideGroups:
    def __init__(self, max_blocks: int) -> None:
        self.max_blocks = max_blocks
        self.held: dict[int, dict[Hash, int]] = {}       # group -> hash -> copies
        # The widest sliding window a group of this replica named (tokens; None: no windowed group). While
        # set, cached blocks the followed group recomputes are the window's cost (kv_replica._store_blocks).
        self.window: int | None = None
        # the last event's hashes, its verdict, and whether it was a store (a report names every hit block)
        self._verdict: tuple[tuple[Hash, ...], bool | None, bool] | None = None

    def stored(self, ev: Stored) -> None:
        held = self.held.setdefault(ev.group, {})
        hashes = ev.hashes
        if ev.window and (self.window is None or ev.window > self.window):
            self.window = ev.window
        if not hashes:
            return            # a prefill chunk of which the group keeps no block: no store, no verdict
        if ev.parent is None:
            report: bool | None = None
            if ev.window and ev.block_size > 0:
                need = min(len(hashes), -(-(ev.window - 1) // ev.block_size))
                report = all(h in held for h in hashes[len(hashes) - need:])
            prev = self._verdict
            if prev is not None and prev[0] == hashes:      # a third group: every group must hit
                report = None if prev[1] is None or report is None else prev[1] and report
            self._verdict = (hashes, report, report is False)
            if report:
                return                                       # a report changes no reference count
        elif ev.window:
            # A sliding-window group's store below a parent: the blocks before the request's replay point and
            # shared-prefix junction (vLLM 0.32.0 reachable_block_mask), stored just before the followed
            # group's blocks of the same request: a store, so that group's event is one too.
            self._verdict = (hashes, False, True)
        for h in hashes:
            c = held.get(h)
            if c is not None:
                held[h] = c + 1
            elif len(held) < self.max_blocks:
                held[h] = 1

    def removed(self, group: int, hashes: Iterable[Hash]) -> None:
        held = self.held.get(group)
        if held is None:
            return
        for h in hashes:
            c = held.pop(h, 0) - 1
            if c > 0:
                held[h] = c

    def judge(self, hashes: tuple[Hash, ...]) -> bool | None:
        """The other groups' verdict on the followed group's parent-null event ``hashes``: True a report,
        False a store, None no verdict (no such event just before, or a group without a window)."""
        v, self._verdict = self._verdict, None
        if v is None:
            return None
        if v[0] == hashes:
            return v[1]
        if v[2] and set(v[0]) <= set(hashes):
            return False          # the window group stored part of these blocks: the same request's store
        return None

    def cleared(self) -> None:
        self.held.clear()
        self._verdict = None

    def restarted(self) -> None:
        """A new vLLM process: it may serve another model (another window, or none)."""
        self.cleared()
        self.window = None
