"""A selective parser for the Prometheus text exposition format (0.0.4).

vLLM's /metrics page is ~50 KB, mostly histogram buckets cachemon never reads.
Instead of building every family (``prometheus_client.parser`` costs 10-40 us per
sample), we look at each line's metric name and only parse the samples whose
*stem* (name without the ``vllm:`` / ``vllm_`` / ``ray_vllm:`` / ``ray_vllm_`` prefix)
is wanted. The wanted stems come from the era table, so the parser stays generic.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from cachemon.sources.wire_label import MAX_LABEL_CHARS, wire_label

_LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_ESCAPE_RE = re.compile(r'\\[\\"n]')
# A whole label list: name="value" pairs, commas between, one trailing comma allowed.
_LABEL_PAIR = r'[a-zA-Z_][a-zA-Z0-9_]*\s*=\s*"(?:[^"\\]|\\.)*"'
_LABEL_LIST_RE = re.compile(r"\s*(?:" + _LABEL_PAIR + r"\s*(?:,\s*" + _LABEL_PAIR + r"\s*)*(?:,\s*)?)?")


class ExpositionError(ValueError):
    """The body is not a (complete) Prometheus text exposition."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass
class Exposition:
    """The wanted part of one /metrics page."""

    # stem -> list of (labels dict, value)
    samples: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)
    # stem -> HELP text (only for stems asked for)
    help: dict[str, str] = field(default_factory=dict)
    # unprefixed process metrics that reveal restarts
    process_start_time: float | None = None
    # which naming prefix the page used (vllm:, vllm_, ray_vllm:, ...), for the info metric
    prefix: str | None = None
    # wanted samples whose label values were rewritten (non-printable characters, or too long: wire_label)
    rewritten_labels: int = 0


class LabelBudget:
    """How many (model_name, engine) label sets one page may cost (unbounded, a 13 MB page of
    100 000 label sets took 5.5 s and 440 MB a poll). Samples of label sets in ``keep`` (admitted
    on earlier polls) are always read; other label sets are read until ``limit`` distinct ones
    have been, after which their samples are skipped without parsing their labels, and counted
    in ``skipped``. The state refuses label sets past its cardinality guard anyway: reading a
    few more than it can keep only serves to count them."""

    def __init__(self, limit: int, keep: frozenset[tuple[str, str]] | set[tuple[str, str]] = frozenset()):
        self.limit = limit
        self.keep = keep
        self.skipped = 0
        self.read: set[tuple[str, str]] = set()     # label sets read on this page
        self.keep_models = frozenset(m for m, _ in keep)


# Check the deadline every this many wanted samples (a clock read costs ~50 ns; a sample ~2 us).
_DEADLINE_EVERY = 2048


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return _ESCAPE_RE.sub(lambda m: _ESCAPES[m.group(0)], value)


_label_cache: dict[str, dict[str, str]] = {}
_rewritten: set[str] = set()     # label texts of _label_cache whose values wire_label rewrote


def parse_labels(text: str) -> dict[str, str]:
    """Label set of one sample. Polls see the same label strings again and again, so
    parsed sets are memoised (bounded); callers must treat the dict as read-only.
    Only ever called with label texts ``_REST_RE`` accepted: ``_split_rest`` relies on it."""
    labels = _label_cache.get(text)
    if labels is None:
        if _LABEL_LIST_RE.fullmatch(text) is None:
            # findall alone would read `eng:ne="0"` as ne="0": a label set that is not what the
            # page says must be an error, never another series
            raise ExpositionError("parse", f"malformed label set {{{text[:80]}}}")
        if len(_label_cache) >= 4096:
            _label_cache.clear()
            _rewritten.clear()
        labels = {k: _unescape(v) for k, v in _LABEL_RE.findall(text)}
        # a value exported as a label (model_name, ...) must be printable and bounded (wire_label.py)
        if not all(len(v) <= MAX_LABEL_CHARS and v.isprintable() for v in labels.values()):
            safe = {k: wire_label(v) for k, v in labels.items()}
            if safe != labels:
                labels = safe
                _rewritten.add(text)
        _label_cache[text] = labels
    return labels


_rest_cache: dict[str, tuple[str | None, str]] = {}


