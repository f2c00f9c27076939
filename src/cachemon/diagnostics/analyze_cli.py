"""`cachemon analyze`: the click command and its two output formats (text for people,
JSON for scripts). The work itself is in `analyze.py`."""
from __future__ import annotations

import json
import os
import sys

import click

from cachemon.diagnostics.requests_io import RequestsFileError
from cachemon.diagnostics.tokenize import MissingExtraError, TokenizerDirError

SKIPS_SHOWN = 10


@click.command("analyze")
@click.argument("requests", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--tokenizer", "tokenizer_dir", type=click.Path(file_okay=False),
              help="Model directory with tokenizer.json and the chat template (exact mode). "
                   "Without it: approximate mode on bytes.")
@click.option("--block-size", default=16, show_default=True, type=click.IntRange(min=1),
              help="vLLM KV block size (16 on GPUs by default, 128 on the CPU backend).")
@click.option("--cache-blocks", type=click.IntRange(min=2),
              help="KV cache size in blocks as vLLM counts it (num_gpu_blocks, incl. its null block); "
                   "default unlimited (nothing evicted).")
@click.option("--lora-model", "lora_models", multiple=True, metavar="NAME",
              help="A `model` value that is a LoRA adapter (its blocks never match the base model's); repeatable.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--redact", is_flag=True, help="Never show prompt text (patterns and sample values are withheld).")
@click.option("--top", default=3, show_default=True, type=click.IntRange(min=0),
              help="How many causes get a what-if re-simulation.")
def analyze_command(requests, tokenizer_dir, block_size, cache_blocks, lora_models, fmt, redact, top):
    """Predict vLLM's prefix-cache hits for REQUESTS (JSONL, one request body per line;
    several files are one stream, in order) and name what breaks prefix reuse."""
    from cachemon.diagnostics.analyze import analyze
    from cachemon.diagnostics.tokenize import load_encoder

    try:
        encoder = load_encoder(tokenizer_dir)
        fp = _fingerprint(tokenizer_dir) if tokenizer_dir else None
        total = sum(os.path.getsize(p) for p in requests if os.path.isfile(p))
        for p in requests:
            if not os.path.isfile(p):
                raise RequestsFileError(f"cannot read {p}: no such file")
        if sys.stderr.isatty():
            with click.progressbar(length=2 * total if top else total, label="analyzing", file=sys.stderr) as bar:
                def progress(n):
                    bar.update(min(n, bar.length) - bar.pos)
                res = analyze(list(requests), encoder, block_size=block_size, cache_blocks=cache_blocks,
                              lora_models=lora_models, top=top, progress=progress)
                bar.update(bar.length - bar.pos)
        else:
            res = analyze(list(requests), encoder, block_size=block_size, cache_blocks=cache_blocks,
                          lora_models=lora_models, top=top)
    except (TokenizerDirError, MissingExtraError, RequestsFileError) as e:
        click.echo(f"cachemon analyze: {e}", err=True)
        sys.exit(2)
    if fmt == "json":
        click.echo(json.dumps(to_json(res, fp, tokenizer_dir, redact), indent=1))
    else:
        click.echo(to_text(res, fp, tokenizer_dir, redact))


def _fingerprint(d):
    from cachemon.runtime.fingerprint import fingerprint_dir
    try:
        fp = fingerprint_dir(d)
        return {"tokenizer": fp["tokenizer"], "chat_template": fp["chat_template"]}
    except TokenizerDirError:
        return None


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _num(n: int) -> str:
    return f"{n:,}".replace(",", " ")


def cause_json(rank, c, what_ifs, redact):
    d = {
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


def to_json(res, fp, tokenizer_dir, redact: bool) -> dict:
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
                        for f, ln, p, c in zip(res.sources, res.lines, res.prompt_tokens, res.cached_tokens)],
        "observed": None if not res.observed_compared else {
            "requests": res.observed_compared, "prompt_tokens_match": res.observed_prompt_match,
            "cached_tokens_match": res.observed_cached_match, "mismatch_lines": res.observed_mismatch_lines},
        "oversized_requests": res.oversized,
        "skipped": {"count": res.skipped_count, "lines": [{"line": s.line, "reason": s.reason} for s in res.skipped]},
        "causes": [cause_json(i, c, res.what_ifs.get(i, []), redact) for i, c in enumerate(res.causes)],
        "what_if_all": None if res.combined is None else {
            "causes": len(res.combined.fix.fixes), "hit_ratio_before": round(res.combined.hit_ratio_before, 6),
            "hit_ratio_after": round(res.combined.hit_ratio_after, 6),
            "cached_tokens_after": res.combined.cached_tokens_after},
    }


def to_text(res, fp, tokenizer_dir, redact: bool) -> str:
    out = [f"cachemon analyze: {res.path}"]
    if res.approximate:
        out.append("  APPROXIMATE: no --tokenizer, so tokens are UTF-8 bytes of a generic rendering; "
                   "divergences are real, counts are not vLLM's.")
    else:
        fps = f" (tokenizer {fp['tokenizer']}, chat template {fp['chat_template'] or 'none'})" if fp else ""
        out.append(f"  tokenizer: {tokenizer_dir}{fps}")
    cache = "unlimited" if res.cache_blocks is None else f"{res.cache_blocks} blocks, LRU"
    out.append(f"  block size {res.block_size}, cache {cache}")
    skipped = f", {res.skipped_count} skipped" if res.skipped_count else ""
    out.append(f"  {res.requests} requests{skipped}; {_num(res.total_prompt)} prompt tokens, "
               f"{_num(res.total_cached)} predicted cached -> predicted hit ratio {_pct(res.hit_ratio)}")
    if res.approximate:
        out.append("  (vLLM's usage numbers in the file, if any, are not compared in approximate mode)")
    elif res.observed_compared:
        out.append(f"  vLLM's own usage in the file: prompt_tokens match on {res.observed_prompt_match}/"
                   f"{res.observed_compared}, cached_tokens match on {res.observed_cached_match}/{res.observed_compared}"
                   + (f" (first mismatches at lines {', '.join(res.observed_mismatch_lines[:5])})"
                      if res.observed_mismatch_lines else ""))
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
        out.append(f"All {len(w.fix.fixes)} top causes fixed together: predicted hit ratio "
                   f"{_pct(w.hit_ratio_before)} -> {_pct(w.hit_ratio_after)}")
    if res.skipped_count:
        out.append("")
        out.append(f"Skipped {res.skipped_count} lines:")
        for s in res.skipped[:SKIPS_SHOWN]:
            out.append(f"  line {s.line}: {s.reason}")
        if res.skipped_count > SKIPS_SHOWN:
            out.append(f"  ... and {res.skipped_count - SKIPS_SHOWN} more (--format json lists up to 1000)")
    return "\n".join(out)
