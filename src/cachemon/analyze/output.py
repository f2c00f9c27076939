"""`cachemon analyze`'s two output formats: text for people, JSON for scripts (its field names are an
interface)."""
from __future__ import annotations

from cachemon.analyze.divergence import Cause, CombinedFix
from cachemon.analyze.results import AnalyzeResult, WhatIf
from cachemon.analyze.tenant_report import tenants_json, tenants_text
from cachemon.jsontypes import JsonObject


def _fixes(w: WhatIf) -> int:
    """How many causes' fixes a what-if applied (the combined one: all the top causes')."""
    return len(w.fix.fixes) if isinstance(w.fix, CombinedFix) else 1


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _num(n: int) -> str:
    return f"{n:,}".replace(",", " ")


def cause_json(rank: int, c: Cause, what_ifs: list[WhatIf], redact: bool) -> JsonObject:
    d: JsonObject = {
        "rank": rank + 1, "class": c.klass, "location": c.location, "role": c.role, "message_index": c.msg_index,
        "char_span": list(c.char_span) if c.char_span else None, "requests": c.requests,
        "tokens_lost": c.tokens_lost, "first_diverging_token": c.first_pos, "example_lines": [*c.lines],
        "what_if": [{"fix": w.fix.kind, "description": w.fix.description,
                     "hit_ratio_before": round(w.hit_ratio_before, 6), "hit_ratio_after": round(w.hit_ratio_after, 6),
                     "cached_tokens_after": w.cached_tokens_after} for w in what_ifs],
    }
    if not redact:
        d["pattern"] = c.pattern
        d["samples"] = [s[:60] for s in c.samples]
    return d


def observed_text(res: AnalyzeResult) -> str:
    """How the prediction compares with vLLM's usage numbers, in words."""
    text = f"prompt_tokens match on {res.observed_prompt_match}/{res.observed_compared}, "
    if res.cached_reported:
        text += f"cached_tokens match on {res.cached_matched}/{res.cached_compared}"
        if res.null_details:
            text += f" ({res.null_details} with prompt_tokens_details null, i.e. 0 cached)"
    else:
        text += ("cached_tokens not reported (no prompt_tokens_details on any line: a V0 server, or "
                 "--enable-prompt-tokens-details off)")
    if res.mismatch_lines:
        text += f"; first mismatches at lines {', '.join(res.mismatch_lines[:5])}"
    return text


