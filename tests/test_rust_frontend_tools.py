"""`cachemon analyze`, `capture` and `warmup` on vLLM 0.32.0's Rust frontend, on what a real Rust-frontend
server served (tests/fixtures/vllm-0.32.0-cpu-rust-frontend/tools: a real `cachemon capture` run, the
server's log, and raw chat responses recorded from it). Nothing here is constructed: the servers below
only serve those recorded bytes again, in the order they were recorded."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner

from cachemon.analyze.server_config import read_cache_config, read_log_config
from cachemon.cli import main as cli
from cachemon.config.warmup import Prompt, Prompts
from cachemon.demo.replay import ReplayServer
from cachemon.runtime.warmup_run import run_warmup
from cachemon.tools.capture import DEFAULT_SCENARIOS, CaptureError, capture
from cachemon.tools.warmup_command import format_result
from helpers import FIXTURES

TOOLS = FIXTURES / "vllm-0.32.0-cpu-rust-frontend" / "tools"
CAP = TOOLS / "capture"
MODEL = FIXTURES / "vllm-0.32.0-cpu" / "model"
LOG = TOOLS / "vllm-server.log"
REQUESTS = [str(CAP / f"requests-{s}.jsonl") for s in DEFAULT_SCENARIOS]     # in the order they were sent
RUST_PAGE = CAP / "metrics-start.txt"
RECORDED_MODELS = json.loads((TOOLS / "responses.json").read_text())["models"]


def test_the_rust_page_has_no_cache_config_but_its_log_gives_block_size_and_pool():
    assert "vllm:cache_config_info" not in RUST_PAGE.read_text()
    lc = read_log_config(str(LOG))
    assert (lc.block_size, lc.num_blocks, lc.pool_tokens, lc.prefix_caching, lc.frontend, lc.version) == (
        128, 160, 20480, "true", "rust", "0.32.0")
    py = read_log_config(str(FIXTURES / "vllm-0.32.0-cpu-rust-frontend" / "python" / "vllm-server.log"))
    assert (py.block_size, py.frontend) == (128, "python")


def _analyze(*args: str):
    return CliRunner().invoke(cli, ["analyze", *REQUESTS, "--tokenizer", str(MODEL), "--format", "json",
                                    "--top", "0", *args])


@pytest.mark.parametrize("source", [["--metrics-file", str(RUST_PAGE), "--log-file", str(LOG)],
                                    ["--log-file", str(LOG)]])
def test_analyze_learns_the_block_size_from_the_rust_servers_log(source):
    res = _analyze(*source)
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert (out["block_size"], out["cache_blocks"]) == (128, 160)
    assert f"block size 128 read from the start-up lines of {LOG}" in out["block_size_source"]
    if "--metrics-file" in source:
        assert f"{RUST_PAGE} has no vllm:cache_config_info" in out["block_size_source"]
    # vLLM's own per-request cached_tokens (null on the Rust frontend's misses) all agree with the simulation
    v = out["observed"]
    assert (v["cached_tokens_compared"], v["cached_tokens_match"], v["prompt_tokens_details_null"]) == (12, 12, 9)
    assert out["cached_tokens"] == 2304


def test_analyze_on_the_rust_page_alone_says_where_the_block_size_is():
    res = _analyze("--metrics-file", str(RUST_PAGE))
    assert res.exit_code == 2
    assert "has no vllm:cache_config_info" in res.output and "pass --log-file" in res.output


def test_without_the_pool_override_the_log_gives_no_block_size_and_analyze_says_so():
    """A real Rust server started without --num-gpu-blocks-override: its log states the pool in tokens only."""
    log = TOOLS / "vllm-server-no-override.log"
    lc = read_log_config(str(log))
    assert (lc.block_size, lc.num_blocks, lc.pool_tokens, lc.prefix_caching, lc.frontend) == (
        None, None, 2097152, "true", "rust")
    res = _analyze("--metrics-file", str(RUST_PAGE), "--log-file", str(log))
    assert res.exit_code == 2
    assert "give the pool (2097152 tokens) but no block count" in res.output and "pass --block-size" in res.output
    ok = _analyze("--log-file", str(log), "--block-size", "128")
    assert ok.exit_code == 0 and json.loads(ok.output)["block_size"] == 128


def test_a_log_without_the_start_up_lines_is_a_clear_error_not_a_default():
    """capture's server.log is the slice written during the capture: no start-up line in it."""
    res = _analyze("--log-file", str(CAP / "server.log"))
    assert res.exit_code == 2
    assert "state no KV cache size" in res.output and "pass --block-size" in res.output
    assert read_cache_config(None, None, str(CAP / "server.log"), block_size_given=True).block_size is None


