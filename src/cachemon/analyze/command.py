"""`cachemon analyze`: the click command and its two output formats (text for people,
JSON for scripts). The work itself is in `analyze.py`."""
from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any

import click

from cachemon.analyze.divergence import Cause, CombinedFix
from cachemon.analyze.pool_plot import PlotError, plot_pool_curve
from cachemon.analyze.requests_io import RequestsFileError
from cachemon.analyze.server_config import (
    ServerCacheConfig,
    ServerConfigError,
    choose_block_size,
    free_order_note,
    read_cache_config,
    server_version,
)
from cachemon.analyze.sim.fleet import ROUTING_POLICIES
from cachemon.analyze.sim.window import resolve_window
from cachemon.analyze.tenant_report import TenantConfigError, tenant_options, tenants_json, tenants_text
from cachemon.analyze.tenant_split import TENANT_BY
from cachemon.analyze.tokenize import MissingExtraError, TokenizerDirError
from cachemon.normalise.block_sizes import PLATFORMS

if TYPE_CHECKING:
    from cachemon.analyze.pipeline import AnalyzeResult, WhatIf

SKIPS_SHOWN = 10


@click.command("analyze")
@click.argument("requests", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--tokenizer", "tokenizer_dir", type=click.Path(file_okay=False),
              help="Model directory with tokenizer.json and the chat template (exact mode). "
                   "Without it: approximate mode on bytes.")
@click.option("--block-size", type=click.IntRange(min=1),
              help="vLLM KV block size. Default: read from --upstream / --metrics-file / --log-file, else the "
                   "default of the release (--vllm-version, the log or the server's /version) on --platform "
                   "(GPU: 16 up to 0.33, 64 from 0.34.0; CPU: 128), else 64, stated as an assumption.")
@click.option("--platform", type=click.Choice(PLATFORMS), default=None,
              help="Where the server ran (its default block size): gpu or cpu. Default: cpu for a '+cpu' "
                   "version, else gpu, stated as an assumption.")
@click.option("--compare-block-size", "compare_block_size", type=click.IntRange(min=1), metavar="TOKENS",
              help="Also replay the same requests under this block size (the same pool in tokens), side by side "
                   "with today's: what an upgrade that moves the block size (vLLM 0.34: 16 -> 64 on GPUs) costs.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="Draw the pool-size curve (hit ratio against KV pool size, the current pool marked) to FILE "
                   "(.png or .svg; needs the `plot` extra: pip install 'cachemon[plot]').")
@click.option("--match-unit", type=click.IntRange(min=1),
              help="Token boundary prefix-cache hits land on when it is not the block (hybrid and sliding-window "
                   "models). Default: the server's match floor read from --upstream / --metrics-file "
                   "(cachemon_prefix_cache_match_floor_tokens), else the block size.")
@click.option("--sliding-window", "sliding_window", type=click.IntRange(min=0), metavar="TOKENS",
              help="The model's sliding window (0: none): a hit needs the window before it cached in the "
                   "sliding-window layers' group, which keeps it only before each prompt's end and before a "
                   "shared prefix seen once. Default: read from --model-config, else config.json in --tokenizer.")
@click.option("--model-config", type=click.Path(exists=True),
              help="The model's config.json (or its directory): sliding_window and layer_types say whether "
                   "and how the model slides. Default: config.json in --tokenizer.")
@click.option("--cache-blocks", type=click.IntRange(min=2),
              help="KV cache size in blocks as vLLM counts it (num_gpu_blocks, incl. its null block). "
                   "Default: the server's num_gpu_blocks from --upstream / --metrics-file, else unlimited.")
@click.option("--upstream", metavar="URL",
              help="A vLLM server (base URL or its /metrics URL): block size and pool size are read "
                   "from its vllm:cache_config_info.")
@click.option("--metrics-file", type=click.Path(dir_okay=False),
              help="A saved vLLM /metrics page to read vllm:cache_config_info from (instead of --upstream).")
@click.option("--log-file", type=click.Path(dir_okay=False),
              help="The vLLM server's log: block size and pool from its start-up lines, where the page has no "
                   "vllm:cache_config_info (vLLM 0.32's Rust frontend) or without --upstream / --metrics-file.")
@click.option("--vllm-version", metavar="VERSION",
              help="The vLLM release the traffic ran on: where it puts freed blocks without a hash (before 0.24.0 "
                   "at the free queue's end, then at its front). Default: read from --log-file, else --upstream's "
                   "/version, else the newest order.")
@click.option("--completion-tokens", "default_completion", type=click.IntRange(min=1), default=1,
              show_default=True,
              help="Generated tokens assumed for a request whose line has no usage.completion_tokens "
                   "(decode blocks take room in a finite pool).")