def to_json(res: AnalyzeResult, fp: dict[str, str] | None, tokenizer_dir: str | None, redact: bool) -> JsonObject:
    return {
        "file": res.path,
        "mode": "approximate" if res.approximate else "exact",
        "approximate_note": ("token counts are UTF-8 bytes of a generic rendering, not the model's tokens; "
                             "pass --tokenizer for vLLM-exact numbers") if res.approximate else None,
        "tokenizer": None if not tokenizer_dir else {"path": str(tokenizer_dir), **(fp or {})},
        "block_size": res.block_size,
        "cache_blocks": res.cache_blocks,
        "requests": res.requests,
        "prompt_tokens": res.total_prompt,
        "cached_tokens": res.total_cached,
        "hit_ratio": round(res.hit_ratio, 6),
        "files": [*res.files],
        "per_request": [{"file": f, "line": ln, "prompt_tokens": p, "cached_tokens": c}
                        for f, ln, p, c in zip(res.sources, res.lines, res.prompt_tokens, res.cached_tokens, strict=False)],
        "block_size_source": res.config_note,
        "block_size_assumed": res.block_size_assumed,
        "block_size_comparison": block_compare_json(res),
        "free_order": res.free_order or None,     # normalise/eras.FREE_ORDERS (None: unlimited pool, no eviction)
        "sliding_window": None if res.window is None else {
            "tokens": res.window.tokens, "hybrid": res.window.hybrid, "source": res.window.source},
        "events": {"count": res.events_count, "first": [*res.events]},
        "completion_tokens_assumed": {"requests": res.completion_assumed, "tokens": res.default_completion},
        "observed": None if not res.observed_compared else {
            "requests": res.observed_compared, "prompt_tokens_match": res.observed_prompt_match,
            "cached_tokens_reported": res.cached_reported,
            "cached_tokens_compared": res.cached_compared if res.cached_reported else 0,
            "cached_tokens_match": res.cached_matched if res.cached_reported else None,
            "prompt_tokens_details_null": res.null_details,
            "mismatch_lines": [*res.mismatch_lines]},
        "oversized_requests": res.oversized,
        "replicas": res.replicas, "routing": res.routing if res.replicas > 1 else None,
        "per_replica": None if not res.cached_by_replica else [
            {"replica": i, "requests": n, "cached_tokens": c}
            for i, (n, c) in enumerate(zip(res.requests_by_replica, res.cached_by_replica, strict=True))],
        "pool_curve": None if res.curve is None else {
            "note": "one server, requests one at a time; pool sizes count vLLM's null block; "
                    "the free queue of vLLM >= 0.24.0 (uncached-first)",
            "unlimited_cached_tokens": res.curve[-1] if res.curve else 0,
            "pool_for_80pct_of_unlimited": res.pool_for(0.8), "pool_for_90pct_of_unlimited": res.pool_for(0.9),
            "pool_for_100pct_of_unlimited": res.pool_for(1.0),
            "points": [{"pool_blocks": c, "cached_tokens": t,
                        "hit_ratio": round(t / res.total_prompt, 6) if res.total_prompt else 0.0}
                       for c, t in res.curve_points()]},
        "routing_comparison": None if not res.routing_results else {
            "replicas": res.compare_replicas, "cache_blocks_per_replica": res.cache_blocks,
            "policies": {p: {"cached_tokens": c, "hit_ratio": round(c / t, 6) if t else 0.0,
                             "cached_tokens_vs_round_robin": c - res.routing_results["round-robin"][0],
                             "requests_per_replica": [*res.routing_spread[p]] if p in res.routing_spread else None,
                             "cached_tokens_per_replica": [*res.routing_cached[p]] if p in res.routing_cached else None}
                         for p, (c, t) in res.routing_results.items()}},
        "shortfall": shortfall_json(res),
        "stored_split": split_json(res),
        "tenants": tenants_json(res.tenants),
        "skipped": {"count": res.skipped_count, "lines": [{"line": s.line, "reason": s.reason} for s in res.skipped],
                    "vllm_log_info_request_lines": res.log_info_requests, "vllm_log_other_lines": res.log_other_lines},
        "causes": [cause_json(i, c, res.what_ifs.get(i, []), redact) for i, c in enumerate(res.causes)],
        "what_if_all": None if res.combined is None else {
            "causes": _fixes(res.combined), "hit_ratio_before": round(res.combined.hit_ratio_before, 6),
            "hit_ratio_after": round(res.combined.hit_ratio_after, 6),
            "cached_tokens_after": res.combined.cached_tokens_after},
    }


def shortfall_json(res: AnalyzeResult) -> JsonObject | None:
    sf = res.shortfall
    if sf is None or not sf.prompt_tokens:
        return None
    p = sf.prompt_tokens
    return {"from": "observed" if sf.observed is not None else "predicted",
            "hit_ratio": round(sf.start / p, 6), "ideal_hit_ratio": round(sf.fixed / p, 6),
            "parts": [{"cause": name, "tokens": t, "hit_ratio_points": round(t / p, 6)} for name, t in sf.parts()]}


SPLIT_MEANING = {
    "restart": "cached on this server before its last restart",
    "reset": "cached before a prefix-cache reset",
    "capacity": "cached before, evicted for room",
    "routing": "cached on another replica at the time",
    "first": "never cached before (new text, and the generated blocks)",
    "recompute_last_block": "still cached: a whole-block prompt recomputes its last block (not a miss)",
    "sliding_window": "still cached in the full-attention layers, recomputed: the sliding-window layers lacked "
                      "the window before the hit point",
}


