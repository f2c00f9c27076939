"""Turn one parsed vLLM page into cachemon's unified, era-independent values.

Output values are *raw* (as vLLM reports them, converted to tokens); reset
correction happens later in ``cachemon.state``.
"""
from __future__ import annotations

import math
from collections import Counter as Tally
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import NamedTuple

from cachemon import catalog as C
from cachemon.normalise import eras as E
from cachemon.normalise import updates as S
from cachemon.normalise.multiprocess import MultiprocessSigns, per_process_gauges
from cachemon.normalise.server_profile import ServerProfile
from cachemon.normalise.updates import CounterSample, SeriesKey, SourceId
from cachemon.sources.exposition import Exposition, LabelBudget, parse

Sig = tuple[tuple[str, str], ...]
Rows = list[tuple[dict[str, str], float, Sig]]     # labels, value, source label set


class Problem(NamedTuple):
    """Something on the page cachemon could not count, in plain language (check, logs)."""

    code: str       # hits_counter_missing | blocks_without_block_size | duplicate_series | rejected_samples
    message: str

    def __str__(self) -> str:
        return self.message

WANTED = E.wanted_stems()
# Only *_total counters have a *_created twin per series (a histogram's is per histogram, and
# the eviction histogram's _count or the prompt-length buckets are not counters with a twin).
CREATED = {stem: E.created_stem(stem) for stem in E.counter_stems() if stem.endswith("_total")}
HELP_WANTED = E.help_stems()
BARE = E.bare_stems()


@dataclass
class Normalised:
    era: E.Era
    # one sample per source series, raw (as vLLM counts, converted to tokens)
    samples: list[CounterSample] = field(default_factory=list)
    gauges: dict[SeriesKey, float] = field(default_factory=dict)
    process_start_time: float | None = None
    engines: dict[tuple[str, str], ServerProfile] = field(default_factory=dict)
    prefix: str | None = None
    rejected: Tally[str] = field(default_factory=Tally)   # refused samples by reason
    problems: list[Problem] = field(default_factory=list)
    multiprocess: MultiprocessSigns = field(default_factory=MultiprocessSigns)   # multiprocess.py

    @cached_property
    def counters(self) -> dict[SeriesKey, float]:
        """Raw values per exported series: the source series summed (for one-shot reads
        such as `cachemon check`; the daemon's state corrects each source first)."""
        out: dict[SeriesKey, float] = {}
        for smp in self.samples:
            out[smp.key] = out.get(smp.key, 0.0) + smp.value
        return out

    @property
    def block_size(self) -> int | None:
        sizes = {c.block_size for c in self.engines.values() if c.block_size}
        return sizes.pop() if len(sizes) == 1 else (max(sizes) if sizes else None)

    @property
    def match_floor(self) -> int | None:
        floors = {c.match_floor for c in self.engines.values() if c.match_floor}
        return max(floors) if floors else None

    @property
    def prefix_caching(self) -> str:
        vals = {c.prefix_caching for c in self.engines.values() if c.prefix_caching}
        return "mixed" if len(vals) > 1 else (vals.pop() if vals else "")

    @property
    def hash_algo(self) -> str:
        vals = {c.hash_algo for c in self.engines.values() if c.hash_algo}
        return ",".join(sorted(vals))


def _summed(raw: list[tuple[dict[str, str], float]]) -> list[tuple[dict[str, str], float]]:
    """One row per (model_name, engine): the sum of its series (an engine's extra labels, as SGLang's
    cache_source, split one count). A value that is not a count poisons its sum, so the sum is refused
    whole (the last good one kept) rather than dropping as if the engine had restarted."""
    sums: dict[tuple[str, str], float] = {}
    bad: dict[tuple[str, str], float] = {}      # the first bad value of a sum: refused for what it is (nan, infinite...)
    for labels, value in raw:
        ident = _ident(labels)
        sums[ident] = sums.get(ident, 0.0) + value
        if _counter_problem(value) is not None:
            bad.setdefault(ident, value)
    sums.update(bad)
    return [({"model_name": m, "engine": e} if e else {"model_name": m}, v) for (m, e), v in sums.items()]


def _ident(labels: dict[str, str]) -> tuple[str, str]:
    return labels.get("model_name", ""), labels.get("engine", "")


