"""The ``routers:`` section: the routers in front of the replicas, which kind each is (a row of
normalise/routers.ROUTER_KINDS) and which upstreams it fronts. Read by the router stage
(runtime/router_stage.py); no label is added to the upstreams' series."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cachemon.config.sections import load_section, setting
from cachemon.config.values import MINUTE, ConfigError, duration, http_url, list_of, mapping_of, or_empty, text
from cachemon.urls import host_port


@dataclass
class RouterEntry:
    url: str = setting(http_url)                                   # the router's Prometheus page
    kind: str = setting(text)                                      # vllm-router, dynamo, llm-d, ...
    name: str = setting(or_empty(text), "")
    # the upstreams (by name) whose traffic this router sends; none: every upstream
    upstreams: list[str] = setting(list_of(text), default_factory=list)
    # the router's worker label -> upstream name, where the worker URL is not the upstream's host:port
    workers: dict[str, str] = setting(mapping_of(text), default_factory=dict)
    timeout: float = setting(duration(hi=MINUTE), 3.0)

    def __post_init__(self) -> None:
        if not self.name:
            self.name = host_port(self.url)       # never the userinfo: names are labels


def router_entry(v: object, k: str) -> RouterEntry:
    return load_section(RouterEntry, v, k)


def check_routers(routers: Sequence[RouterEntry], upstream_names: set[str], kinds: Sequence[str] = ()) -> None:
    """Names unique; every upstream named exists; the kind known (``kinds``: the router table's, when given)."""
    seen: set[str] = set()
    for i, r in enumerate(routers):
        if r.name in seen:
            raise ConfigError(f"routers[{i}].name", f"{r.name!r} is used twice")
        seen.add(r.name)
        for j, u in enumerate(r.upstreams):
            if u not in upstream_names:
                raise ConfigError(f"routers[{i}].upstreams[{j}]", f"no upstream is named {u!r}")
        for w, u in r.workers.items():
            if u not in upstream_names:
                raise ConfigError(f"routers[{i}].workers[{w}]", f"no upstream is named {u!r}")
        if kinds and r.kind not in kinds:
            raise ConfigError(f"routers[{i}].kind", f"expected one of {', '.join(kinds)}, got {r.kind!r}")
