"""vLLM 0.32.0's prefix cache on a model with sliding-window attention layers (Gemma-2/3, Mistral-style
sliding windows, hybrid local/global models), for requests run one at a time.

A sliding-window layer only attends to the last ``window`` tokens, so vLLM keeps a separate KV-cache group
for those layers and caches in it only the blocks a later request can resume from. The rules, read (not
copied) in vllm-project/vllm v0.32.0:

* The hit needs the window before it. ``SlidingWindowManager.find_longest_cache_hit``
  (``v1/core/single_type_kv_cache_manager.py``) scans the request's blocks from the right and stops at the
  first run of ``cdiv(window - 1, block_size)`` consecutive blocks the group holds: the hit ends there. With
  no such run, only the group's leading run from block 0 hits (the window before it is shorter than the
  window).
* A hybrid model takes the shortest hit of its groups. ``HybridKVCacheCoordinator.find_longest_cache_hit``
  (``v1/core/kv_cache_coordinator.py``) asks the full-attention group first (the usual chain prefix, at most
  ``prompt - 1`` tokens), then the sliding-window group up to that length; with one group of each kind one
  pass suffices. The full-attention group is truncated to the result: its cached blocks past the hit are
  computed and stored again (the live ledger's ``sliding_window`` reason). A model whose layers all slide
  has one group (``UnitaryKVCacheCoordinator``): only the window rule applies.
* The sliding-window group caches sparsely. ``prefix_cache_retention_interval`` defaults to 0
  (``config/cache.py``): ``SlidingWindowManager.reachable_block_mask`` keeps only the
  ``cdiv(window - 1, block_size)`` blocks before each reachable boundary: the prompt's replay boundary
  ``prompt - 1`` (``replay_boundaries``) and, on a hybrid model, the shared-prefix junction: the
  full-attention hit when the window cut the hit short of it (``KVCacheManager.get_computed_blocks``:
  ``shared_prefix_boundary``). Boundaries are rounded down to the block (the scheduler block: equal to the
  block size when both groups use one block size, as on the real capture). Generated blocks never land
  before a boundary, so that group never caches them.

Scope: the pool is unlimited here; window_pool.py runs the same rules on a finite pool shared by the
groups. EAGLE and hash blocks finer than the block are not modelled. The real captures this is held to:
tests/fixtures/vllm-0.32.0-cpu-hybrid-swa.
"""
from __future__ import annotations

import json
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cachemon.analyze.sim.block_hash import BlockKey
from cachemon.analyze.sim.prefix import PrefixCacheSim
from cachemon.jsontypes import JsonObject
from cachemon.state.ledger.reasons import Reason

_SLIDING = Reason.SLIDING_WINDOW.label
_FIRST = Reason.FIRST.label


