"""`cachemon analyze` on a sliding-window model: the REAL captures of tests/fixtures/vllm-0.32.0-cpu-hybrid-swa
(a tiny Gemma-3 text config, window 256, block 128, on real vLLM 0.32.0; the model config is constructed,
the engine's hits and events are real; see its README).

Asserted against the files: with the window read from the recorded model config, analyze predicts vLLM's
usage.cached_tokens for every request of both captures; without it, it predicts hits vLLM did not give
(exactly on the requests whose full-attention prefix the window cut); its split of stored tokens equals the
live ledger's on the same capture's events, the window's cost included. The config readers are checked
on CONSTRUCTED configs (marked below).
"""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from assert_support import nonempty
from cachemon.analyze.pipeline import analyze
from cachemon.analyze.sim.window import (
    SlidingWindow,
    WindowedPrefixCacheSim,
    read_model_window,
    resolve_window,
    window_from_config,
)
from cachemon.analyze.tokenize import ModelTokenizer
from cachemon.cli import main
from cachemon.state.ledger.fleet import FleetLedger
from helpers import FIXTURES
from kv_support import load_requests, messages

SWA = FIXTURES / "vllm-0.32.0-cpu-hybrid-swa"
# swa_partial (window 512) and swa_only (every layer slides) were recorded after the rule was written;
# swa_tiny_pool and swa_pool_mix (a pool of 40 blocks that evicts) after the pool was modelled, and
# swa_chunked (72 blocks, prompts prefilled in two chunks) after the chunks were; swa_multiturn (chats whose
# replies fill blocks, cached by the full-attention group only) last
LARGE_POOL = ("hybrid_swa", "hybrid_swa_full", "swa_partial", "swa_only", "swa_multiturn")
TINY_POOL = ("swa_tiny_pool", "swa_pool_mix", "swa_chunked")
CAPTURES = LARGE_POOL + TINY_POOL
HYBRID_CAPTURES = ("hybrid_swa", "hybrid_swa_full", "swa_partial", "swa_multiturn") + TINY_POOL


@pytest.fixture(scope="module")
def tok():
    return ModelTokenizer(FIXTURES / "vllm-0.32.0-cpu" / "model")    # the tokenizer kv_record.py serves


def _usage(d) -> list[tuple[int, int]]:
    rows = sorted((r for r in load_requests(d) if "usage" in r), key=lambda r: r["t_send"])
    return [(r["usage"]["prompt_tokens"], r["usage"]["prompt_tokens_details"]["cached_tokens"]) for r in rows]


def _config(d) -> tuple[int, int]:
    """(block size, pool in blocks) from the capture's own /metrics page."""
    from cachemon.analyze.server_config import read_cache_config
    cfg = read_cache_config(None, str(d / "metrics-final.txt"))
    assert cfg.block_size is not None and cfg.num_blocks is not None
    return cfg.block_size, cfg.num_blocks


def _block(d) -> int:
    return _config(d)[0]


@pytest.mark.parametrize("name", CAPTURES)
def test_analyze_predicts_every_request_with_the_window(name, tok):
    d = SWA / name
    window = read_model_window(d / "model-config.json")
    assert window is not None and window.hybrid == (name != "swa_only")
    bs, pool = _config(d)
    res = analyze(str(d / "requests.jsonl"), tok, block_size=bs, cache_blocks=pool, what_if=False, window=window)
    want = _usage(d)
    assert list(zip(res.prompt_tokens, res.cached_tokens, strict=True)) == want
    assert sum(res.cached_tokens) == sum(c for _, c in want) > 0


@pytest.mark.parametrize("name", CAPTURES)
def test_the_pool_matters_only_where_it_evicts(name, tok):
    """An unlimited pool gives the same hits on the captures whose pool of 160 blocks evicted nothing, and
    hits vLLM did not give on the 40-block ones (both groups' blocks share that pool)."""
    d = SWA / name
    window = read_model_window(d / "model-config.json")
    res = analyze(str(d / "requests.jsonl"), tok, block_size=_block(d), what_if=False, window=window)
    want = [c for _, c in _usage(d)]
    if name in TINY_POOL:
        assert sum(res.cached_tokens) > sum(want)
        bs, pool = _config(d)      # the block-size rule on the same pool: more hits than vLLM gave too
        plain = analyze(str(d / "requests.jsonl"), tok, block_size=bs, cache_blocks=pool, what_if=False)
        assert sum(plain.cached_tokens) > sum(want)
    else:
        assert list(res.cached_tokens) == want


