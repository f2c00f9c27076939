"""The ``cost:`` section: per-token or GPU-hour prices, read into a CostModel."""
from __future__ import annotations

from dataclasses import dataclass

from cachemon.config import ConfigError, load_section, number, optional, section, setting, text


@dataclass(frozen=True)
class TokenPrices:
    """Prices per million tokens (``cost.per_million_tokens``)."""
    uncached_input: float = setting(number(lo=0))
    cached_input: float = setting(number(lo=0))
    output: float = setting(number(lo=0), 0.0)


@dataclass(frozen=True)
class GpuHourPrices:
    """``cost.gpu_hour``."""
    price: float = setting(number(lo=0))                                     # price of one GPU hour
    prefill_tokens_per_second: float = setting(number(positive=True))       # measured prefill throughput of one GPU
    # measured output throughput; None = output not priced
    decode_tokens_per_second: float | None = setting(optional(number(positive=True)), None)


@dataclass(frozen=True)
class CostSection:
    """The ``cost:`` section as written; ``parse_cost_config`` turns it into a CostModel."""
    currency: str = setting(text, "USD")
    per_million_tokens: TokenPrices | None = setting(optional(section(TokenPrices)), None)
    gpu_hour: GpuHourPrices | None = setting(optional(section(GpuHourPrices)), None)


@dataclass(frozen=True)
class CostModel:
    currency: str = "USD"
    tokens: TokenPrices | None = None
    gpu: GpuHourPrices | None = None

    @property
    def kind(self) -> str:
        return "per_million_tokens" if self.tokens else "gpu_hour"


def parse_cost_config(raw: object, key: str = "cost") -> CostModel | None:
    """The ``cost:`` section (see the module docstring and docs); None when absent."""
    if raw is None:
        return None
    c = load_section(CostSection, raw, key)
    if (c.per_million_tokens is None) == (c.gpu_hour is None):
        raise ConfigError(key, "give exactly one of per_million_tokens or gpu_hour")
    t = c.per_million_tokens
    if t is not None and t.cached_input > t.uncached_input:
        raise ConfigError(f"{key}.per_million_tokens.cached_input",
                          "is above uncached_input: a cache hit cannot cost more than a miss")
    return CostModel(c.currency.strip(), tokens=t, gpu=c.gpu_hour)
