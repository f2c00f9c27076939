"""Per tenant (cache_salt) and per adapter (LoRA) accounting, and the isolation reason, on CONSTRUCTED
streams: made-up token ids, hashes derived here per (salt, adapter) as vLLM's chain does (the salt in
block 0's extra keys changes every hash below it). The wire shape of extra_keys is vLLM 0.32.0's
(``to_event_extra_keys``: the LoRA name first, then the salt, on the first block of a chain only; the
real cache_salt capture shows ``[['tenant-a'], None, ...]``)."""
from __future__ import annotations

import hashlib
import hmac

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cachemon import catalog as C
from cachemon.config import ConfigError, KvEventsSettings, load_section
from cachemon.expose.kv_collector import KvLedgerCollector
from cachemon.expose.render import render
from cachemon.normalise.kv_batch import KvBatch, Removed, Stored
from cachemon.state.ledger import records as K
from cachemon.state.ledger.fleet import FleetLedger
from cachemon.state.ledger.tenants import TenantLabels, salt_of

BS = 4
KEY = b"0123456789abcdef-test-key"
SALT_A, SALT_B, SALT_C = "s3cret-salt-a", "s3cret-salt-b", "s3cret-salt-c"
NAMES = {hashlib.sha256(SALT_A.encode()).hexdigest(): "acme"}


def hlabel(salt: str) -> str:
    return "h-" + hmac.new(KEY, salt.encode(), hashlib.sha256).hexdigest()[:12]


def toks(*ids: int) -> list[int]:
    return [t for i in ids for t in range(i * 100, i * 100 + BS)]


class Vllm:
    """A constructed replica: vLLM's chained hashes with the salt and adapter in the chain."""

    def __init__(self, fleet: FleetLedger, name: str) -> None:
        self.fleet, self.name, self.seq, self.t = fleet, name, 0, 1000.0

    def hashes(self, ids: list[int], salt: str | None, lora: str | None) -> list[int]:
        out, p = [], hash(("vllm", salt, lora))
        for i in ids:
            p = hash((p, i)) & ((1 << 64) - 1)
            out.append(p)
        return out

    def send(self, *events) -> None:
        self.t += 1.0
        self.fleet.on_batch(self.name, "m", KvBatch(self.seq, self.t, list(events)), self.t)
        self.seq += 1

    def stored(self, ids: list[int], salt: str | None = None, lora: str | None = None, upto: int = 0) -> Stored:
        hs = self.hashes(ids, salt, lora)
        n = len(ids) - upto
        head = tuple(x for x in (lora, salt) if x is not None)
        extra = tuple([head or None] + [(lora,) if lora else None] * (n - 1)) if upto == 0 else \
            tuple([(lora,) if lora else None] * n)
        return Stored(tuple(hs[upto:]), hs[upto - 1] if upto else None, tuple(toks(*ids[upto:])), BS, lora,
                      "GPU", extra)

    def store(self, ids: list[int], **kw) -> list[int]:
        self.send(self.stored(ids, **kw))
        return self.hashes(ids, kw.get("salt"), kw.get("lora"))


def rows(f: FleetLedger, replica: str) -> dict[tuple[str, str], dict[str, float]]:
    snap = next(s for s in f.snapshot() if s.replica == replica)
    out = {}
    for t, a, split, hits in snap.tenants:
        d = {k: v for k, v in split.items() if v}
        if hits:
            d["hits"] = hits
        out[(t, a)] = d
    return out


def fleet(top_k: int = 20, key: bytes | None = KEY, full_reports: bool | None = None) -> FleetLedger:
    return FleetLedger(tenants=TenantLabels(NAMES, key, top_k), full_reports=full_reports)


SHARED = [1, 2, 3]          # a shared system prompt of three blocks


def test_salted_tenants_sharing_a_system_prompt_pay_isolation_per_extra_salt():
    f = fleet()
    r = Vllm(f, "a")
    r.store(SHARED + [10], salt=SALT_A)
    r.store(SHARED + [20], salt=SALT_B)
    r.store(SHARED + [30], salt=SALT_C)
    r.store(SHARED + [40])                    # no salt
    got = rows(f, "a")
    assert got == {("acme", ""): {"first": 4 * BS},
                   (hlabel(SALT_B), ""): {"isolation": 3 * BS, "first": BS},
                   (hlabel(SALT_C), ""): {"isolation": 3 * BS, "first": BS},
                   ("", ""): {"isolation": 3 * BS, "first": BS}}
    v = f.view("a")
    assert v is not None and v.stored_tokens["isolation"] == 9 * BS and v.stored_tokens["first"] == 7 * BS
    # a second request of tenant B hits its own chain: the continuation below it is B's (inherited)
    hs = r.hashes(SHARED + [20, 21], SALT_B, None)
    r.send(Stored((hs[4],), hs[3], tuple(toks(21)), BS, None, "GPU", (None,)))
    assert rows(f, "a")[(hlabel(SALT_B), "")]["first"] == 2 * BS