@pytest.mark.parametrize("name", [n for n in LARGE_POOL if n != "swa_multiturn"])   # there no held prefix was cut
def test_without_the_window_analyze_predicts_hits_vllm_did_not_give(name, tok):
    d = SWA / name
    bs = _block(d)
    plain = analyze(str(d / "requests.jsonl"), tok, block_size=bs, what_if=False)
    window = read_model_window(d / "model-config.json")
    windowed = analyze(str(d / "requests.jsonl"), tok, block_size=bs, what_if=False, window=window)
    want = [c for _, c in _usage(d)]
    wrong = [i for i, (p, c) in enumerate(zip(plain.cached_tokens, want, strict=True)) if p != c]
    assert wrong and all(plain.cached_tokens[i] > want[i] for i in wrong)     # plain rule: too many hits
    # the requests it gets wrong are exactly those whose held full-attention prefix the window cut,
    # and the hits it over-predicts are the window's cost in the split
    assert sum(plain.cached_tokens) - sum(want) == windowed.stored_split["sliding_window"] > 0


@pytest.mark.parametrize("name", HYBRID_CAPTURES)
def test_the_split_equals_the_live_ledgers_on_the_same_events(name, tok):
    d = SWA / name
    window = read_model_window(d / "model-config.json")
    bs, pool = _config(d)
    res = analyze(str(d / "requests.jsonl"), tok, block_size=bs, cache_blocks=pool, what_if=False, window=window)
    fleet = FleetLedger()
    msgs = messages(d)                # cachemon's own decoder: the events' groups and window
    for m in msgs:
        fleet.on_batch(m["replica"], "tiny", m["batch"], m["t"])
    view = fleet.view(msgs[0]["replica"])
    assert view is not None and view.in_sync
    got = {k: v for k, v in res.stored_split.items() if v}
    assert got == {k: int(v) for k, v in view.stored_tokens.items() if v}
    assert got["first"] > 0


def test_a_model_whose_layers_all_slide_gives_the_ledger_no_group_to_follow():
    """swa_only: one KV-cache group, kind sliding_window. The ledger follows full-attention groups only (a
    sliding-window group stores only the blocks it keeps), so it counts every event apart and splits
    nothing; it still exports the window the events name."""
    d = SWA / "swa_only"
    fleet = FleetLedger()
    msgs = messages(d)
    kinds = {(e.group, e.kind, e.window) for m in msgs for e in m["batch"].events if hasattr(e, "kind")}
    assert kinds == {(0, "sliding_window", 256)}
    for m in msgs:
        fleet.on_batch(m["replica"], "tiny", m["batch"], m["t"])
    view = fleet.view(msgs[0]["replica"])
    led = fleet.replica(msgs[0]["replica"])
    assert view is not None and led is not None
    assert view.sliding_window == 256 and not any(view.stored_tokens.values())
    assert led.anomalies["other_groups"] == sum(len(m["batch"].events) for m in msgs) > 0


def test_the_cli_reads_the_window_from_the_model_config(tmp_path):
    d = SWA / "hybrid_swa"
    args = ["analyze", str(d / "requests.jsonl"), "--tokenizer", str(FIXTURES / "vllm-0.32.0-cpu" / "model"),
            "--metrics-file", str(d / "metrics-final.txt"), "--format", "json", "--redact", "--top", "0"]
    runner = CliRunner()
    with_cfg = runner.invoke(main, [*args, "--model-config", str(d / "model-config.json")])
    assert with_cfg.exit_code == 0, with_cfg.output
    out = json.loads(with_cfg.output)
    assert [r["cached_tokens"] for r in out["per_request"]] == [c for _, c in _usage(d)]
    assert out["sliding_window"]["tokens"] == 256 and out["sliding_window"]["hybrid"] is True
    assert out["observed"]["cached_tokens_match"] == len(_usage(d))
    # --sliding-window 0 turns it off: the plain rule, which misses vLLM on some requests
    off = json.loads(runner.invoke(main, [*args, "--model-config", str(d / "model-config.json"),
                                          "--sliding-window", "0"]).output)
    assert off["sliding_window"] is None and off["observed"]["cached_tokens_match"] < len(_usage(d))
    # a model directory with the config (as --tokenizer usually is): found there
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text((d / "model-config.json").read_text())
    assert resolve_window(None, None, str(model)) == read_model_window(model)