def _counter_problem(value: float) -> str | None:
    """Why a counter sample cannot be a count, or None when it can."""
    if 0 <= value < S.MAX_COUNTER:     # the common case first: one comparison chain
        return None
    if math.isnan(value):
        return S.REJECT_NAN
    if math.isinf(value):
        return S.REJECT_INFINITE
    return S.REJECT_NEGATIVE if value < 0 else S.REJECT_IMPLAUSIBLE


def _gauge_problem(value: float, unit: str) -> str | None:
    """Why a gauge sample is out of its catalog unit's range, or None (the log parser checks
    its percentages the same way: normalise/log_grammar.py)."""
    if math.isnan(value):
        return S.REJECT_NAN
    if math.isinf(value):
        return S.REJECT_INFINITE
    if value < 0 or (unit == "ratio" and value > 1.0):
        return S.REJECT_OUT_OF_RANGE
    return None


def select_era(page: Exposition) -> E.Era:
    for era in E.ERAS:
        if era.detect not in page.samples:
            continue
        if era.help_contains:
            text = page.help.get(era.detect, "")
            if era.help_contains.lower() not in text.lower():
                continue
        return era
    return E.NO_PREFIX_CACHE_METRICS


_CACHE_MAX = 4096

# (stem, metric, extra labels, extra label name, source label set): a counter's exported key and source id.
_IdKey = tuple[str, str, tuple[str, ...], str | None, Sig]


class Normaliser:
    """Normalises the pages of one upstream (the poller keeps one; a one-shot read uses a new one).

    It holds what makes a repeat poll cheap, bounded: the parser hands out the same
    (memoised) label dict for the same label text on every poll, so the sorted form is kept
    per dict object (the entry holds the dict, so its id cannot be reused while the entry
    lives), and each counter's exported key and source id, the same few dozen on every poll."""

    def __init__(self) -> None:
        self._sigs: dict[int, tuple[dict[str, str], Sig]] = {}
        self._ids: dict[_IdKey, tuple[SeriesKey, SourceId]] = {}

    def source_labels(self, labels: dict[str, str]) -> Sig:
        got = self._sigs.get(id(labels))
        if got is not None and got[0] is labels:
            return got[1]
        # Sorted, so the same label set in another order is the same series.
        sig = tuple(sorted(labels.items()))
        if len(self._sigs) >= _CACHE_MAX:
            self._sigs.clear()
        self._sigs[id(labels)] = (labels, sig)
        return sig

    def series_ids(self, key: _IdKey, labels: dict[str, str]) -> tuple[SeriesKey, SourceId]:
        ids = self._ids.get(key)
        if ids is None:
            stem, metric, extra, extra_label, sig = key
            series = SeriesKey(metric, _ident(labels) + extra + ((labels.get(extra_label, ""),) if extra_label else ()))
            if len(self._ids) >= _CACHE_MAX:
                self._ids.clear()
            ids = self._ids[key] = (series, SourceId(stem, sig))
        return ids

    def normalise(self, page: Exposition) -> Normalised:
        return _Page(self, page).normalise()

    def normalise_text(self, body: str, budget: LabelBudget | None = None, deadline: float | None = None) -> Normalised:
        """Parse and normalise one page; ``budget`` and ``deadline`` bound the work (the poller's)."""
        page = parse(body, WANTED, HELP_WANTED, budget, deadline, BARE)
        out = self.normalise(page)
        out.multiprocess = per_process_gauges(page)      # a prometheus_client multiprocess page?
        if page.rewritten_labels:                         # counted per poll, like the samples refused
            out.rejected[S.REJECT_REWRITTEN] += page.rewritten_labels
        if budget is not None and budget.skipped:
            out.rejected[S.REJECT_BUDGET] += budget.skipped
            out.problems.append(Problem(S.REJECT_BUDGET, (
                f"the page has more than {budget.limit} (model_name, engine) label sets: samples of further new "
                "ones are not read (label-set budget)")))
        return out


