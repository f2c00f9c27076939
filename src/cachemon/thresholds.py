"""Alert thresholds and windows: the single source for alerts, dashboards, runbook and `cachemon check`."""
from __future__ import annotations

# Hit ratio (hit tokens / query tokens) below these for ALERT_FOR -> alert.
HIT_RATIO_WARNING = 0.80
HIT_RATIO_CRITICAL = 0.60
ALERT_FOR = "5m"
# Below this many query tokens per second an upstream counts as idle: no hit-ratio alerts.
TRAFFIC_FLOOR_TOKENS_PER_SECOND = 1.0


def severity_for_ratio(ratio: float) -> str | None:
    if ratio < HIT_RATIO_CRITICAL:
        return "critical"
    if ratio < HIT_RATIO_WARNING:
        return "warning"
    return None
