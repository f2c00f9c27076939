"""`cachemon analyze` simulates the free-queue order of the vLLM release the traffic ran on
(normalise/eras.FREE_ORDERS), read from --vllm-version, the server's log or its /version.

Real captures only: the tiny_pool scenario (36 blocks, 6 tenants x 3 rounds, then 2 tenants x 2) recorded
from vLLM 0.10.2.post2, 0.11.2.post2 and 0.32.0 (tests/fixtures/vllm-*-cpu-kv-events/tiny_pool, READMEs
there). The same traffic hits 1 536 tokens on the old releases and 8 704 on 0.32.0: before 0.24.0 a
finished request's uncached partial block goes to the free queue's end with its cached blocks, so each new
tenant evicts an old tenant's whole chain; from 0.24.0 it goes to the front and is reused first."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cachemon.diagnostics.analyze import analyze
from cachemon.diagnostics.analyze_cli import analyze_command
from cachemon.diagnostics.server_config import free_order_note, server_version
from cachemon.diagnostics.tokenize import ModelTokenizer
from helpers import FIXTURES

RELEASES = ["0.10.2", "0.11.2", "0.32.0"]
MODEL = FIXTURES / "vllm-0.32.0-cpu" / "model"      # the model kv_record.py serves


def _dir(release: str):
    return FIXTURES / f"vllm-{release}-cpu-kv-events" / "tiny_pool"


def _served(release: str) -> list[int]:
    """The server's own cached_tokens per request (0.10.2 / 0.11.2 send null details when 0)."""
    lines = [json.loads(x) for x in (_dir(release) / "requests.jsonl").read_text(encoding="utf-8").splitlines() if x]
    return [int((r["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0) for r in lines if "usage" in r]


@pytest.fixture(scope="module")
def tok():
    return ModelTokenizer(MODEL)


def _simulate(release: str, tok, uncached_first: bool) -> list[int]:
    pool = json.loads((_dir(release) / "metadata.json").read_text(encoding="utf-8"))["replicas"]["vllm"]
    return list(analyze(str(_dir(release) / "requests.jsonl"), tok, block_size=128, cache_blocks=pool["pool_blocks_override"],
                        what_if=False, curve=False, uncached_first=uncached_first).cached_tokens)


@pytest.mark.parametrize("release", RELEASES)
def test_the_order_read_from_the_servers_log_gives_every_requests_cached_tokens(release, tok):
    version, source = server_version(None, None, str(_dir(release) / "vllm-server.log"))
    assert version.startswith(release) and "start-up lines" in source
    uncached_first, note = free_order_note(version, source)
    assert uncached_first == (release == "0.32.0")
    assert version in note
    assert _simulate(release, tok, uncached_first) == _served(release)


@pytest.mark.parametrize("release", RELEASES)
def test_the_other_order_misses_on_the_same_capture(release, tok):
    """The order is what separates the releases here: the other one gets most requests wrong."""
    uncached_first, _ = free_order_note(*server_version(None, None, str(_dir(release) / "vllm-server.log")))
    served = _served(release)
    wrong = _simulate(release, tok, not uncached_first)
    assert sum(a != b for a, b in zip(wrong, served, strict=True)) > len(served) // 2


@pytest.mark.parametrize("release", ["0.11.2", "0.32.0"])
def test_cli_takes_the_release_from_the_log_and_says_so(release):
    d = _dir(release)
    out = CliRunner().invoke(analyze_command, [str(d / "requests.jsonl"), "--tokenizer", str(MODEL), "--log-file",
                                               str(d / "vllm-server.log"), "--no-curve", "--top", "0", "--format", "json"])
    assert out.exit_code == 0, out.output
    res = json.loads(out.output)
    assert res["cached_tokens"] == sum(_served(release))
    order = "uncached-first" if release == "0.32.0" else "append-all"
    assert f"free queue {order}" in res["block_size_source"] and release in res["block_size_source"]


def test_cli_without_a_version_simulates_the_newest_order_and_says_so():
    d = _dir("0.11.2")
    args = [str(d / "requests.jsonl"), "--tokenizer", str(MODEL), "--block-size", "128", "--cache-blocks", "36",
            "--no-curve", "--top", "0", "--format", "json"]
    unknown = json.loads(CliRunner().invoke(analyze_command, args).output)
    assert "free queue uncached-first" in unknown["block_size_source"]
    assert "no vLLM version known" in unknown["block_size_source"]
    given = json.loads(CliRunner().invoke(analyze_command, [*args, "--vllm-version", "0.11.2"]).output)
    assert "free queue append-all" in given["block_size_source"]
    assert (unknown["cached_tokens"], given["cached_tokens"]) == (sum(_served("0.32.0")), sum(_served("0.11.2")))
