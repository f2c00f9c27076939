"""Complete lines of one log source -> running counters, the newest stats lines, line outcomes.

Counters here are absolute totals kept by cachemon (user rules, the throughput
estimate) and persisted with the read offsets (statefile), so they never reset and
each line is counted once. The newest stats line per engine is kept as parsed;
``cachemon.normalise.logs`` turns it into catalog series, like the /metrics path.
"""
from __future__ import annotations

from collections.abc import Sequence

from cachemon import catalog as C
from cachemon.catalog import SeriesKey
from cachemon.sources.logs import vllm_lines
from cachemon.sources.logs.framing import candidates
from cachemon.sources.logs.rules import Malformed, Rule

_YEAR = 365 * 86400.0


class LogStream:
    def __init__(self, name: str, model_name: str = "", rules: Sequence[Rule] = (), builtin: bool = True,
                 stats_interval: float = 10.0):
        self.name = name
        self.model_name = model_name
        self.rules = list(rules)
        self.builtin = builtin
        self.stats_interval = stats_interval
        needles: list[bytes] = list(vllm_lines.NEEDLES) if builtin else []
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
        self.stats: dict[tuple[str, str], vllm_lines.StatsLine] = {}
        # engine -> [log time, API-server pid, recent gaps] of its last stats line
        self.engine_last: dict[str, list] = {}
        self.lines = {"parsed": 0, "unmatched": 0, "malformed": 0}
        self.stats_lines = 0
        self.kind = ""
        self.min_version = ""
        self.vllm_restarts = 0          # API-server pid changed between stats lines (check report)
        self.last_reset_log_time: float | None = None   # log time (vllm_lines.log_time) of the last reset
        self.changed = False

    # -- persistence -----------------------------------------------------------------
    def snapshot(self) -> dict:
        return {"counters": [[m, list(lab), v] for (m, lab), v in sorted(self.counters.items())],
                "engine_last": self.engine_last}

    def restore(self, d: dict) -> None:
        self.counters = {SeriesKey(str(m), tuple(str(x) for x in lab)): float(v)
                         for m, lab, v in d.get("counters", [])}
        self.changed_counters = dict.fromkeys(self.counters)
        self.engine_last = {str(k): [float(v[0]), str(v[1]), [float(g) for g in v[2]][-9:]]
                            for k, v in d.get("engine_last", {}).items()}
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
        return vllm_lines.era_of(self.kind, self.min_version)

    # -- lines -----------------------------------------------------------------------
    def feed(self, block: bytes) -> int:
        """Account for a block of complete lines; returns how many were stats lines."""
        total = block.count(b"\n")
        parsed = malformed = stats = 0
        if self.scan_all:
            spans = _all_lines(block)
        else:
            spans = candidates(block, self.needles)
        for s, e in spans:
            line = block[s:e]
            outcome = self._line(line)
            if outcome == 2:
                stats += 1
                parsed += 1
            elif outcome == 1:
                parsed += 1
            elif outcome < 0:
                malformed += 1
        self.lines["parsed"] += parsed
        self.lines["malformed"] += malformed
        self.lines["unmatched"] += total - parsed - malformed
        self.stats_lines += stats
        if parsed:
            self.changed = True
        return stats

    def _line(self, raw: bytes) -> int:
        """2 stats line, 1 rule match, 0 nothing, -1 malformed."""
        raw = raw.lstrip(b"\x00").rstrip(b"\r")
        text = raw.decode("utf-8", "replace")
        result, bad = 0, False
        if self.builtin:
            try:
                s = vllm_lines.parse(text)
            except vllm_lines.MalformedLine:
                s, bad = None, True
            if s is not None:
                self._apply_stats(s)
                result = 2
            else:
                reset = vllm_lines.reset_event(text)
                if reset is not None:
                    rk = SeriesKey(C.LOG_CACHE_RESETS.name, (reset,))
                    self.counters[rk] = self.counters.get(rk, 0.0) + 1.0
                    self.changed_counters[rk] = None
                    if reset == "done":
                        self.last_reset_log_time = vllm_lines.log_time(text)
                    result = 1
        for r in self.rules:
            if r.needles and not any(n in raw for n in r.needles):
                continue
            try:
                updates = r.apply(text, self.model_name)
            except Malformed:
                bad = True
                continue
            if updates is None:
                continue
            for kind, metric, labels, value in updates:
                k = SeriesKey(metric, labels)
                if kind == "counter":
                    self.counters[k] = self.counters.get(k, 0.0) + value
                    self.changed_counters[k] = None
                else:
                    self.gauges[k] = value
            result = max(result, 1)
        if result:
            return result
        return -1 if bad else 0

    def _apply_stats(self, s: vllm_lines.StatsLine) -> None:
        if s.kind == "v1":
            self.kind = "v1"
        elif not self.kind and s.kind.startswith("v0"):
            self.kind = "v0"
        self.min_version = vllm_lines.newer(self.min_version, s.min_version)
        # The newest line of each layout per engine; normalise/logs.py maps it onto catalog series.
        self.stats[(s.engine, s.kind)] = s
        if s.kind in ("v1", "v0"):
            self._estimate(s)

    def _estimate(self, s: vllm_lines.StatsLine) -> None:
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
        gaps = list(prev[2]) if prev is not None and len(prev) > 2 else []
        self.engine_last[s.engine] = [s.timestamp, s.pid, gaps]
        if prev is None:
            return
        restarted = bool(s.pid and prev[1] and s.pid != prev[1])
        if restarted:
            self.vllm_restarts += 1
        gap = s.timestamp - prev[0]
        if gap < -_YEAR / 2:          # the log has no year: Dec 31 -> Jan 1
            gap += _YEAR
        cap = min(self.stats_interval, sorted(gaps)[len(gaps) // 2]) if gaps else self.stats_interval
        if restarted:
            gap = cap
        elif gap > 0:
            gaps.append(gap)
            del gaps[:-9]
        if gap > 0:
            self.counters[key] += s.prompt_throughput * min(gap, cap)


def _all_lines(block: bytes):
    s = 0
    n = len(block)
    while s < n:
        e = block.find(b"\n", s)
        if e < 0:
            e = n
        yield s, e
        s = e + 1
