"""vLLM's default KV block size per release and platform: what a server uses when nobody passed
``--block-size`` and nothing (``vllm:cache_config_info``, a log line, a KV event) says it.

Read in each release's sdist from PyPI (downloaded 2026-12-06 00:10 UTC; file:line of that release):

* GPU (CUDA, ROCm): 16 from 0.8.5 to 0.33.x, 64 from 0.34.0.
  0.8.5 ``vllm/platforms/cuda.py:143`` (``cache_config.block_size = 16``), 0.10.2 ``platforms/cuda.py:138``,
  0.32.0 ``vllm/config/cache.py:72`` and 0.33.0 ``config/cache.py:185`` (``DEFAULT_BLOCK_SIZE = 16``),
  0.34.0 ``config/cache.py:185`` (``DEFAULT_BLOCK_SIZE = 64``). From 0.32 the attention backend may pick
  another size (``platforms/interface.py:773-781``, 0.34.0 ``:783-791``, logged "Setting kv cache block
  size to N for ... backend(s)"), and MLA models always did (0.8.5 ``platforms/cuda.py:156``: 64): the
  table is the default of ordinary attention.
* CPU backend: 128. 0.32.0 ``platforms/cpu.py:293``; 0.33.0 ``platforms/cpu.py:562`` and 0.34.0
  ``platforms/cpu.py:561`` (the backend's preference, default 128). 0.8.5 ``platforms/cpu.py:75`` and
  0.10.2 ``platforms/cpu.py:149``: 128 with Intel's IPEX, else 16 (the CPU wheels ship it: every real
  capture in tests/fixtures, 0.8.5 to 0.32.0, has ``block_size="128"``). CPU MLA (16) and DeepSeek-V4
  (256) are forced sizes, not defaults (0.32.0 ``platforms/cpu.py:280,291``).

Releases between the ones read (0.11 to 0.31) are taken to agree with both neighbours, which agree.

TODO(merge): the helper "floors" adds ``normalise.eras.default_block_size(version, platform)``; the lead
keeps one of the two tables.
"""
from __future__ import annotations

from dataclasses import dataclass

from cachemon.normalise.eras import version_key

PLATFORMS = ("gpu", "cpu")


@dataclass(frozen=True)
class BlockSizeRow:
    platform: str
    first: str              # the first release with this default
    tokens: int
    source: str             # where it was read (release file:line)


# Newest first per platform: the first row whose `first` is at or below the version applies.
DEFAULT_BLOCK_SIZES: tuple[BlockSizeRow, ...] = (
    BlockSizeRow("gpu", "0.34.0", 64, "vllm 0.34.0 vllm/config/cache.py:185"),
    BlockSizeRow("gpu", "0", 16, "vllm 0.8.5 vllm/platforms/cuda.py:143 ... 0.33.0 vllm/config/cache.py:185"),
    BlockSizeRow("cpu", "0", 128, "vllm 0.8.5 vllm/platforms/cpu.py:75 ... 0.34.0 vllm/platforms/cpu.py:561"),
)

NEWEST_GPU = DEFAULT_BLOCK_SIZES[0]


def platform_of(version: str) -> str | None:
    """The platform a version string names: the CPU wheels' local version says ``+cpu`` ("0.32.0+cpu")."""
    return "cpu" if "+cpu" in version.lower() else None


def default_block_size(version: str, platform: str) -> BlockSizeRow | None:
    """vLLM `version`'s default block size on `platform` ("gpu" or "cpu"); None when the version is unreadable."""
    if platform not in PLATFORMS:
        raise ValueError(f"unknown platform {platform!r} (known: {', '.join(PLATFORMS)})")
    key = version_key(version)
    if key is None:
        return None
    return next(r for r in DEFAULT_BLOCK_SIZES if r.platform == platform and key >= (version_key(r.first) or ()))
