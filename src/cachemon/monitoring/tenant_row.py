"""The overview dashboard's "Tenants and adapters" row: whose tokens missed, and what isolation costs.

Plain data (title, description, unit, queries); ``dashboards.py`` turns it into Grafana panels with
its own helpers, so this module needs nothing of it. Every name comes from the catalog and every
number from the thresholds.

Label safety: the panels show ``tenant`` as the ledger exports it (a configured name, a keyed hash
``h-...``, ``""`` without a salt, ``other`` past the top-K), never a salt, and only rates of token
counts: no panel puts one tenant's content beside another's.
"""
from __future__ import annotations

from dataclasses import dataclass

from cachemon import catalog as c
from cachemon import thresholds as t
from cachemon.state.ledger.reasons import NOT_MISSES

TITLE = "Tenants and adapters (KV-cache events)"
# What an empty panel of the row says (Grafana shows a panel's noValue in place of "No data"): the row
# selects only series of a named tenant or adapter, so a server without either draws no copies of its total.
NO_TENANTS = "No tenants or adapters: needs a cache_salt or a LoRA adapter in the requests, and KV events"


@dataclass(frozen=True)
class PanelSpec:
    title: str
    description: str
    targets: tuple[tuple[str, str], ...]    # (PromQL, legend)
    w: int = 8
    ratio: bool = False                     # a 0..1 ratio (else tokens per second, stacked)


def _rate(spec: c.MetricSpec, matchers: str) -> str:
    return f"rate({spec.sample_name}{{{matchers}}}[$__rate_interval])"


def panels(matchers: str) -> list[PanelSpec]:
    """The row's panels over the dashboard's selection (``matchers``: job, instance, upstream, model)."""
    stored = c.KV_TENANT_STORED_TOKENS
    named = f'{matchers}, {c.TENANT}!=""'          # tenant="": no cache_salt (an ordinary server's total)
    not_misses = "|".join(sorted(NOT_MISSES))
    missed = f'{named}, {c.REASON}!~"{not_misses}"'
    by_adapter = f'{matchers}, {c.ADAPTER}!="", {c.REASON}!~"{not_misses}"'
    isolation = f'{matchers}, {c.REASON}="isolation"'
    hits = f"sum by ({c.TENANT}) ({_rate(c.KV_TENANT_HIT_TOKENS, named)})"
    kv = f"sum by ({c.TENANT}) ({_rate(stored, named)})"
    # isolation exists only between salts or adapters, but one side may be unnamed: name it in the legend
    # (a tenant or an adapter: `or` keeps one copy of a series both sides select)
    by_pair = f"sum by ({c.TENANT}, {c.ADAPTER})"
    salted = f'{isolation}, {c.TENANT}!=""'
    adapted = f'{isolation}, {c.ADAPTER}!=""'
    isolated = (f"label_replace(label_replace(\n{by_pair} ({_rate(stored, salted)})\n"
                f"or {by_pair} ({_rate(stored, adapted)}),\n"
                f'"{c.TENANT}", "no salt", "{c.TENANT}", ""), "{c.ADAPTER}", "base model", "{c.ADAPTER}", "")')
    never = ("Tenant: the name configured for the cache_salt, else h- and a keyed hash, empty without a salt, "
             "`other` past the label budget; never the salt. Adapter: the LoRA name, empty for the base model. "
             "Empty on a server whose requests carry neither (its total is the panels above).")
    return [
        PanelSpec("Missed tokens by tenant",
                  "Tokens vLLM computed and stored per second, per tenant, for every reason but "
                  f"{' and '.join(sorted(NOT_MISSES))} ({stored.sample_name}). " + never,
                  ((f"sum by ({c.TENANT}) ({_rate(stored, missed)})", "{{tenant}}"),)),
        PanelSpec("Missed tokens by adapter",
                  "The same per LoRA adapter: would these adapters share a prefix if they could? See the "
                  "isolation panel. " + never,
                  ((f"sum by ({c.ADAPTER}) ({_rate(stored, by_adapter)})", "{{adapter}}"),)),
        PanelSpec("Isolation cost by tenant and adapter",
                  "Tokens per second recomputed only because of the separation: their token content was cached "
                  "at that moment under another salt or adapter (reason isolation). What a cache_salt costs, "
                  "and what adapters sharing a prompt would save. " + never,
                  ((isolated, "tenant {{tenant}}, adapter {{adapter}}"),)),
        PanelSpec("Missed tokens by tenant and reason",
                  "Each tenant's misses by reason: first (new content on every request points at a per-request "
                  "value at the head of its prompts), isolation, capacity, reset, restart, routing. " + never,
                  ((f"sum by ({c.TENANT}, {c.REASON}) ({_rate(stored, missed)})", "{{tenant}}: {{reason}}"),),
                  w=12),
        PanelSpec("Hit ratio by tenant (full-report requests)",
                  "KV tokens served from the prefix cache / (served + stored), per tenant, from requests that ask "
                  "vLLM for a full KV-cache report; no line for requests without a cache_salt (stores are per tenant, "
                  f"lookups are not). CachemonTenantHitRatioCollapsed fires below {t.TENANT_HIT_RATIO_LOW:.0%} "
                  "while the model's other tenants hold. " + never,
                  ((f"{hits}\n/ (({hits} + {kv} or {hits}) > 0)", "{{tenant}}"),), w=12, ratio=True),
    ]
