"""One description of a server (normalise/server_profile.py), read from the real vLLM 0.32.0 captures of
both frontends: the Python frontend's page and log, the Rust frontend's page (no cache_config_info) and log."""
from __future__ import annotations

import json

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
