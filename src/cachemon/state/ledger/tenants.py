"""Whose tokens: the ledger's split per tenant (cache_salt) and per adapter (LoRA name).

vLLM puts a request's ``cache_salt`` in the extra keys of the first block of its chain only
(``vllm/v1/core/kv_cache_utils.py`` ``generate_block_hash_extra_keys``: ``start_token_idx == 0``);
the blocks below inherit it through ``parent_block_hash``, so the ledger keeps a small tenant code
in each cached block's record (state/ledger/records.py) and a child takes its parent's.

Labels. A salt is often a secret that isolates tenants: it is never exported, never logged, and
never kept: bounded caches of codes and labels remember it by its sha256 digest. Its label is, in this order, the name the config
gives its sha256 hex digest (``kv_events.tenants``: the config holds no secret), else ``h-`` and the
first 12 hex digits of HMAC-SHA256(``kv_events.tenant_key``, salt), else ``unnamed``. No salt: ``""``.
The adapter label is the LoRA name, ``""`` without one. At most ``top_k`` distinct (tenant, adapter)
pairs of hashed tenants get their own series (first come, first served, so a series never moves);
later ones are folded into ``tenant="other"`` (the adapter kept) and counted (``overflow``).
Named tenants always keep their name: the config bounds them.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

from cachemon.normalise.tenant_label import OTHER, TenantNamer, salt_digest, salt_key
from cachemon.state.ledger.reasons import REASONS

UNNAMED = "unnamed"
MAX_CODES = 0xFFF             # tenant codes fit 12 bits of a block record (0: no salt, no adapter)
SALT_CACHE = 4096             # salts -> code remembered (cleared when full: a salt is hashed again)


def salt_of(extra: object, lora: str | None) -> str | None:
    """The cache_salt in a chain head's extra keys, as vLLM publishes them (``to_event_extra_keys``:
    the LoRA name first when there is one, then (mm id, offset) pairs, then the salt, then prompt
    embedding digests as bytes): the first string that is not the LoRA name's slot."""
    if not isinstance(extra, tuple):
        return None
    items = extra[1:] if lora is not None and extra and extra[0] == lora else extra
    for x in items:
        if isinstance(x, str):
            return x
    return None


class TenantLabels:
    """Salt -> tenant label, by normalise/tenant_label.py's rules (the same names as ``cachemon
    analyze``); without a key, unnamed salts are ``unnamed`` here (analyze draws a per-run key)."""

    def __init__(self, names: Mapping[str, str] | None = None, key: bytes | None = None, top_k: int = 20) -> None:
        self.names = {k.lower(): v for k, v in (names or {}).items()}     # sha256(salt) hex -> name
        self._namer = TenantNamer(self.names, key) if key is not None else None
        self.top_k = top_k

    def label(self, salt: str) -> tuple[str, bool]:
        """(label, whether the config names it)."""
        name = self.names.get(salt_digest(salt)) if self.names else None
        if name is not None:
            return name, True
        if self._namer is None:
            return UNNAMED, False
        return self._namer(salt), False


class TenantBook:
    """Codes per (tenant, adapter), shared by every replica of a fleet (so top-K is fleet-wide)."""

    def __init__(self, labels: TenantLabels) -> None:
        self.labels = labels
        self.pairs: list[tuple[str, str]] = [("", "")]          # code -> (tenant, adapter)
        self._codes: dict[tuple[str, str], int] = {("", ""): 0}
        self._salts: dict[tuple[bytes | None, str | None], int] = {}
        self.hashed = 0                                          # hashed-tenant pairs given a series

    def code(self, salt: str | None, lora: str | None) -> int:
        """The code of a chain head's (salt, adapter); cached per distinct pair seen."""
        if salt is None and lora is None:
            return 0
        # a salt is a secret of any length a vLLM client sends: remembered by its digest, never kept
        key = (None if salt is None else salt_key(salt), lora)
        c = self._salts.get(key)
        if c is not None:
            return c
        if len(self._salts) >= SALT_CACHE:
            self._salts.clear()
        c = self._salts[key] = self._new_code(salt, lora)
        return c

    def folded(self, code: int) -> bool:
        return self.pairs[code][0] == OTHER

    def _new_code(self, salt: str | None, lora: str | None) -> int:
        adapter = lora or ""
        named = True
        tenant = ""
        if salt is not None:
            tenant, named = self.labels.label(salt)
        pair = (tenant, adapter)
        c = self._codes.get(pair)
        if c is not None:
            return c
        if not named:
            if self.hashed >= self.labels.top_k or len(self.pairs) >= MAX_CODES:
                return self._fold(adapter)
            self.hashed += 1
        elif len(self.pairs) >= MAX_CODES:
            return self._fold(adapter)
        return self._add(pair)

    def _fold(self, adapter: str) -> int:
        """Beyond the top K: (other, adapter), whose events count as overflow."""
        pair = (OTHER, adapter)
        c = self._codes.get(pair)
        return c if c is not None else self._add(pair)

    def _add(self, pair: tuple[str, str]) -> int:
        c = len(self.pairs)
        self.pairs.append(pair)
        self._codes[pair] = c
        return c


class TenantCounts:
    """One replica's counters per tenant code: stored tokens by reason, reused (hit) tokens, and the
    events folded into tenant="other"."""

    def __init__(self, book: TenantBook) -> None:
        self.book = book
        self.stored: dict[int, list[int]] = {}
        self.reused: dict[int, int] = {}
        self.overflow = 0

    def add_stored(self, code: int, blocks_by_reason: Iterable[int], block_size: int) -> None:
        row = self.stored.get(code)
        if row is None:
            row = self.stored[code] = [0] * len(REASONS)
        for r, n in enumerate(blocks_by_reason):
            if n:
                row[r] += n * block_size
        if code and self.book.folded(code):
            self.overflow += 1

    def add_reused(self, code: int, tokens: int) -> None:
        self.reused[code] = self.reused.get(code, 0) + tokens
        if code and self.book.folded(code):
            self.overflow += 1

    def rows(self) -> list[tuple[str, str, dict[str, float], float]]:
        """(tenant, adapter, stored tokens by reason, reused tokens) of every pair this replica saw."""
        out = []
        for c in sorted(self.stored.keys() | self.reused.keys()):
            t, a = self.book.pairs[c]
            row = self.stored.get(c) or [0] * len(REASONS)
            out.append((t, a, {r: float(v) for r, v in zip(REASONS, row, strict=True)}, float(self.reused.get(c, 0))))
        return out
