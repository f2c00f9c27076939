"""Every engine is a row (normalise/engines.py): SGLang, MindIE, TensorRT-LLM and vllm-ascend read
through the same pipeline as vLLM. Pages and event streams are CONSTRUCTED from each engine's source
(tests/fixtures/<engine>-constructed/README.md cites file and line); the truth is computed here from
the fixture's own inputs (requests.json, the event lists), never by cachemon."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from assert_support import nonempty
from cachemon import catalog as C
from cachemon.normalise import engines as EN
from cachemon.normalise import eras as E
from cachemon.normalise.normaliser import normalise_text, to_update
from cachemon.state.store import Store

FIX = Path(__file__).parent / "fixtures"
SGL = FIX / "sglang-constructed"
MINDIE = FIX / "mindie-constructed"


def _feed(pages: list[str]) -> tuple[float, float, int, dict[tuple[str, tuple[str, ...]], float]]:
    """Each page through normalise -> Store, 10 s apart: (queries, hits, restarts, gauges) at the end."""
    store = Store({"1m": 60.0})
    for i, text in enumerate(pages):
        store.apply("u", to_update(normalise_text(text)), 1000.0 + 10 * i)
    st = store._state("u", "metrics")
    q, h = st.local_totals()
    return q, h, st.restarts, dict(st.gauges)


def _sglang_truth() -> tuple[float, float, int]:
    """By hand from requests.json: a page's requests are cumulative within its process; a new process
    (p1 -> p2) starts from zero, so the total is each process's last page summed."""
    pages = json.loads((SGL / "requests.json").read_text())["pages"]
    last: dict[str, dict] = {}
    for p in pages:
        last[p["file"].split("-")[1]] = p
    q = sum(r["prompt"] for p in last.values() for r in p["requests"])
    h = sum(r["cached"] for p in last.values() for r in p["requests"])
    return q, h, len(last) - 1


def test_every_era_and_wire_row_names_an_engine_row():
    for era in nonempty(E.ERAS):
        assert era.engine in EN.BY_NAME, era.name
    for eng in nonempty(EN.ENGINES):
        assert eng.counters in ("counter", "gauge-as-counter", "none") and eng.source


def test_sglang_counters_are_exact_and_the_restart_counted_once():
    pages = [(SGL / p["file"]).read_text() for p in json.loads((SGL / "requests.json").read_text())["pages"]]
    q, h, restarts, gauges = _feed(pages)
    tq, th, tr = _sglang_truth()
    assert (q, h, restarts) == (tq, th, tr) == (5100.0, 2212.0, 1)


def test_sglang_per_batch_gauge_is_a_reported_ratio_never_the_hit_rate():
    n = normalise_text((SGL / "metrics-p1-t1.txt").read_text())
    assert n.era.name == "sglang-cached-tokens" and n.era.engine == "sglang"
    assert n.gauges == {n_key: 0.6 for n_key in n.gauges}
    (key,) = n.gauges
    assert key.metric == C.REPORTED_HIT_RATIO.name and key.labels[-1] == "per_batch_tokens"
    upd = to_update(n)
    assert upd.info is not None and upd.info.engine == "sglang" and upd.info.era == "sglang-cached-tokens"


def test_sglang_page_without_a_hit_yet_counts_zero_hits():
    """SGLang creates sglang:cached_tokens_total at the first hit: before it, 0 hits, not 'missing'."""
    text = "\n".join(ln for ln in (SGL / "metrics-p2-t2.txt").read_text().splitlines()
                     if "cached_tokens" not in ln) + "\n"
    n = normalise_text(text)
    assert not n.problems
    assert {k.metric: v for k, v in n.counters.items() if k.labels[-1] == "local"} == {
        C.QUERY_TOKENS.name: 700.0, C.HIT_TOKENS.name: 0.0, C.MISS_TOKENS.name: 700.0}


