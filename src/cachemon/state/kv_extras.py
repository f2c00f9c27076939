"""A stored block's extra keys (vLLM's ``BlockStored.extra_keys``): what the ledger hashes into a content id,
and what of them is token *content* (multimodal keys, prompt-embedding digests) rather than the salt or the
LoRA name, which isolation leaves out (state/kv_replica.py)."""
from __future__ import annotations


def hashable(x: object) -> object:
    """vLLM's extra keys arrive as msgpack arrays (lists): make them hashable, recursively."""
    if isinstance(x, list | tuple):
        return tuple(hashable(v) for v in x)
    if isinstance(x, dict):
        return tuple(sorted((str(k), hashable(v)) for k, v in x.items()))
    return x


def block_extras(extra: tuple[object, ...] | None) -> tuple[object, ...] | None:
    """A store's per-block extra keys, None when every block has none (0.32.0 sends [None] per block:
    checked at C speed, so the store loop makes no call for those blocks)."""
    return None if extra is None or extra.count(None) == len(extra) else extra


def content_extra(x: object) -> object:
    """A block's extra keys without the salt and the LoRA name (strings): what is content (mm keys,
    prompt-embedding digests) stays. None when nothing is left, as for a block without extra keys."""
    if not isinstance(x, tuple):
        return None
    kept = tuple(hashable(v) for v in x if not isinstance(v, str))
    return kept or None
