"""`cachemon report`'s per-tenant part: per model, per tenant and per adapter over the period, the
tokens stored by reason (isolation included) and the hits of full-report requests, from the raw samples
of the ledger's counters (the same exact sums as the rest of the report).

Tenants appear as the ledger labels them (a configured name, ``h-`` and a keyed hash, ``""`` without a
salt, ``other``): never a salt.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypedDict

from cachemon import catalog as C

MISSING = "recompute_last_block"     # stored but not a miss

Labels = dict[str, str]
Samples = list[tuple[float, float]]


class TenantRow(TypedDict):
    """One tenant's (or adapter's) tokens over the period."""
    stored_tokens: dict[str, float]      # by reason
    hit_tokens: float | None             # None: no full-report request
    missed_tokens: float
    hit_ratio: float | None              # hits / (hits + stored) over the pairs with full-report requests


class ModelTenants(TypedDict):
    tenants: dict[str, TenantRow]
    adapters: dict[str, TenantRow]


@dataclass
class _Sums:
    """A row while the (tenant, adapter) pairs are added up."""
    stored_tokens: dict[str, float] = field(default_factory=dict)
    hit_tokens: float | None = None
    kv: float = 0.0                      # hits + stored of the pairs with hits: the ratio's basis

    def add(self, pair: _Sums) -> None:
        for why, n in pair.stored_tokens.items():
            self.stored_tokens[why] = self.stored_tokens.get(why, 0.0) + n
        if pair.hit_tokens is not None:       # the ratio's basis: pairs with full-report requests only
            self.hit_tokens = (self.hit_tokens or 0.0) + pair.hit_tokens
            self.kv += pair.hit_tokens + sum(pair.stored_tokens.values())

    def row(self) -> TenantRow:
        hits, kv = self.hit_tokens, self.kv
        return {"stored_tokens": self.stored_tokens, "hit_tokens": hits,
                "missed_tokens": sum(self.stored_tokens.values()) - self.stored_tokens.get(MISSING, 0.0),
                "hit_ratio": hits / kv if hits is not None and kv > 0 else None}


def tenant_section(raw: Callable[[str], Iterable[tuple[Labels, Samples]]],
                   increase: Callable[[Samples], float]) -> dict[str, ModelTenants]:
    """model -> {"tenants": {tenant: row}, "adapters": {adapter: row}}; a row: stored tokens by reason,
    missed tokens, hit tokens (None: no full-report request), and the hit ratio hits / (hits + stored)
    over the (tenant, adapter) pairs that have full-report requests."""
    pairs: dict[tuple[str, str, str], _Sums] = {}

    def pair(labels: Labels) -> _Sums:
        key = (labels.get(C.MODEL, ""), labels.get(C.TENANT, ""), labels.get(C.ADAPTER, ""))
        return pairs.setdefault(key, _Sums())

    for labels, pts in raw(C.KV_TENANT_STORED_TOKENS.sample_name):
        st = pair(labels).stored_tokens
        why = labels.get(C.REASON, "")
        st[why] = st.get(why, 0.0) + increase(pts)
    for labels, pts in raw(C.KV_TENANT_HIT_TOKENS.sample_name):
        p = pair(labels)
        p.hit_tokens = (p.hit_tokens or 0.0) + increase(pts)
    sums: dict[str, tuple[dict[str, _Sums], dict[str, _Sums]]] = {}
    for (model, tenant, adapter), p in pairs.items():
        tenants, adapters = sums.setdefault(model, ({}, {}))
        tenants.setdefault(tenant, _Sums()).add(p)
        adapters.setdefault(adapter, _Sums()).add(p)
    return {model: {"tenants": {k: r.row() for k, r in tenants.items()},
                    "adapters": {k: r.row() for k, r in adapters.items()}}
            for model, (tenants, adapters) in sums.items()}


def tenant_lines(section: ModelTenants | None) -> list[str]:
    if not section:
        return []
    lines = ["  per tenant / adapter (KV-cache events; hit ratio only with full-report requests):"]
    for kind, rows in (("tenants", section["tenants"]), ("adapters", section["adapters"])):
        for name, r in rows.items():
            why = ", ".join(f"{k} {v:.0f}" for k, v in sorted(r["stored_tokens"].items()) if v and k != MISSING)
            ratio = "n/a" if r["hit_ratio"] is None else f"{100 * r['hit_ratio']:.1f} %"
            shown = name or ("(no salt)" if kind == "tenants" else "(base model)")
            lines.append(f"    {kind[:-1]:<7} {shown:<18} hit ratio {ratio:>7}  missed {r['missed_tokens']:.0f}"
                         + (f" ({why})" if why else ""))
    return lines