class RecordedServer:
    """GET /v1/models, /version and POST /v1/chat/completions answered with the bytes recorded from the real
    Rust frontend (responses.json), chat responses in recorded order."""

    def __init__(self, name: str = "responses.json"):
        rec = json.loads((TOOLS / name).read_text())
        self.chat = [c["response"] for c in rec["chat"]]
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _json(self, obj):
                body = json.dumps(obj).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._json(RECORDED_MODELS if self.path == "/v1/models" else rec["version"])

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                self._json(owner.chat.pop(0))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def _pages():
    return [(p, (CAP / f"metrics-{p}.txt").read_text()) for p in ("start",) + DEFAULT_SCENARIOS]


@pytest.mark.slow
def test_capture_on_the_rust_frontend_counts_its_null_details_as_zero(tmp_path):
    """The Rust frontend answers a miss with prompt_tokens_details null: capture must not take that for a
    server without --enable-prompt-tokens-details, and takes the block size from the log."""
    srv = RecordedServer()
    said: list[str] = []
    try:
        with ReplayServer(_pages()) as pages:
            m = capture(srv.url, tmp_path / "o", n=2, metrics_url=pages.url, log_file=LOG, settle=0,
                        echo=said.append)
    finally:
        srv.close()
    # the server's one profile (ServerProfile): the size and where it was read
    assert f"block_size 128 from the start-up lines of {LOG})" in said[0]
    assert m["vllm_version"] == "0.32.0"
    assert m["cache_config"] == {"block_size": "128", "num_gpu_blocks": "160", "enable_prefix_caching": "True",
                                 "source": "the server log's start-up lines"}
    assert [(s["cached_tokens"], s["requests_with_hits"]) for s in m["scenarios"]] == [(768, 1), (0, 0), (0, 0)]


@pytest.mark.slow
def test_warmup_text_counts_the_rust_frontends_null_details_as_zero(tmp_path):
    srv = RecordedServer()
    try:
        with ReplayServer(_pages()) as pages:
            items = [Prompt(n, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}) for n in (1, 2)]
            res = run_warmup(srv.url, Prompts(items=items), rate=None,
                             metrics_url=pages.url)
    finally:
        srv.close()
    assert res.ok == 2 and [r.cached_tokens for r in res.results] == [None, 768]
    text = format_result(res, "p.jsonl")
    assert "cached_tokens reported by the server: 768 over 2 request(s) (1 with prompt_tokens_details null, " \
           "i.e. 0 cached)" in text


@pytest.mark.slow
def test_capture_on_a_rust_server_without_the_details_flag_is_refused(tmp_path):
    """Without --enable-prompt-tokens-details the Rust frontend sends null on hits too (the second of the two
    recorded responses hit 768 tokens by vLLM's counters): no response with the details is refused."""
    srv = RecordedServer("responses-no-details-flag.json")
    try:
        with ReplayServer(_pages()) as pages:
            with pytest.raises(CaptureError, match="start vLLM with --enable-prompt-tokens-details"):
                capture(srv.url, tmp_path / "o", ["static-system-prompt"], n=2, metrics_url=pages.url, settle=0,
                        echo=lambda s: None)
    finally:
        srv.close()