def _split_rest(rest: str) -> tuple[str | None, str] | None:
    """(label text or None, value text) of a sample line after its name, or None when
    the line is malformed: exactly what ``_REST_RE`` reads, but cheaper on repeat polls.

    A line seen before verbatim (``_created`` timestamps, config info, idle gauges) is
    looked up; for a line whose label text was read before (so it has no unquoted ``}``:
    its closing brace is the first one the regex would stop at, i.e. the last ``}``
    before the value) only the value part is matched. Label texts with escapes or
    ``}`` in values take the same path once they are known."""
    cached = _rest_cache.get(rest)
    if cached is not None:
        return cached
    got: tuple[str | None, str]
    j = rest.rfind("}")
    if j > 0 and rest[0] == "{" and rest[1:j] in _label_cache:
        m = _TAIL_RE.match(rest, j + 1)
        if m is None:
            return None
        got = (rest[1:j], m.group(1))
    else:
        m = _REST_RE.match(rest)
        if m is None:
            return None
        got = (m.group(1), m.group(2))
    if len(_rest_cache) >= 4096:
        _rest_cache.clear()
    _rest_cache[rest] = got
    return got


# The text inside a sample's braces: anything but `"` and `}`, or a quoted value in which
# `}`, `,` and escaped quotes are plain text (unrolled so the engine never backtracks).
_LABELS = r'[^"}]*(?:"(?:[^"\\]|\\.)*"[^"}]*)*'
# A wanted sample: the regex only finds the line (name, then `{` or a blank); the rest
# of the line is checked strictly, so a line it cannot read is an error, never a skip.
_SAMPLE_TEMPLATE = r"\n(?:ray_)?vllm[:_](%s)(?=[{ \t])([^\n]*)"
_TAIL = r"[ \t]+([^ \t]+)(?:[ \t]+[^ \t#][^ \t]*)?(?:[ \t]+#.*)?[ \t]*\Z"
_REST_RE = re.compile(r"(?:\{(" + _LABELS + r")\})?" + _TAIL)
_TAIL_RE = re.compile(_TAIL)
_HELP_TEMPLATE = r"\n# HELP (?:ray_)?vllm[:_](%s) ([^\n]*)"
_PREFIX_RE = re.compile(r"\n(ray_vllm[:_]|vllm[:_])")
# A line that is neither a comment, a blank line nor starts like a sample (a metric
# name, then `{`, or blanks and what can start a number): plain text, not an exposition.
# vLLM's own lines, most of the page, pass on their prefix (cheap: the wanted ones are
# read strictly anyway).
_NOT_A_LINE_RE = re.compile(r"\n(?![#\n]|(?:ray_)?vllm[:_]|[a-zA-Z_:][a-zA-Z0-9_:]*(?:\{|[ \t]+[-+0-9.NIni])|[ \t]*(?:\n|\Z))")
# The first sample line must be a whole one (a README's first line may pass the check above).
_FIRST_SAMPLE_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*" + _REST_RE.pattern)
_compiled: dict[tuple[frozenset[str], frozenset[str]], tuple[re.Pattern[str], re.Pattern[str] | None]] = {}


_Trie = dict[str, "_Trie"]


def _alternation(names: set[str] | frozenset[str]) -> str:
    """A regex matching exactly one of ``names``, factored as a trie: the engine tries
    alternatives one by one, so a flat ``a|b|c`` of 29 stems costs 29 attempts on each of
    the page's ~400 vLLM lines, while the trie rejects a name on its first characters."""
    trie: _Trie = {}
    for name in names:
        node = trie
        for ch in name:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: _Trie) -> str:
        ends = "" in node
        branches = [re.escape(ch) + emit(child) for ch, child in sorted(node.items()) if ch]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        if ends:
            # A name ending here may also be the prefix of a longer one: the longer
            # alternative comes first and the lookahead after the group decides.
            return "(?:" + body + ")?"
        return body

    return emit(trie)


def _patterns(wanted: frozenset[str], help_wanted: frozenset[str]) -> tuple[re.Pattern[str], re.Pattern[str] | None]:
    """One regex per wanted set: its leading literal newline lets the regex engine
    skip straight from line to line, and the alternation rejects unwanted names
    (histogram buckets, most of the page) after a few characters."""
    key = (wanted, help_wanted)
    pats = _compiled.get(key)
    if pats is None:
        alt = _alternation(wanted)
        sample = re.compile(_SAMPLE_TEMPLATE % alt)
        helps = None
        if help_wanted:
            names = set(help_wanted) | {h[: -len("_total")] for h in help_wanted if h.endswith("_total")}
            halt = _alternation(names)
            helps = re.compile(_HELP_TEMPLATE % halt)
        pats = _compiled[key] = (sample, helps)
    return pats


_kept_compiled: dict[frozenset[str], re.Pattern[str] | None] = {}


