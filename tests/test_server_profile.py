"""One description of a server (normalise/server_profile.py), read from the real vLLM 0.32.0 captures of
both frontends: the Python frontend's page and log, the Rust frontend's page (no cache_config_info) and log."""
from __future__ import annotations

import json

from cachemon import catalog as C
from cachemon.analyze.server_config import read_cache_config, read_log_config
from cachemon.normalise.normaliser import normalise_text
from cachemon.normalise.server_profile import ServerProfile, merge
from helpers import FIXTURES

RUST = FIXTURES / "vllm-0.32.0-cpu-rust-frontend"
PY_LOG = RUST / "python" / "vllm-server.log"
RUST_LOG = RUST / "tools" / "vllm-server.log"


def _python_page() -> str:
    with (RUST / "python" / "metrics.jsonl").open() as f:
        return next(d["text"] for d in map(json.loads, f) if "cache_config_info" in d.get("text", ""))


def test_the_page_and_the_log_of_one_python_server_agree_and_merge_field_by_field(tmp_path):
    (page,) = normalise_text(_python_page()).engines.values()
    log = read_log_config(str(PY_LOG))
    assert (page.prefix_caching, page.block_size) == (log.prefix_caching, log.block_size) == ("true", 128)
    assert page.version == "" and log.version == "0.32.0" and log.frontend == "python"
    both = merge(page, log)
    assert (both.block_size, both.version, both.frontend, both.hash_algo) == (128, "0.32.0", "python", page.hash_algo)
    assert both.source_of("block_size") == "the page's vllm:cache_config_info"
    assert both.source_of("version") == f"the start-up lines of {PY_LOG}"
    # analyze reads the same: the page first, the log for what the page does not say
    saved = tmp_path / "page.txt"
    saved.write_text(_python_page())
    got = read_cache_config(None, str(saved), str(PY_LOG))
    assert (got.block_size, got.num_blocks, got.version) == (128, page.num_blocks, "0.32.0")


def test_the_rust_frontends_log_is_its_only_profile():
    log = read_log_config(str(RUST_LOG))
    assert (log.frontend, log.version, log.prefix_caching, log.block_size) == ("rust", "0.32.0", "true", 128)
    assert merge(None, log, ServerProfile.from_kv_events(None)) == log


def test_kv_events_fill_the_block_size_only_where_nothing_else_said_it():
    kv = ServerProfile.from_kv_events(128)
    assert merge(ServerProfile(prefix_caching="true"), kv).block_size == 128
    assert merge(ServerProfile(block_size=32, sources=(("block_size", "page"),)), kv).source_of("block_size") == "page"


def test_cache_key_moves_with_the_block_size_and_the_floor_only():
    a = ServerProfile(prefix_caching="true", block_size=32, hash_algo="sha256", match_floor=32, num_blocks=10)
    assert a.cache_key() == ServerProfile(prefix_caching="true", block_size=32, hash_algo="sha256",
                                          match_floor=32, num_blocks=99).cache_key()
    assert a.cache_key() != ServerProfile(prefix_caching="true", block_size=128, hash_algo="sha256",
                                          match_floor=128).cache_key()


def test_a_start_up_line_with_thousands_of_digits_is_no_size_and_the_log_source_keeps_counting(tmp_path):
    """Round 7 of the red team (issue 38): one hostile "KV cache size" line of 5 000 digits (constructed,
    appended to the real Python-frontend log) made int() raise on every later update, so the live log
    source failed each poll with a traceback (423 in 12 s) and exported no hit ratio or prompt token again."""
    from cachemon.normalise.log_stream import LogStream
    from cachemon.normalise.log_updates import log_update

    lines = PY_LOG.read_bytes().splitlines(keepends=True)
    hostile = (b"(EngineCore pid=14205) INFO 12-02 07:03:46 [kv_cache_utils.py:2327] CPU KV cache size: "
               + b"9" * 5000 + b" tokens, Maximum concurrency for 4 tokens per request: 5.00x\n")
    override = b"(EngineCore pid=14205) INFO 12-02 07:03:46 [kv_cache_utils.py:2619] Overriding " \
               b"num_gpu_blocks=16384 with num_gpu_blocks_override=" + b"7" * 4400 + b"\n"
    log = tmp_path / "vllm-server.log"
    log.write_bytes(b"".join(lines) + hostile + override)     # after the last engine's own lines
    got = read_log_config(str(log))                 # analyze and check read it so
    assert (got.pool_tokens, got.num_blocks, got.block_size, got.version) == (None, None, None, "0.32.0")
    stream = LogStream("log:vllm-server.log")
    stream.feed(log.read_bytes())
    upd = log_update(stream)                        # the live log source, each poll
    assert upd.info is not None and upd.info.vllm_version == "0.32.0" and upd.info.block_size == ""
    got_gauges = {k.metric for k in upd.gauges}
    assert C.REPORTED_HIT_RATIO.name in got_gauges and C.KV_CACHE_CAPACITY.name not in got_gauges
    assert C.PROMPT_TOKENS_ESTIMATED.name in {c.key.metric for c in upd.counters}
