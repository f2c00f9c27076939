"""A stored block's extra keys (vLLM's ``BlockStored.extra_keys``): what the ledger hashes into a content id,
and what of them is token *content* (multimodal keys, prompt-embedding digests) rather than the salt or the
LoRA name, which isolation leaves out (state/ledger/replica.py)."""
from __future__ import annotations

from cachemon.state.ledger.records import CID_MASK, KEY_MASK


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


def keyed_ids(pu: int, th: int, x: object, base: int, lora: str | None) -> tuple[int, int]:
    """(token content id, content id) of a block of a salted or adapter chain with extra keys ``x``,
    token key hash ``th``, below token content id ``pu``; ``base`` is the chain's key (its parent's
    content id xor token content id; the LoRA root's for a head). The content id is the token content
    id xor the key: ``base``, and the block's salt mixed in when it has one (its keys' strings other
    than the LoRA name, which vLLM repeats in every block's keys; the salt is only in a chain's first).
    Equal tokens and keys give equal ids; another salt or adapter another content id, the same token
    content id."""
    mask = CID_MASK
    ce = content_extra(x)
    uid = (hash((pu, th)) if ce is None else hash((pu, th, ce))) & mask
    if isinstance(x, tuple):
        s = tuple(v for v in x if isinstance(v, str) and v != lora)
        if s:
            base = hash((base, s)) & KEY_MASK
    return uid, uid ^ base
