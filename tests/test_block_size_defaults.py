"""The default KV block size per vLLM release and platform (normalise/eras.py ``default_block_size``): the
CPU rows against every real capture's `vllm:cache_config_info`, the GPU rows against the 0.33.0 / 0.34.0
wheels' `vllm/config/cache.py:185` (cited in the table), and no guess where the release or platform is unknown."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from cachemon.normalise.eras import BLOCK_SIZE_DEFAULTS, default_block_size

FIX = Path(__file__).parent / "fixtures"
# real CPU captures recorded without --block-size, and the release each ran (fixtures/README.md)
CPU_CAPTURES = {"vllm-0.8.5-cpu-v0": "0.8.5.post2", "vllm-0.10.2-cpu": "0.10.2.post2",
                "vllm-0.11.2-cpu": "0.11.2.post2", "vllm-0.32.0-cpu": "0.32.0+cpu"}


@pytest.mark.parametrize("folder,version", sorted(CPU_CAPTURES.items()))
def test_cpu_default_is_what_the_real_servers_ran(folder: str, version: str) -> None:
    page = (FIX / folder / "metrics-idle.txt").read_text()
    sizes = set(re.findall(r'cache_config_info\{[^}]*\bblock_size="(\d+)"', page))
    assert sizes == {str(default_block_size(version, "cpu"))}


def test_gpu_default_moved_in_0_34() -> None:
    assert [default_block_size(v, "cuda") for v in ("0.9.2", "0.33.0", "0.33.9", "0.34.0", "v0.34.1rc1")] == \
        [16, 16, 16, 64, 64]
    assert default_block_size("0.34.0", "rocm") == 64
    assert default_block_size("0.34.0", "cpu") == 128          # the CPU platform keeps 128
    assert default_block_size("0.23.0", "ascend") == 128


@pytest.mark.parametrize("version,platform", [(None, "gpu"), ("", "cuda"), ("not-a-version", "gpu"),
                                              ("0.34.0", None), ("0.34.0", "tpu")])
def test_unknown_release_or_platform_is_no_guess(version: str | None, platform: str | None) -> None:
    assert default_block_size(version, platform) is None


def test_every_row_cites_its_source() -> None:
    assert all(re.search(r"\.py", r.source) for r in BLOCK_SIZE_DEFAULTS)
