"""`cachemon analyze`: the click command and its two output formats (text for people,
JSON for scripts). The work itself is in `analyze.py`."""
from __future__ import annotations

import json
import os
import sys

import click

from cachemon.analyze.output import to_json, to_text
from cachemon.analyze.pool_plot import PlotError, plot_pool_curve
from cachemon.analyze.requests_io import RequestsFileError
from cachemon.analyze.server_config import (
    ServerConfigError,
    choose_block_size,
    free_order_note,
    read_cache_config,
    server_version,
)
from cachemon.analyze.sim.fleet import ROUTING_POLICIES
from cachemon.analyze.sim.window import resolve_window
from cachemon.analyze.tenant_report import TenantConfigError, tenant_options
from cachemon.analyze.tenant_split import TENANT_BY
from cachemon.analyze.tokenize import MissingExtraError, TokenizerDirError
from cachemon.normalise.eras import PLATFORMS
from cachemon.normalise.server_profile import ServerProfile


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
              help="Also replay the same requests under this block size (the same pool in tokens, as near as whole "
                   "blocks allow: the report says by how much), side by side "
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
        server = read_cache_config(upstream, metrics_file, log_file, block_size is not None) \
            if (upstream or metrics_file or log_file) else None
        version, version_source = server_version(vllm_version, upstream, log_file)
        chosen = choose_block_size(block_size, server, version, version_source, platform)
        config_note = chosen.note + _pool_note(server, cache_blocks)
        block_size = chosen.tokens
        if cache_blocks is None and server is not None and server.num_blocks:
            cache_blocks = server.num_blocks
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
                      server: ServerProfile | None) -> tuple[int, int | None, str]:
    """The simulation's block (hits land on its multiples) and pool: the match unit where it is not the
    block, the pool kept in tokens. Returns (block, blocks, a note for the config line)."""
    source = "--match-unit"
    if match_unit is None and server is not None and server.match_floor:
        match_unit, source = server.match_floor, f"{server.match_floor_source} in {server.source_of('match_floor')}"
    if match_unit is None or match_unit == block_size:
        return block_size, cache_blocks, ""
    blocks = max(2, cache_blocks * block_size // match_unit) if cache_blocks else None
    return match_unit, blocks, f"; hits land on {match_unit}-token boundaries ({source}): simulated in units of it"


def _pool_note(server: ServerProfile | None, cache_blocks: int | None) -> str:
    if cache_blocks is None and server is not None and server.num_blocks:
        return f"; pool of {server.num_blocks} blocks read from {server.source}"
    return ""


def _fingerprint(d: str) -> dict[str, str] | None:
    from cachemon.sources.fingerprint import fingerprint_dir
    try:
        fp = fingerprint_dir(d)
        return {"tokenizer": fp["tokenizer"], "chat_template": fp["chat_template"]}
    except TokenizerDirError:
        return None


