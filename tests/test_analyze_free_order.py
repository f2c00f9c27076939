"""`cachemon analyze` simulates the free-queue order of the vLLM release the traffic ran on
(normalise/eras.FREE_ORDERS), read from --vllm-version, the server's log or its /version.

Real captures only: the tiny_pool scenario (36 blocks, 6 tenants x 3 rounds, then 2 tenants x 2) recorded
from vLLM 0.10.2.post2, 0.11.2.post2 and 0.32.0 (tests/fixtures/vllm-*-cpu-kv-events/tiny_pool, READMEs
there). The same traffic hits 1 536 tokens on the old releases and 8 704 on 0.32.0: before 0.24.0 a
finished request's uncached partial block goes to the free queue's end with its cached blocks, so each new
tenant evicts an old tenant's whole chain; from 0.24.0 it goes to the front and is reused first."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from click.testing import CliRunner

from cachemon.analyze.command import analyze_command
from cachemon.analyze.pipeline import analyze
from cachemon.analyze.server_config import free_order_note, server_version
from cachemon.analyze.tokenize import ModelTokenizer
from helpers import FIXTURES, free_port

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
    order, note = free_order_note(version, source)
    assert order.uncached_first == (release == "0.32.0")
    assert version in note
    assert _simulate(release, tok, order.uncached_first) == _served(release)


@pytest.mark.parametrize("release", RELEASES)
def test_the_other_order_misses_on_the_same_capture(release, tok):
    """The order is what separates the releases here: the other one gets most requests wrong."""
    order, _ = free_order_note(*server_version(None, None, str(_dir(release) / "vllm-server.log")))
    served = _served(release)
    wrong = _simulate(release, tok, not order.uncached_first)
    assert sum(a != b for a, b in zip(wrong, served, strict=True)) > len(served) // 2


@pytest.mark.parametrize("release", ["0.11.2", "0.32.0"])
def test_cli_takes_the_release_from_the_log_and_says_so(release):
    d = _dir(release)
    out = CliRunner().invoke(analyze_command, [str(d / "requests.jsonl"), "--tokenizer", str(MODEL), "--log-file",
                                               str(d / "vllm-server.log"), "--no-curve", "--top", "0", "--format", "json"])
    assert out.exit_code == 0, out.output
    res = json.loads(out.output)
    # the CLI's own comparison with the usage in the file: every request
    assert res["observed"]["cached_tokens_match"] == res["observed"]["cached_tokens_compared"] == len(_served(release))
    assert res["cached_tokens"] == sum(_served(release))
    order = "uncached-first" if release == "0.32.0" else "append-all"
    assert res["free_order"] == order
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
    assert (unknown["free_order"], given["free_order"]) == ("uncached-first", "append-all")
    assert given["observed"]["cached_tokens_match"] == len(_served("0.11.2")) > unknown["observed"]["cached_tokens_match"]
    assert (unknown["cached_tokens"], given["cached_tokens"]) == (sum(_served("0.32.0")), sum(_served("0.11.2")))


def test_cli_asks_the_upstreams_version():
    """--upstream: the real 0.11.2 tiny_pool /metrics page (block size and pool) and a /version answer
    (CONSTRUCTED body: vLLM's ``{"version": ...}`` with the version this capture's metadata.json records)."""
    d = _dir("0.11.2")
    page = (d / "metrics-final.txt").read_bytes()
    version = json.loads((d / "metadata.json").read_text(encoding="utf-8"))["vllm_version"]

    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            body = {"/metrics": page, "/version": json.dumps({"version": version}).encode()}.get(self.path)
            self.send_response(200 if body else 404)
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *a):
            pass

    srv = HTTPServer(("127.0.0.1", free_port()), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        out = CliRunner().invoke(analyze_command, [str(d / "requests.jsonl"), "--tokenizer", str(MODEL), "--upstream",
                                                   url, "--no-curve", "--top", "0", "--format", "json"])
    finally:
        srv.shutdown()
    assert out.exit_code == 0, out.output
    res = json.loads(out.output)
    assert (res["block_size"], res["cache_blocks"], res["free_order"]) == (128, 36, "append-all")
    assert f"{url}/version" in res["block_size_source"]
    assert res["observed"]["cached_tokens_match"] == len(_served("0.11.2"))
