"""`cachemon analyze --by-tenant`: the options it reads and the per-tenant part of its output.

Label safety: a tenant appears only as its configured name or keyed hash (normalise.tenant_label);
nothing here sees the raw salt or user.
"""
from __future__ import annotations

from cachemon.analyze.tenant_split import Share, TenantOptions, TenantReport
from cachemon.jsontypes import JsonObject
from cachemon.normalise.tenant_label import TenantNamer


class TenantConfigError(Exception):
    """--tenant-names / --tenant-key-file cannot be used."""


def _yaml(path: str, what: str) -> object:
    import yaml
    try:
        with open(path, encoding="utf-8") as f:
            return yaml.safe_load(f)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise TenantConfigError(f"cannot read {what} {path}: {str(e).splitlines()[0]}") from e


def check_names(data: object, where: str) -> dict[str, str]:
    """A mapping sha256(salt) hex -> tenant name, by the live config's rules (``kv_events.tenants``;
    its errors name an entry by position, never by a key that may be a salt)."""
    from cachemon.config import ConfigError, tenant_names
    try:
        return tenant_names(data, where)
    except ConfigError as e:
        raise TenantConfigError(str(e)) from e


def read_names(path: str) -> dict[str, str]:
    return check_names(_yaml(path, "--tenant-names"), f"--tenant-names {path}")


def read_config(path: str) -> tuple[dict[str, str], bytes | None]:
    """``kv_events.tenants`` and ``kv_events.tenant_key`` of a cachemon config file: the live ledger's
    naming, so that analyze names every tenant as the ledger does."""
    from cachemon.config import ConfigError, tenant_key
    data = _yaml(path, "--tenant-config")
    kv = data.get("kv_events") if isinstance(data, dict) else None
    if not isinstance(kv, dict):
        raise TenantConfigError(f"--tenant-config {path}: no kv_events section")
    names = check_names(kv.get("tenants") or {}, f"--tenant-config {path}: kv_events.tenants")
    key = kv.get("tenant_key")
    try:
        key = tenant_key(key, f"--tenant-config {path}: kv_events.tenant_key") if key is not None else None
    except ConfigError as e:
        raise TenantConfigError(str(e)) from e
    return names, key.encode("utf-8") if key else None


def read_key(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            key = f.read().strip()
    except OSError as e:
        raise TenantConfigError(f"cannot read --tenant-key-file {path}: {e.strerror or e}") from e
    if len(key) < 16:
        raise TenantConfigError(f"--tenant-key-file {path}: the key must be at least 16 bytes")
    return key


def tenant_options(config_path: str | None, names_path: str | None, key_path: str | None, by: str,
                   top: int) -> TenantOptions:
    """--tenant-config gives the ledger's names and key; --tenant-names / --tenant-key-file override them."""
    names, key = read_config(config_path) if config_path else ({}, None)
    if names_path:
        names = read_names(names_path)
    if key_path:
        key = read_key(key_path)
    return TenantOptions(TenantNamer(names, key), by, top)


def _ratio(num: int, den: int) -> float | None:
    return round(num / den, 6) if den else None


def _share_json(s: Share) -> JsonObject:
    return {"requests": s.requests, "prompt_tokens": s.prompt_tokens, "cached_tokens": s.cached_tokens,
            "hit_ratio": _ratio(s.cached_tokens, s.prompt_tokens),
            "observed_cached_tokens": s.observed_cached_tokens if s.observed_requests else None,
            "full_report_cached_tokens": s.full_report_cached_tokens,
            "stored_tokens": dict(s.stored), "missed_tokens": s.missed}


def tenants_json(rep: TenantReport | None) -> JsonObject | None:
    if rep is None:
        return None
    return {"tenant_by": rep.by, "naming": rep.naming,
            "note": "stored tokens per reason as the live ledger's cachemon_kv_tenant_stored_tokens_total; "
                    "isolation: content cached under another salt or adapter at that moment",
            "tenants": {t: _share_json(s) for t, s in rep.tenants.items()},
            "adapters": {a: _share_json(s) for a, s in rep.adapters.items()},
            "pairs": [{"tenant": t, "adapter": a, **_share_json(s)} for (t, a), s in rep.pairs.items()],
            "tenants_in_other": rep.tenants_folded, "isolation_index_compactions": rep.index_compactions}


def _num(n: int) -> str:
    return f"{n:,}".replace(",", " ")     # as the rest of analyze's text


def _rows(title: str, shares: dict[str, Share], noname: str) -> list[str]:
    out = [f"  {title:<18} {'requests':>8} {'hit ratio':>9} {'missed':>10}  by reason"]
    for name, s in shares.items():
        ratio = f"{100 * s.hit_ratio:.1f}%" if s.prompt_tokens else "-"
        why = ", ".join(f"{r} {_num(t)}" for r, t in s.stored.items() if t and r != "recompute_last_block") or "-"
        out.append(f"  {(name or noname)[:18]:<18} {s.requests:>8} {ratio:>9} {_num(s.missed):>10}  {why}")
    return out


def tenants_text(rep: TenantReport | None) -> list[str]:
    if rep is None:
        return []
    iso = sum(s.stored["isolation"] for s in rep.tenants.values())
    out = [f"Per tenant (by {rep.by}; names: {rep.naming}):"]
    out += _rows("tenant", rep.tenants, "(no salt)" if rep.by == "salt" else "(no user)")
    if rep.tenants_folded:
        out.append(f"  ({rep.tenants_folded} more tenants summed in `other`; --top-tenants)")
    out += _rows("adapter", rep.adapters, "(base model)")
    out.append(f"  isolation cost: {_num(iso)} tokens recomputed whose content was cached under another "
               "salt or adapter at the time")
    return out