def test_vllm_names_are_not_read_without_vllms_prefix_nor_sglangs_with_it():
    page = ("# TYPE prompt_tokens_total counter\nprompt_tokens_total 5\n"
            "vllm:sglang:prompt_tokens_total 7\nsglang:prompt_tokens_total{model_name=\"m\"} 9\n")
    n = normalise_text(page)
    assert n.era.engine == "sglang"
    assert [s.value for s in n.samples if s.key.metric == C.QUERY_TOKENS.name] == [9.0]
    assert not [s for s in n.samples if s.key.metric == C.PROMPT_TOKENS.name]


@pytest.mark.parametrize("bad", ["NaN", "-1"])
def test_a_bad_source_series_refuses_the_sum_rather_than_faking_a_restart(bad):
    text = (SGL / "metrics-p1-t1.txt").read_text()
    broken = text.replace('cache_source="host",engine_type="unified",model_name="qwen",pp_rank="0",tp_rank="0"} 200.0',
                          f'cache_source="host",engine_type="unified",model_name="qwen",pp_rank="0",tp_rank="0"}} {bad}')
    assert broken != text
    q, h, restarts, _ = _feed([text, broken])
    assert (h, restarts) == (1700.0, 0)


def _last_value(text: str, name: str) -> float:
    return float(next(ln.rsplit(" ", 1)[1] for ln in text.splitlines() if ln.startswith(name + "{")))


def test_mindie_token_gauges_are_exact_reset_aware_counters():
    files = nonempty(sorted(MINDIE.glob("metrics-p*.txt")))
    texts = [f.read_text() for f in files]
    q, h, restarts, gauges = _feed(texts)
    # truth by hand: the last page of each process (p1, p2), read straight from the files
    last = {f.name.split("-")[1]: t for f, t in zip(files, texts, strict=True)}
    assert q == sum(_last_value(t, "all_radix_match_num") for t in last.values()) == 16384.0
    assert h == sum(_last_value(t, "npu_radix_match_hit_num") for t in last.values()) == 7168.0
    assert restarts == 1
    rate = {k.labels[-1]: v for k, v in gauges.items() if k.metric == C.REPORTED_HIT_RATIO.name}
    assert rate == {"since_start_tokens": pytest.approx(0.333333)}


def test_mindie_rate_gauge_alone_is_reported_never_counted():
    text = "".join(ln + "\n" for ln in (MINDIE / "metrics-p1-t1.txt").read_text().splitlines()
                   if "radix_match" not in ln)
    n = normalise_text(text)
    assert n.era.name == "mindie-hit-rate-gauge" and not n.samples
    assert list(n.gauges.values()) == [0.5]


# --- KV events -------------------------------------------------------------------------------------

def _sglang_as_vllm_maps(msgs):
    """The reference's reading of SGLang's explicit salt: vLLM carries a salt in the chain head's extra
    keys (tests/tenant_support._salt), SGLang on every event of the chain as `cache_salt`. The pool's
    split counts the pool only: a host-tier (CPU_PINNED) store is another tier's, left out here."""
    for m in msgs:
        m.events = [e for e in m.events if e.get("medium") in (None, "GPU")]
        for e in m.events:
            if e["type"] == "BlockStored" and e.get("cache_salt") and e.get("parent_block_hash") is None:
                e["extra_keys"] = [[e["cache_salt"]]] + [None] * (len(e["block_hashes"]) - 1)
    return msgs


def test_sglang_batches_decode_as_a_row_not_unknown_era():
    from cachemon.normalise.kv_batch import Cleared, Stored
    from kv_support import messages
    msgs = nonempty(messages(SGL))
    batches = [m["batch"] for m in msgs]
    assert all(b.release == "sglang 0.5.23" for b in batches if b.events and not isinstance(b.events[0], Cleared))
    assert all(b.dp_rank == 0 for b in batches)
    first = next(e for b in batches for e in b.events if isinstance(e, Stored))
    assert first.block_size == 1 and len(first.hashes) == len(first.tokens) == 40     # one hash per token
    assert first.extra == (("tenant-a-secret",),) + (None,) * 39                      # the salt, as vLLM's
    mediums = {e.medium for b in batches for e in b.events if isinstance(e, Stored)}
    assert mediums == {"GPU", "CPU"}


