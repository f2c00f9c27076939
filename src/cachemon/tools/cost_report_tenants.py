"""`cachemon report`'s per-tenant part: per model, per tenant and per adapter over the period, the
tokens stored by reason (isolation included) and the hits of full-report requests, from the raw samples
of the ledger's counters (the same exact sums as the rest of the report).

Tenants appear as the ledger labels them (a configured name, ``h-`` and a keyed hash, ``""`` without a
salt, ``other``): never a salt.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from cachemon import catalog as C

MISSING = "recompute_last_block"     # stored but not a miss


def _row() -> dict[str, Any]:
    return {"stored_tokens": {}, "hit_tokens": None, "_kv": 0.0}


def _add(into: dict[str, Any], pair: dict[str, Any]) -> None:
    for why, n in pair["stored_tokens"].items():
        into["stored_tokens"][why] = into["stored_tokens"].get(why, 0.0) + n
    if pair["hit_tokens"] is not None:       # the ratio's basis: pairs with full-report requests only
        into["hit_tokens"] = (into["hit_tokens"] or 0.0) + pair["hit_tokens"]
        into["_kv"] += pair["hit_tokens"] + sum(pair["stored_tokens"].values())


def tenant_section(raw: Callable[[str], Iterable[tuple[dict[str, Any], list[Any]]]],
                   increase: Callable[[list[Any]], float]) -> dict[str, Any]:
    """model -> {"tenants": {tenant: row}, "adapters": {adapter: row}}; a row: stored tokens by reason,
    missed tokens, hit tokens (None: no full-report request), and the hit ratio hits / (hits + stored)
    over the (tenant, adapter) pairs that have full-report requests."""
    pairs: dict[tuple[str, str, str], dict[str, Any]] = {}

    def pair(labels: dict[str, Any]) -> dict[str, Any]:
        key = (labels.get(C.MODEL, ""), labels.get(C.TENANT, ""), labels.get(C.ADAPTER, ""))
        return pairs.setdefault(key, _row())

    for labels, pts in raw(C.KV_TENANT_STORED_TOKENS.sample_name):
        st = pair(labels)["stored_tokens"]
        why = labels.get(C.REASON, "")
        st[why] = st.get(why, 0.0) + increase(pts)
    for labels, pts in raw(C.KV_TENANT_HIT_TOKENS.sample_name):
        p = pair(labels)
        p["hit_tokens"] = (p["hit_tokens"] or 0.0) + increase(pts)
    out: dict[str, dict[str, Any]] = {}
    for (model, tenant, adapter), p in pairs.items():
        m = out.setdefault(model, {"tenants": {}, "adapters": {}})
        _add(m["tenants"].setdefault(tenant, _row()), p)
        _add(m["adapters"].setdefault(adapter, _row()), p)
    for m in out.values():
        for r in (*m["tenants"].values(), *m["adapters"].values()):
            r["missed_tokens"] = sum(r["stored_tokens"].values()) - r["stored_tokens"].get(MISSING, 0.0)
            kv = r.pop("_kv")
            r["hit_ratio"] = r["hit_tokens"] / kv if r["hit_tokens"] is not None and kv > 0 else None
    return out


def tenant_lines(section: dict[str, Any] | None) -> list[str]:
    if not section:
        return []
    lines = ["  per tenant / adapter (KV-cache events; hit ratio only with full-report requests):"]
    for kind in ("tenants", "adapters"):
        for name, r in section[kind].items():
            why = ", ".join(f"{k} {v:.0f}" for k, v in sorted(r["stored_tokens"].items()) if v and k != MISSING)
            ratio = "n/a" if r["hit_ratio"] is None else f"{100 * r['hit_ratio']:.1f} %"
            shown = name or ("(no salt)" if kind == "tenants" else "(base model)")
            lines.append(f"    {kind[:-1]:<7} {shown:<18} hit ratio {ratio:>7}  missed {r['missed_tokens']:.0f}"
                         + (f" ({why})" if why else ""))
    return lines
