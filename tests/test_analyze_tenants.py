"""`cachemon analyze --by-tenant`: whose tokens missed, per tenant and per adapter (issue 25, item 4).

The split is held to what vLLM's own KV events imply per tenant (tenant_support.reference_tenant_split)
on the real recordings of tests/fixtures/vllm-0.32.0-cpu-kv-events/: ``cache_salt`` (the same prompt
under salts tenant-a, tenant-b, tenant-a, none, tenant-a), every one-at-a-time scenario (no salt: one
tenant, no isolation), ``full_report_mixed`` (hits) and ``tenants_lora``; the live ledger
(state/ledger/fleet.py with state/ledger/tenants.py) is held to the same split, and its exposition too.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from assert_support import nonempty
from cachemon.analyze.command import analyze_command
from cachemon.analyze.pipeline import analyze
from cachemon.analyze.requests_io import LOG_INFO_REASON, Request, Skip, parse_line
from cachemon.analyze.tenant_split import TenantOptions
from cachemon.analyze.tokenize import ModelTokenizer
from cachemon.normalise.tenant_label import OTHER, LabelBudget, TenantNamer, salt_digest, top_k
from helpers import FIXTURES
from kv_support import load_messages, load_requests
from tenant_support import HITS, reference_tenant_split

KV = FIXTURES / "vllm-0.32.0-cpu-kv-events"
TOKENIZER = FIXTURES / "vllm-0.32.0-cpu" / "model"
BS = 128
KEY = b"cachemon-test-key-0123456789abcdef"
# scenario -> (pool blocks as recorded, replicas); requests one at a time
SCENARIOS = {"cache_salt": (160, 1), "tiny_pool": (36, 1), "reset": (160, 1), "restart": (160, 1),
             "routing": (160, 2), "multiturn": (160, 1), "dynamic_prefix_head": (160, 1),
             "full_report_mixed": (160, 1), "tenants_lora": (160, 1), "tenants_alert": (400, 1)}


@pytest.fixture(scope="module")
def tok():
    return ModelTokenizer(TOKENIZER)


def _namer() -> TenantNamer:
    return TenantNamer({salt_digest("tenant-a"): "alpha"}, KEY)


def _lora_models(d: Path) -> list[str]:
    """The adapters the recording served (scripts/e2e/kv_more.py writes them under metadata "tenants")."""
    meta = json.loads((d / "metadata.json").read_text())
    return sorted((meta.get("tenants") or {}).get("adapters") or {})


def _analyze(d: Path, tok, namer: TenantNamer, **kw):
    pool, replicas = SCENARIOS[d.name]
    return analyze(str(d / "requests.jsonl"), tok, block_size=BS, cache_blocks=pool, what_if=False,
                   replicas=replicas, routing="round-robin", lora_models=_lora_models(d),
                   tenants=TenantOptions(namer, top=100), **kw)


def _pairs(res) -> dict[tuple[str, str], dict[str, int]]:
    """analyze's per-tenant split, reasons with tokens only (the ledger's reasons include cache_opt_out,
    which analyze's simulation never names)."""
    return {k: {r: x for r, x in s.stored.items() if x} for k, s in res.tenants.pairs.items() if any(s.stored.values())}


