"""KV-cache events (docs/kv-events.md): where a replica publishes them, and the ledger's bounds."""
from __future__ import annotations

import re
from dataclasses import dataclass

from cachemon import install_hint
from cachemon.config.sections import load_section, setting
from cachemon.config.values import MINUTE, ConfigError, boolean, duration, integer, optional, string, text, type_error

KV_EVENTS_EXTRA = install_hint("kv-events")
MiB = 1024 * 1024


def check_kv_event_deps(key: str) -> None:
    """Following KV events needs pyzmq and msgspec (the extra); say so on one line, without importing them."""
    import importlib.util
    missing = [dist for mod, dist in (("zmq", "pyzmq"), ("msgspec", "msgspec")) if importlib.util.find_spec(mod) is None]
    if missing:
        raise ConfigError(key, f"following KV events needs {' and '.join(missing)}: {KV_EVENTS_EXTRA}")


def zmq_endpoint(v: object, k: str) -> str:
    """Where to connect: tcp://HOST:PORT (the publisher binds; a wildcard host is a bind address) or ipc://PATH."""
    if not isinstance(v, str) or not v:
        raise type_error(k, "a ZMQ endpoint like tcp://127.0.0.1:5557", v)
    if v.startswith("ipc://") and len(v) > len("ipc://"):
        return v
    host, sep, port_text = v[len("tcp://"):].rpartition(":") if v.startswith("tcp://") else ("", "", "")
    if not sep or not host or host in ("*", "0.0.0.0", "[::]") or not port_text.isdigit() \
            or not (1 <= int(port_text) <= 65535):
        raise ConfigError(k, f"expected tcp://HOST:PORT (a host to connect to, port 1-65535) or ipc://PATH, got {v!r}")
    return v


@dataclass
class KvEventsEndpoint:
    """``upstreams[].kv_events``: one replica's event publisher (vLLM's --kv-events-config)."""
    endpoint: str = setting(zmq_endpoint)                        # vLLM's "endpoint", as a host to connect to
    replay: str | None = setting(optional(zmq_endpoint), None)   # vLLM's "replay_endpoint": recovers gaps
    topic: str = setting(string, "")                             # vLLM's "topic" (its default is "")
    model: str | None = setting(optional(text), None)            # default: the model the metrics report
    max_frame_bytes: int | None = setting(optional(integer(lo=1024, hi=1024 * MiB)), None)  # None: kv_events'


def kv_events_endpoint(v: object, k: str) -> KvEventsEndpoint:
    """``tcp://HOST:PORT`` or a mapping {endpoint, replay, topic, model, max_frame_bytes}."""
    out = load_section(KvEventsEndpoint, {"endpoint": v} if isinstance(v, str) else v, k)
    check_kv_event_deps(k)
    return out


_SHA256_HEX = re.compile(r"[0-9a-fA-F]{64}")
_RESERVED_TENANTS = ("", "other", "unnamed")


def tenant_names(v: object, k: str) -> dict[str, str]:
    """``kv_events.tenants``: sha256(cache_salt) hex digest -> tenant name. A key that is not a digest
    may be a raw salt (a secret): errors never repeat a key, only its position."""
    if not isinstance(v, dict):
        raise ConfigError(k, f"expected a mapping of sha256(cache_salt) hex digests to tenant names, got "
                             f"{type(v).__name__}")
    out: dict[str, str] = {}
    for i, (digest, name) in enumerate(v.items()):
        where = f"{k} (entry {i + 1})"
        if not isinstance(digest, str) or not _SHA256_HEX.fullmatch(digest):
            raise ConfigError(where, "keys are the sha256 hex digest of a cache_salt (printf %s SALT | sha256sum), "
                                     "64 hex digits; a raw salt does not belong in the config")
        if not isinstance(name, str) or len(name) > 64 or not name.isprintable() or name in _RESERVED_TENANTS \
                or name.startswith("h-"):
            raise ConfigError(where, "a tenant name is 1-64 printable characters, not other, unnamed or h-...")
        out[digest.lower()] = name
    return out