def test_isolation_only_while_the_other_copy_is_cached_and_across_replicas():
    f = fleet()
    a, b = Vllm(f, "a"), Vllm(f, "b")
    ha = a.store(SHARED, salt=SALT_A)
    b.store(SHARED, salt=SALT_B)              # cached on a under another salt: isolation on b
    assert rows(f, "b") == {(hlabel(SALT_B), ""): {"isolation": 3 * BS}}
    a.send(*(Removed((h,)) for h in ha))
    hb = b.hashes(SHARED, SALT_B, None)
    b.send(*(Removed((h,)) for h in hb))
    b.store(SHARED, salt=SALT_C)              # nothing cached any more: first
    assert rows(f, "b")[(hlabel(SALT_C), "")] == {"first": 3 * BS}


def test_adapters_over_the_same_prompts():
    f = fleet()
    r = Vllm(f, "a")
    r.store(SHARED, lora="sql")
    r.store(SHARED, lora="chat")
    r.store(SHARED, lora="chat", salt=SALT_A)
    assert rows(f, "a") == {("", "sql"): {"first": 3 * BS}, ("", "chat"): {"isolation": 3 * BS},
                            ("acme", "chat"): {"isolation": 3 * BS}}


def test_full_report_hits_per_tenant():
    f = FleetLedger(tenants=TenantLabels(NAMES, KEY, 20), full_reports=True)
    r = Vllm(f, "a")
    r.store(SHARED + [10], salt=SALT_A)
    report = r.stored(SHARED, salt=SALT_A)    # vLLM's report of the 3 reused blocks (parent null)
    r.send(report)
    assert rows(f, "a")[("acme", "")] == {"first": 4 * BS, "hits": 3 * BS}


def test_top_k_folds_later_hashed_tenants_into_other_and_counts_them():
    f = fleet(top_k=1)
    r = Vllm(f, "a")
    r.store([1], salt=SALT_B)
    r.store([2], salt=SALT_C)                 # the second hashed tenant: other
    r.store([3], salt="another-secret")
    r.store([4], salt=SALT_A)                 # named by the config: always its own series
    got = rows(f, "a")
    assert set(got) == {(hlabel(SALT_B), ""), ("other", ""), ("acme", "")}
    assert got[("other", "")] == {"first": 2 * BS}
    snap = f.snapshot()[0]
    assert snap.tenant_overflow == 2


def test_without_a_key_unnamed_salts_are_labelled_unnamed():
    f = fleet(key=None)
    r = Vllm(f, "a")
    r.store([1], salt=SALT_B)
    assert set(rows(f, "a")) == {("unnamed", "")}


def test_the_page_never_carries_a_salt_or_token_ids():
    f = fleet()
    r = Vllm(f, "a")
    r.store(SHARED + [10], salt=SALT_A)
    r.store(SHARED + [20], salt=SALT_B)
    page = render([KvLedgerCollector(f)]).decode()
    assert SALT_A not in page and SALT_B not in page and "s3cret" not in page
    assert " 100" not in page.replace(".0", "")        # the first token id of block 1
    fams = {m.name: m for m in text_string_to_metric_families(page)}
    got = {(s.labels["tenant"], s.labels["reason"]): s.value
           for s in fams[C.KV_TENANT_STORED_TOKENS.name].samples if s.value}
    assert got == {("acme", "first"): 4 * BS, (hlabel(SALT_B), "isolation"): 3 * BS, (hlabel(SALT_B), "first"): BS}


def test_salt_of_reads_vllms_event_shape():
    assert salt_of(("tenant-a",), None) == "tenant-a"
    assert salt_of(("sql", "tenant-a"), "sql") == "tenant-a"
    assert salt_of(("sql",), "sql") is None
    assert salt_of((("mm-hash", 0), "tenant-a", b"\x00digest"), None) == "tenant-a"
    assert salt_of((b"\x00digest",), None) is None
    assert salt_of(None, None) is None


@pytest.mark.parametrize("raw,msg", [
    ({"tenants": {SALT_A: "acme"}}, "sha256 hex digest"),
    ({"tenants": {hashlib.sha256(b"x").hexdigest(): "other"}}, "not other"),
    ({"tenants": ["acme"]}, "expected a mapping"),
    ({"tenant_key": "short"}, "at least 16"),
    ({"tenant_top_k": 0}, ""),
])
def test_config_errors_are_clear_and_never_repeat_a_salt(raw, msg):
    with pytest.raises(ConfigError) as e:
        load_section(KvEventsSettings, raw, "kv_events")
    assert msg in str(e.value) and SALT_A not in str(e.value) and "short" not in str(e.value)
    assert str(e.value).startswith("kv_events.")