def contiguous_blocks(window: int, block_size: int) -> int:
    """Blocks a sliding-window group must hold just before a hit (``cdiv(window - 1, block_size)``)."""
    return max(-(-(window - 1) // block_size), 1)


class WindowedPrefixCacheSim(PrefixCacheSim):
    """``PrefixCacheSim`` for a model with a sliding-window KV-cache group (unlimited pool).

    ``hybrid``: the model also has full-attention layers (a full-attention group whose chain prefix bounds
    the hit); False: every layer slides (one group). ``cut_tokens`` counts the tokens a full-attention
    model would have hit but the window did not let through."""

    def __init__(self, block_size: int, window: int, hybrid: bool = True) -> None:
        if window < 2:
            raise ValueError("the sliding window must be at least 2 tokens")
        self.window = window
        self.hybrid = hybrid
        self.need = contiguous_blocks(window, block_size)
        self.cut_tokens = 0
        super().__init__(block_size, None)

    def _empty(self) -> None:
        super()._empty()
        self._win: set[BlockKey] = set()      # the sliding-window group's cached hashes

    def window_hit(self, hashes: Sequence[BlockKey], limit: int) -> int:
        """Blocks the sliding-window group lets a request hit among its first `limit`."""
        held, need, run = self._win, self.need, 0
        for i in range(limit - 1, -1, -1):
            if hashes[i] in held:
                run += 1
                if run >= need:
                    return i + run
            else:
                run = 0
        return run

    def _run_unlimited(self, ids: Sequence[int], extra: Hashable, hashes: list[int], max_blocks: int,
                       completion_tokens: int | None, completion_ids: Sequence[int] | None,
                       generated: list[BlockKey] | None) -> int:
        n, bs = len(ids), self.block_size
        held = self._lookup_unlimited(hashes, max_blocks, update=False)   # what full attention would hit
        hit = self.window_hit(hashes, held if self.hybrid else max_blocks)
        if generated is None:
            generated = (self.generated_hashes(ids, hashes, completion_tokens, completion_ids, extra)
                         if completion_ids is not None else [])
        self.cut_tokens += (held - hit) * bs
        if self.split is not None:
            self._split(hashes, generated, hit, held, max_blocks, n, completion_tokens)
        self._seen.update(hashes)
        self._seen.update(generated)
        # the sliding-window group: the blocks before each reachable boundary, from the hit on
        ends = {(n - 1) // bs}
        if self.hybrid and held > hit:
            ends.add(held)                    # the shared-prefix junction
        for end in ends:
            self._win.update(hashes[max(hit, end - self.need):min(end, len(hashes))])
        return hit

    def _split(self, hashes: list[int], generated: list[BlockKey], hit: int, full: int, max_blocks: int, n: int,
               completion_tokens: int | None) -> None:
        """The full-attention group's stores by reason, as the live ledger classifies them: cached blocks
        recomputed because the window cut the hit (hit..full) are ``sliding_window``. A model whose layers
        all slide has no such group (the ledger follows none); its split counts the same way: blocks it
        computed before and a full-attention model would have hit are ``sliding_window``."""
        split, bs, seen = self.split, self.block_size, self._seen
        assert split is not None
        for j in range(hit, full):        # on a finite pool the request's own blocks may have evicted some
            if hashes[j] in seen:
                split[_SLIDING] += bs
            else:
                self._classify_new([hashes[j]], j)
        if max_blocks > full:
            self._classify_new(hashes[full:max_blocks], full)
        for j, h in enumerate(hashes[max(full, max_blocks):] + generated, max(full, max_blocks)):
            self._classify(h, j, h in seen)
        n_full = (n + max((completion_tokens or 1) - 1, 0)) // bs
        split[_FIRST] += max(n_full - len(hashes) - len(generated), 0) * bs
        self._trim_history()


@dataclass(frozen=True)
class SlidingWindow:
    """A model's sliding window as analyze simulates it."""
    tokens: int
    hybrid: bool = True          # full-attention layers too (two KV-cache groups), else every layer slides
    source: str = ""             # where it was read ("--sliding-window", "PATH: sliding_window + layer_types", ...)

    def describe(self) -> str:
        kind = "hybrid: full-attention layers too" if self.hybrid else "every layer slides"
        return f"sliding window {self.tokens} tokens ({kind}; {self.source})"


def window_from_config(config: JsonObject, source: str) -> SlidingWindow | None:
    """The sliding window of a Hugging Face model config (``config.json``; a multimodal model's
    ``text_config`` is read), or None.

    ``layer_types`` (transformers >= 4.53: "sliding_attention" / "full_attention" per layer) decides when
    present; else ``use_sliding_window: false`` (Qwen2) turns it off; else ``sliding_window_pattern``
    (Gemma-3: every n-th layer full), a Gemma-2/3 ``model_type`` or ``cache_implementation: hybrid`` make it
    hybrid; else a bare ``sliding_window`` slides every layer (Mistral-style)."""
    text = config.get("text_config")
    cfg = text if isinstance(text, dict) else config
    window = cfg.get("sliding_window")
    if not isinstance(window, int) or isinstance(window, bool) or window < 2:
        return None
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        if "sliding_attention" not in types:
            return None
        return SlidingWindow(window, any(t != "sliding_attention" for t in types), f"{source}: sliding_window + layer_types")
    if cfg.get("use_sliding_window") is False:
        return None
    pattern = cfg.get("sliding_window_pattern")
    if isinstance(pattern, int) and not isinstance(pattern, bool) and pattern > 1:
        return SlidingWindow(window, True, f"{source}: sliding_window + sliding_window_pattern")
    if cfg.get("cache_implementation") == "hybrid" or str(cfg.get("model_type", "")).startswith(("gemma2", "gemma3")):
        # Gemma-2 configs before layer_types: every other layer slides (transformers' "hybrid" cache)
        return SlidingWindow(window, True, f"{source}: sliding_window + {cfg.get('model_type') or 'hybrid cache'}")
    return SlidingWindow(window, False, f"{source}: sliding_window")


def read_model_window(path: str | Path) -> SlidingWindow | None:
    """``window_from_config`` of a config file, or of ``config.json`` in a model directory (None when the
    directory has none). Raises ValueError when the file cannot be read as JSON."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
        if not p.is_file():
            return None
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read the model config {p}: {e}") from None
    return window_from_config(data, str(p)) if isinstance(data, dict) else None


def resolve_window(tokens: int | None, model_config: str | None, tokenizer_dir: str | None) -> SlidingWindow | None:
    """analyze's window: ``--sliding-window`` (0: none; hybrid unless the model config says every layer
    slides), else ``--model-config``, else ``config.json`` in the tokenizer directory. vLLM 0.32.0's
    ``cache_config_info{sliding_window}`` is no source: ``CacheConfig.sliding_window`` is never set there
    (the real hybrid page says "None")."""
    found = read_model_window(model_config) if model_config else (
        read_model_window(tokenizer_dir) if tokenizer_dir and Path(tokenizer_dir).is_dir() else None)
    if tokens is None:
        return found
    if tokens == 0:
        return None
    if tokens < 2:
        raise ValueError("--sliding-window must be 0 (none) or at least 2 tokens")
    return SlidingWindow(tokens, found.hybrid if found is not None else True, "--sliding-window")


__all__ = ["SlidingWindow", "WindowedPrefixCacheSim", "contiguous_blocks", "read_model_window", "resolve_window",
           "window_from_config"]
