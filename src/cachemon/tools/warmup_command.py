"""`cachemon warmup`: the offline command around ``cachemon.runtime.warmup_run.run_warmup``.

The daemon's warm-up trigger and this command share that core; the core lives in the runtime
layer so the sidecar never imports this module (the offline tools may import runtime, not the reverse).
"""
from __future__ import annotations

import json
import sys

import click

from cachemon.cli_options import stopped_by_sigterm, timeout_option, usage_error
from cachemon.config import ConfigError, parse_duration
from cachemon.config.warmup import DEFAULT_MAX_LOAD, WarmupError, load_prompts, parse_rate
from cachemon.runtime.warmup_run import WarmupResult, pct_text, run_warmup

# --- text output --------------------------------------------------------------------------------

def format_result(res: WarmupResult, path: str) -> str:
    lines = [f"warm-up of {res.api}: {res.prompts} prompt(s) from {path}"]
    if res.duplicates:
        lines.append(f"  {res.duplicates} duplicate line(s) sent once")
    if res.skipped:
        lines.append(f"  {len(res.skipped)} line(s) skipped:")
        lines += [f"    line {n}: {why}" for n, why in res.skipped[:20]]
        if len(res.skipped) > 20:
            lines.append(f"    ... and {len(res.skipped) - 20} more")
    b = res.before
    if b is not None and b.load is not None:
        lines.append(f"load before: {b.running or 0:g} running + {b.waiting or 0:g} waiting (limit {res.max_load:g})")
    if res.refused:
        lines.append(f"REFUSED: {res.refused}")
        return "\n".join(lines)
    rate = f"at most {res.rate:g}/s" if res.rate else "unthrottled"
    lines.append(f"sent {len(res.results)} request(s) {rate}, {res.concurrency} in flight, in {res.seconds:.1f} s: "
                 f"{res.ok} ok, {len(res.failed)} failed" + (" (stopped early)" if res.stopped else ""))
    for r in res.failed[:50]:
        lines.append(f"  FAILED prompt {r.index + 1} (line {r.line}): {r.error}")
    if len(res.failed) > 50:
        lines.append(f"  ... and {len(res.failed) - 50} more failures")
    a = res.after
    if b is not None and a is not None:
        lines.append(f"hit ratio since server start: before {pct_text(b.hit_ratio)} ({b.query_tokens or 0:.0f} query tokens), "
                     f"after {pct_text(a.hit_ratio)} ({a.query_tokens or 0:.0f} query tokens)")
        lines.append(f"hit ratio during the warm-up (counter deltas; includes any other traffic): {pct_text(res.delta_ratio)}")
    ok = [r for r in res.results if r.ok]
    cached = [r.cached_tokens for r in ok if r.cached_tokens is not None]
    if cached:      # null details are 0 once any response has them (the Rust frontend sends null on a miss)
        nulls = len(ok) - len(cached)
        lines.append(f"cached_tokens reported by the server: {sum(cached)} over {len(ok)} request(s)"
                     + (f" ({nulls} with prompt_tokens_details null, i.e. 0 cached)" if nulls else ""))
    return "\n".join(lines)


# --- CLI ------------------------------------------------------------------------------------------

def _parse_rate(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return parse_rate(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


@click.command("warmup")
@click.option("--api", required=True, metavar="URL", help="The vLLM OpenAI server, e.g. http://127.0.0.1:8000.")
@click.option("--prompts", "prompts_path", required=True, type=click.Path(dir_okay=False),
              help="JSONL: one chat/completions request body per line, or {\"request\": body}.")
@click.option("--concurrency", default=1, show_default=True, type=click.IntRange(1, 64), help="Requests in flight.")
@click.option("--rate", default="1/s", show_default=True, metavar="R/s", help="Max requests started per second.")
@click.option("--max-tokens", default=1, show_default=True, type=click.IntRange(1, 4096), help="max_tokens of each request.")
@click.option("--max-load", default=DEFAULT_MAX_LOAD, show_default=True, type=click.FloatRange(0),
              help="Refuse when running + waiting requests are above this.")
@click.option("--force", is_flag=True, help="Warm up even when the server is busy or its load is unknown.")
@timeout_option("60s", "Per-request timeout.")
@click.option("--metrics-url", metavar="URL", help="Where to read load and counters (default API/metrics).")
@click.option("--model", help="Model for prompts that name none (default: the first of /v1/models).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def warmup_command(api: str, prompts_path: str, concurrency: int, rate: str, max_tokens: int, max_load: float,
                   force: bool, timeout: str, metrics_url: str | None, model: str | None, as_json: bool) -> None:
    """Send the stable prefixes (system prompt, tools, few-shot examples) to re-populate the prefix cache.

    Exit codes: 0 all prompts ok, 1 some failed, 2 bad input, 3 refused (server busy or load unknown),
    143 stopped by SIGTERM.
    """
    try:
        r = _parse_rate(rate)
        t = parse_duration(timeout, "--timeout")
        prompts = load_prompts(prompts_path)
        if not prompts.items:
            why = f" ({len(prompts.skipped)} bad line(s), first: line {prompts.skipped[0][0]}: {prompts.skipped[0][1]})" \
                if prompts.skipped else ""
            raise WarmupError(f"no usable prompt in {prompts_path}{why}")
        def show_progress(done: int, total: int) -> None:
            click.echo(f"\rwarm-up: {done}/{total} sent", err=True, nl=done == total)
        progress = show_progress if sys.stderr.isatty() and not as_json else None
        with stopped_by_sigterm("warmup", "requests already sent may still be answered by the server"):
            res = run_warmup(api, prompts, concurrency=concurrency, rate=r, max_tokens=max_tokens,
                             max_load=max_load, force=force, timeout=t, metrics_url=metrics_url, model=model,
                             progress=progress)
    except (WarmupError, ConfigError, click.BadParameter) as e:
        usage_error(e.format_message() if isinstance(e, click.BadParameter) else e, "warmup")
    click.echo(json.dumps(res.to_json(), indent=2) if as_json else format_result(res, prompts_path))
    if res.refused:
        sys.exit(3)
    sys.exit(1 if res.failed else 0)