def test_sglang_ledger_split_is_exact_and_the_restart_counted_once():
    from cachemon.state.ledger.fleet import FleetLedger
    from kv_support import REASONS, load_messages, reference_split, replay
    fleet = FleetLedger()
    replay(SGL, fleet, model="qwen")
    view = fleet.view("sgl-0")
    assert view is not None and view.in_sync
    got = {r: int(view.stored_tokens.get(r, 0)) for r in REASONS}
    want = reference_split(_sglang_as_vllm_maps(load_messages(SGL)))["sgl-0"]
    assert got == want
    # by hand: 40 + 40 (b: isolation, not first) + 25 + 43 (plain: 40 isolation + 3 first) + 25 (capacity)
    # + 40 after the restart (restart)
    assert sum(got.values()) == 213 and got["restart"] == 40 and got["capacity"] == 25
    assert got["reset"] == 0            # the AllBlocksCleared each process starts with finds an empty cache


def test_sglang_salts_split_by_tenant_and_never_leave_raw():
    from cachemon.expose.kv_collector import KvLedgerCollector
    from cachemon.expose.render import render
    from cachemon.state.ledger.fleet import FleetLedger
    from cachemon.state.ledger.tenants import TenantLabels
    from kv_support import load_messages, replay
    from tenant_support import reference_tenant_split
    key = b"k" * 16
    labels = TenantLabels({}, key, 20)
    fleet = FleetLedger(tenants=labels)
    replay(SGL, fleet, model="qwen")
    snap = next(s for s in fleet.snapshot() if s.replica == "sgl-0")
    got = {(t, a): {k: int(v) for k, v in split.items() if v} for t, a, split, _ in snap.tenants}
    import hashlib
    import hmac

    def hlabel(salt: str | None) -> str:      # normalise/tenant_label.py's rule, written out
        return "h-" + hmac.new(key, salt.encode(), hashlib.sha256).hexdigest()[:12] if salt else ""
    want = reference_tenant_split(_sglang_as_vllm_maps(load_messages(SGL)), hlabel)
    want = {k: {r: v for r, v in d.items() if v and r != "hits"} for k, d in want.items()}
    assert got == {k: v for k, v in want.items() if v}
    page = render([KvLedgerCollector(fleet)]).decode()
    assert got and "tenant=\"h-" in page and "secret" not in repr(got) + page


TRT = FIX / "tensorrt-llm-constructed"


def test_tensorrt_llm_string_token_ids_decode_and_split_exactly():
    from cachemon.normalise.kv_batch import Stored
    from cachemon.state.ledger.fleet import FleetLedger
    from kv_support import REASONS, load_messages, messages, reference_split, replay
    batches = [m["batch"] for m in nonempty(messages(TRT))]
    # a text-only store is a shape vLLM 0.24+ publishes too, read as vLLM's (the first BlockStored settles the
    # stream's decoder; both decode the same): the label is vLLM's range. A first store with mm_keys names
    # TensorRT-LLM.
    assert {b.release for b in batches} == {"0.24.0-0.34.0"}
    image_first = load_messages(TRT)[1]
    import msgspec

    from cachemon.normalise.kv_decode import KvDecoder
    payload = msgspec.msgpack.encode([image_first.ts, image_first.events, 0])
    assert KvDecoder().decode(payload, 0).release == "tensorrt-llm 13599e9"
    fleet = FleetLedger()
    replay(TRT, fleet, model="llava")
    view = fleet.view("trt-0")
    assert view is not None and view.in_sync
    snap = next(s for s in fleet.snapshot() if s.replica == "trt-0")
    assert not dict(snap.anomalies).get("malformed_stores")
    got = {r: int(view.stored_tokens.get(r, 0)) for r in REASONS}
    # The repeat stores its whole prompt again from block 0 (parent null, every block cached): on vLLM's wire
    # that is a request that skipped the lookup (prompt_logprobs), read as cache_opt_out unless the replica
    # is known to send full reports (state/ledger/reuse.py); the reference predates that rule and calls it
    # recompute_last_block. Every other reason is the reference's.
    ref = reference_split(load_messages(TRT))["trt-0"]
    ref["cache_opt_out"], ref["recompute_last_block"] = ref["recompute_last_block"], 0
    assert got == ref
    # by hand: 16 + 12 first, 12 again (cached: cache_opt_out), 8 first (another image), 12 back after their
    # eviction (capacity)
    assert got["first"] == 36 and got["cache_opt_out"] == 12 and got["capacity"] == 12
    img = batches[1].events[0]
    assert isinstance(img, Stored) and len(img.hashes) == 3 and img.block_size == 4