class _Page:
    """One page being normalised: its de-duplicated rows and the result so far."""

    def __init__(self, normaliser: Normaliser, page: Exposition):
        self.n = normaliser
        self.page = page
        self.era = select_era(page)
        self.out = Normalised(era=self.era, process_start_time=page.process_start_time, prefix=page.prefix)
        self.deduped: dict[str, Rows] = {}

    def rows(self, stem: str) -> Rows | None:
        """The stem's samples with exact duplicates removed (first one kept) and counted:
        a page that repeats a label set is invalid, and summing it would double a counter."""
        got = self.deduped.get(stem)
        if got is not None:
            return got
        if stem not in self.page.samples:
            if self.era.sum_sources and stem == self.era.hits and self.era.queries in self.page.samples:
                # the engine creates its hits series at the first hit: none yet is 0 hits
                got = self.deduped[stem] = [(labels, 0.0, sig) for labels, _, sig in self.rows(self.era.queries) or ()]
            return got
        raw = self.page.samples[stem]
        if self.era.sum_sources and stem in (self.era.queries, self.era.hits):
            raw = _summed(raw)
        got = []
        seen: set[Sig] = set()
        for labels, value in raw:
            sig = self.n.source_labels(labels)
            if sig in seen:
                self.out.rejected[S.REJECT_DUPLICATE] += 1
                continue
            seen.add(sig)
            got.append((labels, value, sig))
        if len(got) < len(raw):
            self.out.problems.append(Problem(S.REJECT_DUPLICATE, (
                f"{stem}: {len(raw) - len(got)} duplicate series on the page (an invalid exposition): "
                "only the first of each is counted")))
        self.deduped[stem] = got
        return got

    def normalise(self) -> Normalised:
        era = self.era
        self.read_engines()
        # Local prefix cache: the era decides which names and which unit.
        if era.queries and era.hits:
            self.read_cache_tier(era.queries, era.hits, "local", scale_blocks=era.unit == "blocks")
        self.read_ratio_gauges()
        # KV-connector tier.
        self.read_cache_tier(E.EXTERNAL_QUERIES, E.EXTERNAL_HITS, "external")
        self.read_common_counters()
        self.read_gauges()
        self.profile_other_engine()
        self.attribute_engines()
        return self.out

    def profile_other_engine(self) -> None:
        """Another engine's page has no vllm:cache_config_info: its profile says only which engine it is
        (the era's row), read from its metric names."""
        era, out = self.era, self.out
        if era.detect and era.engine != "vllm" and not out.engines:
            for smp in out.samples:
                ident = (smp.key.labels[0], smp.key.labels[1])
                out.engines.setdefault(ident, ServerProfile(engine=era.engine,
                                                            sources=(("engine", "the page's metric names"),)))

    def read_engines(self) -> None:
        # cache_config_info carries no model_name on V1 (one row per engine).
        for labels, _, _ in self.rows(E.CACHE_CONFIG) or ():
            self.out.engines[_ident(labels)] = replace(ServerProfile.from_cache_config_info(labels),
                                                       engine=self.era.engine)

    def block_size_for(self, ident: tuple[str, str]) -> int | None:
        engines = self.out.engines
        cfg = engines.get(ident) or engines.get(("", ident[1])) or engines.get(("", ""))
        if cfg and cfg.block_size:
            return cfg.block_size
        return self.out.block_size

    def read_counter(self, stem: str, spec: C.MetricSpec, extra: tuple[str, ...] = (), scale_blocks: bool = False,
                     extra_label: str | None = None) -> dict[Sig, CounterSample] | None:
        """Samples of one counter stem by source label set; None when the stem is absent."""
        got = self.rows(stem)
        if got is None:
            return None
        out = self.out
        twin = CREATED.get(stem)
        created = {sig: v for _, v, sig in (self.rows(twin) if twin else None) or () if math.isfinite(v)}
        by_source: dict[Sig, CounterSample] = {}
        bad: dict[str, int] = {}
        for labels, value, sig in got:
            problem = _counter_problem(value)
            if problem is not None:
                bad[problem] = bad.get(problem, 0) + 1
                continue
            if scale_blocks:
                bs = self.block_size_for(_ident(labels))
                if bs is None:
                    out.problems.append(Problem("blocks_without_block_size", (
                        f"{stem} counts blocks but no block_size is known (vllm:cache_config_info missing): "
                        "not converted")))
                    continue
                value *= bs
            key, source = self.n.series_ids((stem, spec.name, extra, extra_label, sig), labels)
            smp = by_source[sig] = CounterSample(key, source, value, created.get(sig))
            out.samples.append(smp)
        for reason, n in bad.items():
            out.rejected[reason] += n
            out.problems.append(Problem("rejected_samples", (
                f"{stem}: {n} sample(s) refused ({reason}): a counter must be a finite number >= 0; "
                "the last good value is kept")))
        return by_source

    def read_cache_tier(self, queries: str, hits: str, cache: str, scale_blocks: bool = False) -> None:
        q = self.read_counter(queries, C.QUERY_TOKENS, (cache,), scale_blocks)
        h = self.read_counter(hits, C.HIT_TOKENS, (cache,), scale_blocks)
        if q is not None and h is None and cache == "local":
            self.out.problems.append(Problem("hits_counter_missing",
                                             f"{hits} is missing although {queries} is present: hits cannot be counted"))
        if q is not None and h is not None:
            self.hold_partners(queries, hits, q, h)
        if not q or not h:
            return
        # A page's hits above its queries (no vLLM counts more hits than queries; one read between a batch's
        # two increments shows the hits behind, never ahead) are refused: taken, a lower next reading would be
        # a glitch, held, and the misses stuck until the queries passed the bogus hits (70 polls).
        ahead = {id(h.pop(sig)) for sig, qs in q.items() if sig in h and h[sig].value > qs.value}
        if ahead:
            self.out.samples = [s for s in self.out.samples if id(s) not in ahead]
            self.out.rejected[S.REJECT_HITS_AHEAD] += len(ahead)
        # Miss tokens per source series, so they are reset-corrected like their inputs.
        miss_stem = "miss:" + queries
        for sig, qs in q.items():
            hs = h.get(sig)
            if hs is not None:
                self.out.samples.append(CounterSample(SeriesKey(C.MISS_TOKENS.name, qs.key.labels),
                                                      SourceId(miss_stem, sig), max(qs.value - hs.value, 0.0),
                                                      qs.created, pair=(qs.source, hs.source)))

    def hold_partners(self, queries: str, hits: str, q: dict[Sig, CounterSample], h: dict[Sig, CounterSample]) -> None:
        """A series whose query or hit sample was refused (NaN, an infinity, ...) keeps both at their last
        good values for this poll: its hits taken alone were capped at the held queries (a 100 % interval),
        its queries alone advanced with neither hits nor misses (a 0 % one). The refused sample is counted;
        its partner is held, said in the same problem list."""
        refused_q = {sig for _, _, sig in self.rows(queries) or ()} - q.keys()
        refused_h = {sig for _, _, sig in self.rows(hits) or ()} - h.keys()
        alone = [d.pop(sig) for d, refused in ((h, refused_q), (q, refused_h)) for sig in list(d) if sig in refused]
        if not alone:
            return
        held = {id(smp) for smp in alone}
        self.out.samples = [smp for smp in self.out.samples if id(smp) not in held]
        self.out.problems.append(Problem("rejected_samples", (
            f"{queries} / {hits}: {len(alone)} sample(s) held at their last good value because the other "
            "counter of their pair was refused this poll (hits and queries move together)")))

    def read_ratio_gauges(self) -> None:
        """V0's hit-rate gauges (a ratio over block lookups since start); -1 means caching is off."""
        out = self.out
        for stem, cache, basis in self.era.ratio_gauges:
            for labels, value, _ in self.rows(stem) or ():
                ident = _ident(labels)
                if value < 0:     # V0 sets -1 when prefix caching is disabled
                    # the engine's cache_config_info row (no model_name on V0), else a new one
                    at = next((k for k in (ident, ("", ident[1])) if k in out.engines), ident)
                    cfg = out.engines.setdefault(at, ServerProfile())
                    if cache == "local":
                        out.engines[at] = replace(cfg, prefix_caching="false")
                    continue
                bad = _gauge_problem(value, C.REPORTED_HIT_RATIO.unit)
                if bad is not None:
                    out.rejected[bad] += 1
                    continue
                k = SeriesKey(C.REPORTED_HIT_RATIO.name, ident + (cache, basis))
                out.gauges[k] = max(value, out.gauges.get(k, value))

    def read_common_counters(self) -> None:
        for spec, cands in (
            (C.PROMPT_TOKENS, E.COMMON_COUNTERS["prompt_tokens"]),
            (C.GENERATION_TOKENS, E.COMMON_COUNTERS["generation_tokens"]),
            (C.PREEMPTIONS, E.COMMON_COUNTERS["preemptions"]),
            (C.PROMPT_CACHED_TOKENS, E.COMMON_COUNTERS["prompt_cached_tokens"]),
        ):
            for stem in cands:
                if self.read_counter(stem, spec) is not None:
                    break
        self.read_counter(E.PROMPT_TOKENS_BY_SOURCE, C.PROMPT_TOKENS_BY_SOURCE, extra_label="source")
        self.read_counter(E.CACHED_BY_SOURCE, C.HIT_TOKENS_BY_SOURCE, extra_label="source")
        self.read_counter(E.PARAMS_N_COUNT, C.SAMPLING_REQUESTS)
        self.read_counter(E.PARAMS_N_SUM, C.SAMPLING_SEQUENCES)
        self.read_counter(E.PROMPT_LENGTH_BUCKETS, C.PROMPT_LENGTH_REQUESTS, extra_label="le")
        self.read_counter(E.PROMPT_LENGTH_SUM, C.PROMPT_LENGTH_SUM)
        self.read_counter(E.KV_EVICTIONS, C.KV_EVICTED_BLOCKS)

    def read_gauges(self) -> None:
        for spec, cands in (
            (C.KV_CACHE_USAGE, E.COMMON_GAUGES["kv_cache_usage"]),
            (C.REQUESTS_RUNNING, E.COMMON_GAUGES["requests_running"]),
            (C.REQUESTS_WAITING, E.COMMON_GAUGES["requests_waiting"]),
        ):
            for stem in cands:
                got = self.rows(stem)
                if got is not None:
                    self._read_gauge(stem, spec, got)
                    break

    def _read_gauge(self, stem: str, spec: C.MetricSpec, got: Rows) -> None:
        out = self.out
        for labels, value, _ in got:
            bad = _gauge_problem(value, spec.unit)
            if bad is not None:
                out.rejected[bad] += 1
                out.problems.append(Problem("rejected_samples", (
                    f"{stem}: {value!r} refused ({bad}): not a {spec.unit or 'count'}; not exported")))
                continue
            k = SeriesKey(spec.name, _ident(labels))
            # Usage and queue gauges of collapsed series: the fullest one matters.
            out.gauges[k] = max(value, out.gauges.get(k, value))

    def attribute_engines(self) -> None:
        """V1's cache_config_info has an engine label but no model_name: with a single served
        model (the usual case) attribute the config to it, so the series join on model_name."""
        out = self.out
        models = {smp.key.labels[0] for smp in out.samples} | {k.labels[0] for k in out.gauges}
        if len(models) == 1:
            model = models.pop()
            out.engines = {((model if m == "" else m), e): cfg for (m, e), cfg in out.engines.items()}


def normalise(page: Exposition) -> Normalised:
    """One page on its own (a one-shot read; a poller keeps a ``Normaliser``)."""
    return Normaliser().normalise(page)


def normalise_text(body: str, budget: LabelBudget | None = None, deadline: float | None = None) -> Normalised:
    """Parse and normalise one page on its own (a one-shot read; a poller keeps a ``Normaliser``)."""
    return Normaliser().normalise_text(body, budget, deadline)


def to_update(n: Normalised, vllm_version: str = "") -> S.Update:
    """The state's input for one normalised page (engine config becomes gauges)."""
    bs = n.block_size
    info = S.UpstreamInfo(
        kind="metrics", era=n.era.name, engine=n.era.engine if n.era.detect else "", vllm_version=vllm_version,
        prefix_caching=n.prefix_caching, block_size=str(bs) if bs else "",
        hash_algo=n.hash_algo, counter_unit=n.era.unit,
    )
    gauges = dict(n.gauges)
    for ident, cfg in n.engines.items():
        gauges.update(cfg.config_gauges(ident))
    return S.Update(counters=list(n.samples), gauges=gauges, process_start_time=n.process_start_time,
                    info=info, rejected=Tally(n.rejected), profiles=dict(n.engines))