def tenant_key(v: object, k: str) -> str:
    """``kv_events.tenant_key``: the HMAC key of hashed tenant labels (a secret: never repeated)."""
    if not isinstance(v, str) or len(v) < 16:
        raise ConfigError(k, "expected a string of at least 16 characters (the HMAC key of tenant labels)")
    return v


@dataclass
class KvEventsSettings:
    """The top-level ``kv_events:`` section: bounds of every followed stream and of the ledger."""
    # The ledger (state/kv_ledger), per replica: departed block contents remembered (evicted, cleared,
    # lost at a restart) to name why a block is stored again; older ones count as first. The default
    # keeps a fleet of 64 replicas x 50 000 cached blocks, every history full, under 1 GB (the ledger's
    # own defaults; benchmarks/bench_kv_ledger.py).
    history_blocks: int = setting(integer(lo=0, hi=100_000_000), 32_768)
    # The ledger, per replica: cached blocks tracked at most. 1 Mi: a vLLM pool's num_gpu_blocks on the
    # largest GPUs at block_size 16.
    max_blocks: int = setting(integer(lo=1, hi=100_000_000), 1 << 20)
    # The source, per stream: a frame larger than this is dropped and counted (reason oversized).
    max_frame_bytes: int = setting(integer(lo=1024, hi=1024 * MiB), 16 * MiB)
    # The source, per stream: messages ZMQ queues before it drops (RCVHWM); a drop shows as a gap, which
    # the replay socket (10 000 batches deep in vLLM) can still fill. vLLM publishes one batch per engine
    # step, so the queue only fills if the ledger stalls; memory is at most this x the batch size.
    queue_messages: int = setting(integer(lo=100, hi=10_000_000), 10_000)
    # How long a gap's recovery from the replay socket may take before the rest counts as lost.
    replay_timeout: float = setting(duration(0.01, 10 * MINUTE), 2.0)
    # Per-tenant accounting (docs/kv-events.md, "Tenants and adapters"): names for cache_salts, keyed by
    # sha256(salt) hex so the config holds no secret; unnamed salts are labelled h-<12 hex of
    # HMAC-SHA256(tenant_key, salt)> (or "unnamed" without a key); at most tenant_top_k hashed tenants
    # get their own series, later ones count under tenant="other".
    tenants: dict[str, str] = setting(tenant_names, default_factory=dict)
    tenant_key: str | None = setting(optional(tenant_key), None, secret=True)
    tenant_top_k: int = setting(integer(lo=1, hi=1000), 20)
    # The isolation reason: a stored block whose token content is cached at that moment under another salt
    # or adapter. Costs one index entry per cached block of a model whose chain heads carry two keys or more
    # (salt, adapter; docs/kv-events.md, "Per-tenant accounting"); false keeps the per-tenant split without it.
    isolation: bool = setting(boolean, True)
    # Reuse reports (docs/kv-events.md, "Full report mode"): whether the replicas' clients send requests with
    # kv_cache_report_mode="full". A report of cached blocks has the very shape of a request that skipped the
    # prefix lookup (prompt_logprobs, echo + logprobs) and recomputed a prompt whose blocks were all cached:
    # true reads that shape as a report (hits), false never does (cache_opt_out tokens), null (auto) reads it
    # as a report once a replica sent one that only a lookup makes (followed by its own computed blocks).
    full_reports: bool | None = setting(optional(boolean), None)
    # New series start at 0 (expose/new_series.py): a replica's ledger counters, and a tenant and adapter's
    # on each replica, are served at 0 for this long after /metrics first shows them, then their values, so
    # rate() counts the first stores. Longer than the scrape interval of every Prometheus scraping this
    # sidecar (the default 1m; 15s in the shipped configs), so each of them sees the 0. 0: values at once
    # (the first increments of a new replica or tenant are then lost to rate()).
    new_series_hold: float = setting(duration(0, 10 * MINUTE), 90.0)
