"""The soak's upstream pages (benchmarks/bench_soak.py, constructed from the real vLLM 0.32.0 CPU
capture) are valid pages that cachemon reads whole: >= 300 series over several model names, every
label set with hits <= queries, and a later page is a valid next poll (counters only grow)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from bench_soak import build_page_template  # noqa: E402

from cachemon.normalise.normaliser import normalise_text  # noqa: E402


def render(template, growth: float) -> str:
    return "\n".join(p if v is None else f"{p}{v * (1 + growth * f) if f else v!r}" for p, v, f in template) + "\n"


def test_soak_pages_hold_300_series_over_many_models_and_only_grow():
    template, series, models = build_page_template(300)
    assert series >= 300 and models >= 5
    first, later = normalise_text(render(template, 0.0)), normalise_text(render(template, 0.5))
    assert not first.problems and not first.rejected
    names = {key.labels[0] for key in first.counters}      # model_name first (catalog.SERIES_LABELS)
    assert len(names) == models and "tiny" in names
    for key, v in first.counters.items():
        assert later.counters[key] >= v
    queries = {k: v for k, v in first.counters.items() if k.metric.endswith("query_tokens")}
    hits = {k: v for k, v in first.counters.items() if k.metric.endswith("hit_tokens")}
    assert len(queries) >= models and len(hits) == len(queries)
    for k, q in queries.items():
        assert hits[k._replace(metric=k.metric.replace("query", "hit"))] <= q
