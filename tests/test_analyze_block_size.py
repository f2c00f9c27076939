"""`cachemon analyze` never silently assumes block size 16 (issue 35, Build 1), and answers the question before an
upgrade that moves it (issue 35, Build 2): the same requests under another block size, side by side.

Real captures: tests/fixtures/vllm-0.32.0-cpu (16 requests with an 831-token static system prompt; vLLM hit 768
tokens on requests 1-15, 11 520 in all, at block size 128) and every CPU capture's cache_config_info."""
from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from cachemon.cli import main
from cachemon.normalise.eras import default_block_row, platform_of
from cachemon.sources.exposition import parse
from helpers import FIXTURES

REAL_032 = FIXTURES / "vllm-0.32.0-cpu"
STATIC = str(REAL_032 / "requests-static-system-prompt.jsonl")
MODEL = str(REAL_032 / "model")


def analyze_json(*args: str) -> dict:
    r = CliRunner().invoke(main, ["analyze", STATIC, "--tokenizer", MODEL, "--no-curve", "--top", "0",
                                  "--format", "json", *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_the_table_says_what_each_release_read_says():
    assert default_block_row("0.8.5", "gpu").block_size == 16
    assert default_block_row("0.33.0", "gpu").block_size == 16
    assert default_block_row("0.34.0", "gpu").block_size == 64          # vllm 0.34.0 vllm/config/cache.py:185
    assert default_block_row("v0.34.1rc1", "gpu").block_size == 64
    assert default_block_row("0.34.0", "cpu").block_size == 128
    assert default_block_row("0.10.2", "cpu").block_size == 128
    assert default_block_row("not a version", "gpu") is None
    assert platform_of("0.32.0+cpu") == "cpu" and platform_of("0.34.0") is None
    assert default_block_row("0.34.0", "tpu") is None                   # an unknown platform: no guess


@pytest.mark.parametrize("capture", sorted(d.name for d in FIXTURES.glob("vllm-*-cpu*")
                                           if "hybrid" not in d.name and list(d.glob("metrics*.txt"))))
def test_the_cpu_row_is_what_every_real_cpu_capture_ran_with(capture):
    """Real: each release's CPU server, started without --block-size, reported the table's default."""
    version = re.match(r"vllm-([\d.]+)-cpu", capture).group(1)
    pages = [p for p in sorted((FIXTURES / capture).glob("metrics*.txt")) if "cache_config_info" in p.read_text()]
    assert pages
    labels = parse(pages[0].read_text(), frozenset({"cache_config_info"})).samples["cache_config_info"][0][0]
    assert int(labels["block_size"]) == default_block_row(version, "cpu").block_size


def test_nothing_known_is_an_assumption_said_out_loud_never_a_silent_16():
    d = analyze_json()
    assert d["block_size"] == 64 and d["block_size_assumed"] is True
    assert "ASSUMED" in d["block_size_source"] and "--block-size" in d["block_size_source"]
    assert "0.8.5-0.33 GPUs default to 16" in d["block_size_source"]


def test_the_release_and_platform_give_the_block_size_and_say_where_it_came_from():
    d = analyze_json("--vllm-version", "0.32.0", "--platform", "cpu")
    assert (d["block_size"], d["block_size_assumed"]) == (128, False)
    assert "vLLM 0.32.0's default on CPU" in d["block_size_source"] and "--vllm-version" in d["block_size_source"]
    # and with it, the prediction is vLLM's own on every request of the real capture
    assert d["observed"]["cached_tokens_match"] == d["observed"]["cached_tokens_compared"] == 16
    assert analyze_json("--vllm-version", "0.32.0+cpu")["block_size"] == 128        # the CPU wheel's version
    old_gpu = analyze_json("--vllm-version", "0.33.0", "--platform", "gpu")
    assert (old_gpu["block_size"], old_gpu["block_size_assumed"]) == (16, False)
    new = analyze_json("--vllm-version", "0.34.0")                                   # platform not said
    assert (new["block_size"], new["block_size_assumed"]) == (64, True)
    assert "ASSUMED a GPU server" in new["block_size_source"] and "--platform cpu" in new["block_size_source"]
    bad = analyze_json("--vllm-version", "nightly")
    assert (bad["block_size"], bad["block_size_assumed"]) == (64, True)
    assert "vLLM version 'nightly' (from --vllm-version) unreadable" in bad["block_size_source"]


def test_the_same_requests_under_a_moved_floor_side_by_side():
    """Real capture at block size 128. Truth by hand, independent of the simulator: a request can hit at most
    830 of its 831 tokens, in whole blocks, so requests 1-15 hit floor(830 / B) * B each: 768 at 128 (what
    vLLM hit), 768 at 64 and 256, 512 at 512."""
    d = analyze_json("--block-size", "128", "--compare-block-size", "512")
    cmp = d["block_size_comparison"]
    assert cmp["today"]["cached_tokens"] == d["cached_tokens"] == 15 * 768 == 11520
    assert cmp["compared"] == {"block_size": 512, "cache_blocks": None, "cached_tokens": 15 * 512,
                               "hit_ratio": round(15 * 512 / d["prompt_tokens"], 6)}
    assert cmp["tokens_lost"] == 15 * 256
    assert analyze_json("--block-size", "128", "--compare-block-size", "64")["block_size_comparison"]["tokens_lost"] == 0
    text = CliRunner().invoke(main, ["analyze", STATIC, "--tokenizer", MODEL, "--no-curve", "--top", "0",
                                     "--block-size", "128", "--compare-block-size", "512"]).output
    assert "Block size 128 (today) vs 512" in text and "moving the floor to 512 costs 3 840 cached tokens" in text


def test_a_finite_pool_keeps_its_size_in_tokens_under_the_other_block_size():
    v2 = FIXTURES / "vllm-0.32.0-cpu-analyze-v2"
    r = CliRunner().invoke(main, ["analyze", str(v2 / "requests-pool36.jsonl"), "--tokenizer", str(v2 / "model"),
                                  "--metrics-file", str(v2 / "metrics-pool36.txt"), "--compare-block-size", "256",
                                  "--no-curve", "--top", "0", "--format", "json"])
    cmp = json.loads(r.output)["block_size_comparison"]
    assert cmp["today"]["cached_tokens"] == 17536            # vLLM's own prefix_cache_hits_total on this capture
    assert (cmp["today"]["cache_blocks"], cmp["compared"]["cache_blocks"]) == (36, 18)


def test_a_log_whose_version_has_thousands_of_digits_is_an_unknown_version_not_a_traceback(tmp_path):
    """Red team round 7 (issue 38): the real Python-frontend log with its engine's version replaced by 5 000
    digits (constructed): eras.version_key's int() raised ValueError out of `cachemon analyze --log-file`."""
    log = tmp_path / "vllm-server.log"
    real = (FIXTURES / "vllm-0.32.0-cpu-rust-frontend" / "python" / "vllm-server.log").read_text()
    log.write_text(real.replace("LLM engine (v0.32.0)", "LLM engine (v" + "9" * 5000 + ")"))
    assert "9" * 5000 in log.read_text()
    r = CliRunner().invoke(main, ["analyze", str(FIXTURES / "analyze" / "constructed-reordered-tools.jsonl"),
                                  "--log-file", str(log), "--no-curve", "--format", "json"])
    assert r.exception is None and r.exit_code == 0, r.output[-500:]
    assert json.loads(r.output)["block_size"] == 128      # the pool over the block count, as the log says


def test_a_pool_too_small_for_the_compared_block_is_never_called_the_same_pool():
    """Red team (issue 38): --cache-blocks 10 --compare-block-size 1000 replayed 2 blocks (2 000 tokens, vLLM's
    smallest pool) under the heading "the same requests and pool in tokens" beside today's 160 tokens. Real
    capture; the pools by hand: 10 x 16 = 160 tokens; 160 // 1000 = 0 < 2 blocks -> 2 x 1000; 160 // 64 = 2."""
    args = ["--block-size", "16", "--cache-blocks", "10"]
    d = analyze_json(*args, "--compare-block-size", "1000")["block_size_comparison"]
    assert d["pool_tokens"] == {"today": 160, "compared": 2000} and d["compared"]["cache_blocks"] == 2
    assert "cannot hold one 1000-token block" in d["note"] and "not the same pool" in d["note"]
    text = CliRunner().invoke(main, ["analyze", STATIC, "--tokenizer", MODEL, "--no-curve", "--top", "0", *args,
                                     "--compare-block-size", "1000"]).output
    assert "Block size 16 (today) vs 1000, the same requests:" in text and "pool in tokens" not in text
    assert "2 blocks = 2 000 tokens (12.5x today's), not the same pool" in text
    rounded = analyze_json(*args, "--compare-block-size", "64")["block_size_comparison"]
    assert rounded["pool_tokens"] == {"today": 160, "compared": 128}
    assert "2.50 blocks of 64: simulated with 2 whole blocks = 128 tokens (80 % of today's)" in rounded["note"]
    same = analyze_json(*args, "--compare-block-size", "32")["block_size_comparison"]     # 10 x 16 = 5 x 32
    assert same["pool_tokens"] == {"today": 160, "compared": 160} and "keeps its size in tokens" in same["note"]