def _kept_pattern(models: frozenset[str]) -> re.Pattern[str] | None:
    """A regex finding ``model_name="<one of models>"`` (escaped as the exposition escapes label
    values) anywhere in the page, or None when a model_name-less label set is kept. Its literal
    head lets the regex engine skip from occurrence to occurrence: ~20 ms over 13 MB, where a
    per-line regex costs ~0.5 s. vLLM's client library writes labels as ``name="value"``; a page
    spacing them otherwise past the budget only has those lines counted as skipped."""
    if "" in models:
        return None
    if models not in _kept_compiled:
        if len(_kept_compiled) >= 16:
            _kept_compiled.clear()
        # as a trie: a flat alternation of 512 names costs 512 attempts at every occurrence
        names = _alternation({m.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
                              for m in models}) if models else "(?!)"
        _kept_compiled[models] = re.compile('model_name="(?:' + names + ')"')
    return _kept_compiled[models]


def _check_is_exposition(text: str) -> None:
    """Plain text served with HTTP 200 (``OK``, a README, a login page) is not a page with
    no vLLM metric on it: it must not count as an exposition (``up`` 1, era none).

    Every line is checked only on a page without ``# TYPE`` lines: a client library's page
    (vLLM's) always has them and prose never does, and the scan costs as much as the
    parse itself. The first sample line is checked whole on every page, and the wanted
    samples are read strictly anyway."""
    bad = None if "\n# TYPE " in text else _NOT_A_LINE_RE.search(text)
    if bad is not None:
        line = text[bad.end():text.find("\n", bad.end())]
        raise ExpositionError("not_exposition", f"not an exposition line: {line[:40]!r}")
    i = 0
    while text.startswith("\n#", i) or text.startswith("\n\n", i):
        i = text.find("\n", i + 1)
    end = text.find("\n", i + 1)
    first = text[i + 1:end].strip()
    m = _FIRST_SAMPLE_RE.match(first)
    # "Hello world" has a sample's shape; a bad value on a line that looks like a metric
    # (labels, or `_` / `:` in its name: never in prose) is a parse error of that sample.
    if not first or m is None or not (is_float(m.group(2)) or m.group(1) is not None
                                      or "_" in first.split()[0] or ":" in first.split()[0]):
        raise ExpositionError("not_exposition",
                              "no sample line (NAME[{LABELS}] VALUE)" if not first else
                              f"not an exposition line: {first[:40]!r}")


def is_float(value: str) -> bool:
    """Python's float() accepts it (also NaN, Inf and +Inf, as the exposition format does)."""
    try:
        float(value)
    except ValueError:
        return False
    return True


def _page_text(body: str) -> str:
    """The body as ``"\n" + complete lines``, after the checks that it is a whole exposition."""
    start = body[:256].lstrip()
    if not start:
        if not body.strip():
            raise ExpositionError("not_exposition", "empty body")
        start = body.lstrip()
    if "\x00" in body:
        raise ExpositionError("not_exposition", "body contains NUL bytes")
    head = start[:1]
    if not (head == "#" or head.isalpha() or head in "_:"):
        raise ExpositionError("not_exposition", f"body does not start like an exposition (starts with {start[:20]!r})")
    # OpenMetrics ends with "# EOF", the final newline being optional there
    cut = not body.endswith("\n") and not body.endswith("\n# EOF")
    # plain text ("OK") is told apart from a page cut off mid-line by its complete lines
    text = "\n" + (body[:body.rfind("\n") + 1] if cut else body if body.endswith("\n") else body + "\n")
    _check_is_exposition(text)
    if cut:
        raise ExpositionError("truncated", "body does not end with a newline: the exposition was cut off")
    return text


