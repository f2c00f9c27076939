"""vLLM's rules one at a time, on small inputs built for the rule (constructed; the
real-traffic proof is tests/test_analyze_real_v2.py)."""
from __future__ import annotations

import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner

from cachemon.analyze.chat_template import _prepare_message, normalise_tools
from cachemon.analyze.command import read_cache_config
from cachemon.analyze.divergence import OTHER, REORDERED
from cachemon.analyze.pipeline import analyze
from cachemon.analyze.sim.prefix import PrefixCacheSim
from cachemon.analyze.tokenize import ModelTokenizer
from cachemon.cli import main
from helpers import FIXTURES, REAL_032, free_port
from literal_prefix_sim import LiteralPrefixCacheSim

V2 = FIXTURES / "vllm-0.32.0-cpu-analyze-v2"
STATIC = str(REAL_032 / "requests-static-system-prompt.jsonl")


def test_tools_are_rebuilt_like_the_request_model():
    tools = [{"function": {"parameters": {"type": "object"}, "name": "f", "x-extra": 1}, "type": "function"},
             {"type": "function", "function": {"name": "g", "description": "d", "strict": True}}]
    assert normalise_tools(tools) == [
        {"type": "function", "function": {"name": "f", "description": None, "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "g", "description": "d", "parameters": None, "strict": True}}]
    assert [list(t["function"]) for t in normalise_tools(tools)] == [
        ["name", "description", "parameters"], ["name", "description", "parameters", "strict"]]


def test_messages_are_normalised_like_vllm():
    m = {"role": "assistant", "content": None, "extra": "dropped",
         "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}},
                        {"id": "2", "type": "function", "function": {"name": "g", "arguments": "not json"}}]}
    got = _prepare_message(m, openai_format=False)
    assert got["content"] == "" and "extra" not in got
    assert [tc["function"]["arguments"] for tc in got["tool_calls"]] == [{"a": 1}, {}]
    assert m["tool_calls"][0]["function"]["arguments"] == "{\"a\": 1}"     # the input is not mutated
    assert _prepare_message({"role": "assistant", "content": "x", "tool_calls": []}, False) == \
        {"role": "assistant", "content": "x"}
    assert _prepare_message({"role": "user", "content": "hi"}, True)["content"] == [{"type": "text", "text": "hi"}]
    assert _prepare_message({"role": "tool", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                             "tool_call_id": "7"}, True) == {"role": "tool", "content": "a\nb", "tool_call_id": "7"}


def test_uncached_blocks_go_to_the_front_of_the_free_queue():
    literal = LiteralPrefixCacheSim(block_size=4, cache_blocks=8)        # 7 usable blocks
    literal.run(list(range(10)))                              # 2 full blocks + 1 partial
    queue = list(literal._free)
    hashed = [b for b in queue if literal._block_hash[b] is not None]
    assert literal._block_hash[queue[0]] is None and queue[-len(hashed):] == hashed
    # the partial block is reused first: the cached blocks survive the next request
    for sim in (literal, PrefixCacheSim(block_size=4, cache_blocks=8)):
        sim.run(list(range(10)))
        sim.run(list(range(100, 117)))                        # 5 blocks: the 5 without a hash
        assert sim.run(list(range(10))) == 8


def test_generated_blocks_take_room_and_can_be_hit_with_known_ids():
    bs = 4
    sim = PrefixCacheSim(bs, None)
    prompt, out = list(range(6)), [50, 51, 52, 53, 54]
    sim.run(prompt, None, None, len(out), out)
    # the next turn repeats prompt + output (but the last output token was never computed)
    assert sim.run(prompt + out + [9, 9, 9]) == 8
    lru = PrefixCacheSim(bs, 4)                               # 3 usable blocks
    lru.run(list(range(8)), None, None, 9)                    # 8 + 8 computed -> 4 blocks: does not fit
    assert lru.oversized == 1


def test_null_prompt_tokens_details_is_zero_cached(tmp_path):
    lines = [json.loads(ln) for ln in Path(STATIC).read_text().splitlines()][:3]
    lines[0]["usage"]["prompt_tokens_details"] = None         # what vLLM sends when nothing was cached
    p = tmp_path / "r.jsonl"
    p.write_text("".join(json.dumps(d) + "\n" for d in lines))
    out = CliRunner().invoke(main, ["analyze", str(p), "--tokenizer", str(REAL_032 / "model"), "--block-size", "128"])
    assert "cached_tokens match on 3/3 (1 with prompt_tokens_details null, i.e. 0 cached)" in out.output


def test_no_details_anywhere_is_not_reported(tmp_path):
    lines = [json.loads(ln) for ln in Path(STATIC).read_text().splitlines()][:3]
    for d in lines:
        del d["usage"]["prompt_tokens_details"]               # a V0 server / details off
    p = tmp_path / "r.jsonl"
    p.write_text("".join(json.dumps(d) + "\n" for d in lines))
    out = CliRunner().invoke(main, ["analyze", str(p), "--tokenizer", str(REAL_032 / "model"), "--block-size", "128"])
    assert "prompt_tokens match on 3/3, cached_tokens not reported" in out.output
    assert "0/3" not in out.output


def test_block_size_default_is_said_out_loud():
    out = CliRunner().invoke(main, ["analyze", STATIC, "--tokenizer", str(REAL_032 / "model"), "--no-curve"])
    assert "block size 64 ASSUMED" in out.output and "--upstream" in out.output
    assert "ASSUMED block size 64: every number below depends on it" in out.output


def test_block_size_from_a_saved_metrics_page_and_from_a_live_server():
    page = (REAL_032 / "metrics-idle.txt").read_bytes()
    assert read_cache_config(None, str(REAL_032 / "metrics-idle.txt")).block_size == 128

    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/metrics" else 404)
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *a):
            pass

    srv = HTTPServer(("127.0.0.1", free_port()), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        cfg = read_cache_config(url, None)
        assert (cfg.block_size, cfg.num_blocks) == (128, 16384)
        out = CliRunner().invoke(main, ["analyze", STATIC, "--tokenizer", str(REAL_032 / "model"),
                                        "--upstream", url, "--no-curve"])
        assert out.exit_code == 0 and "block size 128 read from" in out.output
        assert "cached_tokens match on 16/16" in out.output
    finally:
        srv.shutdown()


def test_metrics_page_without_cache_config_is_a_clear_error(tmp_path):
    p = tmp_path / "m.txt"
    p.write_text("# nothing\nfoo 1\n")
    out = CliRunner().invoke(main, ["analyze", STATIC, "--metrics-file", str(p)])
    assert out.exit_code == 2 and "no vllm:cache_config_info" in out.output


@pytest.fixture(scope="module")
def tools_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("tools-model")
    shutil.copy(REAL_032 / "model" / "tokenizer.json", d / "tokenizer.json")
    shutil.copy(V2 / "model" / "chat_template.jinja", d / "chat_template.jinja")
    return ModelTokenizer(d)


def test_same_order_different_tools_is_not_called_reordered(tmp_path, tools_model):
    system = json.loads(Path(STATIC).read_text().splitlines()[0])["request"]["messages"][0]["content"]
    lines = []
    for i in range(6):
        tools = [{"type": "function", "function": {"name": n, "description": f"{n} v{i}"}} for n in ("a", "b", "c")]
        lines.append({"messages": [{"role": "system", "content": system}, {"role": "user", "content": f"q{i}"}],
                      "tools": tools})
    p = tmp_path / "r.jsonl"
    p.write_text("".join(json.dumps(d) + "\n" for d in lines))
    res = analyze(str(p), tools_model, block_size=16)
    assert res.causes and res.causes[0].location == "tools"
    assert res.causes[0].klass == OTHER and res.causes[0].fixes() == []
    assert REORDERED not in {c.klass for c in res.causes}


def test_bad_reset_time_is_a_clear_error():
    out = CliRunner().invoke(main, ["analyze", STATIC, "--reset-at-time", "yesterday-ish"])
    assert out.exit_code == 2 and "--reset-at-time" in out.output and "ISO 8601" in out.output
    out = CliRunner().invoke(main, ["analyze", STATIC, "--tokenizer", str(REAL_032 / "model"), "--block-size", "128",
                                    "--reset-at-time", "2020-01-01T00:00:00Z", "--no-curve"])
    assert out.exit_code == 0 and "cache emptied" not in out.output      # the lines carry no time...
    assert "1 --reset-at-time value(s) not applied" in out.output        # ...and the output says so
