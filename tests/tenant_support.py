"""The per-tenant split that vLLM's own KV events imply: the yardstick for `cachemon analyze
--tenants` and for the live ledger's per-tenant counters.

Plain reading, block by block, of the real recordings (kv_support.load_messages: msgspec only):

* a chain's tenant is the ``cache_salt`` in its first block's ``extra_keys`` (vLLM 0.32.0 puts
  the untagged salt last in block 0's keys, after the LoRA name; ``generate_block_hash_extra_keys``
  / ``to_event_extra_keys`` in vllm/v1/core/kv_cache_utils.py); a continuation (``parent_block_hash``
  set) inherits its parent's tenant; the adapter is the event's ``lora_name``;
* the reason is kv_support.reference_split's (recompute_last_block, the latest departure, routing,
  first), and a block that would be ``first`` is ``isolation`` when its token content (the token
  chain from the prompt's start, without salt or adapter) is cached on any replica now under
  another (salt, adapter).

Full report mode (``kv_cache_report_mode`` full, vLLM 0.32.0 ``BlockPool.emit_cached_block_events``): at
the lookup vLLM also publishes the blocks a request reused, as a ``BlockStored`` with a null parent of
blocks that are all cached at that moment. Such a report is a hit of the request's tenant, not a store
(a one-block report is ambiguous with a twin, a one-block prompt recomputed while cached: read as a report
once the replica has sent an unambiguous one, as the ledger reads it, docs/kv-events.md).

Tenants come out as ``namer(salt)`` (normalise.tenant_label), so the raw salt never leaves here.
"""
from __future__ import annotations

from collections import Counter

from kv_support import KvMessage

TENANT_REASONS = ("first", "capacity", "reset", "restart", "routing", "recompute_last_block", "isolation",
                  "sliding_window")
HITS = "hits"        # a pseudo-reason of the returned rows: tokens of full-mode reuse reports


def _salt(first_keys, lora: str | None) -> str | None:
    keys = list(first_keys or [])
    if lora is not None and keys and keys[0] == lora:
        keys = keys[1:]
    return keys[-1] if keys and isinstance(keys[-1], str) else None


def _why(rep: str, c: int, cached: dict[str, Counter], departed: dict[str, dict], isolated) -> str:
    """A stored block's reason, in the contract's order (the departure record used up)."""
    if cached[rep][c] > 0:
        return "recompute_last_block"
    if c in departed[rep]:
        return departed[rep].pop(c)
    if any(cs[c] > 0 for r, cs in cached.items() if r != rep):
        return "routing"
    return "isolation" if isolated() else "first"

def reference_tenant_split(messages: list[KvMessage], namer) -> dict[tuple[str, str], dict[str, int]]:
    """{(tenant, adapter): {reason: tokens}} over all replicas, from the events alone."""
    full: dict[tuple, int] = {}        # (parent id, tokens, salt, lora) -> content id
    plain: dict[tuple, int] = {}       # (parent plain id, tokens) -> token-content id
    meta: dict[int, tuple] = {}        # content id -> (plain id, salt, lora)
    cached: dict[str, Counter] = {}    # replica -> content id -> copies
    by_hash: dict[str, dict] = {}      # replica -> vLLM hash -> content id
    departed: dict[str, dict] = {}     # replica -> content id -> how it left
    last_seq: dict[str, int] = {}
    reported: set[str] = set()          # replicas that sent an unambiguous reuse report
    out: dict[tuple[str, str], dict[str, int]] = {}

    def depart_all(rep: str, why: str) -> None:
        for c in cached[rep]:
            departed[rep][c] = why
        cached[rep].clear()
        by_hash[rep].clear()

    def elsewhere_under_other_key(p: int, key: tuple) -> bool:
        return any(n > 0 and meta[c][0] == p and meta[c][1:] != key for cs in cached.values() for c, n in cs.items())

    for m in messages:
        rep = m.replica
        if rep not in cached:
            cached[rep], by_hash[rep], departed[rep] = Counter(), {}, {}
        if m.seq == 0 and rep in last_seq:
            depart_all(rep, "restart")
        last_seq[rep] = m.seq
        for e in m.events:
            kind = e["type"]
            if kind == "BlockRemoved":              # one copy of each goes; the last one: capacity
                gone = Counter(by_hash[rep][h] for h in e["block_hashes"])
                cached[rep].subtract(gone)
                departed[rep].update((c, "capacity") for c in gone if cached[rep][c] <= 0)
                cached[rep] = +cached[rep]
            elif kind == "AllBlocksCleared":
                depart_all(rep, "reset")
            elif kind == "BlockStored":
                bs, toks, lora = e["block_size"], e["token_ids"], e.get("lora_name")
                parent = e.get("parent_block_hash")
                extras = e.get("extra_keys") or []
                hs = e["block_hashes"]
                if parent is None and all(cached[rep][by_hash[rep].get(h, -1)] > 0 for h in hs) \
                        and (len(hs) > 1 or rep in reported):
                    if len(hs) > 1:
                        reported.add(rep)
                    salt = _salt(extras[0] if extras else None, lora)
                    row = out.setdefault((namer(salt), lora or ""), dict.fromkeys(TENANT_REASONS, 0))
                    row[HITS] = row.get(HITS, 0) + len(hs) * bs
                    continue
                if parent is None:
                    pc, pp, salt = None, None, _salt(extras[0] if extras else None, lora)
                else:
                    pc = by_hash[rep][parent]
                    pp, salt, _ = meta[pc]
                key = (salt, lora)
                share = out.setdefault((namer(salt), lora or ""), dict.fromkeys(TENANT_REASONS, 0))
                for k, h in enumerate(e["block_hashes"]):
                    block = tuple(toks[k * bs:(k + 1) * bs])
                    p = plain.setdefault((pp, block), len(plain))
                    c = full.setdefault((pc, block, salt, lora), len(full))
                    meta[c] = (p, salt, lora)
                    share[_why(rep, c, cached, departed, lambda p=p, key=key: elsewhere_under_other_key(p, key))] += bs
                    cached[rep][c] += 1
                    by_hash[rep][h] = c
                    pc, pp = c, p
            else:
                raise AssertionError(f"unknown event type {kind!r}")
    return out