class _SampleReader:
    """The wanted samples of one page, within the label-set budget and the deadline."""

    def __init__(self, text: str, sample_re: re.Pattern[str], budget: LabelBudget | None, deadline: float | None):
        self.text = text
        self.sample_re = sample_re
        self.budget = budget
        self.deadline = deadline
        self.samples: dict[str, list[tuple[dict[str, str], float]]] = {}
        # Label texts known to belong to a label set read (or kept) on this page, and ones known not to:
        # past the budget a sample whose label text is in neither is skipped unparsed.
        self.texts_in: set[str] = set()
        self.texts_out: set[str] = set()
        self.rewritten = 0

    def read(self, stem: str, rest: str) -> bool:
        """Parse one wanted sample into ``samples``; False when the budget refuses its label set."""
        split = _split_rest(rest)
        if split is None:
            raise ExpositionError("parse", f"malformed sample line for {stem}: {rest[:60]!r}")
        labels, value = split
        try:
            v = float(value)
        except ValueError:
            raise ExpositionError("parse", f"bad sample value {value[:40]!r} for {stem}") from None
        lab = parse_labels(labels) if labels else {}
        if _rewritten and labels in _rewritten:
            self.rewritten += 1
        if self.budget is not None and labels is not None and labels not in self.texts_in \
                and not self._admit(labels, lab, self.budget):
            return False
        self.samples.setdefault(stem, []).append((lab, v))
        return True

    def _admit(self, labels: str, lab: dict[str, str], budget: LabelBudget) -> bool:
        if labels in self.texts_out:
            return False
        ident = (lab.get("model_name", ""), lab.get("engine", ""))
        if ident in budget.read or ident in budget.keep or len(budget.read) < budget.limit:
            budget.read.add(ident)
        else:
            self.texts_out.add(labels)
            return False
        self.texts_in.add(labels)
        return True

    def check_deadline(self, n: int) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise ExpositionError("timeout", f"reading the page took longer than the poll's timeout "
                                             f"({n} wanted samples read so far)")

    def read_all(self) -> None:
        n = 0
        for m in self.sample_re.finditer(self.text):
            n += 1
            if n % _DEADLINE_EVERY == 0:
                self.check_deadline(n)
            if not self.read(m.group(1), m.group(2)):
                assert self.budget is not None
                self.budget.skipped += 1
                self._read_past_budget(n, m.end(), self.budget)
                return

    def _read_past_budget(self, n: int, rest_at: int, budget: LabelBudget) -> None:
        """The budget is spent: of the rest of the page only the samples of kept models and of
        models read above are read (their label sets are checked again), found by their
        model_name (no label is parsed for the rest); every other wanted sample is counted as
        skipped."""
        text, sample_re = self.text, self.sample_re
        total = sum(1 for _ in sample_re.finditer(text, rest_at))
        self.check_deadline(n + total)
        accepted = 0
        kept_re = _kept_pattern(budget.keep_models | frozenset(m for m, _ in budget.read))
        if kept_re is not None:
            line_at = -1
            for km in kept_re.finditer(text, rest_at):
                pos = km.start()
                line = text.rfind("\n", 0, pos)
                if line == line_at or text[pos - 1] not in "{, \t":
                    continue        # the line was read, or "xmodel_name": not the label
                line_at = line
                lm = sample_re.match(text, line)
                if lm is not None and lm.end() > pos:
                    accepted += self.read(lm.group(1), lm.group(2))
        else:       # a kept label set without model_name: every line must be looked at
            for m in sample_re.finditer(text, rest_at):
                accepted += self.read(m.group(1), m.group(2))
        budget.skipped += total - accepted
        self.check_deadline(n + total)


def _process_start_time(text: str) -> float | None:
    i = text.find("\nprocess_start_time_seconds ")
    if i < 0:
        return None
    end = text.find("\n", i + 1)
    fields = text[i + 28:end].split()
    if not fields:
        return None
    try:
        return float(fields[0])
    except ValueError:
        raise ExpositionError("parse", f"bad process_start_time_seconds value {fields[0][:40]!r}") from None


def parse(body: str, wanted: frozenset[str], help_wanted: frozenset[str] = frozenset(),
          budget: LabelBudget | None = None, deadline: float | None = None) -> Exposition:
    """Parse the samples of the wanted stems.

    ``wanted`` holds full stems as exposed after the prefix, e.g.
    ``prefix_cache_hits_total`` or ``prefix_cache_hits_created``. ``help_wanted`` holds
    stems whose HELP text is needed (e.g. to tell blocks from tokens).

    Raises ExpositionError for a body that is not an exposition at all, was cut off
    (the format requires a final newline), or has a malformed wanted sample: a page
    that half-parses must never become a wrong number. ``budget`` bounds the label sets
    read (see LabelBudget); ``deadline`` (time.monotonic()) the time spent: past it the
    page is an error (reason timeout), as a transfer past the poll's timeout is.
    """
    text = _page_text(body)
    sample_re, help_re = _patterns(wanted, help_wanted)
    reader = _SampleReader(text, sample_re, budget, deadline)
    reader.read_all()
    out = Exposition(samples=reader.samples, rewritten_labels=reader.rewritten)
    samples = out.samples
    if samples:
        pm = _PREFIX_RE.search(text)
        out.prefix = pm.group(1) if pm else None
    # HELP lines are only needed to tell eras apart; skip the scan when none is on the page.
    if help_re is not None and any(h in samples for h in help_wanted):
        for name, help_text in help_re.findall(text):
            out.help[name if name.endswith("_total") else name + "_total"] = help_text
    out.process_start_time = _process_start_time(text)
    return out
