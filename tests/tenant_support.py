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
                    if cached[rep][c] > 0:
                        why = "recompute_last_block"
                    elif c in departed[rep]:
                        why = departed[rep].pop(c)
                    elif any(cs[c] > 0 for r, cs in cached.items() if r != rep):
                        why = "routing"
                    elif elsewhere_under_other_key(p, key):
                        why = "isolation"
                    else:
                        why = "first"
                    share[why] += bs
                    cached[rep][c] += 1
                    by_hash[rep][h] = c
                    pc, pp = c, p
            else:
                raise AssertionError(f"unknown event type {kind!r}")
    return out


def sampled_tenant_series(folder, fleet, model: str = "tiny", step: float = 15.0,
                          hold: int = 30) -> tuple[list[dict], dict[str, float]]:
    """The per-tenant counters of ``fleet`` fed the recording ``folder`` (kv_support.replay's order, a
    seq back to 0 a restart) as Prometheus would scrape them from cachemon every ``step`` seconds of the
    recording, from one step before its first message; promtool ``input_series`` (a series is 0 before
    its pair exists, and holds its last value ``hold`` steps after the recording: cachemon keeps
    serving it), and the final value of each series."""
    from cachemon import catalog as c
    from kv_support import messages
    msgs = messages(folder)
    t0, samples, fed, last = msgs[0]["t"] - 1, [], 0, {}
    for k in range(int((msgs[-1]["t"] - t0) // step) + 2):      # until every message is in
        while fed < len(msgs) and msgs[fed]["t"] <= t0 + k * step:
            m = msgs[fed]
            if m["replica"] in last and int(m["seq"]) == 0:
                fleet.on_restart(m["replica"], m["t"])
            last[m["replica"]] = int(m["seq"])
            fleet.on_batch(m["replica"], model, m["batch"], m["t"])
            fed += 1
        row: dict[str, float] = {}
        for snap in fleet.snapshot():
            for tenant, adapter, split, hits in snap.tenants:
                lab = f'job="cachemon", instance="pod", upstream="{snap.replica}", model_name="{model}", ' \
                      f'tenant="{tenant}", adapter="{adapter}"'
                for reason, v in split.items():
                    row[f'{c.KV_TENANT_STORED_TOKENS.sample_name}{{{lab}, reason="{reason}"}}'] = v
                row[f"{c.KV_TENANT_HIT_TOKENS.sample_name}{{{lab}}}"] = hits
        samples.append(row)
    final = samples[-1]
    return [{"series": name, "values": " ".join(f"{s.get(name, 0):g}" for s in samples) + f" {final[name]:g}x{hold}"}
            for name in final], final