def tenant_samples(folder, fleet, model: str = "tiny", step: float = 15.0, after: int = 30,
                   new_series_hold: float | None = None) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    """Feed ``fleet`` the recording ``folder`` (kv_support.replay's order, a seq back to 0 a restart) and
    read its per-tenant counters every ``step`` seconds of the recording, from one step before its first
    message to ``after`` steps after its last: (what /metrics serves, through the real collector and
    its new-series hold of ``new_series_hold`` seconds on the recording's clock, None: the shipped
    default; what the ledger holds, exact), one {promtool series name: value} per sample. A series not
    on the page is not in the sample."""
    from prometheus_client.parser import text_string_to_metric_families

    from cachemon import catalog as c
    from cachemon.config.kv import KvEventsSettings
    from cachemon.expose.kv_collector import KvLedgerCollector
    from cachemon.expose.new_series import NewSeriesHold
    from cachemon.expose.render import render
    from kv_support import messages
    msgs = messages(folder)
    t0, fed, last = msgs[0]["t"] - 1, 0, {}
    clock = [t0]
    hold = KvEventsSettings().new_series_hold if new_series_hold is None else new_series_hold
    served = KvLedgerCollector(fleet, NewSeriesHold(hold, clock=lambda: clock[0]))
    exact = KvLedgerCollector(fleet)
    wanted = {c.KV_TENANT_STORED_TOKENS.name, c.KV_TENANT_HIT_TOKENS.name}

    def page(col: KvLedgerCollector) -> dict[str, float]:
        row: dict[str, float] = {}
        for fam in text_string_to_metric_families(render([col]).decode()):
            for smp in fam.samples if fam.name in wanted else ():
                lab = dict(smp.labels)
                extra = f', reason="{lab["reason"]}"' if "reason" in lab else ""
                row[f'{smp.name}{{job="cachemon", instance="pod", upstream="{lab["upstream"]}", '
                    f'model_name="{lab["model_name"]}", tenant="{lab["tenant"]}", adapter="{lab["adapter"]}"{extra}}}'] \
                    = smp.value
        return row
    shown: list[dict[str, float]] = []
    true: list[dict[str, float]] = []
    for k in range(int((msgs[-1]["t"] - t0) // step) + 2 + after):
        clock[0] = t0 + k * step
        while fed < len(msgs) and msgs[fed]["t"] <= clock[0]:
            m = msgs[fed]
            if m["replica"] in last and int(m["seq"]) == 0:
                fleet.on_restart(m["replica"], m["t"])
            last[m["replica"]] = int(m["seq"])
            fleet.on_batch(m["replica"], model, m["batch"], m["t"])
            fed += 1
        shown.append(page(served))
        true.append(page(exact))
    return shown, true


def sampled_tenant_series(folder, fleet, model: str = "tiny", step: float = 15.0,
                          hold: int = 30, new_series_hold: float | None = None) -> tuple[list[dict], dict[str, float]]:
    """The per-tenant counters of ``fleet`` fed the recording ``folder`` as Prometheus would scrape them
    from cachemon every ``step`` seconds of the recording (tenant_samples: the page as served, a new
    series at 0 for ``new_series_hold`` seconds), until ``hold`` steps after the recording (cachemon keeps
    serving them): promtool ``input_series`` (``_``: no sample, the series is not on the page yet) and
    the final value of each series."""
    shown, _ = tenant_samples(folder, fleet, model, step, hold, new_series_hold)
    final = shown[-1]
    return [{"series": name, "values": " ".join(f"{s[name]:g}" if name in s else "_" for s in shown)}
            for name in final], final
