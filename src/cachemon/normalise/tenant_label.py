"""Tenant and adapter label values: a ``cache_salt`` never leaves cachemon as it was sent.

A salt is often a secret (its whole point is that another tenant cannot produce it), so it is
never exported, logged or printed. It becomes a label value in one of two ways, the same for
the live ledger (KV events) and for ``cachemon analyze`` (request files), so that both name a
tenant identically:

* **configured name**: ``kv_events.tenants`` maps ``sha256(salt)`` (hex) to a name; the
  configuration holds a digest, not the salt itself;
* **keyed hash** otherwise: ``h-`` + the first 12 hex digits of HMAC-SHA256(key, salt). Without
  the key, the label cannot be turned back into the salt by trying candidate salts. The key
  is ``kv_events.tenant_key`` (its UTF-8 bytes): the same key gives the same names in the live
  ledger (state/ledger/tenants.py) and in ``cachemon analyze``. Without a key the ledger says
  ``unnamed``; analyze, which has the whole stream in hand, draws a random key instead so that
  tenants stay apart, and says that its names hold for that run only.

No salt: the empty tenant ``""``. Adapters are labelled by their LoRA name (``""``: the base
model): adapter names are chosen by the operator, not secrets.

Cardinality (``LabelBudget``): the first K distinct label values keep their own series, the rest
share ``other``; every overflowed value is counted, so the loss is visible.
"""
from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Mapping

NO_TENANT = ""
OTHER = "other"
HASH_PREFIX = "h-"
HASH_HEX_DIGITS = 12


def _bytes(salt: str) -> bytes:
    # surrogatepass: a salt that came through JSON with a lone surrogate still has one digest
    return salt.encode("utf-8", "surrogatepass")


def salt_key(salt: str) -> bytes:
    """What a cache remembers a salt by: its sha256 digest (32 bytes), never the salt."""
    return hashlib.sha256(_bytes(salt)).digest()


def salt_digest(salt: str) -> str:
    """The configuration's key for a salt: sha256 of its UTF-8 bytes, lowercase hex."""
    return hashlib.sha256(_bytes(salt)).hexdigest()


MEMO_SIZE = 8192          # salts whose label is remembered (by digest): ~1.5 MB at most


class TenantNamer:
    """Salt -> tenant label value. ``names``: sha256(salt) hex -> name; ``key``: the HMAC key
    (None: a random key for this process; see ``key_is_random``).

    Labels are remembered by the salt's sha256 digest (32 bytes), never by the salt: a salt is a
    secret, and may be any length (2 000 salts of 100 000 characters held 194 MB as keys)."""

    def __init__(self, names: Mapping[str, str] | None = None, key: bytes | None = None):
        self.names = {d.lower(): n for d, n in (names or {}).items()}
        self.key_is_random = key is None
        self._key = os.urandom(32) if key is None else key
        self._memo: dict[bytes, str] = {}

    def __call__(self, salt: str | None) -> str:
        if not salt:
            return NO_TENANT
        digest = salt_key(salt)
        got = self._memo.get(digest)
        if got is None:
            got = self.names.get(digest.hex())
            if got is None:
                mac = hmac.new(self._key, _bytes(salt), hashlib.sha256).hexdigest()
                got = HASH_PREFIX + mac[:HASH_HEX_DIGITS]
            if len(self._memo) < MEMO_SIZE:     # bounded: a stream of distinct salts stays cheap
                self._memo[digest] = got
        return got


def adapter_label(lora_name: str | None) -> str:
    """An adapter's label value: its LoRA name, ``""`` for the base model."""
    return lora_name or ""


class LabelBudget:
    """At most ``k`` distinct values keep their own label (``always``: values that never count
    against it, e.g. configured tenant names and ``""``); the rest become ``other``, counted in
    ``overflowed`` (one per value turned away, not per use)."""

    def __init__(self, k: int, always: frozenset[str] = frozenset()):
        if k < 0:
            raise ValueError("k must be at least 0")
        self.k = k
        self.always = always
        self.admitted: set[str] = set()
        self._refused: set[str] = set()
        self.overflowed = 0

    def __call__(self, value: str) -> str:
        if value in self.admitted or value in self.always or value == NO_TENANT:
            return value
        if len(self.admitted) < self.k:
            self.admitted.add(value)
            return value
        if value not in self._refused and len(self._refused) < 1 << 20:
            self._refused.add(value)
            self.overflowed += 1
        return OTHER


def top_k(totals: Mapping[str, float], k: int, keep: frozenset[str] = frozenset()) -> tuple[list[str], list[str]]:
    """Offline top-K: the ``k`` largest keys (ties by name) plus ``keep``, and the rest (for ``other``)."""
    ranked = sorted((x for x in totals if x not in keep), key=lambda x: (-totals[x], x))
    shown = [x for x in totals if x in keep] + ranked[:k]
    return shown, ranked[k:]
