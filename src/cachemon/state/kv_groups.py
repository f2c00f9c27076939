"""A hybrid model's other KV-cache groups, held only to read its reuse reports.

The ledger follows one group (kv_replica.ReplicaLedger._followed). On a hybrid model a full-report
request's reuse report comes once per group (the real hybrid_swa_full capture: the sliding-window
group's report first, then the full-attention group's, the same hashes), and the full-attention group
also recomputes cached blocks from block 0 whenever the sliding-window group lacks the window before
the hit point: a store shaped exactly like that group's report. What tells them apart is the
sliding-window group: vLLM 0.32.0 (``v1/core/single_type_kv_cache_manager.py``,
``SlidingWindowManager.find_longest_cache_hit``) hits k blocks only when that group holds the
``cdiv(window - 1, block_size)`` blocks before block k, so its parent-null event is a report exactly
when it holds them. The verdict is handed to the followed group's event with the same hashes.
A group that names no window (mamba, an older release) gives no verdict: the ledger counts the event
as ambiguous. Bounded like the ledger: at most ``max_blocks`` hashes per group.
"""
from __future__ import annotations

from collections.abc import Iterable

from cachemon.normalise.kv_events import Hash, Stored


class SideGroups:
    def __init__(self, max_blocks: int) -> None:
        self.max_blocks = max_blocks
        self.held: dict[int, dict[Hash, int]] = {}       # group -> hash -> copies
        # The widest sliding window a group of this replica named (tokens; None: no windowed group). While
        # set, cached blocks the followed group recomputes are the window's cost (kv_replica._store_blocks).
        self.window: int | None = None
        self._verdict: tuple[tuple[Hash, ...], bool | None] | None = None

    def stored(self, ev: Stored) -> None:
        held = self.held.setdefault(ev.group, {})
        hashes = ev.hashes
        if ev.window and (self.window is None or ev.window > self.window):
            self.window = ev.window
        if ev.parent is None:
            report: bool | None = None
            if ev.window and ev.block_size > 0:
                need = min(len(hashes), -(-(ev.window - 1) // ev.block_size))
                report = all(h in held for h in hashes[len(hashes) - need:])
            prev = self._verdict
            if prev is not None and prev[0] == hashes:      # a third group: every group must hit
                report = None if prev[1] is None or report is None else prev[1] and report
            self._verdict = (hashes, report)
            if report:
                return                                       # a report changes no reference count
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
        if v is None or v[0] != hashes:
            return None
        return v[1]

    def cleared(self) -> None:
        self.held.clear()
        self._verdict = None

    def restarted(self) -> None:
        """A new vLLM process: it may serve another model (another window, or none)."""
        self.cleared()
        self.window = None
