"""Complete lines of one log source -> running counters, the newest stats lines, line outcomes.

The tailer (``sources.logs``) hands over blocks of complete lines, as mtail's does; this
is where a line becomes catalog series: vLLM's stats and reset lines (parsed by
``normalise.log_grammar``) and user rules (``log_rules``).

Counters here are absolute totals kept by cachemon (user rules, the throughput
estimate) and persisted with the read offsets (statefile), so they never reset and
each line is counted once. The newest stats line per engine is kept as parsed;
``cachemon.normalise.log_updates`` turns it into catalog series, like the /metrics path.
"""
from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from cachemon import catalog as C
from cachemon.catalog import SeriesKey
from cachemon.normalise import eras, log_grammar
from cachemon.normalise.log_rules import Malformed, rule_updates
from cachemon.sources.logs.framing import candidates
from cachemon.sources.logs.rule_spec import Rule
from cachemon.sources.logs.state_doc import StreamState

_YEAR = 365 * 86400.0
RECENT_GAPS = 9         # gaps between stats lines kept per engine (their median caps the estimate)


class LineOutcome(enum.Enum):
    """What one line was: a vLLM stats line, another line a parser or rule used, one no parser
    wanted, or one a parser recognised but could not use (malformed)."""

    STATS = "stats"
    MATCHED = "matched"
    NOTHING = "nothing"
    MALFORMED = "malformed"


@dataclass
class EngineLast:
    """An engine's last stats line with a timestamp: its log time, the API server's pid, and the
    recent gaps between its lines."""

    time: float
    pid: str
    gaps: list[float] = field(default_factory=list)

    def to_json(self) -> tuple[float, str, list[float]]:
        return self.time, self.pid, self.gaps

    @classmethod
    def from_json(cls, v: tuple[float, str, list[float]]) -> EngineLast:
        """The state file's ``[time, pid, gaps]``; raises TypeError/ValueError/IndexError on other data."""
        return cls(float(v[0]), str(v[1]), [float(g) for g in v[2]][-RECENT_GAPS:])


