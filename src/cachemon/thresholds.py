"""Alert thresholds and windows: the single source for alerts, dashboards, runbook and `cachemon check`."""
from __future__ import annotations

# Hit ratio (hit tokens / query tokens) below these for ALERT_FOR -> alert.
HIT_RATIO_WARNING = 0.80
HIT_RATIO_CRITICAL = 0.60
ALERT_FOR = "5m"
# Below this many query tokens per second an upstream counts as idle: no hit-ratio alerts.
TRAFFIC_FLOOR_TOKENS_PER_SECOND = 1.0



# --- further alert thresholds and windows (rendered by cachemon.monitoring) ------------
# Windows of the recorded hit ratios; the alerts read the 5m one (= ALERT_FOR).
RATIO_WINDOWS = ("1m", "5m")
ALERT_RATIO_WINDOW = "5m"
# Exporter (Prometheus `up`) or upstream (cachemon_upstream_up) down for this long.
DOWN_FOR = "5m"
# Prefix caching reported off on an engine for this long.
CACHING_DISABLED_FOR = "10m"
# A drop of this many ratio points (0..1) within CHANGE_LOOKBACK of a model / version /
# tokenizer / chat-template / cache-config change; compared with the ratio CHANGE_LOOKBACK ago.
CHANGE_DROP = 0.20
CHANGE_LOOKBACK = "30m"
# After a restart or cache reset the ratio may sit below HIT_RATIO_WARNING while the cache
# warms up; alert when it is still there RECOVERY_FOR after the event.
RECOVERY_FOR = "15m"
# One replica this many ratio points below its model's fleet ratio for SKEW_FOR.
SKEW_DROP = 0.20
SKEW_FOR = "15m"
# Eviction pressure: KV cache this full for KV_CACHE_FOR, or this many preemptions per second.
KV_CACHE_USAGE_HIGH = 0.95
KV_CACHE_FOR = "15m"
PREEMPTIONS_PER_SECOND_HIGH = 0.05
PREEMPTIONS_FOR = "5m"
# No stats line in the log for this long while the same exporter sees traffic.
LOG_STATS_STALE_SECONDS = 120
LOG_STALLED_FOR = "5m"
# A cachemon target seen within ABSENT_LOOKBACK but gone from discovery for ABSENT_FOR.
ABSENT_LOOKBACK = "1d"
ABSENT_FOR = "10m"
# KV-cache events (docs/kv-events.md): evicted-then-recomputed ("capacity") tokens above this share of
# the stored tokens over ALERT_RATIO_WINDOW, for CAPACITY_SHARE_FOR, while the hit ratio is below its
# warning threshold -> CachemonKVCapacityDominatesMisses.
CAPACITY_SHARE_HIGH = 0.5
CAPACITY_SHARE_FOR = "15m"
# The ledger's dynamic-prefix signature active this long while the hit ratio is low -> CachemonDynamicPrefixFound.
DYNAMIC_PREFIX_FOR = "5m"
# A configured router (`routers:`) blind this long while the engines behind it hit -> CachemonRouterBlind.
ROUTER_BLIND_FOR = "15m"
# Label sets refused by the cardinality guard, or samples not read past the label-set budget,
# within OVERFLOW_LOOKBACK, for OVERFLOW_FOR.
OVERFLOW_LOOKBACK = "10m"
OVERFLOW_FOR = "5m"
# Per tenant (KV events with full-report requests): a tenant whose share of KV tokens served from the cache
# is below TENANT_HIT_RATIO_LOW over ALERT_RATIO_WINDOW for TENANT_FOR, while the model's other tenants
# together are at or above the hit-ratio warning threshold -> CachemonTenantHitRatioCollapsed.
TENANT_HIT_RATIO_LOW = 0.5
TENANT_FOR = "10m"
