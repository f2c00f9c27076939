"""The KV ledger: why each stored block missed, per replica, tenant and tier (fed by KV events)."""