def _ledger_pairs(d: Path) -> dict | None:
    """The live ledger's per-tenant split of the recording (state/ledger/tenants.py; None before it is merged),
    fed as the KV-event stage would (kv_support.replay), with the same names and key as ``_namer``; its
    hits (full-report reuse reports) under the pseudo-reason HITS."""
    import importlib.util
    if importlib.util.find_spec("cachemon.state.ledger.tenants") is None:
        return None
    from cachemon.state.ledger.fleet import FleetLedger
    from cachemon.state.ledger.tenants import TenantLabels
    from kv_support import replay
    fleet = FleetLedger(tenants=TenantLabels({salt_digest("tenant-a"): "alpha"}, KEY, 100), full_reports=True)
    replay(d, fleet, "tiny")
    out: dict[tuple[str, str], dict[str, int]] = {}
    for snap in fleet.snapshot():
        for t, a, split, hits in snap.tenants:
            row = out.setdefault((t, a), {})
            for r, v in [*split.items(), (HITS, hits)]:
                if v:
                    row[r] = row.get(r, 0) + int(v)
    return {k: v for k, v in out.items() if v}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_tenant_split_equals_what_the_events_imply(scenario, tok):
    d = KV / scenario
    if not (d / "events.jsonl").is_file():
        pytest.skip(f"recording {d} not in this tree")
    namer = _namer()
    res = _analyze(d, tok, namer)
    usage = [r["usage"] for r in load_requests(d) if "usage" in r]
    # exact hits first: the per-tenant numbers rest on the same simulation
    assert list(res.cached_tokens) == [(u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0 for u in usage]
    ref = reference_tenant_split(load_messages(d), namer)
    ledger = _ledger_pairs(d)
    if ledger is not None:               # the live ledger, once its tenant split is in the tree: splits and hits
        assert ledger == {k: {r: x for r, x in v.items() if x} for k, v in ref.items() if any(v.values())}
    reported = {k: v.pop(HITS) for k, v in ref.items() if HITS in v}
    ref = {k: {r: x for r, x in v.items() if x} for k, v in ref.items() if any(v.values())}
    assert ref and _pairs(res) == ref
    # hits: what the full-report requests' reuse reports say, per tenant, equals analyze's prediction
    # for those requests (and vLLM's usage, checked above)
    assert reported == {k: s.full_report_cached_tokens for k, s in res.tenants.pairs.items()
                        if s.full_report_cached_tokens}
    # the per-tenant split adds up to the global one (isolation is a part of the global `first`)
    glob = dict(res.stored_split)
    tot = {r: sum(s.stored[r] for s in res.tenants.tenants.values()) for r in res.tenants.tenants[next(iter(
        res.tenants.tenants))].stored}
    assert tot.pop("first") + tot.pop("isolation") == glob.pop("first")
    assert glob.pop("isolation", 0) == 0       # analyze's global split keeps isolation inside first
    assert tot == glob


def test_cache_salt_isolation_is_the_shared_blocks_stored_once_per_other_salt(tok):
    d = KV / "cache_salt"
    res = _analyze(d, tok, _namer())
    t = res.tenants.tenants
    # tenant-a came first: its 6 blocks are new content; tenant-b and the unsalted request stored the
    # same token content again (6 blocks each) while tenant-a's copy was cached: isolation
    blocks = (811 + 4 - 1) // BS
    assert t["alpha"].stored["first"] == blocks * BS and t["alpha"].stored["isolation"] == 0
    assert t[""].stored["isolation"] == blocks * BS and t[""].stored["first"] == 0
    hashed = [x for x in t if x.startswith("h-")]
    assert len(hashed) == 1 and t[hashed[0]].stored["isolation"] == blocks * BS
    assert sum(s.stored["isolation"] for s in t.values()) == 2 * blocks * BS
    # hits per tenant: tenant-a's 2nd and 3rd requests hit its 6 blocks; vLLM's usage says the same
    assert t["alpha"].cached_tokens == t["alpha"].observed_cached_tokens == 2 * blocks * BS
    assert t[""].cached_tokens == t[hashed[0]].cached_tokens == 0


def test_keyed_names_are_stable_for_one_key_and_differ_for_another():
    a, b = TenantNamer(key=KEY), TenantNamer(key=KEY[::-1])
    assert a("tenant-b") == TenantNamer(key=KEY)("tenant-b") != b("tenant-b")
    assert a("tenant-b").startswith("h-") and len(a("tenant-b")) == 14
    assert a(None) == a("") == ""
    assert TenantNamer()("x") != TenantNamer()("x")          # random keys: names for one run only
    assert TenantNamer({salt_digest("x").upper(): "ex"})("x") == "ex"


def test_label_budget_and_top_k():
    budget = LabelBudget(2, always=frozenset({"alpha"}))
    got = [budget(v) for v in ("alpha", "h-1", "", "h-2", "h-3", "h-3", "h-4", "h-1")]
    assert got == ["alpha", "h-1", "", "h-2", OTHER, OTHER, OTHER, "h-1"]
    assert budget.overflowed == 2
    shown, folded = top_k({"a": 5, "b": 9, "c": 1, "": 0}, 1, frozenset({""}))
    assert shown == ["", "b"] and folded == ["a", "c"]


def test_top_tenants_folds_the_rest_into_other(tok):
    d = KV / "cache_salt"
    res = analyze(str(d / "requests.jsonl"), tok, block_size=BS, cache_blocks=160, what_if=False,
                  tenants=TenantOptions(TenantNamer(key=KEY), top=0))
    assert set(res.tenants.tenants) == {"", OTHER} and res.tenants.tenants_folded == 2
    assert res.tenants.tenants[OTHER].requests == 4


def _cli(args: list[str]) -> tuple[int, str]:
    r = CliRunner().invoke(analyze_command, args)
    return r.exit_code, r.output


def test_the_salt_is_never_printed(tmp_path):
    d = KV / "cache_salt"
    key = tmp_path / "key"
    key.write_bytes(KEY)
    names = tmp_path / "names.yaml"
    names.write_text(f"{salt_digest('tenant-a')}: alpha\n")
    for fmt in ("text", "json"):
        code, out = _cli([str(d / "requests.jsonl"), "--tokenizer", str(TOKENIZER), "--block-size", "128",
                          "--cache-blocks", "160", "--top", "0", "--tenant-names", str(names),
                          "--tenant-key-file", str(key), "--format", fmt])
        assert code == 0, out
        assert "tenant-a" not in out and "tenant-b" not in out
        assert "alpha" in out and TenantNamer(key=KEY)("tenant-b") in out
    tenants = json.loads(out)["tenants"]["tenants"]
    assert tenants["alpha"]["stored_tokens"]["first"] == 768 and tenants[""]["stored_tokens"]["isolation"] == 768


def test_a_names_file_holding_salts_is_refused(tmp_path):
    names = tmp_path / "names.yaml"
    names.write_text("tenant-a: alpha\n")
    code, out = _cli([str(KV / "cache_salt" / "requests.jsonl"), "--tenant-names", str(names)])
    assert code == 2 and "(entry 1)" in out and "sha256 hex digest" in out and "tenant-a" not in out


def test_by_user(tmp_path, tok):
    # constructed: the cache_salt stream with a `user` on each line and no salt
    src = [json.loads(x) for x in (KV / "cache_salt" / "requests.jsonl").read_text().splitlines() if x.strip()]
    path = tmp_path / "users.jsonl"
    with open(path, "w") as f:
        for i, d in enumerate(src):
            d["request"].pop("cache_salt", None)
            d["request"]["user"] = f"user-{i % 2}"
            d.pop("usage")
            f.write(json.dumps(d) + "\n")
    res = analyze(str(path), tok, block_size=BS, cache_blocks=160, what_if=False,
                  tenants=TenantOptions(TenantNamer(key=KEY), by="user"))
    t = res.tenants.tenants
    u0, u1 = TenantNamer(key=KEY)("user-0"), TenantNamer(key=KEY)("user-1")
    assert set(t) == {u0, u1} and t[u0].requests == 3 and t[u1].requests == 2
    # no salt: one cache, so user-1 hits what user-0 stored; nothing is isolation
    assert t[u0].stored["first"] == 768 and t[u1].cached_tokens == 2 * 768
    assert all(s.stored["isolation"] == 0 for s in t.values())


def test_two_adapters_over_the_same_prompt(tmp_path, tok):
    # constructed: the cache_salt stream's prompt sent to the base model and two LoRA adapters
    # (by `model` with --lora-model, and by a `lora_name` field)
    line = json.loads((KV / "cache_salt" / "requests.jsonl").read_text().splitlines()[3])
    line.pop("usage")
    rows = []
    for model, lora in (("tiny", None), ("ad-1", None), ("tiny", "ad-2"), ("ad-1", None), ("tiny", "ad-2")):
        d = json.loads(json.dumps(line))
        d["request"]["model"] = model
        if lora:
            d["lora_name"] = lora
        rows.append(json.dumps(d))
    path = tmp_path / "lora.jsonl"
    path.write_text("\n".join(rows) + "\n")
    res = analyze(str(path), tok, block_size=BS, cache_blocks=None, what_if=False, lora_models=["ad-1"],
                  tenants=TenantOptions(TenantNamer(key=KEY)))
    a = res.tenants.adapters
    assert set(a) == {"", "ad-1", "ad-2"}
    assert a[""].stored["first"] == 768 and a["ad-1"].stored["isolation"] == a["ad-2"].stored["isolation"] == 768
    assert a["ad-1"].cached_tokens == a["ad-2"].cached_tokens == 768 and a[""].cached_tokens == 0


def test_vllm_request_log_lines():
    # real: the INFO line of --enable-log-requests (tests/fixtures/.../cache_salt/vllm-server.log)
    # carries no prompt: a counted skip that says how to get one
    log = (KV / "cache_salt" / "vllm-server.log").read_text().splitlines()
    info = next(x for x in log if "Received request" in x)
    assert list(parse_line(info, 7)) == [Skip(7, LOG_INFO_REASON)]
    # constructed in vLLM 0.32.0's DEBUG format (request_logger.log_request_body:
    # "Request %s JSON body: %s", model_dump_json(exclude_unset=True))
    body = {"model": "ad-1", "messages": [{"role": "user", "content": "hi"}], "cache_salt": "s3cret", "user": "u"}
    debug = ("(APIServer pid=18236) DEBUG 12-01 07:35:38 [request_logger.py:76] Request chatcmpl-a91f JSON body: "
             + json.dumps(body, separators=(",", ":")))
    (req,) = parse_line(debug, 8)
    assert isinstance(req, Request) and (req.cache_salt, req.user, req.model) == ("s3cret", "u", "ad-1")
    (skip,) = parse_line(debug[:-5], 9)            # --max-log-len cut the body short
    assert isinstance(skip, Skip) and "not valid JSON" in skip.reason


def test_names_are_the_hmac_of_the_salt_with_the_configured_key(tmp_path):
    import hashlib
    import hmac
    cfg = tmp_path / "cachemon.yaml"
    cfg.write_text(f"kv_events:\n  tenant_key: {KEY.decode()}\n  tenants:\n    {salt_digest('tenant-a')}: alpha\n")
    code, out = _cli([str(KV / "cache_salt" / "requests.jsonl"), "--tokenizer", str(TOKENIZER), "--block-size", "128",
                      "--top", "0", "--tenant-config", str(cfg), "--format", "json"])
    assert code == 0, out
    expected_b = "h-" + hmac.new(KEY, b"tenant-b", hashlib.sha256).hexdigest()[:12]
    assert set(json.loads(out)["tenants"]["tenants"]) == {"alpha", "", expected_b}
    cfg.write_text("upstreams: []\n")
    code, out = _cli([str(KV / "cache_salt" / "requests.jsonl"), "--tenant-config", str(cfg)])
    assert code == 2 and "no kv_events section" in out


def test_analyze_names_tenants_as_the_live_ledger_does():
    # the ledger's labels (state/ledger/tenants.py, branch kv) with the same names and key
    import importlib.util
    if importlib.util.find_spec("cachemon.state.ledger.tenants") is None:
        pytest.skip("state/ledger/tenants.py (the ledger's tenant labels) is not in this tree yet")
    from cachemon.state.ledger.tenants import TenantLabels
    names = {salt_digest("tenant-a"): "alpha"}
    ledger, ours = TenantLabels(names, KEY), TenantNamer(names, KEY)
    for salt in nonempty(("tenant-a", "tenant-b", "ünïcode", "x" * 300)):
        assert ledger.label(salt)[0] == ours(salt)


@pytest.mark.parametrize("scenario", ["cache_salt", "tiny_pool"])
def test_compacting_the_isolation_index_changes_nothing(scenario, tok, monkeypatch):
    # a tiny index bound forces a compaction after almost every request: only uncached content goes
    from cachemon.analyze import tenant_split
    d = KV / scenario
    full = _pairs(_analyze(d, tok, _namer()))
    monkeypatch.setattr(tenant_split, "INDEX_MIN", 4)
    monkeypatch.setattr(tenant_split, "INDEX_FACTOR", 0)
    res = _analyze(d, tok, _namer())
    assert res.tenants.index_compactions > 0 and _pairs(res) == full


def test_tenants_lora_isolation_is_the_shared_prompt_stored_once_per_other_key(tok):
    # real: three salted tenants and an unsalted one share the system prompt, the unsalted one also via
    # two LoRA adapters; a sixth sender puts a timestamp at the head (no salt)
    d = KV / "tenants_lora"
    if not (d / "events.jsonl").is_file():
        pytest.skip(f"recording {d} not in this tree")
    namer = _namer()
    res = _analyze(d, tok, namer)
    lines = [r for r in load_requests(d) if "usage" in r]
    shared = {(r["request"].get("cache_salt"), r["request"]["model"]) for r in lines if r["tenant"] != "ts"}
    blocks = 768 // BS                                            # the shared system prompt's full blocks
    t = res.tenants
    assert sum(s.stored["isolation"] for s in t.tenants.values()) == (len(shared) - 1) * blocks * BS
    first_salted = namer(lines[0]["request"]["cache_salt"])       # the first sender stored it: first
    assert t.tenants[first_salted].stored == {**dict.fromkeys(t.tenants[first_salted].stored, 0), "first": 768}
    assert t.adapters["a1"].stored["isolation"] == t.adapters["a2"].stored["isolation"] == blocks * BS
    # the timestamp sender stores its whole prompt every time (first), inside the unsalted tenant
    ts = [r for r in lines if r["tenant"] == "ts"]
    assert t.pairs[("", "")].stored["first"] == sum((r["usage"]["prompt_tokens"] + 3) // BS * BS for r in ts)


def test_a_real_info_level_server_log_is_skipped_and_says_why(tok):
    # real: the tenants_lora server log (--enable-log-requests at the default INFO level): every request
    # line is a counted skip that names the fix, the other log lines are counted as such, nothing is guessed
    d = KV / "tenants_lora"
    if not (d / "vllm-server.log").is_file():
        pytest.skip(f"recording {d} not in this tree")
    res = analyze(str(d / "vllm-server.log"), tok, block_size=BS, what_if=False, curve=False,
                  tenants=TenantOptions(_namer()))
    sent = [r for r in load_requests(d) if "usage" in r]
    assert res.requests == 0 and res.log_info_requests == len(sent) and res.log_other_lines > 0
    assert res.skipped_count >= res.log_info_requests + res.log_other_lines
    assert res.tenants is not None and not res.tenants.pairs


def test_the_live_page_carries_analyzes_split_and_never_a_salt(tok):
    # real: the tenants_lora capture through the live ledger (as the KV-event stage feeds it) and its
    # collector's exposition: the series the recording rules and the dashboard row read
    from prometheus_client.parser import text_string_to_metric_families

    from cachemon import catalog as C
    from cachemon.expose.kv_collector import KvLedgerCollector
    from cachemon.expose.render import render
    from cachemon.state.ledger.fleet import FleetLedger
    from cachemon.state.ledger.tenants import TenantLabels
    from kv_support import replay
    d = KV / "tenants_lora"
    if not (d / "events.jsonl").is_file():
        pytest.skip(f"recording {d} not in this tree")
    fleet = FleetLedger(tenants=TenantLabels({salt_digest("tenant-a"): "alpha"}, KEY, 100), full_reports=True)
    replay(d, fleet, "tiny")
    page = render([KvLedgerCollector(fleet)]).decode()
    meta = json.loads((d / "metadata.json").read_text())
    assert not [s for s in meta["tenants"]["salts"].values() if s in page]
    fams = {m.name: m for m in text_string_to_metric_families(page)}
    stored: dict[tuple[str, str], dict[str, int]] = {}
    for s in fams[C.KV_TENANT_STORED_TOKENS.name].samples:
        if s.value:
            row = stored.setdefault((s.labels["tenant"], s.labels["adapter"]), {})
            row[s.labels["reason"]] = row.get(s.labels["reason"], 0) + int(s.value)
    hits = {(s.labels["tenant"], s.labels["adapter"]): int(s.value)
            for s in fams[C.KV_TENANT_HIT_TOKENS.name].samples if s.value}
    res = _analyze(d, tok, _namer())
    assert stored == {k: {r: v for r, v in s.stored.items() if v} for k, s in res.tenants.pairs.items() if s.missed}
    assert hits == {k: s.full_report_cached_tokens for k, s in res.tenants.pairs.items() if s.full_report_cached_tokens}
    assert sum(v.get("isolation", 0) for v in stored.values()) > 0 and hits


def _salted_stream(path: Path, n: int = 400, seed: int = 5) -> None:
    """constructed: token-id prompts, 6 shared 300-token heads, a random 40-200-token tail, 5 salts and
    no salt, 2 LoRA adapters and the base model, 16 generated tokens each: isolation under LRU pressure."""
    import random
    rng = random.Random(seed)
    heads = [[rng.randrange(1000) for _ in range(300)] for _ in range(6)]
    with path.open("w") as f:
        for k in range(n):
            body: dict = {"prompt": heads[rng.randrange(6)] + [rng.randrange(1000) for _ in range(rng.randint(40, 200))],
                          "model": ["base", "ad-1", "ad-2"][k % 3]}
            if k % 6:
                body["cache_salt"] = f"salt-{k % 6}"
            f.write(json.dumps({"request": body, "usage": {"prompt_tokens": len(body["prompt"]),
                                                           "completion_tokens": 16}}) + "\n")


@pytest.mark.parametrize(("cache_blocks", "replicas"), [(60, 1), (150, 1), (150, 3), (None, 1), (None, 2)])
def test_isolation_looked_up_per_run_equals_the_per_block_loop(tmp_path, tok, monkeypatch, cache_blocks, replicas):
    # the run lookup (a binary search over a run of first blocks) counts what the per-block loop counts
    from cachemon.analyze import tenant_split
    path = tmp_path / "salted.jsonl"
    _salted_stream(path)
    runs = []
    real = tenant_split.TenantSplit._isolated_run

    def counted(self, plain, start, stop):
        runs.append(stop - start)
        return real(self, plain, start, stop)
    monkeypatch.setattr(tenant_split.TenantSplit, "_isolated_run", counted)

    def once(per_block: bool):
        init = tenant_split.TenantSplit.__init__

        def forced(self, *a, **kw):
            init(self, *a, **kw)
            self._monotone = not per_block
        monkeypatch.setattr(tenant_split.TenantSplit, "__init__", forced)
        try:
            return analyze(str(path), tok, block_size=16, cache_blocks=cache_blocks, what_if=False, curve=False,
                           replicas=replicas, lora_models=["ad-1", "ad-2"], tenants=TenantOptions(_namer(), top=100))
        finally:
            monkeypatch.setattr(tenant_split.TenantSplit, "__init__", init)
    by_run = once(per_block=False)
    assert runs or replicas > 1, "the run lookup was not used"     # a fleet's first blocks come one by one
    runs.clear()
    by_block = once(per_block=True)
    assert not runs
    assert sum(s.stored["isolation"] for s in by_block.tenants.pairs.values()) > 0
    assert _pairs(by_run) == _pairs(by_block)