@click.option("--reset-at", "reset_at", multiple=True, metavar="LINE",
              help="Empty the simulated cache before this line (N, or FILE:N in a multi-file stream), "
                   "e.g. where the server was restarted; repeatable.")
@click.option("--reset-at-time", "reset_times", multiple=True, metavar="TIME",
              help="Empty the simulated cache before the first line whose `time` is at or after TIME "
                   "(epoch seconds or ISO 8601); repeatable.")
@click.option("--replicas", default=1, show_default=True, type=click.IntRange(min=1),
              help="Replicas the traffic ran on (each with its own cache), routed by --routing.")
@click.option("--routing", type=click.Choice(ROUTING_POLICIES), default="round-robin", show_default=True,
              help="How requests were spread over --replicas.")
@click.option("--compare-routing", "compare_routing", type=click.IntRange(min=0), default=0, metavar="N",
              help="Also simulate N replicas under every routing policy and report each fleet's hit ratio.")
@click.option("--seed", default=0, show_default=True, help="Seed of the random routing policy.")
@click.option("--curve/--no-curve", default=True, show_default=True,
              help="Hit ratio for every KV pool size, in one pass.")
@click.option("--lora-model", "lora_models", multiple=True, metavar="NAME",
              help="A `model` value that is a LoRA adapter (its blocks never match the base model's); repeatable.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--redact", is_flag=True, help="Never show prompt text (patterns and sample values are withheld).")
@click.option("--top", default=3, show_default=True, type=click.IntRange(min=0),
              help="How many causes get a what-if re-simulation.")
@click.option("--by-tenant", is_flag=True,
              help="Split hits and stored tokens (by reason, isolation included) per tenant and per adapter. "
                   "Implied by the other --tenant* options.")
@click.option("--tenant-by", type=click.Choice(TENANT_BY), default=None,
              help="What names a tenant: the request's cache_salt (default, as the live ledger) or its `user`.")
@click.option("--tenant-config", type=click.Path(dir_okay=False),
              help="A cachemon config file: its kv_events.tenants and kv_events.tenant_key name tenants exactly "
                   "as the live ledger does.")
@click.option("--tenant-names", type=click.Path(dir_okay=False),
              help="JSON or YAML mapping sha256(salt) hex -> tenant name (as kv_events.tenants); "
                   "other salts get a keyed hash.")
@click.option("--tenant-key-file", type=click.Path(dir_okay=False),
              help="The HMAC key of the keyed-hash tenant names (the live ledger's key gives the same names). "
                   "Without it: a random key, names valid for this run only.")
@click.option("--top-tenants", default=10, show_default=True, type=click.IntRange(min=0),
              help="Tenants shown by name (most missed tokens first); the rest are summed as `other`.")
