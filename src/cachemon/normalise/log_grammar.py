"""vLLM's log lines as data: one row of ``GRAMMARS`` per frontend and stats-line era, and the reset lines.

Adding a frontend or a stats-line era is adding a ``StatsGrammar`` row: its message head (a regex
whose named groups are the fields), who writes it, the versions, what its hit rate is a ratio of,
and its logging interval if the frontend fixes one. ``parse`` tries the rows in order.

Formats (vllm/v1/metrics/loggers.py ``LoggingStatLogger.log``, vllm/engine/metrics.py
for V0; the table is in /work/shared/notes/vllm-metrics.md section 2):

* V0 0.4-0.10: ``Avg prompt throughput: X tokens/s, Avg generation throughput: Y tokens/s,
  Running: N reqs, Swapped: N reqs, Pending: N reqs, GPU KV cache usage: U%, CPU KV cache
  usage: U%[.]`` and, on its own line, ``Prefix cache hit rate: GPU: H%, CPU: H%`` (a block
  ratio since engine start; -100% means that cache is disabled).
* V1 0.7.1-0.8.2: the same head with ``Waiting: N reqs[,] GPU KV cache usage: U%[, Prefix
  cache hit rate: H%]``, no engine prefix.
* V1 0.8.3+: ``Engine 000: `` (or ``N Engines Aggregated: ``) + head + ``Running: N reqs,
  Waiting: N reqs[, Deferred: N reqs][, KV fetch: ...][, Preemptions: N], <DEV> KV cache
  usage: U%[, Prefix cache hit rate: H%][, Corrupted: N reqs][, External prefix cache hit
  rate: E%][, MM cache hit rate: M%]``; DEV is GPU until 0.29, the device type from 0.30
  (CPU, NPU, XPU...). From 0.31 the hit rate is omitted while its window is empty.

vllm-ascend (``vllm_ascend/logger.py``, v0.22.1rc1 on) writes the same lines, and puts
``[vllm-ascend] [module] - `` (or ``[vllm-ascend] - ``) in front of the message of every
record logged from its own code; vLLM's stats lines come from vLLM's code and carry no prefix,
its own lines do. ``ascend_prefix`` takes the prefix off before anything is matched. The one
prefix-cache line of its own, ``CPU Prefix cache hit rate: H%`` (``cpu_kv_cache_manager.py``,
the CPU offloading connector, v0.11.0rc0 - v0.23.0), is a ``StatsLine`` of kind
``ascend_cpu_offload``: a ratio over vLLM's ``CachingMetrics`` window of recent requests.

The V1 hit rate is vLLM's ratio over its recent-request window (~1000 requests), a
gauge; it is never turned into token counts. A message is only recognised right
after the logger's ``] `` (or at the start of the line), so a prompt quoted inside a
request-log line cannot pose as a stats line.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

# vLLM's prefix-cache reset messages, exactly as 0.32 logs them (POST /reset_prefix_cache):
# entrypoints/serve/dev/cache/api_router.py: logger.info("Resetting prefix cache...")
# v1/core/block_pool.py: logger.info("Successfully reset prefix cache") and
# logger.warning("Failed to reset prefix cache because some blocks (%d) are not freed yet").
_RESET = re.compile(r"(?:^|\] )(?:(?P<requested>Resetting prefix cache\.\.\.)|(?P<done>Successfully reset prefix "
                    r"cache)|(?P<failed>Failed to reset prefix cache because))")

# Start-up lines that state the engine's config, for a frontend whose page does not (the Rust frontend
# of 0.32 has no vllm:cache_config_info): the engine core logs them under either frontend.
#   v1/engine/core.py "Initializing a V1 LLM engine (v%s) with config: ... enable_prefix_caching=%s ...";
#   v1/core/kv_cache_utils.py "%s KV cache size: %s tokens, ..." (the pool, group-aware) and
#   "Overriding num_gpu_blocks=%d with num_gpu_blocks_override=%d"; v1/utils.py "Launching Rust frontend: ".
@dataclass(frozen=True)
class ConfigLine:
    """A start-up line that states part of the engine's config: ``needle`` (plain text every such line
    holds, tested before the regex) and ``pattern``, whose named groups are the fields (version,
    prefix_caching, pool, blocks, frontend: ServerProfile.from_log_config reads them)."""
    needle: str
    pattern: re.Pattern[str]


CONFIG_LINES: tuple[ConfigLine, ...] = (
    ConfigLine("with config: ", re.compile(
        r"(?:^|\] )Initializing a V1 LLM engine \(v(?P<version>[\w.+-]+)\) with config: .*?"
        r"\benable_prefix_caching=(?P<prefix_caching>True|False)\b")),
    ConfigLine("KV cache size: ", re.compile(r"(?:^|\] )[A-Z]+ KV cache size: (?P<pool>[0-9,]+) tokens")),
    ConfigLine("num_gpu_blocks_override=", re.compile(
        r"(?:^|\] )Overriding num_gpu_blocks=\d+ with num_gpu_blocks_override=(?P<blocks>\d+)")),
    # a frontend other than Python's announces itself before its engine starts; the group's value,
    # lower-cased, is its eras.FRONTENDS row
    ConfigLine("Launching Rust frontend", re.compile(r"(?:^|\] )Launching (?P<frontend>Rust) frontend: ")),
)

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_ANCHOR = r"(?:^|\] )"
_NUM = r"(-?[0-9]+(?:\.[0-9]+)?|nan|inf|-inf)"

_HEAD = re.compile(
    _ANCHOR + r"(?:Engine (?P<engine>\d+): |(?P<agg>\d+) Engines Aggregated: )?"
    r"Avg prompt throughput: " + _NUM + r" tokens/s, Avg generation throughput: " + _NUM
    + r" tokens/s, Running: (\d+) reqs(?P<rest>.*)$")
_V0_PREFIX = re.compile(_ANCHOR + r"Prefix cache hit rate: GPU: (?P<hit_local>" + _NUM[1:] + r"%, CPU: (?P<hit_cpu_swap>"
                        + _NUM[1:] + r"%\s*$")
_PID = re.compile(r"^\((?P<proc>[A-Za-z]+)(?:_\w+)? pid=(?P<pid>\d+)\) ")
_TS = re.compile(r"(?:^|\s)(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.\d+)? ")

_WAITING = re.compile(r"\bWaiting: (\d+) reqs")
_PENDING = re.compile(r"\bPending: (\d+) reqs")
_DEFERRED = re.compile(r"\bDeferred: (\d+) reqs")
_PREEMPT = re.compile(r"\bPreemptions: (\d+)")
_KV = re.compile(r"\b([A-Z][A-Za-z0-9]*) KV cache usage: " + _NUM + "%")
_HIT = re.compile(r"(?<!External )(?<!MM )\bPrefix cache hit rate: " + _NUM + "%")
_EXT = re.compile(r"\bExternal prefix cache hit rate: " + _NUM + "%")
_MM = re.compile(r"\bMM cache hit rate: " + _NUM + "%")
_KV_FETCH = re.compile(r"\bKV fetch: ")
# vllm_ascend/logger.py (_format_with_ascend_prefix): "[vllm-ascend] [<module>] - " or "[vllm-ascend] - ",
# put right before the message, i.e. after the "] " that closes [file:line].
_ASCEND = re.compile(r"\] (\[vllm-ascend\] (?:\[(?P<module>[\w.-]+)\] )?- )")
_ASCEND_CPU = re.compile(_ANCHOR + r"CPU Prefix cache hit rate: (?P<hit_ascend_cpu_offload>" + _NUM[1:] + r"%\s*$")
# The Rust frontend's line (vllm-rs, src/llm/src/log_stats.rs, its format strings as the binary holds them):
# "Avg prompt tput: X toks/s, Avg generation tput: Y toks/s, Reqs Running: N, Waiting: N, GPU KV cache used: U%,
# Prefix cache hit rate: H%[, External prefix cache hit rate: E%]"; its hit rate is over the last interval.
_RUST = re.compile(
    r"(?:^|\] |: )(?:Engine (?P<engine>\d+): )?Avg prompt tput: (?P<prompt>" + _NUM[1:]
    + r" toks/s, Avg generation tput: (?P<generation>" + _NUM[1:] + r" toks/s, Reqs Running: (?P<running>\d+), "
    r"Waiting: (?P<waiting>\d+), (?P<device>[A-Z][A-Za-z0-9]*) KV cache used: (?P<kv>" + _NUM[1:] + r"%"
    r"(?:, Prefix cache hit rate: (?P<hit_local>" + _NUM[1:] + r"%)?"
    r"(?:, External prefix cache hit rate: (?P<hit_external>" + _NUM[1:] + r"%)?")


@dataclass
class StatsLine:
    """One parsed stats line. Ratios are 0..1; None where the line does not carry the field."""
    kind: str                            # a GRAMMARS row's kind ("v0" for V0's head)
    engine: str = ""
    prompt_throughput: float | None = None
    generation_throughput: float | None = None
    running: int | None = None
    waiting: int | None = None
    device: str = ""
    kv_usage: float | None = None
    hit_rates: dict[str, float] = field(default_factory=dict)    # cache label -> ratio
    min_version: str = ""                # the oldest vLLM that writes this layout
    timestamp: float | None = None       # seconds in the (year-less) log time, for intervals
    pid: str = ""
    interval: float | None = None        # the frontend's fixed logging interval (None: VLLM_LOG_STATS_INTERVAL)


class MalformedLine(ValueError):
    pass


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text) if "\x1b" in text else text


def ascend_prefix(text: str) -> tuple[str, str] | None:
    """(module, text without the prefix) for a line carrying vllm-ascend's prefix, else None.
    The module is "" for ``[vllm-ascend] - `` (a record from the module's own top file)."""
    if "[vllm-ascend]" not in text:
        return None
    m = _ASCEND.search(text, 0, 400)
    if m is None:
        return None
    return m.group("module") or "", text[:m.start(1)] + text[m.end(1):]


def _clean(text: str) -> str:
    text = strip_ansi(text)
    got = ascend_prefix(text)
    return got[1] if got is not None else text


def _pct(s: str, what: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise MalformedLine(f"{what}: not a number") from None
    if not (0.0 <= v <= 100.0):
        raise MalformedLine(f"{what}: {v} outside 0..100%")
    return v / 100.0


def _rate(s: str, what: str) -> float:
    v = float(s)
    if not (v >= 0.0 and v < float("inf")):
        raise MalformedLine(f"{what}: not a finite non-negative number")
    return v


_MONTH_START = (0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334)


def log_time(text: str) -> float | None:
    """vLLM's ``MM-DD HH:MM:SS`` as seconds since the start of a (non-leap) year (ANSI codes around it,
    as the Rust frontend writes them, are skipped)."""
    m = _TS.search(strip_ansi(text), 0, 120)
    if not m:
        return None
    mo, d, h, mi, s = (int(x) for x in m.groups())
    if not (1 <= mo <= 12 and 1 <= d <= 31 and h < 24 and mi < 60 and s < 61):
        return None
    return (((_MONTH_START[mo - 1] + d - 1) * 24 + h) * 60 + mi) * 60 + s


@dataclass(frozen=True)
class StatsGrammar:
    """One frontend's or era's stats line. ``head`` finds it; its named groups are the fields
    (``prompt``, ``generation``, ``running``, ``waiting``, ``device``, ``kv``, ``engine``, and ``hit_<cache>``
    for each hit rate); ``parse`` overrides the generic reading where a layout needs more."""
    kind: str                      # StatsLine.kind
    frontend: str                  # who writes it: vLLM's Python processes, the Rust frontend, vllm-ascend
    versions: str
    head: re.Pattern[str]
    hit_basis: str = ""            # what its hit rate is a ratio of (REPORTED_HIT_RATIO's basis label)
    min_version: str = ""
    interval: float | None = None  # seconds between its lines when the frontend fixes it (None: configurable)
    negative_disabled: bool = False  # a negative hit rate means that cache is off (V0 writes -1 x 100)
    # its hit rate covers its interval only: with no prompt in the interval it says 0.0% of nothing (seen on
    # the real Rust capture), and is not a ratio. The throughput counts computed tokens (cached ones
    # excluded: 100.8 toks/s x 10 s = 3312 - 2304 hit on the capture), and every prompt computes at least
    # its last token, so 0 means no prompt.
    hit_needs_prompts: bool = False
    parse: Callable[[StatsGrammar, str, re.Match[str]], StatsLine] | None = None
    evidence: str = ""             # the real capture under tests/fixtures it is tested on, or "constructed"
    needle: bytes = b""            # plain bytes its lines hold, where they hold none of STATS_NEEDLES


def _by_groups(g: StatsGrammar, text: str, m: re.Match[str]) -> StatsLine:
    """The generic reading of a row's named groups."""
    d = m.groupdict()
    out = StatsLine(kind=g.kind, min_version=g.min_version, interval=g.interval)
    if d.get("engine") is not None:
        out.engine = str(int(d["engine"]))
    if d.get("prompt") is not None:
        out.prompt_throughput = _rate(d["prompt"], "prompt throughput")
    if d.get("generation") is not None:
        out.generation_throughput = _rate(d["generation"], "generation throughput")
    if d.get("running") is not None:
        out.running = int(d["running"])
    if d.get("waiting") is not None:
        out.waiting = int(d["waiting"])
    if d.get("kv") is not None:
        out.device = d.get("device") or ""
        out.kv_usage = _pct(d["kv"], "KV cache usage")
    idle = g.hit_needs_prompts and out.prompt_throughput == 0.0
    for name, raw in d.items():
        if not name.startswith("hit_") or raw is None or idle:
            continue
        if g.negative_disabled and raw.startswith("-"):
            continue
        out.hit_rates[name[4:]] = _pct(raw, f"{name[4:]} hit rate")
    _stamp(out, text)
    return out


# SGLang 0.5.23's prefill line (srt/managers/scheduler_components/metrics_reporter.py:753-762), one per
# prefill batch: "[2026-12-01 20:18:06 TP0] Prefill batch, #new-seq: 1, #new-token: 512, #cached-token: 1536, ..."
_SGLANG_PREFILL = re.compile(_ANCHOR + r"Prefill batch(?: \[\d+\])?, #new-seq: (?P<seqs>\d+), "
                             r"#new-token: (?P<new>\d+), #cached-token: (?P<cached>\d+), ")


def _sglang_prefill(g: StatsGrammar, text: str, m: re.Match[str]) -> StatsLine:
    """That batch's ratio of cached to prompt tokens (new + cached): a reported ratio, never counted."""
    out = StatsLine(kind=g.kind, min_version=g.min_version, interval=g.interval)
    new, cached = int(m["new"]), int(m["cached"])
    if new + cached:
        out.hit_rates["local"] = cached / (new + cached)
    _stamp(out, text)
    return out


def _python_head(_g: StatsGrammar, text: str, m: re.Match[str]) -> StatsLine:
    return _parse_head(text, m)


GRAMMARS: tuple[StatsGrammar, ...] = (
    StatsGrammar("v1", "python", "V1 0.7.1 - 0.33 (V0 0.4 - 0.10 share the head: kind v0)", _HEAD,
                 hit_basis="recent_requests", parse=_python_head,
                 evidence="vllm-0.32.0-cpu/server.log, vllm-0.32.0-cpu-kv-events/*/vllm-server.log"),
    StatsGrammar("v0_prefix", "python", "V0 0.5.5 - 0.10", _V0_PREFIX, hit_basis="since_start_blocks",
                 min_version="0.5.5", negative_disabled=True, evidence="constructed (tests/fixtures/logs/stats-lines.yaml)"),
    StatsGrammar("ascend_cpu_offload", "vllm-ascend", "v0.11.0rc0 - v0.23.0 (CPU offloading connector)",
                 _ASCEND_CPU, hit_basis="recent_requests", evidence="constructed (tests/test_ascend_lines.py)"),
    StatsGrammar("rust", "rust", "0.32 (VLLM_USE_RUST_FRONTEND=1, vllm-rs src/llm/src/log_stats.rs)", _RUST,
                 hit_basis="interval", interval=10.0, min_version="0.32", hit_needs_prompts=True,
                 evidence="vllm-0.32.0-cpu-rust-frontend"),
    StatsGrammar("sglang_prefill", "sglang", "SGLang 0.5.23 (each prefill batch)", _SGLANG_PREFILL,
                 hit_basis="per_batch_tokens", parse=_sglang_prefill, needle=b"#cached-token: ",
                 evidence="constructed: sglang-constructed"),
)
@dataclass(frozen=True)
class LogKind:
    """What a stats line of one kind tells of the whole log (LogStream.kind, cachemon_upstream_info{era})."""
    stream: str          # the log's kind once such a line is seen
    decisive: bool       # it replaces an earlier kind (V0 and V1 share a head), else it only fills an empty one
    era: str             # the era label ...
    versioned: bool = False   # ... followed by "-{the oldest release that writes the lines}+" where known


# Per StatsLine.kind; a kind missing here (a connector's own line) says nothing of the log's kind.
LOG_KINDS: dict[str, LogKind] = {
    "v1": LogKind("v1", True, "v1-log", versioned=True),
    "rust": LogKind("rust", True, "rust-frontend-log"),
    "v0": LogKind("v0", False, "v0-log"),
    "v0_prefix": LogKind("v0", False, "v0-log"),
}


def hit_basis(kind: str) -> str | None:
    """What the logged hit rate of a line kind is a ratio of (REPORTED_HIT_RATIO's basis label), or None."""
    return next((g.hit_basis for g in GRAMMARS if g.kind == kind and g.hit_basis), None)
# Cheap bytes tests: a line without any of these is neither a stats line nor a reset line.
# Cheap bytes tests of the stats lines' rows (a row's own ``needle`` where its line has none of these).
STATS_NEEDLES = (b"cache usage", b"cache used", b"hit rate")
RESET_NEEDLES = (b"reset prefix cache", b"Resetting prefix cache")


def needles() -> tuple[bytes, ...]:
    """Plain bytes one of which every line of the tables holds: a line with none is not read further.
    Read from the rows when a LogStream is made, so a row added to a table is followed."""
    extra = tuple(g.needle for g in GRAMMARS if g.needle and g.needle not in STATS_NEEDLES)
    return STATS_NEEDLES + extra + RESET_NEEDLES + tuple(c.needle.encode() for c in CONFIG_LINES)


def parse(text: str) -> StatsLine | None:
    """A stats line, or None if ``text`` is not one. Raises MalformedLine if it looks like
    one (the message head matched) but a field is missing or out of range."""
    text = _clean(text)
    for g in GRAMMARS:
        m = g.head.search(text)
        if m is not None:
            try:
                return (g.parse or _by_groups)(g, text, m)
            except MalformedLine:
                raise
            except ValueError:      # int() refuses a field of over 4 300 digits: no count is that long
                raise MalformedLine(f"{g.kind}: a number too long to read") from None
    return None


def config_fields(text: str) -> dict[str, str] | None:
    """The config a start-up line states (version, prefix_caching, pool, blocks, frontend), or None."""
    rows = [c for c in CONFIG_LINES if c.needle in text]
    if not rows:
        return None
    text = _clean(text)
    for row in rows:
        m = row.pattern.search(text)
        if m is not None:
            return {k: v.replace(",", "") for k, v in m.groupdict().items() if v is not None}
    return None


def reset_event(text: str) -> str | None:
    """"requested" | "done" | "failed" for vLLM's prefix-cache reset lines, else None. Anchored
    after the logger's "] " like the stats lines, so a prompt quoting the words does not count."""
    m = _RESET.search(_clean(text))
    if m is None:
        return None
    return m.lastgroup


def _stamp(out: StatsLine, text: str) -> None:
    out.timestamp = log_time(text)
    p = _PID.match(text)
    if p:
        out.pid = p.group("pid")


def _parse_head(text: str, m: re.Match[str]) -> StatsLine:
    rest = m.group("rest")
    try:
        pt, gt = _rate(m.group(3), "prompt throughput"), _rate(m.group(4), "generation throughput")
    except ValueError:
        raise MalformedLine("throughput: not a number") from None
    kv = _KV.search(rest)
    if kv is None:
        raise MalformedLine("no KV cache usage field")
    pending = _PENDING.search(rest)
    if pending is not None:                              # V0 layout
        out = StatsLine(kind="v0", min_version="0.4.0", waiting=int(pending.group(1)))
    else:
        w = _WAITING.search(rest)
        if w is None:
            raise MalformedLine("no Waiting field")
        out = StatsLine(kind="v1", waiting=int(w.group(1)))
        if m.group("engine") is not None:
            out.engine = str(int(m.group("engine")))
            out.min_version = "0.8.3"
        elif m.group("agg") is not None:
            out.engine = "aggregated"
            out.min_version = "0.11.1"
        else:
            out.min_version = "0.7.1"
    out.prompt_throughput, out.generation_throughput = pt, gt
    out.running = int(m.group(5))
    out.device = kv.group(1)
    out.kv_usage = _pct(kv.group(2), "KV cache usage")
    if out.kind == "v1":
        hit = _HIT.search(rest)
        if hit is not None:
            out.hit_rates["local"] = _pct(hit.group(1), "prefix cache hit rate")
        ext = _EXT.search(rest)
        if ext is not None:
            out.hit_rates["external"] = _pct(ext.group(1), "external prefix cache hit rate")
        mm = _MM.search(rest)
        if mm is not None:
            out.hit_rates["mm"] = _pct(mm.group(1), "MM cache hit rate")
        out.min_version = newer(out.min_version, _evidence(rest, out.device, ext or mm))
    _stamp(out, text)
    return out


def _evidence(rest: str, device: str, newer_field: object) -> str:
    """The oldest vLLM that can have written these optional fields."""
    if _KV_FETCH.search(rest):
        return "0.32"
    if device != "GPU":
        return "0.30"
    if _DEFERRED.search(rest):
        return "0.20"
    if newer_field or _PREEMPT.search(rest) or "Corrupted: " in rest:
        return "0.11.1"
    return ""


@lru_cache(maxsize=64)
def _vkey(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split(".")) if v else ()


def newer(a: str, b: str) -> str:
    """The later of two version strings ('' is oldest)."""
    return a if _vkey(a) >= _vkey(b) else b


def era_of(kind: str, min_version: str) -> str:
    """Label for cachemon_upstream_info{era}: the log layout and the oldest vLLM that writes it."""
    k = LOG_KINDS.get(kind)
    if k is None:
        return ""
    return f"{k.era}-{min_version}+" if k.versioned and min_version else k.era