def test_vllm_ascend_connector_events_in_the_schedulers_batch_never_lose_the_pools():
    """CONSTRUCTED batch, as vllm-ascend's RecomputeScheduler publishes one step (core/recompute_scheduler.py,
    update_from_output: kv_cache_manager.take_events() then connector.take_events(), one KVEventBatch):
    the pool's BlockStored, then the AscendStore connector's, one per block, medium "cpu", no LoRA, and
    token_ids None when the request kept none (kv_pool/ascend_store kv_transfer.py / pool_worker.py:
    ``token_ids = req_meta.token_ids[start:end] if req_meta.token_ids is not None else None``)."""
    import msgspec

    from cachemon.normalise.kv_decode import KvDecoder
    from cachemon.state.ledger.fleet import FleetLedger
    bs = 128
    toks = list(range(2 * bs))
    gpu = {"type": "BlockStored", "block_hashes": [11, 12], "parent_block_hash": None, "token_ids": toks,
           "block_size": bs, "lora_id": None, "medium": "GPU", "lora_name": None, "group_idx": 0,
           "kv_cache_spec_kind": "full_attention"}
    cpu = [{"type": "BlockStored", "block_hashes": [h], "parent_block_hash": p, "token_ids": t, "block_size": bs,
            "lora_id": None, "medium": "cpu", "lora_name": None}
           for h, p, t in ((11, None, toks[:bs]), (12, 11, None))]
    batch = KvDecoder().decode(msgspec.msgpack.encode([5.0, [gpu, *cpu], 0]), 0)
    assert [len(e.hashes) for e in batch.events] == [2, 1, 1]
    fleet = FleetLedger()
    fleet.on_batch("npu-0", "m", batch, 5.0)
    view = fleet.view("npu-0")
    assert view is not None and view.in_sync and view.stored_tokens["first"] == 2 * bs
    snap = next(s for s in fleet.snapshot() if s.replica == "npu-0")
    assert sum(t.stored_blocks for t in snap.tiers) == 2


def test_the_server_profile_names_the_engine_of_every_page():
    sgl = normalise_text((SGL / "metrics-p1-t1.txt").read_text())
    mindie = normalise_text((MINDIE / "metrics-p1-t1.txt").read_text())
    vllm = normalise_text((FIX / "vllm-0.32.0-cpu" / "metrics-static-system-prompt.txt").read_text())
    assert {p.engine for p in nonempty(list(sgl.engines.values()))} == {"sglang"}
    assert {p.engine for p in nonempty(list(mindie.engines.values()))} == {"mindie"}
    assert {p.engine for p in nonempty(list(vllm.engines.values()))} == {"vllm"}


def test_sglang_prefill_line_is_a_per_batch_reported_ratio():
    from cachemon.normalise.log_grammar import hit_basis, parse
    lines = (SGL / "sglang-server.log").read_text().splitlines()
    got = [parse(ln) for ln in lines]
    ratios = [s.hit_rates.get("local") for s in got if s is not None]
    # by hand from the lines: 0 / (1000 + 0); 800 / (400 + 800)
    assert ratios == [0.0, 800 / 1200]
    assert hit_basis("sglang_prefill") == "per_batch_tokens"
    assert parse(lines[2]) is None                          # the decode line says nothing of the cache