def analyze_command(requests: tuple[str, ...], tokenizer_dir: str | None, block_size: int | None, match_unit: int | None,
                    sliding_window: int | None, model_config: str | None, cache_blocks: int | None,
                    upstream: str | None, metrics_file: str | None, log_file: str | None,
                    vllm_version: str | None, platform: str | None, compare_block_size: int | None,
                    plot_path: str | None, default_completion: int,
                    reset_at: tuple[str, ...], reset_times: tuple[str, ...], replicas: int, routing: str,
                    compare_routing: int, seed: int, curve: bool, lora_models: tuple[str, ...], fmt: str,
                    redact: bool, top: int, by_tenant: bool, tenant_by: str | None, tenant_config: str | None,
                    tenant_names: str | None, tenant_key_file: str | None, top_tenants: int) -> None:
    """Predict vLLM's prefix-cache hits for REQUESTS (JSONL, one request body per line;
    several files are one stream, in order) and name what breaks prefix reuse."""
    from cachemon.analyze.pipeline import analyze
    from cachemon.analyze.requests_io import parse_time
    from cachemon.analyze.tokenize import load_encoder
    from cachemon.sources.exposition import is_float

    try:
        times = []
        for t in reset_times:
            v = parse_time(float(t) if is_float(t) else t)
            if v is None:
                raise click.BadParameter(f"{t!r} is neither epoch seconds nor ISO 8601", param_hint="--reset-at-time")
            times.append(v)
        server = read_cache_config(upstream, metrics_file, log_file) if (upstream or metrics_file or log_file) else None
        if server is not None and not server.block_size and block_size is None and server.from_log:
            raise ServerConfigError(f"{server.source}: pass --block-size")
        version, version_source = server_version(vllm_version, upstream, log_file)
        chosen = choose_block_size(block_size, server, version, version_source, platform)
        config_note = chosen.note + _pool_note(server, cache_blocks)
        block_size = chosen.tokens
        if cache_blocks is None and server is not None and server.num_gpu_blocks:
            cache_blocks = server.num_gpu_blocks
        block_size, cache_blocks, unit_note = match_unit_blocks(block_size, cache_blocks, match_unit, server)
        config_note += unit_note
        order, order_note = free_order_note(version, version_source)
        uncached_first = order.uncached_first
        config_note += f"; {order_note}" if cache_blocks is not None else ""
        try:
            window = resolve_window(sliding_window, model_config, tokenizer_dir)
        except ValueError as e:
            raise ServerConfigError(str(e)) from None
        if window is not None:
            config_note += "; " + window.describe()
        tenants = None
        if by_tenant or tenant_by or tenant_config or tenant_names or tenant_key_file:
            tenants = tenant_options(tenant_config, tenant_names, tenant_key_file, tenant_by or "salt", top_tenants)
        encoder = load_encoder(tokenizer_dir)
        fp = _fingerprint(tokenizer_dir) if tokenizer_dir else None
        total = sum(os.path.getsize(p) for p in requests if os.path.isfile(p))
        for p in requests:
            if not os.path.isfile(p):
                raise RequestsFileError(f"cannot read {p}: no such file")
        if sys.stderr.isatty():
            length = 2 * total if top else total
            with click.progressbar(length=length, label="analyzing", file=sys.stderr) as bar:
                def progress(n: int) -> None:
                    bar.update(min(n, length) - bar.pos)
                res = analyze(list(requests), encoder, block_size=block_size, cache_blocks=cache_blocks,
                              lora_models=lora_models, top=top, progress=progress, reset_at=reset_at,
                              reset_times=times, default_completion=default_completion, replicas=replicas,
                              routing=routing, compare_routing=compare_routing, seed=seed, curve=curve,
                              tenants=tenants, window=window, uncached_first=uncached_first,
                              compare_block_size=compare_block_size)
                bar.update(length - bar.pos)
        else:
            res = analyze(list(requests), encoder, block_size=block_size, cache_blocks=cache_blocks,
                          lora_models=lora_models, top=top, reset_at=reset_at, reset_times=times,
                          default_completion=default_completion, replicas=replicas, routing=routing,
                          compare_routing=compare_routing, seed=seed, curve=curve, tenants=tenants, window=window,
                          uncached_first=uncached_first, compare_block_size=compare_block_size)
        res.config_note = config_note
        res.block_size_assumed = chosen.assumed
        res.free_order = order.name if cache_blocks is not None else ""
        if plot_path:
            plot_pool_curve(res, plot_path)
    except (TokenizerDirError, MissingExtraError, RequestsFileError, ServerConfigError, TenantConfigError,
            PlotError) as e:
        click.echo(f"cachemon analyze: {e}", err=True)
        sys.exit(2)
    if fmt == "json":
        click.echo(json.dumps(to_json(res, fp, tokenizer_dir, redact), indent=1))
    else:
        click.echo(to_text(res, fp, tokenizer_dir, redact))