def split_json(res: AnalyzeResult) -> JsonObject | None:
    if not res.stored_split:
        return None
    return {"note": "tokens of the blocks vLLM stores (prompt blocks not hit + blocks filled by generation), "
                    "by reason, as its KV events would show them (docs/kv-events.md)",
            "tokens": dict(res.stored_split), "total": sum(res.stored_split.values()),
            "by_replica": [dict(s) for s in res.stored_split_by_replica] or None,
            "generated_blocks_inferred": res.inferred_generated_blocks,
            "history_dropped": res.history_dropped}


def split_text(res: AnalyzeResult) -> list[str]:
    sp = res.stored_split
    tot = sum(sp.values()) if sp else 0
    if not tot:
        return []
    out = [f"Where the misses go ({_num(tot)} tokens stored: prompt blocks not hit + generated blocks):"]
    for why, t in sp.items():
        if t:
            out.append(f"  {why:<21} {_num(t):>12}  {_pct(t / tot):>7}  {SPLIT_MEANING.get(why, '')}")
    for i, rs in enumerate(res.stored_split_by_replica):
        out.append(f"  replica {i}: " + (", ".join(f"{w} {_num(t)}" for w, t in rs.items() if t) or "nothing stored"))
    if res.inferred_generated_blocks:
        out.append(f"  ({res.inferred_generated_blocks} generated blocks' tokens read from the next turn of their chat)")
    if res.history_dropped:
        out.append(f"  ({res.history_dropped} departed blocks forgotten to bound memory: counted as first)")
    return out


