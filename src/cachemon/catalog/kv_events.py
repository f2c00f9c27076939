"""KV-cache events: the miss ledger (docs/kv-events.md), its tenants and tiers."""
from __future__ import annotations

from cachemon.catalog.attribution import CAUSE, CERTAINTY
from cachemon.catalog.spec import MODEL, UPSTREAM, _m

REASON = "reason"
# The ledger's counters are served at 0 before their counts (expose/new_series.py, expose/kv_collector.py).
_HELD = (" A new replica's series are 0 for kv_events.new_series_hold (90s) after /metrics first shows them, then "
        "the counts, so rate() and increase() see the first increments: figures arrive that much late, none is lost.")
KV_STORED_TOKENS = _m(
    "kv_stored_tokens", "counter", "tokens", (UPSTREAM, MODEL, REASON),
    "Tokens of blocks vLLM stored (computed and cached), from its KV-cache events, by why they were not "
    "cached already: first (never cached before here, not cached on another replica now; includes "
    "generated tokens), capacity (evicted here earlier), reset (cleared by a prefix-cache reset), restart "
    "(cached by an earlier vLLM process), routing (cached now on another replica of the model), "
    "recompute_last_block (still cached: a prompt of whole blocks recomputes its last one), sliding_window "
    "(still cached in the full-attention group, recomputed because the model's sliding-window group did not "
    "hold the window before the hit point: a legitimate miss of hybrid sliding-window models), cache_opt_out "
    "(still cached, recomputed by a request that does not read the cache: prompt_logprobs, echo with logprobs; "
    "vLLM counts such requests in neither its queries nor its hits)." + _HELD,
    "vLLM KV-cache events (BlockStored, BlockRemoved, AllBlocksCleared) through cachemon's ledger",
)
KV_REUSED_TOKENS = _m(
    "kv_reused_tokens", "counter", "tokens", (UPSTREAM, MODEL),
    "Tokens of cached blocks that requests reused (prefix-cache hits), as vLLM reports them for requests "
    "with kv_cache_report_mode=\"full\" (a BlockStored of the reused blocks, parent null). Never counted "
    "as stored; requests in the default incremental mode report no hits, so this is a lower bound of the "
    "replica's hits unless every request asks for full reports. Starts at 0 with the replica's stored tokens "
    "(kv_events.new_series_hold).",
    "vLLM KV-cache events (full report mode) through cachemon's ledger",
)
KV_CACHED_BLOCKS = _m(
    "kv_cached_blocks", "gauge", "blocks", (UPSTREAM, MODEL),
    "Blocks the ledger holds as cached on the replica now (stored and not yet removed or cleared).",
    "cachemon KV-event ledger",
)
KV_SLIDING_WINDOW = _m(
    "kv_sliding_window_tokens", "gauge", "tokens", (UPSTREAM, MODEL),
    "The sliding window of the model's sliding-window KV-cache group, as its KV events name it; absent on "
    "models without one. On such a model a hit needs the window before it held in that group, which vLLM "
    "keeps only before each prompt's end and before a shared prefix seen once: "
    "cachemon_prefix_cache_match_floor_tokens then bounds resent prompts only, and the first prompt sharing a "
    "prefix with another can miss it (stored reason and cause sliding_window). vLLM's page does not say it "
    "(cache_config_info{sliding_window} stays None).",
    "vLLM KV-cache events (BlockStored kv_cache_spec_sliding_window, 0.22+) through cachemon's ledger",
)
KV_EVENTS = _m(
    "kv_events", "counter", "events", (UPSTREAM, "type"),
    "KV-cache events received, by type: stored, removed, cleared, unknown (a type this cachemon does not "
    "know; counted and skipped).",
    "vLLM KV-cache event stream",
)
KV_LOST_BATCHES = _m(
    "kv_lost_batches", "counter", "", (UPSTREAM, REASON),
    "Event batches lost, by reason: gap (sequence numbers missed and not recovered from the replay socket), "
    "decode_error (a frame that does not decode), oversized (a frame over kv_events.max_frame_bytes), "
    "duplicate (a batch of the same publisher process received again: skipped), seq_jump (a batch whose "
    "sequence number leaps more than 2^24 ahead: a garbled seq, not a gap; skipped), handler (a batch whose "
    "handling raised: a cachemon bug, logged by the exception's type; skipped). "
    "After a loss the ledger is out of sync until the next reset or restart.",
    "cachemon KV-event source",
)
KV_RECOVERED_BATCHES = _m(
    "kv_recovered_batches", "counter", "", (UPSTREAM,),
    "Event batches missed on the live stream and recovered from vLLM's replay socket.",
    "cachemon KV-event source",
)
KV_LEDGER_IN_SYNC = _m(
    "kv_ledger_in_sync", "gauge", "", (UPSTREAM,),
    "1 while the ledger has seen every event since its last known-empty state (process start or reset); "
    "0 after a lost batch until the next reset or restart (its split is then a lower bound).",
    "cachemon KV-event ledger",
)
KV_STREAM_UP = _m(
    "kv_stream_up", "gauge", "", (UPSTREAM,),
    "1 while cachemon is connected to the upstream's KV-event publisher and receiving, else 0.",
    "cachemon KV-event source",
)
KV_STREAM_DISCONNECTS = _m(
    "kv_stream_disconnects", "counter", "", (UPSTREAM,),
    "Connections to the upstream's KV-event publisher that broke after their handshake (vLLM stopped, the "
    "network dropped it, or ZMQ dropped a frame over 4x kv_events.max_frame_bytes). ZMQ reconnects by itself; "
    "what was published meanwhile is asked of the replay socket, and what it cannot give counts as "
    "cachemon_kv_lost_batches_total{reason=\"gap\"}.",
    "cachemon KV-event source",
)
KV_STREAM_PROTOCOL_ERRORS = _m(
    "kv_stream_protocol_errors", "counter", "", (UPSTREAM,),
    "Connections ZMQ gave up without scheduling a retry (a protocol error: a frame over 4x "
    "kv_events.max_frame_bytes, or a peer at the endpoint that does not speak ZMTP); cachemon made a new "
    "socket, backing off. Rising while cachemon_kv_stream_up is 0: the endpoint is not a vLLM KV-event publisher.",
    "cachemon KV-event source",
)
KV_STREAM_LAST_MESSAGE = _m(
    "kv_stream_last_message_timestamp_seconds", "gauge", "seconds", (UPSTREAM,),
    "Unix time at which cachemon received the last message on the upstream's live KV-event stream (any "
    "message, one it then skipped included); absent until the first. vLLM publishes one batch per engine "
    "step that changed the cache and nothing while idle, so its age (time() minus this) is no outage by "
    "itself: with traffic on the upstream and cachemon_kv_stream_up at 1, a growing age is a stalled stream.",
    "cachemon KV-event source",
)
KV_BLOCK_LIFETIME = _m(
    "kv_block_lifetime_seconds", "histogram", "seconds", (UPSTREAM, MODEL),
    "How long blocks stayed cached, from BlockStored to the BlockRemoved that evicted them. Starts at 0 with "
    "the replica's stored tokens (kv_events.new_series_hold).",
    "cachemon KV-event ledger",
)
KV_DIVERGENCE_DEPTH = _m(
    "kv_divergence_depth_blocks", "histogram", "blocks", (UPSTREAM, MODEL),
    "For each stored chain, the depth (in blocks from the prompt's start) of its first new block: where "
    "the prompt stopped matching what was cached. Starts at 0 with the replica's stored tokens "
    "(kv_events.new_series_hold).",
    "cachemon KV-event ledger",
)
KV_LEDGER_ANOMALIES = _m(
    "kv_ledger_anomalies", "counter", "events", (UPSTREAM, "kind"),
    "Events the ledger could not place, by kind: overflow_blocks (stored blocks over kv_events.max_blocks, "
    "not tracked), orphan_stores (a BlockStored whose parent the ledger did not hold), unknown_removed (a "
    "BlockRemoved of a hash it did not hold), malformed_stores (token ids that do not fit the block size or "
    "are not integers), other_groups (events of a second KV-cache group of a hybrid model, not ledgered), "
    "ambiguous_reports (a chain-head BlockStored of cached blocks that may be a full-report reuse report or a "
    "recompute: a single block, a hybrid group without a window to judge by, or, on a replica not known to send "
    "reports (kv_events.full_reports), a request that skipped the lookup), index_misses (a block that "
    "left the pool whose content the model's routing index, or whose token content its isolation index, "
    "did not hold: never, unless an index is wrong, which would miscount routing or isolation), "
    "forged_reports (a reuse report naming blocks cached under another "
    "(tenant, adapter) than its own salt and adapter: vLLM's hashes cover both, so no request sent it; not "
    "counted as hits), tier_unannounced_clears (a "
    "tier other than the GPU pool stored a block it already held: it had been emptied without an event, as "
    "vLLM's reset_prefix_cache?reset_external=true does; the loads taken from it just before were misses), "
    "tier_overflow (an event of a medium beyond the 8 a replica's ledger follows: not followed), "
    "sanitised_labels (a medium or LoRA name with non-printable characters, such as NUL or ESC: each "
    "replaced by U+FFFD in its label value)."
    + _HELD,
    "cachemon KV-event ledger",
)
TENANT = "tenant"
ADAPTER = "adapter"
TENANT_LABELS = (UPSTREAM, MODEL, TENANT, ADAPTER)
KV_TENANT_STORED_TOKENS = _m(
    "kv_tenant_stored_tokens", "counter", "tokens", TENANT_LABELS + (REASON,),
    "cachemon_kv_stored_tokens_total per tenant and adapter. tenant: the name kv_events.tenants gives "
    "sha256(cache_salt) (hex), else h- and 12 hex digits of HMAC-SHA256(kv_events.tenant_key, cache_salt), "
    "else unnamed; empty without a cache_salt; other beyond kv_events.tenant_top_k hashed tenants. The salt "
    "itself is never exported. adapter: the LoRA name, empty without one. reason: as "
    "cachemon_kv_stored_tokens_total, plus isolation (the block's token content was cached at that moment "
    "under another cache_salt or adapter, on this or another replica of the model). A new tenant and "
    "adapter's series are 0 for kv_events.new_series_hold (90s) after /metrics first shows them, then their "
    "counts, so rate() sees the first stores: figures arrive that much late, none is lost.",
    "vLLM KV-cache events (BlockStored extra_keys' cache_salt, lora_name) through cachemon's ledger",
)
KV_TENANT_HIT_TOKENS = _m(
    "kv_tenant_hit_tokens", "counter", "tokens", TENANT_LABELS,
    "cachemon_kv_reused_tokens_total per tenant and adapter (labels as cachemon_kv_tenant_stored_tokens_total): "
    "hits reported by requests with kv_cache_report_mode=\"full\". Without full reports the queries are not "
    "known per tenant, only the stores. Starts at 0 with the tenant's stored tokens (kv_events.new_series_hold).",
    "vLLM KV-cache events (full report mode) through cachemon's ledger",
)
KV_TENANT_LABEL_OVERFLOW = _m(
    "kv_tenant_label_overflow", "counter", "events", (UPSTREAM,),
    "Stores and reuse reports counted under tenant=\"other\": their tenant came after kv_events.tenant_top_k "
    "hashed tenants had their own series. 0 for kv_events.new_series_hold after it first shows, then the count.",
    "cachemon KV-event ledger",
)
MEDIUM = "medium"
KV_TIER_STORED_BLOCKS = _m(
    "kv_tier_stored_blocks", "counter", "blocks", (UPSTREAM, MODEL, MEDIUM),
    "Blocks vLLM reports stored in a tier other than its GPU pool (medium: CPU, FS, OBJ, STORAGE, as the "
    "event names it, in upper case: vllm-ascend's cpu is CPU; at most 32 characters, at most 8 media per "
    "replica, the rest counted as the tier_overflow anomaly), from its KV connector's events. Kept apart from "
    "the pool's split. A new tier's series are "
    "0 for kv_events.new_series_hold after /metrics first shows them, then the counts.",
    "vLLM KV-cache events (medium other than GPU)",
)
KV_TIER_REMOVED_BLOCKS = _m(
    "kv_tier_removed_blocks", "counter", "blocks", (UPSTREAM, MODEL, MEDIUM),
    "Blocks vLLM reports removed from a tier other than its GPU pool, by medium. Starts at 0 with the tier's "
    "stored blocks (kv_events.new_series_hold).",
    "vLLM KV-cache events (medium other than GPU)",
)
KV_TIER_HIT_TOKENS = _m(
    "kv_tier_hit_tokens", "counter", "tokens", (UPSTREAM, MODEL, MEDIUM),
    "Tokens of blocks stored in the GPU pool that another tier (medium) of the replica held at that moment "
    "(the leading blocks of a store): loaded from that tier, not computed, so not counted in "
    "cachemon_kv_stored_tokens_total (an eviction from the GPU that the tier caught is no capacity loss). "
    "Starts at 0 with the tier's stored blocks (kv_events.new_series_hold).",
    "vLLM KV-cache events (medium other than GPU)",
)
KV_HISTORY_EVICTED = _m(
    "kv_history_evicted", "counter", "blocks", (UPSTREAM,),
    "Departed block contents dropped from the ledger's bounded history (kv_events.history_blocks); if "
    "stored again they count as first. Starts at 0 with the replica's anomalies (kv_events.new_series_hold).",
    "cachemon KV-event ledger",
)
CAUSE_MISSED_TOKENS = _m(
    "cause_missed_tokens", "counter", "tokens", (UPSTREAM, MODEL, CAUSE, CERTAINTY),
    "Prompt tokens recomputed because of each cause, counted whenever the cause cost tokens (not only below "
    "the alert threshold). certainty: exact (the KV-event ledger), measured (the ledger after lost events: a "
    "lower bound) or estimated (from the counters where no events are followed; docs/runbook.md says how, "
    "per cause).",
    "cachemon attribution engine",
)