# --- the config readers (CONSTRUCTED configs, shaped as the named model families ship them) ------

@pytest.mark.parametrize("cfg, want", [
    ({"sliding_window": 4096, "layer_types": ["sliding_attention"] * 5 + ["full_attention"]}, (4096, True)),
    ({"sliding_window": 4096, "layer_types": ["full_attention"] * 4}, None),             # constructed
    ({"text_config": {"sliding_window": 1024, "sliding_window_pattern": 6}}, (1024, True)),  # Gemma-3 VL style
    ({"sliding_window": 4096, "use_sliding_window": False}, None),                      # Qwen2 style
    ({"sliding_window": 4096}, (4096, False)),                                           # Mistral style
    ({"model_type": "gemma2", "sliding_window": 4096, "cache_implementation": "hybrid"}, (4096, True)),
    ({"sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"] * 12}, (128, True)),  # gpt-oss
    ({"sliding_window": None}, None),
])
def test_window_from_config_constructed(cfg, want):
    w = window_from_config(cfg, "x")
    assert (None if w is None else (w.tokens, w.hybrid)) == want


def test_a_model_whose_layers_all_slide_has_no_full_attention_bound():
    """Constructed: every layer slides (one KV-cache group) or not (hybrid). The second request shares 3
    blocks with the first (394 tokens), whose sliding-window group kept only blocks 1-2 (the window before
    its replay point 393; window 256, block 128): the run before block 3 is held, so the hit is 3 blocks."""
    a = list(range(384 + 10))
    b = a[:384] + [9999] * 200
    for hybrid in (False, True):
        sim = WindowedPrefixCacheSim(128, 256, hybrid)
        assert sim.run(a) == 0
        assert sim.run(b) == 384
    # 2 shared blocks: the window before block 2 needs blocks 0-1, and block 0 was never kept: no hit
    sim = WindowedPrefixCacheSim(128, 256, True)
    sim.run(a)
    assert sim.run(a[:256] + [7] * 300) == 0
    assert SlidingWindow(256).describe().startswith("sliding window 256 tokens")


def test_attribution_names_the_window_cut_with_the_ledgers_exact_tokens():
    """The real hybrid_swa capture replayed in time (its 1 s /metrics polls and its KV events, as
    `cachemon run` wires them): the misses the window forced are named sliding_window, exact, with the
    ledger's tokens, and never read as a dynamic prefix."""
    from cachemon.judge import attribute as A
    from kv_capture_replay import replay
    d = SWA / "hybrid_swa"
    r = replay(d, kv_events=True)
    fleet = FleetLedger()
    for m in messages(d):
        fleet.on_batch(m["replica"], "tiny", m["batch"], m["t"])
    view = fleet.view("vllm")
    assert view is not None and view.sliding_window == 256
    want = view.stored_tokens["sliding_window"]
    assert want > 0
    assert r.missed[("vllm", A.CauseCode.SLIDING_WINDOW, "exact")] == want
    assert r.ever("vllm", A.CauseCode.SLIDING_WINDOW) > 0
    assert r.ever("vllm", A.CauseCode.DYNAMIC_PREFIX) == 0 and r.ever("vllm", A.CauseCode.DYNAMIC_PREFIX_EXACT) == 0


