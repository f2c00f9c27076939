"""kv_record.py scenarios with a KV tier besides the device pool, on vLLM's CPU build (issue §4).
Registered into kv_record.SCENARIOS by kv_record.main().

* ``cpu_offload_hostcopy``: vLLM's native CPU offloading (``--kv-offloading-backend native
  --kv-offloading-size``: OffloadingConnector + CPUOffloadingManager, events with medium "CPU", hits
  from source "host"), with the byte copy done by ``vllm_plugins/host_offload_worker.py`` (vLLM's own
  worker needs CUDA streams; the spec is loaded through vLLM's out-of-tree spec hook).
* ``example_connector``: vLLM's ExampleConnector (KV saved per prompt to a folder with safetensors and
  loaded back; hits reported as source "external_unspecified"; it publishes no events of its own).

Both: a device pool of 24 blocks (23 usable) and ``--max-model-len 2048``; traffic ``sc_tiers``.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from kv_recorder import Recorder, chat, seq_send, tenant_system

HERE = Path(__file__).resolve().parent
PLUGINS = HERE / "vllm_plugins"


def _brace(s: str) -> str:
    """Escape a JSON flag for kv_recorder's ``str.format`` of extra_args."""
    return s.replace("{", "{{").replace("}", "}}")


def _round(rec: Recorder, phase: str, tag: str, tenants, start: int) -> None:
    """One request per tenant ("TAG k" after the tenant's system prompt), one at a time, then 2 s idle."""
    rec.phase(phase)
    seq_send(rec, rec.replicas["vllm"], rec.args.scenario,
             [chat(tenant_system(k), f"{tag} {k}") for k in tenants], start=start)
    time.sleep(2)


def sc_tiers(rec: Recorder, meta: dict) -> None:
    """6 tenants x 6 blocks through a 23-block device pool (each new tenant evicts older blocks
    from the device), the 6 again (device hits where blocks stayed, the rest from the tier), a
    device-only ``reset_prefix_cache`` and 3 tenants again (from the tier), then a reset of the tier
    too (``?reset_external=true``) and 2 other tenants again (computed: nothing holds them)."""
    r = rec.replicas["vllm"]
    _round(rec, "fill", "Fill", range(6), 0)
    _round(rec, "again", "Again", range(6), 6)
    meta["reset"] = rec.reset(r)          # the device pool only (reset_external=false)
    time.sleep(3)
    _round(rec, "after reset", "After reset", range(3), 12)
    meta["reset_external"] = reset_external(rec, r)
    time.sleep(3)
    _round(rec, "after reset_external", "After reset_external", (3, 4), 15)


def sc_tiers_small(rec: Recorder, _meta: dict) -> None:
    """A device pool that holds one tenant and a CPU tier that holds about three: 6 tenants, then the
    6 again newest first: a device hit, hits from the CPU tier, then misses (evicted from both)."""
    _round(rec, "fill", "Fill", range(6), 0)
    _round(rec, "again, newest first", "Again", reversed(range(6)), 6)


def reset_external(rec: Recorder, r) -> dict:
    """``POST /reset_prefix_cache?reset_external=true``: the device pool and the KV connector's cache."""
    t = time.time()
    resp = r.session.post(r.api + "/reset_prefix_cache", params={"reset_external": "true"}, timeout=60)
    rec.write_event("reset_prefix_cache", replica=r.name, status=resp.status_code, reset_external=True)
    rec.phase(f"reset_external {r.name} HTTP {resp.status_code}")
    return {"t": t, "status": resp.status_code}


def fs_tier(rec: Recorder) -> None:
    """The tiering spec's ``fs`` tier: a fresh folder under the recorder's temporary directory."""
    root = rec.tmp / "fs-tier"
    root.mkdir()
    extra = {"spec_name": "HostCopyTieringOffloadingSpec", "spec_module_path": "host_offload_worker",
             "secondary_tiers": [{"type": "fs", "root_dir": str(root), "enable_kv_events": True,
                                  "locality": "LOCAL", "n_read_threads": 2, "n_write_threads": 2}]}
    rec.plan["extra_args"] = [*rec.plan.get("extra_args", []), "--kv-transfer-config",
                              _brace(json.dumps({"kv_connector_extra_config": extra}))]


def example_storage(rec: Recorder) -> None:
    """ExampleConnector's folder: fresh, under the recorder's temporary directory."""
    store = rec.tmp / "kv-store"
    store.mkdir()
    cfg = {"kv_connector": "ExampleConnector", "kv_role": "kv_both",
           "kv_connector_extra_config": {"shared_storage_path": str(store)}}
    rec.plan["extra_args"] = [*rec.plan.get("extra_args", []), "--kv-transfer-config", _brace(json.dumps(cfg))]


HOSTCOPY = {"kv_connector_extra_config": {"spec_name": "HostCopyCPUOffloadingSpec",
                                          "spec_module_path": "host_offload_worker"}}
DESCRIBED = {"kv_connector_extra_config": {**HOSTCOPY["kv_connector_extra_config"], "self_describing_kv_events": True}}
SMALL = ["--max-model-len", "2048"]

TIERS = {
    "cpu_offload_hostcopy": {
        "fn": sc_tiers, "pool": 24, "env": {"PYTHONPATH": str(PLUGINS)},
        "extra_args": [*SMALL, "--kv-offloading-backend", "native", "--kv-offloading-size", "0.05",
                       "--kv-transfer-config", _brace(json.dumps(HOSTCOPY))]},
    # 12 device blocks (one tenant: 7 blocks a request); 0.0012 GiB: about 19 host chunks of 65 536 bytes
    # (2 layers x K,V x 128 tokens x 64 x bf16), fewer than the 36 blocks of 6 tenants: the tier evicts too
    "cpu_offload_hostcopy_small": {
        "fn": sc_tiers_small, "pool": 12, "env": {"PYTHONPATH": str(PLUGINS)},
        "extra_args": ["--max-model-len", "1024", "--kv-offloading-backend", "native", "--kv-offloading-size", "0.0012",
                       "--kv-transfer-config", _brace(json.dumps(HOSTCOPY))]},
    # the same with the offloading connector's self-describing events (token ids, parents, block size)
    "cpu_offload_hostcopy_described": {
        "fn": sc_tiers_small, "pool": 12, "env": {"PYTHONPATH": str(PLUGINS)},
        "extra_args": ["--max-model-len", "1024", "--kv-offloading-backend", "native", "--kv-offloading-size", "0.0012",
                       "--kv-transfer-config", _brace(json.dumps(DESCRIBED))]},
    # a CPU primary tier of 19 chunks and a file-system tier behind it (vLLM's tiering spec)
    "cpu_fs_tiers": {
        "fn": sc_tiers_small, "pool": 12, "env": {"PYTHONPATH": str(PLUGINS)}, "setup": fs_tier,
        "extra_args": ["--max-model-len", "1024", "--kv-offloading-backend", "native", "--kv-offloading-size", "0.0012"]},
    "example_connector": {"fn": sc_tiers, "pool": 24, "setup": example_storage, "extra_args": list(SMALL)},
}