class LogStream:
    def __init__(self, name: str, model_name: str = "", rules: Sequence[Rule] = (), builtin: bool = True,
                 stats_interval: float = 10.0):
        self.name = name
        self.model_name = model_name
        self.rules = list(rules)
        self.builtin = builtin
        self.stats_interval = stats_interval
        needles: list[bytes] = list(log_grammar.needles()) if builtin else []
        self.scan_all = False
        for r in self.rules:
            if not r.needles:
                self.scan_all = True          # a rule without a literal: try every line
            needles.extend(n for n in r.needles if n not in needles)
        self.needles = tuple(needles)
        # running totals of rule counters and of the throughput estimate (persisted)
        self.counters: dict[SeriesKey, float] = {}
        # counters changed since the last take_changed(): the state's "last seen" for log series
        self.changed_counters: dict[SeriesKey, None] = {}     # an ordered set: first mentioned, first admitted
        # latest values of rule gauges
        self.gauges: dict[SeriesKey, float] = {}
        # (engine, line kind) -> the newest stats line: what the log says "now"
        self.stats: dict[tuple[str, str], log_grammar.StatsLine] = {}
        # engine -> its last stats line's time, pid and recent gaps
        self.engine_last: dict[str, EngineLast] = {}
        self.lines = {"parsed": 0, "unmatched": 0, "malformed": 0}
        self.stats_lines = 0
        self.kind = ""
        self.min_version = ""
        self.vllm_restarts = 0          # API-server pid changed between stats lines (check report)
        self.config: dict[str, str] = {}   # what the start-up lines said (log_grammar.config_fields), newest wins
        self.launching = ""                # a frontend other than Python's announced, its engine not yet up
        self.last_reset_log_time: float | None = None   # log time (log_grammar.log_time) of the last reset
        self.changed = False

    # -- persistence -----------------------------------------------------------------
    def saved_state(self) -> StreamState:
        return {"counters": [(m, list(lab), v) for (m, lab), v in sorted(self.counters.items())],
                "engine_last": {k: v.to_json() for k, v in self.engine_last.items()},
                "lines": dict(self.lines)}     # the line counters go on across a restart, like the offsets

    def restore(self, d: StreamState) -> None:
        self.counters = {SeriesKey(str(m), tuple(str(x) for x in lab)): float(v)
                         for m, lab, v in d.get("counters", [])}
        self.changed_counters = dict.fromkeys(self.counters)
        self.engine_last = {str(k): EngineLast.from_json(v) for k, v in d.get("engine_last", {}).items()}
        for outcome, n in d.get("lines", {}).items():
            if outcome in self.lines:
                self.lines[outcome] = int(n)
        self.changed = True

    def take_changed(self) -> dict[SeriesKey, float]:
        """Totals of the counters that changed since the last call (a log series is "seen"
        when the log mentions it; quiet ones can then age out of the state)."""
        out = {k: self.counters[k] for k in self.changed_counters}
        self.changed_counters = {}
        return out

    @property
    def era(self) -> str:
        if not self.kind:
            return "rules" if self.rules and not self.stats_lines else ""
        return log_grammar.era_of(self.kind, self.min_version)

    # -- lines -----------------------------------------------------------------------
    def feed(self, block: bytes) -> int:
        """Account for a block of complete lines; returns how many were stats lines."""
        total = block.count(b"\n")
        spans = _all_lines(block) if self.scan_all else candidates(block, self.needles)
        stats = matched = malformed = 0
        for s, e in spans:
            outcome = self._line(block[s:e])
            if outcome is LineOutcome.STATS:
                stats += 1
            elif outcome is LineOutcome.MATCHED:
                matched += 1
            elif outcome is LineOutcome.MALFORMED:
                malformed += 1
        parsed = stats + matched
        self.lines["parsed"] += parsed
        self.lines["malformed"] += malformed
        self.lines["unmatched"] += total - parsed - malformed
        self.stats_lines += stats
        if parsed:
            self.changed = True
        return stats

    def _line(self, raw: bytes) -> LineOutcome:
        raw = raw.lstrip(b"\x00").rstrip(b"\r")
        text = raw.decode("utf-8", "replace")
        builtin = self._builtin_line(text) if self.builtin else LineOutcome.NOTHING
        rules = self._rule_lines(raw, text)     # every rule sees every line, a stats line too
        if builtin is LineOutcome.STATS:
            return builtin
        if LineOutcome.MATCHED in (builtin, rules):
            return LineOutcome.MATCHED
        if LineOutcome.MALFORMED in (builtin, rules):
            return LineOutcome.MALFORMED
        return LineOutcome.NOTHING

    def _builtin_line(self, text: str) -> LineOutcome:
        """vLLM's own lines: a stats line, or a prefix-cache reset."""
        try:
            s = log_grammar.parse(text)
        except log_grammar.MalformedLine:
            return LineOutcome.MALFORMED
        if s is not None:
            self._apply_stats(s)
            return LineOutcome.STATS
        reset = log_grammar.reset_event(text)
        if reset is None:
            config = log_grammar.config_fields(text)
            if config is None:
                return LineOutcome.NOTHING
            if "frontend" in config:            # logged before the engine's own start-up lines
                self.launching = config["frontend"].lower()
                return LineOutcome.MATCHED
            if "version" in config:             # an engine starts: what it says replaces the last one's
                self.config = {"frontend": self.launching or eras.FRONTENDS[0].name}   # the default frontend
                self.launching = ""
            self.config.update(config)
            return LineOutcome.MATCHED
        self._add(SeriesKey(C.LOG_CACHE_RESETS.name, (reset,)), 1.0)
        if reset == "done":
            self.last_reset_log_time = log_grammar.log_time(text)
        return LineOutcome.MATCHED

    def _rule_lines(self, raw: bytes, text: str) -> LineOutcome:
        """The user rules: MATCHED if any used the line, else MALFORMED if one refused it."""
        result = LineOutcome.NOTHING
        for r in self.rules:
            if r.needles and not any(n in raw for n in r.needles):
                continue
            try:
                updates = rule_updates(r, text, self.model_name)
            except Malformed:
                if result is LineOutcome.NOTHING:
                    result = LineOutcome.MALFORMED
                continue
            if updates is None:
                continue
            for u in updates:
                k = SeriesKey(u.metric, u.labels)
                if u.kind == "counter":
                    self._add(k, u.value)
                else:
                    self.gauges[k] = u.value
            result = LineOutcome.MATCHED
        return result

    def _add(self, k: SeriesKey, value: float) -> None:
        self.counters[k] = self.counters.get(k, 0.0) + value
        self.changed_counters[k] = None

    def _apply_stats(self, s: log_grammar.StatsLine) -> None:
        k = log_grammar.LOG_KINDS.get(s.kind)
        if k is not None and (k.decisive or not self.kind):
            self.kind = k.stream
        self.min_version = log_grammar.newer(self.min_version, s.min_version)
        # The newest line of each layout per engine; normalise/log_updates.py maps it onto catalog series.
        self.stats[(s.engine, s.kind)] = s
        if s.prompt_throughput is not None:
            self._estimate(s)

    def _estimate(self, s: log_grammar.StatsLine) -> None:
        """ESTIMATED prompt tokens: throughput x the interval since the engine's previous stats line.

        vLLM's throughput is tokens since its previous log call / the time since then, so
        the product is that interval's tokens, up to rounding and the log's 1 s time
        resolution. The interval is capped at the median of the recent gaps (and at
        stats_interval): vLLM logs idle intervals at DEBUG, so a long gap between two
        visible lines still covers one logging interval of throughput. After a vLLM
        restart (the API server's pid changed) the gap means nothing: the cap is used.
        """
        key = SeriesKey(C.PROMPT_TOKENS_ESTIMATED.name, (self.model_name, s.engine))
        self.counters.setdefault(key, 0.0)
        self.changed_counters[key] = None      # a stats line: the engine is alive
        if s.timestamp is None or s.prompt_throughput is None:
            return
        prev = self.engine_last.get(s.engine)
        gaps = list(prev.gaps) if prev is not None else []
        self.engine_last[s.engine] = EngineLast(s.timestamp, s.pid, gaps)
        if prev is None:
            return
        restarted = bool(s.pid and prev.pid and s.pid != prev.pid)
        if restarted:
            self.vllm_restarts += 1
        gap = s.timestamp - prev.time
        if gap < -_YEAR / 2:          # the log has no year: Dec 31 -> Jan 1
            gap += _YEAR
        interval = s.interval or self.stats_interval     # the Rust frontend logs every 10 s whatever is set
        cap = min(interval, sorted(gaps)[len(gaps) // 2]) if gaps else interval
        if restarted:
            gap = cap
        elif gap > 0:
            gaps.append(gap)
            del gaps[:-RECENT_GAPS]
        if gap > 0:
            self.counters[key] += s.prompt_throughput * min(gap, cap)


def _all_lines(block: bytes) -> Iterator[tuple[int, int]]:
    s = 0
    n = len(block)
    while s < n:
        e = block.find(b"\n", s)
        if e < 0:
            e = n
        yield s, e
        s = e + 1