def test_a_connector_chunk_that_is_not_block_size_ids_keeps_its_hashes_and_the_batch():
    """CONSTRUCTED: vllm-ascend's connector stamps its event with the request's original block size
    (kv_transfer.py:831-835) while the chunk is the group's hash block (group_block_size, 837): the ids need
    not add up to block_size. A tier only needs the hashes; a GPU store that does not add up still fails."""
    import msgspec

    from cachemon.normalise.kv_decode import KvDecodeError, KvDecoder
    gpu = {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None, "token_ids": list(range(16)),
           "block_size": 16, "lora_id": None, "medium": "GPU", "lora_name": None}
    chunk = {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None, "token_ids": list(range(64)),
             "block_size": 128, "lora_id": None, "medium": "cpu", "lora_name": None}
    batch = KvDecoder().decode(msgspec.msgpack.encode([1.0, [gpu, chunk], 0]), 0)
    assert [(e.hashes, e.block_size) for e in batch.events] == [((1,), 16), ((1,), 0)]
    with pytest.raises(KvDecodeError, match="token_count"):
        KvDecoder().decode(msgspec.msgpack.encode([1.0, [dict(gpu, token_ids=list(range(15)))], 0]), 0)


# (engine, a page, a later page of the same process, its query counter, its hit counter)
PAIRS = [("mindie", MINDIE / "metrics-p1-t0.txt", MINDIE / "metrics-p1-t1.txt", "all_radix_match_num",
          "npu_radix_match_hit_num"),
         ("sglang", SGL / "metrics-p1-t0.txt", SGL / "metrics-p1-t1.txt", "sglang:prompt_tokens_total",
          "sglang:cached_tokens_total"),
         ("vllm", FIX / "vllm-0.32.0-cpu" / "metrics-idle.txt", FIX / "vllm-0.32.0-cpu" / "metrics-static-system-prompt.txt",
          "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")]


def _exported(state) -> tuple[float, float, float]:
    return tuple(sum(s.value for k, s in state.counters.items() if k.metric == spec.name)   # type: ignore[return-value]
                 for spec in (C.QUERY_TOKENS, C.HIT_TOKENS, C.MISS_TOKENS))


@pytest.mark.parametrize("bad", ["NaN", "+Inf"])
@pytest.mark.parametrize("which", ["queries", "hits"])
@pytest.mark.parametrize(("engine", "first", "later", "queries", "hits"), PAIRS, ids=[p[0] for p in PAIRS])
def test_a_nan_or_inf_hit_or_query_counter_holds_the_pair_counted_and_said(engine, first, later, queries, hits,
                                                                           which, bad):
    """Red team (issue 38): MindIE's query counter read NaN while its hits went on: the hits were capped at the
    held queries (an interval of 100 % hits), a NaN hit counter let the queries advance with neither hits nor
    misses (0 %). CONSTRUCTED: the later page of each engine's fixture with every sample of one counter set to
    NaN or +Inf, read twice between the real pages. The pair holds at the first page's values, the refused
    samples are counted and said, and the later page then gives exactly what it gives without the bad polls."""
    a, b = first.read_text(), later.read_text()
    name = queries if which == "queries" else hits
    broken = "".join(ln.rsplit(" ", 1)[0] + f" {bad}\n" if ln.startswith(name + "{") else ln + "\n"
                     for ln in b.splitlines())
    assert broken != b

    def run(pages: list[str]):
        state = Store({"1m": 60}).upstream("u")
        seen = []
        for i, text in enumerate(pages):
            n = normalise_text(text)
            state.apply(to_update(n), i * 5.0)
            seen.append((_exported(state), n.problems))
        return state, seen
    _, clean = run([a, b, b, b])
    state, got = run([a, broken, broken, b, b, b])
    before = clean[0][0]
    assert before[0] < clean[-1][0][0]                       # the later page moved the counters
    assert [e for e, _ in got[:3]] == [before] * 3           # held: no interval of 0 % or 100 %
    said = " ".join(p.message for p in got[1][1])
    assert f"{name.split(':')[-1]}: 1 sample(s) refused" in said and "held at their last good value" in said
    assert state.rejected[{"NaN": "nan", "+Inf": "infinite"}[bad]] == 2
    assert got[-1][0] == clean[-1][0]                         # then exact, misses included
    q, h, miss = got[-1][0]
    assert miss == q - h
