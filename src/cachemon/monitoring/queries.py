"""The PromQL the panels share: matchers built from the dashboard variables, and the rate and ratio expressions."""
from __future__ import annotations

from cachemon import catalog as c

RI = "$__rate_interval"


# Matchers built from the dashboard variables.
CM = 'job=~"$job", instance=~"$instance"'


# Data series: one cachemon polls many vLLM servers ($upstream), each with engines ($engine).
CMM = CM + f', {c.UPSTREAM}=~"$upstream", {c.MODEL}=~"$model_name", {c.ENGINE}=~"$engine"'


LOCAL = CMM + f', {c.CACHE}="local"'


EXTERNAL = CMM + f', {c.CACHE}="external"'


# The cost counters' two scenarios (the saving factor divides them, not cachemon's convenience gauge).
WITH_CACHE = CMM + ', scenario="with_cache"'


WITHOUT_CACHE = CMM + ', scenario="without_cache"'


# Series labelled by (upstream, model) only: the causes.
CAUSES = CM + f', {c.UPSTREAM}=~"$upstream", {c.MODEL}=~"$model_name"'


# Series labelled by upstream only: the KV-event stream's health.
KVU = CM + f', {c.UPSTREAM}=~"$upstream"'


RESET_DONE = CM + ', result="done"'


# Reported ratios come from log sources too, whose lines name no model (model_name=""), so
# $model_name (allValue .+) would hide them.
REPORTED = CM + f', {c.UPSTREAM}=~"$upstream", {c.CACHE}="local"'


# vLLM's own histograms come from the vLLM scrape job, with variables of their own: $job and
# $instance list cachemon's targets only (a shared Prometheus has hundreds of jobs).
VLLM = f'job=~"$vllm_job", instance=~"$vllm_instance", {c.MODEL}=~"$model_name"'


def rate(spec_or_name: c.MetricSpec | str, matchers: str, fn: str = "rate") -> str:
    name = spec_or_name.sample_name if isinstance(spec_or_name, c.MetricSpec) else spec_or_name
    return f"{fn}({name}{{{matchers}}}[{RI}])"


def ratio(by_labels: str = "") -> str:
    """Hit tokens / query tokens of the selection, optionally per ``by_labels``."""
    agg = f"sum by ({by_labels})" if by_labels else "sum"
    return (f"{agg} ({rate(c.HIT_TOKENS, LOCAL)})\n"
            f"/ ({agg} ({rate(c.QUERY_TOKENS, LOCAL)}) > 0)")