def test_config_reads_names_key_and_top_k():
    s = load_section(KvEventsSettings, {"tenants": {hashlib.sha256(SALT_A.encode()).hexdigest().upper(): "acme"},
                                        "tenant_key": KEY.decode(), "tenant_top_k": 5}, "kv_events")
    assert s.tenants == NAMES and s.tenant_top_k == 5 and s.tenant_key == KEY.decode()


def test_without_the_isolation_index_the_split_per_tenant_stays_and_isolation_is_first():
    f = FleetLedger(tenants=TenantLabels(NAMES, KEY, 20), isolation=False)
    r = Vllm(f, "a")
    r.store(SHARED, salt=SALT_A)
    r.store(SHARED, salt=SALT_B)
    assert rows(f, "a") == {("acme", ""): {"first": 3 * BS}, (hlabel(SALT_B), ""): {"first": 3 * BS}}
    led = f.replica("a")
    assert led is not None and led.isolation is False and led.isolation_index is None


def test_the_tenant_key_stays_out_of_the_settings_repr():
    s = load_section(KvEventsSettings, {"tenant_key": KEY.decode()}, "kv_events")
    assert KEY.decode() not in repr(s) and s.tenant_key == KEY.decode()


def test_one_key_builds_no_isolation_index_and_the_second_finds_the_first_ones_copies():
    f = fleet()
    r = Vllm(f, "a")
    r.store(SHARED + [10], salt=SALT_A)
    r.store(SHARED + [11], salt=SALT_A)       # the same key again: nothing can be isolation yet
    led = f.replica("a")
    assert led is not None and led.isolation is True and led.isolation_index is None
    r.store(SHARED + [12], salt=SALT_B)       # a second key: the index starts with A's cached copies
    assert led.isolation_index is not None
    assert rows(f, "a")[(hlabel(SALT_B), "")] == {"isolation": 3 * BS, "first": BS}


def test_adapters_past_the_code_bound_share_one_counted_other_row_and_never_spill():
    """Issue 38 item 4, CONSTRUCTED: 4 200 LoRA names over one shared prompt (three blocks and one of its
    own each). Tenant codes are 12 bits of a block record; the first 4 094 adapters get their own codes
    (4 095 pairs with ("", "")), every later pair the last code, (other, other), counted as overflow. On
    74d8045 codes went on past 0xFFF into the record's key bits: the later adapters' rows were wrong, and
    their evictions missed their ids in the isolation index (stale ids, counted as index_misses)."""
    f = fleet()
    r = Vllm(f, "a")
    n, own = 4200, 4094
    sent = [r.store(SHARED + [10 + i], lora=f"adapter-{i}") for i in range(n)]
    got = rows(f, "a")
    assert len(got) == own + 1 and f._book is not None and len(f._book.pairs) == own + 2   # none past the bound
    assert got[("", "adapter-0")] == {"first": 4 * BS}
    assert all(got[("", f"adapter-{i}")] == {"isolation": 3 * BS, "first": BS} for i in range(1, own))
    assert got[("other", "other")] == {"isolation": 3 * BS * (n - own), "first": BS * (n - own)}
    assert f.snapshot()[0].tenant_overflow == n - own
    led = f.replica("a")
    assert led is not None and led.isolation_index is not None and len(led.isolation_index) == 4 * n
    assert max(K.tenant_of(rec) for rec in led._cached.values()) == K.TENANT_MAX
    r.send(*(Removed((h,)) for hs in sent for h in reversed(hs)))
    assert len(led.isolation_index) == 0 and led.anomalies["index_misses"] == 0


def test_a_report_of_another_tenants_cached_blocks_is_counted_and_credited_to_no_one():
    """Issue 38 item 8, CONSTRUCTED: a hostile publisher reports tenant A's cached blocks (A's hashes) under
    B's salt. vLLM's hashes cover the salt, so no request of B reused them: the report is counted as
    forged_reports and gives no hits to B, to A or to the replica. On 74d8045 B was credited the hits.
    The replica is declared to send full reports (kv_events.full_reports: true): without that, an all-cached
    store from block 0 is read as a request that skipped the lookup (cache_opt_out), never as hits either."""
    f = fleet(full_reports=True)
    r = Vllm(f, "a")
    ha = r.store(SHARED, salt=SALT_A)
    r.store([9], salt=SALT_B)
    forged = Stored(tuple(ha), None, tuple(toks(*SHARED)), BS, None, "GPU", ((SALT_B,), None, None))
    r.send(forged)
    assert rows(f, "a") == {("acme", ""): {"first": 3 * BS}, (hlabel(SALT_B), ""): {"first": BS}}
    led = f.replica("a")
    assert led is not None and led.reused_tokens == 0
    assert led.anomalies["forged_reports"] == 1
    r.send(r.stored(SHARED, salt=SALT_A))     # A's own report of the same blocks: A's hits
    assert rows(f, "a")[("acme", "")] == {"first": 3 * BS, "hits": 3 * BS}
    assert led.reused_tokens == 3 * BS and led.anomalies["forged_reports"] == 1