def match_unit_blocks(block_size: int, cache_blocks: int | None, match_unit: int | None,
                      server: ServerCacheConfig | None) -> tuple[int, int | None, str]:
    """The simulation's block (hits land on its multiples) and pool: the match unit where it is not the
    block, the pool kept in tokens. Returns (block, blocks, a note for the config line)."""
    source = "--match-unit"
    if match_unit is None and server is not None and server.match_unit:
        match_unit, source = server.match_unit, f"{server.match_unit_source} in {server.source}"
    if match_unit is None or match_unit == block_size:
        return block_size, cache_blocks, ""
    blocks = max(2, cache_blocks * block_size // match_unit) if cache_blocks else None
    return match_unit, blocks, f"; hits land on {match_unit}-token boundaries ({source}): simulated in units of it"


def _pool_note(server: ServerCacheConfig | None, cache_blocks: int | None) -> str:
    if cache_blocks is None and server is not None and server.num_gpu_blocks:
        return f"; pool of {server.num_gpu_blocks} blocks read from {server.source}"
    return ""


def _fingerprint(d: str) -> dict[str, str] | None:
    from cachemon.sources.fingerprint import fingerprint_dir
    try:
        fp = fingerprint_dir(d)
        return {"tokenizer": fp["tokenizer"], "chat_template": fp["chat_template"]}
    except TokenizerDirError:
        return None


def _fixes(w: WhatIf) -> int:
    """How many causes' fixes a what-if applied (the combined one: all the top causes')."""
    return len(w.fix.fixes) if isinstance(w.fix, CombinedFix) else 1


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _num(n: int) -> str:
    return f"{n:,}".replace(",", " ")


def cause_json(rank: int, c: Cause, what_ifs: list[WhatIf], redact: bool) -> dict[str, Any]:
    d: dict[str, Any] = {
        "rank": rank + 1, "class": c.klass, "location": c.location, "role": c.role, "message_index": c.msg_index,
        "char_span": list(c.char_span) if c.char_span else None, "requests": c.requests,
        "tokens_lost": c.tokens_lost, "first_diverging_token": c.first_pos, "example_lines": c.lines,
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


def to_json(res: AnalyzeResult, fp: dict[str, str] | None, tokenizer_dir: str | None, redact: bool) -> dict[str, Any]:
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
        "files": res.files,
        "per_request": [{"file": f, "line": ln, "prompt_tokens": p, "cached_tokens": c}
                        for f, ln, p, c in zip(res.sources, res.lines, res.prompt_tokens, res.cached_tokens, strict=False)],
        "block_size_source": res.config_note,
        "block_size_assumed": res.block_size_assumed,
        "block_size_comparison": block_compare_json(res),
        "free_order": res.free_order or None,     # normalise/eras.FREE_ORDERS (None: unlimited pool, no eviction)
        "sliding_window": None if res.window is None else {
            "tokens": res.window.tokens, "hybrid": res.window.hybrid, "source": res.window.source},
        "events": {"count": res.events_count, "first": res.events},
        "completion_tokens_assumed": {"requests": res.completion_assumed, "tokens": res.default_completion},
        "observed": None if not res.observed_compared else {
            "requests": res.observed_compared, "prompt_tokens_match": res.observed_prompt_match,
            "cached_tokens_reported": res.cached_reported,
            "cached_tokens_compared": res.cached_compared if res.cached_reported else 0,
            "cached_tokens_match": res.cached_matched if res.cached_reported else None,
            "prompt_tokens_details_null": res.null_details,
            "mismatch_lines": res.mismatch_lines},
        "oversized_requests": res.oversized,
        "replicas": res.replicas, "routing": res.routing if res.replicas > 1 else None,
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
                             "requests_per_replica": res.routing_spread.get(p)}
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


def shortfall_json(res: AnalyzeResult) -> dict[str, Any] | None:
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


def split_json(res: AnalyzeResult) -> dict[str, Any] | None:
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
        out.append(f"  {p:<21} {_num(c):>12}  {_pct(c / t if t else 0.0):>7}  {vs:<22} requests per replica {spread}")
    out.append(f"  -> best: {best} (policies: docs/analyze.md, 'Routing')")
    return out


def block_compare_json(res: AnalyzeResult) -> dict[str, Any] | None:
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
            "note": "the same requests on the same setup; the pool keeps its size in tokens"}


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
    return [f"Block size {res.block_size} (today) vs {bc.block_size}, the same requests and pool in tokens:",
            f"  block size {res.block_size:<6} {pool(res.cache_blocks):>16}  {_num(bc.today_cached_tokens):>12} cached  "
            f"{_pct(bc.today_cached_tokens / p):>7}",
            f"  block size {bc.block_size:<6} {pool(bc.cache_blocks):>16}  {_num(bc.cached_tokens):>12} cached  "
            f"{_pct(bc.cached_tokens / p):>7}",
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
    out = [f"cachemon analyze: {res.path}"]
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
    if res.approximate:
        out.append("  (vLLM's usage numbers in the file, if any, are not compared in approximate mode)")
    elif res.observed_compared:
        out.append("  vLLM's own usage in the file: " + observed_text(res))
    if res.oversized:
        out.append(f"  {res.oversized} requests need more blocks than --cache-blocks holds (predicted 0 cached)")
    out.append("")
    if not res.causes:
        out.append("No varying segment in front of reusable text was found.")
    else:
        out.append("What breaks prefix reuse (ranked by tokens of reuse lost):")
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
    extra = (split_text(res) + tenants_text(res.tenants) + pool_text(res) + block_compare_text(res) + routing_text(res)
             + shortfall_text(res))
    if extra:
        out.append("")
        out += extra
    if res.skipped_count:
        out.append("")
        out.append(f"Skipped {res.skipped_count} lines:")
        if res.log_info_requests or res.log_other_lines:
            out.append(f"  (a vLLM server log: {res.log_info_requests} request lines at INFO level, which carry no "
                       f"prompt, cache_salt or user - run vLLM with --log-level DEBUG --enable-log-requests for its "
                       f"`JSON body` lines; {res.log_other_lines} other log lines)")
        for s in res.skipped[:SKIPS_SHOWN]:
            out.append(f"  line {s.line}: {s.reason}")
        if res.skipped_count > SKIPS_SHOWN:
            out.append(f"  ... and {res.skipped_count - SKIPS_SHOWN} more (--format json lists up to 1000)")
    return "\n".join(out)