def pool_text(res: AnalyzeResult) -> list[str]:
    if not res.curve or not res.total_prompt:
        return []
    p = res.total_prompt
    full = res.curve[-1]
    order = "vLLM's LRU order" + ("" if res.free_order in ("", "uncached-first") else
                                  f" of >= 0.24.0, not the {res.free_order} free queue simulated above")
    out = [f"KV pool size (one server, {order}; sizes count the null block): unlimited pool -> {_pct(full / p)}"]
    if full:
        need = [(f, c) for f in (0.8, 0.9, 1.0) if (c := res.pool_for(f)) is not None]   # None only without a curve
        out.append("  " + ", ".join(f"{int(f * 100)} % of that needs {_num(c)} blocks ({_num(c * res.block_size)} "
                                    f"tokens)" for f, c in need))
        pts = sorted({c for _, c in need} | ({res.cache_blocks} if res.cache_blocks else set()))
        pts = sorted(set(pts) | {max(2, c // 2) for c in pts})
        out.append("  curve: " + ", ".join(f"{_num(c)} -> {_pct(res.curve[min(c, len(res.curve) - 1)] / p)}"
                                          for c in pts) + " (all points: --format json)")
    return out


def routing_text(res: AnalyzeResult) -> list[str]:
    if not res.routing_results:
        return []
    pool = "unlimited pools" if res.cache_blocks is None else f"{res.cache_blocks} blocks each"
    best = max(res.routing_results.items(), key=lambda kv: kv[1][0])[0]
    rr = res.routing_results["round-robin"][0]
    out = [f"Routing over {res.compare_replicas} replicas ({pool}; requests one at a time), cached tokens per policy:"]
    for p, (c, t) in res.routing_results.items():
        vs = "" if p == "round-robin" else f"{c - rr:+,} vs round-robin".replace(",", " ")
        spread = "/".join(str(n) for n in res.routing_spread.get(p, []))
        held = " / ".join(_num(n) for n in res.routing_cached.get(p, []))
        out.append(f"  {p:<21} {_num(c):>12}  {_pct(c / t if t else 0.0):>7}  {vs:<22} requests per replica {spread}"
                   f" (cached {held})")
    out.append(f"  -> best: {best} (policies: docs/analyze.md, 'Routing')")
    return out


def block_compare_json(res: AnalyzeResult) -> JsonObject | None:
    bc = res.block_compare
    if bc is None:
        return None
    p = res.total_prompt
    return {"today": {"block_size": res.block_size, "cache_blocks": res.cache_blocks,
                      "cached_tokens": bc.today_cached_tokens,
                      "hit_ratio": round(bc.today_cached_tokens / p, 6) if p else 0.0},
            "compared": {"block_size": bc.block_size, "cache_blocks": bc.cache_blocks,
                         "cached_tokens": bc.cached_tokens, "hit_ratio": round(bc.cached_tokens / p, 6) if p else 0.0},
            "tokens_lost": bc.cost,
            "pool_tokens": {"today": None if res.cache_blocks is None else res.cache_blocks * res.block_size,
                            "compared": None if bc.cache_blocks is None else bc.cache_blocks * bc.block_size},
            "note": bc.pool(res.block_size, res.cache_blocks)
            or "the same requests on the same setup; the pool keeps its size in tokens"}


def block_compare_text(res: AnalyzeResult) -> list[str]:
    bc = res.block_compare
    if bc is None or not res.total_prompt:
        return []
    p = res.total_prompt

    def pool(blocks: int | None) -> str:
        return "unlimited pool" if blocks is None else f"{_num(blocks)} blocks"
    if bc.cost > 0:
        verdict = (f"moving the floor to {bc.block_size} costs {_num(bc.cost)} cached tokens "
                   f"({_pct(bc.cost / p)} of the prompt tokens)")
    elif bc.cost < 0:
        verdict = f"block size {bc.block_size} would gain {_num(-bc.cost)} cached tokens"
    else:
        verdict = "no difference on these requests"
    rounded = bc.pool(res.block_size, res.cache_blocks)
    same = "the same requests" + ("" if rounded else " and pool in tokens")
    return [f"Block size {res.block_size} (today) vs {bc.block_size}, {same}:",
            f"  block size {res.block_size:<6} {pool(res.cache_blocks):>16}  {_num(bc.today_cached_tokens):>12} cached  "
            f"{_pct(bc.today_cached_tokens / p):>7}",
            f"  block size {bc.block_size:<6} {pool(bc.cache_blocks):>16}  {_num(bc.cached_tokens):>12} cached  "
            f"{_pct(bc.cached_tokens / p):>7}",
            *([f"  the pool: {rounded}"] if rounded else []),
            f"  {verdict}"]


def shortfall_text(res: AnalyzeResult) -> list[str]:
    sf = res.shortfall
    if sf is None or not sf.prompt_tokens:
        return []
    p = sf.prompt_tokens
    what = "observed (vLLM's usage)" if sf.observed is not None else "predicted"
    out = [(f"Shortfall: {what} {_pct(sf.start / p)} vs ideal {_pct(sf.fixed / p)} "
            f"(unlimited pool, one server, no resets, top causes fixed) = {_pct((sf.fixed - sf.start) / p)}:")]
    for name, t in sf.parts():
        out.append(f"  {name:<32} {_pct(t / p):>8}  ({_num(t)} tokens)")
    return out


def to_text(res: AnalyzeResult, fp: dict[str, str] | None, tokenizer_dir: str | None, redact: bool) -> str:
    out = [f"cachemon analyze: {res.path}"] + _setup_text(res, fp, tokenizer_dir) + [""] + _causes_text(res, redact)
    extra = (split_text(res) + tenants_text(res.tenants) + pool_text(res) + block_compare_text(res) + routing_text(res)
             + shortfall_text(res))
    if extra:
        out += [""] + extra
    if res.skipped_count:
        out += [""] + _skips_text(res)
    return "\n".join(out)


def _setup_text(res: AnalyzeResult, fp: dict[str, str] | None, tokenizer_dir: str | None) -> list[str]:
    """What was simulated (tokenizer, block size, pool, events) and the headline prediction."""
    out = []
    if res.approximate:
        out.append("  APPROXIMATE: no --tokenizer, so tokens are UTF-8 bytes of a generic rendering; "
                   "divergences are real, counts are not vLLM's.")
    else:
        fps = f" (tokenizer {fp['tokenizer']}, chat template {fp['chat_template'] or 'none'})" if fp else ""
        out.append(f"  tokenizer: {tokenizer_dir}{fps}")
    cache = "unlimited" if res.cache_blocks is None else f"{res.cache_blocks} blocks, LRU"
    out.append(f"  block size {res.block_size}, cache {cache}" + (f" ({res.config_note})" if res.config_note else ""))
    if res.block_size_assumed:
        out.append(f"  ASSUMED block size {res.block_size}: every number below depends on it (see above)")
    if res.cache_blocks is not None and res.completion_assumed:
        out.append(f"  {res.completion_assumed} requests have no usage.completion_tokens: {res.default_completion} "
                   "generated token(s) assumed for their decode blocks (--completion-tokens)")
    if res.reset_times_unused:
        out.append(f"  {res.reset_times_unused} --reset-at-time value(s) not applied: no later line carries a `time`")
    if res.events_count:
        out.append(f"  cache emptied {res.events_count} times: " + ", ".join(res.events[:5])
                   + (", ..." if res.events_count > 5 else ""))
    skipped = f", {res.skipped_count} skipped" if res.skipped_count else ""
    out.append(f"  {res.requests} requests{skipped}; {_num(res.total_prompt)} prompt tokens, "
               f"{_num(res.total_cached)} predicted cached -> predicted hit ratio {_pct(res.hit_ratio)}")
    if res.cached_by_replica:
        out.append(f"  on {res.replicas} replicas ({res.routing}): requests "
                   + "/".join(str(n) for n in res.requests_by_replica)
                   + ", cached " + " / ".join(_num(c) for c in res.cached_by_replica))
    if res.approximate:
        out.append("  (vLLM's usage numbers in the file, if any, are not compared in approximate mode)")
    elif res.observed_compared:
        out.append("  vLLM's own usage in the file: " + observed_text(res))
    if res.oversized:
        out.append(f"  {res.oversized} requests need more blocks than --cache-blocks holds (predicted 0 cached)")
    return out


def _causes_text(res: AnalyzeResult, redact: bool) -> list[str]:
    """The ranked causes, each with its what-ifs, and all of them fixed together."""
    if not res.causes:
        out = ["No varying segment in front of reusable text was found."]
    else:
        out = ["What breaks prefix reuse (ranked by tokens of reuse lost):"]
        for i, c in enumerate(res.causes):
            where = c.location
            if c.char_span and c.location not in ("tools", "template"):
                where += f" chars {c.char_span[0]}-{c.char_span[1]}"
            what = c.klass if redact else f"{c.klass} \"{c.pattern}\""
            out.append(f"{i + 1:>2}. {what} in {where}")
            if not redact and c.samples:
                out.append("    e.g. " + ", ".join(f"\"{s[:60]}\"" for s in c.samples))
            out.append(f"    {c.requests} requests, {_num(c.tokens_lost)} tokens of reuse lost; "
                       f"lines {', '.join(c.lines[:3])}{', ...' if c.requests > 3 else ''}")
            for w in res.what_ifs.get(i, []):
                out.append(f"    {w.fix.description}: predicted hit ratio {_pct(w.hit_ratio_before)} -> "
                           f"{_pct(w.hit_ratio_after)}")
    if res.combined is not None:
        w = res.combined
        out.append(f"All {_fixes(w)} top causes fixed together: predicted hit ratio "
                   f"{_pct(w.hit_ratio_before)} -> {_pct(w.hit_ratio_after)}")
    return out


def _skips_text(res: AnalyzeResult) -> list[str]:
    out = [f"Skipped {res.skipped_count} lines:"]
    if res.log_info_requests or res.log_other_lines:
        out.append(f"  (a vLLM server log: {res.log_info_requests} request lines at INFO level, which carry no "
                   f"prompt, cache_salt or user - run vLLM with --log-level DEBUG --enable-log-requests for its "
                   f"`JSON body` lines; {res.log_other_lines} other log lines)")
    for s in res.skipped[:SKIPS_SHOWN]:
        out.append(f"  line {s.line}: {s.reason}")
    if res.skipped_count > SKIPS_SHOWN:
        out.append(f"  ... and {res.skipped_count - SKIPS_SHOWN} more (--format json lists up to 1000)")
    return out


SKIPS_SHOWN = 10
