"""A CPU-platform transfer worker for vLLM 0.32.0's native CPU offloading, loaded by vLLM itself as an
out-of-tree offloading spec (``kv_connector_extra_config``: ``spec_name`` + ``spec_module_path``, which
``vllm/v1/kv_offload/factory.py`` supports).

Why: on vLLM's CPU build, ``CPUOffloadingSpec.get_worker`` refuses to run ("CPU Offloading is currently
only supported on CUDA-alike and XPU GPUs") because its ``CPUOffloadingWorker`` copies with CUDA streams
and events. Everything else of native offloading is vLLM's own, unchanged code: the scheduler-side
``OffloadingConnector``, ``CPUOffloadingManager`` (LRU, reference counts, what is held), the KV events
it publishes with ``medium`` "CPU", the cache-hit sources (``host``) on ``/metrics`` and in
``usage.prompt_tokens_details``. This module only replaces the byte copy: a synchronous
``index_select`` / ``index_copy_`` between the "device" pool (host memory on this platform) and a
separate host tensor of ``num_cpu_chunks`` chunks. ``HostCopyTieringOffloadingSpec`` does the same
for vLLM's ``TieringOffloadingSpec`` (a CPU primary tier plus secondary tiers: ``fs`` writes blocks to files,
medium STORAGE, hits from source ``disk``), whose worker shares a host region with the scheduler's tiers.
It is used only to record real captures on this machine (scripts/e2e/kv_tiers_plans.py); cachemon never
imports it.
"""
from __future__ import annotations

import time

import numpy as np
import torch
from vllm.logger import init_logger
from vllm.v1.kv_offload.base import (
    BlockIDsLoadStoreSpec,
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

logger = init_logger(__name__)


class HostCopyWorker(OffloadingWorker):
    """Copies whole pages, one offloaded chunk per device block (``blocks_per_chunk`` 1)."""

    def __init__(self, kv_caches: CanonicalKVCaches, blocks_per_chunk: int, num_cpu_chunks: int,
                 region: SharedOffloadRegion | None = None):
        if blocks_per_chunk != 1:
            raise ValueError(f"HostCopyWorker copies one block per chunk, got blocks_per_chunk={blocks_per_chunk}")
        self.region = region       # the tiering spec's shared host region (its secondary tiers read it)
        self.device: list[torch.Tensor] = []
        self.host: list[torch.Tensor] = []
        for t in kv_caches.tensors:
            dev = t.tensor.view(torch.int8)
            self.device.append(dev)
            self.host.append(region.create_next_worker_view(dev.shape[1]) if region is not None
                             else torch.zeros((num_cpu_chunks, dev.shape[1]), dtype=torch.int8))
        # the tensors each KV cache group's layers use
        self.group_tensors = [sorted({r.tensor_idx for r in refs}) for refs in kv_caches.group_data_refs]
        self.done: list[TransferResult] = []
        logger.info("HostCopyWorker: %d tensors, %d host chunks of %s bytes", len(self.host), num_cpu_chunks,
                    [h.shape[1] for h in self.host])

    def _copy(self, job_id: int, gpu: GPULoadStoreSpec, other: LoadStoreSpec, store: bool) -> bool:
        assert isinstance(other, BlockIDsLoadStoreSpec)
        t0 = time.perf_counter()
        dev_ids = np.asarray(gpu.block_ids, dtype=np.int64)
        host_ids = np.asarray(other.block_ids, dtype=np.int64)
        assert len(dev_ids) == len(host_ids), (len(dev_ids), len(host_ids))
        nbytes = 0
        off = 0
        for g, size in enumerate(gpu.group_sizes):
            if not size:
                continue
            d = torch.from_numpy(dev_ids[off:off + size])
            h = torch.from_numpy(host_ids[off:off + size])
            off += size
            for ti in self.group_tensors[g]:
                if store:
                    self.host[ti].index_copy_(0, h, self.device[ti].index_select(0, d))
                else:
                    self.device[ti].index_copy_(0, d, self.host[ti].index_select(0, h))
                nbytes += size * self.host[ti].shape[1]
        self.done.append(TransferResult(job_id=job_id, success=True, transfer_size=nbytes,
                                        transfer_time=time.perf_counter() - t0))
        return True

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        return self._copy(job_id, src_spec, dst_spec, store=True)

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec) -> bool:
        return self._copy(job_id, dst_spec, src_spec, store=False)

    def get_finished(self) -> list[TransferResult]:
        out, self.done = self.done, []
        return out

    def wait(self, job_ids: set[int]) -> None:  # noqa: ARG002 (vLLM's signature)
        return   # every copy is finished when submit_* returns

    def shutdown(self) -> None:
        self.host.clear()          # the region's views first, or it cannot close its mapping
        if self.region is not None:
            self.region.cleanup()
            self.region = None


class HostCopyCPUOffloadingSpec(CPUOffloadingSpec):
    """vLLM's CPUOffloadingSpec (its manager, sizes, events), with the host-copy worker."""

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            self._worker = HostCopyWorker(kv_caches, self.blocks_per_chunk, self.num_chunks)  # type: ignore[assignment]
        return self._worker  # type: ignore[return-value]


class HostCopyTieringOffloadingSpec(TieringOffloadingSpec):
    """vLLM's TieringOffloadingSpec (a CPU primary tier and secondary tiers such as ``fs``, each with its
    own events and cache-hit source), with the host-copy worker on the spec's shared host region."""

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            rank = 0 if self.replicated_layout else self.config.parallel.rank
            region = SharedOffloadRegion(engine_id=self._engine_id, num_chunks=self.num_chunks, rank=rank,
                                         kv_bytes_per_chunk=self.kv_bytes_per_chunk,
                                         cpu_page_size=self.cpu_page_size_per_worker)
            self._worker = HostCopyWorker(kv_caches, self.blocks_per_chunk, self.num_chunks, region)  # type: ignore[assignment]
        return self._worker  # type: ignore[return-value]