def test_a_pool_that_never_fills_gives_the_unlimited_hits_constructed():
    """Constructed random traffic (prompts sharing heads of varied length, resends, generated tokens):
    the finite-pool simulation with room for everything equals the unlimited one, request by request,
    split included, whether it prefills in one step or in chunks of 200 tokens; with a reset both forget
    everything."""
    import random

    from cachemon.analyze.sim.window_pool import WindowedPoolSim
    rng = random.Random(7)
    heads = [[rng.randrange(1000) for _ in range(rng.randrange(100, 900))] for _ in range(5)]
    for window, hybrid, chunk in nonempty(((256, True, 2048), (512, True, 200), (256, False, 2048), (256, True, 200))):
        big, unl = WindowedPoolSim(128, window, 100_000, hybrid, chunk), WindowedPrefixCacheSim(128, window, hybrid)
        big.track_split()
        unl.track_split()
        for i in range(200):
            h = heads[rng.randrange(len(heads))]
            ids = h[:rng.randrange(len(h) // 2, len(h) + 1)] + [rng.randrange(1000) for _ in range(rng.randrange(0, 300))]
            out = rng.randrange(1, 200)
            if i == 120:
                big.reset()
                unl.reset()
            assert big.run(ids, completion_tokens=out) == unl.run(ids, completion_tokens=out), (window, i)
        assert big.split == unl.split and big.cached_tokens > 0


def test_long_prompts_are_prefilled_in_chunks_and_that_decides_a_hit(tok):
    """swa_chunked: ~3250-token prompts on a 72-block pool. vLLM prefills 2048 tokens a step (its CPU
    default) and the sliding-window group frees the blocks that left the window between the two chunks;
    the pool simulation that prefills in one step evicts differently and misses a hit vLLM gave. The
    sliding-window group publishes a store without any hash for a chunk it keeps no block of: decoded
    (its window counted), nothing lost."""
    from cachemon.analyze.sim.window_pool import WindowedPoolSim
    from cachemon.normalise.kv_batch import Stored
    d = SWA / "swa_chunked"
    want = [c for _, c in _usage(d)]
    bs, pool = _config(d)
    window = read_model_window(d / "model-config.json")
    assert window is not None
    from cachemon.analyze.requests_io import Request
    from cachemon.analyze.sim.block_hash import BlockHasher
    rows = sorted((r for r in load_requests(d) if "usage" in r), key=lambda r: r["t_send"])
    encs = tok.encode_many([Request(line=i + 1, kind="chat", messages=r["request"]["messages"]) for i, r in enumerate(rows)])
    hasher = BlockHasher(bs)
    got = {}
    for chunk in (2048, 1 << 30):
        sim = WindowedPoolSim(bs, window.tokens, pool, window.hybrid, chunk)
        got[chunk] = [sim.run(e.ids, hashes=hasher(e.ids, None), completion_tokens=r["usage"]["completion_tokens"])
                      for e, r in zip(encs, rows, strict=True)]
    assert got[2048] == want
    assert got[1 << 30] != want and sum(got[1 << 30]) < sum(want)
    msgs = messages(d)
    empty = [e for m in msgs for e in m["batch"].events if isinstance(e, Stored) and not e.hashes]
    assert empty and {(e.group, e.kind) for e in empty} == {(0, "sliding_window")}
    fleet = FleetLedger()
    for m in msgs:
        fleet.on_batch(m["replica"], "tiny", m["batch"], m["t"])
    view = fleet.view(msgs[0]["replica"])
    assert view is not None and view.in_sync


def test_a_reply_shown_by_the_next_turn_is_held_by_the_full_attention_group_constructed():
    """Constructed: a turn's reply (its tokens unknown at first) fills blocks 2-3; the next turn's prompt
    shows it, so the placeholders are renamed. The full-attention group holds them, but the window group
    never keeps generated blocks, so the hit stops at the first turn's replay point (256) and the two
    held blocks are the window's cost; the next turn hits through them, on the finite pool as on the
    unlimited one."""
    from cachemon.analyze.sim.block_hash import block_hashes
    from cachemon.analyze.sim.window_pool import WindowedPoolSim
    first = list(range(300))
    second = first + list(range(1000, 1200)) + list(range(2000, 2100))
    for sim in nonempty((WindowedPoolSim(128, 256, 200), WindowedPrefixCacheSim(128, 256))):
        sim.track_split()
        gen = sim.generated_hashes(first, block_hashes(first, 128), 213, None)
        assert [g[0] for g in gen] == ["generated"] * 2           # blocks 2 and 3 of 512 computed tokens
        sim.run(first, completion_tokens=213, generated=gen)
        real = block_hashes(second, 128)
        sim.rename({gen[0]: real[2], gen[1]: real[3]})
        assert sim.run(second) == 256, type(sim).__name__
        assert sim.split is not None and sim.split["sliding_window"] == 256, type(sim).__name__
        # the second turn kept the window before that junction (block 4): a third turn hits through the reply
        assert sim.run(second + list(range(3000, 3050))) == 512, type(sim).__name__
