"""vLLM 0.34.0 as rows (issue 35 item 1), on CONSTRUCTED pages: tests/fixtures/vllm-0.34.0-constructed/ (0.34.0
cannot run on this machine: its README says why). Their `vllm:cache_config_info` labels are 0.34.0's own
``CacheConfig.metrics_info()`` run here (make_pages.py), spliced into the real 0.32.0 pages; every other line is
the real page.

Asserted: the `/metrics` era and every counter read exactly as on the real page the labels were spliced into;
the block size of the page (64 on a GPU, 128 on the CPU build) equals ``default_block_size`` for 0.34.0 on that
platform; the new label ``enable_extensible_kv_cache`` and a ``gpu_memory_utilization`` of "None" read as no
number and break nothing; the Rust frontend's page now says its block size itself."""
from __future__ import annotations

import json
import re
from pathlib import Path

from cachemon.normalise.eras import default_block_size
from cachemon.normalise.normaliser import normalise_text, to_update
from cachemon.runtime.change_detector import _cache_config_of, _describe_cache_config
from cachemon.state.store import Store

FIX = Path(__file__).parent / "fixtures"
HERE = FIX / "vllm-0.34.0-constructed"


def _labels(page: str) -> dict[str, str]:
    m = re.search(r"^vllm:cache_config_info\{(.*)\} \S+$", page, re.M)
    assert m is not None
    return dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))


def _samples(page: str) -> list[tuple[object, float]]:
    return sorted((s.key, s.value) for s in normalise_text(page).samples)     # type: ignore[type-var]


def test_the_gpu_page_reads_its_block_size_and_counters_and_no_label_is_a_number_it_is_not() -> None:
    page = (HERE / "metrics-gpu.txt").read_text()
    labels = _labels(page)
    assert labels["gpu_memory_utilization"] == "None" and labels["enable_extensible_kv_cache"] == "True"
    n = normalise_text(page)
    assert n.era.name == "v1-prefix-cache"
    (cfg,) = n.engines.values()
    assert cfg.block_size == default_block_size("0.34.0", "cuda") == 64
    assert cfg.match_floor == 64 and cfg.pool_tokens == 262144 and cfg.prefix_caching == "true"
    # every count as on the real 0.32.0 page it was spliced into
    real = (FIX / "vllm-0.32.0-cpu" / "metrics-static-system-prompt.txt").read_text()
    assert _samples(page) == _samples(real) and _samples(page)
    # the daemon's path: the store, and change detection's description of the config
    Store({"1m": 60.0}).apply("u", to_update(n, "0.34.0"), 1.0)
    assert "block_size=64" in _describe_cache_config(_cache_config_of(n))


def test_the_rust_frontend_page_of_0_34_says_its_block_size_itself() -> None:
    page = (HERE / "metrics-rust.txt").read_text()
    assert page.endswith("# EOF\n")
    n = normalise_text(page)
    assert n.era.name == "v1-prefix-cache"
    (cfg,) = n.engines.values()
    assert cfg.block_size == default_block_size("0.34.0", "cpu") == 128
    # 0.32.0's Rust page has no cache_config_info at all (the real capture): the log had to say it
    rows = [json.loads(x) for x in (FIX / "vllm-0.32.0-cpu-rust-frontend" / "rust" / "metrics.jsonl").read_text().splitlines()]
    old = [r["text"] for r in rows if r.get("text") and r.get("accept") == "text/plain"][-1]
    assert "cache_config_info" not in old and not normalise_text(old).engines
    assert _samples(page) == _samples(old)
