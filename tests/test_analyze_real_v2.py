"""Exactness on new real vLLM 0.32.0 traffic (tests/fixtures/vllm-0.32.0-cpu-analyze-v2).

The same traffic ran on three real servers with KV pools of 36, 48 and 160 blocks:
tools (missing description, unknown key, Chinese and emoji, content null, tool-call
arguments as a JSON string), multi-turn chats with 150 generated tokens per turn,
cache_salt, prompts at block multiples +-1, six prompts cycled through the pool
(eviction), and a POST /reset_prefix_cache mid-stream. Every request's predicted
prompt_tokens and cached_tokens must equal what vLLM returned, and the totals must
equal vLLM's own counters. Each rule is also switched off once, to show the capture
needs it.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cachemon.analyze import chat_template as chat_template_mod
from cachemon.analyze import pipeline as analyze_mod
from cachemon.analyze.command import read_cache_config
from cachemon.analyze.pipeline import analyze
from cachemon.analyze.tokenize import ModelTokenizer
from helpers import FIXTURES
from literal_prefix_sim import LiteralPrefixCacheSim

V2 = FIXTURES / "vllm-0.32.0-cpu-analyze-v2"
POOLS = (36, 40, 48, 160)


def capture(pool: int) -> str:
    return str(V2 / f"requests-pool{pool}.jsonl")


def metrics(pool: int) -> str:
    return str(V2 / f"metrics-pool{pool}.txt")


def vllm_usage(path: str) -> list[tuple[int, int]]:
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        d = json.loads(line)
        if "usage" in d:
            u = d["usage"]
            out.append((u["prompt_tokens"], (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)))
    return out


def counters(path: str) -> tuple[float, float]:
    page = Path(path).read_text()
    q = float(re.search(r"^vllm:prefix_cache_queries_total\{[^}]*\} (\S+)", page, re.MULTILINE).group(1))
    h = float(re.search(r"^vllm:prefix_cache_hits_total\{[^}]*\} (\S+)", page, re.MULTILINE).group(1))
    return q, h


@pytest.fixture(scope="module")
def tok():
    return ModelTokenizer(V2 / "model")


def run(tok, pool: int, path: str | None = None, **kw):
    cfg = read_cache_config(None, metrics(pool))
    return analyze(path or capture(pool), tok, block_size=cfg.block_size, cache_blocks=cfg.num_blocks,
                   what_if=False, **kw)


@pytest.mark.parametrize("pool", POOLS)
def test_every_request_exact(tok, pool):
    res = run(tok, pool)
    expected = vllm_usage(capture(pool))
    assert len(expected) == 35
    assert list(zip(res.prompt_tokens, res.cached_tokens, strict=False)) == expected
    assert res.cached_compared == res.cached_matched == res.observed_prompt_match == 35
    assert (res.total_prompt, res.total_cached) == counters(metrics(pool))


@pytest.mark.parametrize("pool", POOLS)
def test_block_and_pool_size_come_from_the_servers_metrics(pool):
    cfg = read_cache_config(None, metrics(pool))
    assert (cfg.block_size, cfg.num_blocks) == (128, pool)


def mismatches(res, path) -> int:
    got = list(zip(res.prompt_tokens, res.cached_tokens, strict=True))
    return sum(1 for g, e in zip(got, vllm_usage(path), strict=True) if g != e)


def test_without_tool_normalisation_the_tools_requests_mismatch(tok, monkeypatch):
    monkeypatch.setattr(chat_template_mod, "normalise_tools", lambda tools: tools)
    res = run(tok, 48)
    assert [p for p, (op, _) in list(zip(res.prompt_tokens, vllm_usage(capture(48)), strict=False))[:4] if p != op] != []


def test_without_message_normalisation_content_null_requests_mismatch(tok, monkeypatch):
    monkeypatch.setattr(chat_template_mod, "_prepare_message", lambda m, openai_format: m)
    res = run(tok, 48)
    # requests 1 and 3 carry an assistant message with content null and string arguments
    assert res.prompt_tokens[1] != vllm_usage(capture(48))[1][0]


def test_without_generated_tokens_multi_turn_and_eviction_mismatch(tmp_path, tok):
    # drop what the lines say about the output: only the prompt's blocks are simulated
    stripped = tmp_path / "no-output.jsonl"
    with open(stripped, "w") as out:
        for line in Path(capture(36)).read_text().splitlines():
            d = json.loads(line)
            d.pop("completion_token_ids", None)
            if "usage" in d:
                d["usage"].pop("completion_tokens", None)
            out.write(json.dumps(d) + "\n")
    res = run(tok, 36, str(stripped))
    assert res.completion_assumed == 35
    assert mismatches(res, capture(36)) > 0


def test_without_the_reset_marker_the_requests_after_it_mismatch(tmp_path, tok):
    no_reset = tmp_path / "no-reset.jsonl"
    lines = [ln for ln in Path(capture(160)).read_text().splitlines(True) if '"event"' not in ln]
    no_reset.write_text("".join(lines))
    res = run(tok, 160, str(no_reset))
    assert res.events_count == 0
    assert mismatches(res, capture(160)) >= 1
    # the same split given on the command line instead of in the file
    res = run(tok, 160, str(no_reset), reset_at=["33"])
    assert res.events_count == 1 and mismatches(res, capture(160)) == 0
    # or by time: the reset's own timestamp from the capture
    when = next(json.loads(ln)["time"] for ln in Path(capture(160)).read_text().splitlines() if '"event"' in ln)
    res = run(tok, 160, str(no_reset), reset_times=[when])
    assert res.events_count == 1 and mismatches(res, capture(160)) == 0


def test_with_the_old_free_queue_order_eviction_mismatches(tok, monkeypatch):
    # every freed block appended to the queue's end, uncached ones too (cachemon <= v1)
    class Appending(LiteralPrefixCacheSim):
        def _release(self, blocks, hashed):
            self._free.update(dict.fromkeys(reversed(blocks)))

    assert sum(mismatches(run(tok, pool), capture(pool)) for pool in (36, 48)) == 0
    monkeypatch.setattr(analyze_mod, "PrefixCacheSim", LiteralPrefixCacheSim)
    assert sum(mismatches(run(tok, pool), capture(pool)) for pool in (36, 48)) == 0    # the reference agrees
    monkeypatch.setattr(analyze_mod, "PrefixCacheSim", Appending)
    assert sum(mismatches(run(tok, pool), capture(pool)) for pool in (36, 48)) > 0
