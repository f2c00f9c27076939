"""Keep the docs' generated tables (metrics, eras, causes) in sync with the code.

A development tool, not part of the package: `python scripts/readme.py --write` (`make monitoring`)
rewrites the marked blocks in every markdown file that holds one
(README.md and docs/*.md); `--check` (used by tests/test_readme_tables.py) exits 1 when they are
stale. It imports the cachemon it finds (the checkout's, with PYTHONPATH=src or an editable install).
"""
from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

from cachemon import catalog
from cachemon.judge.attribute import cause_table
from cachemon.normalise import eras, kv_decode, log_grammar

README = Path(__file__).resolve().parents[1] / "README.md"


def era_table() -> str:
    rows = ["| era | vLLM | detected by | unit | counters read | note |", "|---|---|---|---|---|---|"]
    for e in eras.ERAS + (eras.NO_PREFIX_CACHE_METRICS,):
        counters = ", ".join(f"`vllm:{s}`" for s in (e.queries, e.hits) if s) or \
            ", ".join(f"`vllm:{s}` (ratio)" for s, _ in e.ratio_gauges) or "-"
        detect = f"`vllm:{e.detect}`" + (f" with HELP containing \"{e.help_contains}\"" if e.help_contains else "") \
            if e.detect else "nothing matched"
        rows.append(f"| `{e.name}` | {e.versions} | {detect} | {e.unit} | {counters} | {e.note} |")
    return "\n".join(rows)


FIXTURES = README.parent / "tests" / "fixtures"


def _proof(evidence: str) -> str:
    """'real: FIXTURE' when the named capture is in tests/fixtures, else 'constructed' (with what)."""
    if evidence.startswith("constructed"):
        return evidence
    real = [e.strip() for e in evidence.split(",") if (FIXTURES / e.strip().split("/")[0]).is_dir()]
    return ("real: " + ", ".join(f"`{e}`" for e in real)) if real else f"constructed (no capture of {evidence} yet)"


def _kv_proof(era: kv_decode.KvEra) -> str:
    """A KV-event wire era is proven on a real capture when tests/fixtures holds vllm-X-*kv-events for a
    release X it covers."""
    caps = sorted(p.name for p in FIXTURES.glob("vllm-*kv-events*")
                  if _in(p.name.split("-")[1], era.first, era.last))
    return ("real: " + ", ".join(f"`{c}`" for c in caps)) if caps else "constructed (payloads built from its schema)"


def _vkey(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def _in(v: str, first: str, last: str) -> bool:
    return _vkey(first) <= _vkey(v) <= _vkey(last)


def metrics_table(specs: tuple[catalog.MetricSpec, ...] | None = None) -> str:
    """docs/metrics.md table: name, type, unit, labels, meaning, source."""
    rows = ["| metric | type | unit | labels | meaning | source |", "|---|---|---|---|---|---|"]
    for s in specs or catalog.ALL:
        kind = f"{s.type} (convenience)" if s in catalog.CONVENIENCE else s.type
        rows.append(
            f"| `{s.sample_name}` | {kind} | {s.unit or '-'} | {', '.join(f'`{label}`' for label in s.labels)} "
            f"| {s.help} | {s.source} |"
        )
    return "\n".join(rows)


def proof_table() -> str:
    """One row per frontend and per wire era (metrics, log grammar, KV events): proven on a real capture
    (which fixture) or resting on constructed data."""
    rows = ["| kind | era | vLLM | how cachemon reads it | proven on |", "|---|---|---|---|---|"]
    for f in eras.FRONTENDS:
        rows.append(f"| frontend | `{f.name}` | {f.versions} | page: {f.page_format}; restarts: {f.restart_signals}; "
                    f"block size / caching / start time: {f.config_source}; log line: `{f.log_grammar}` | "
                    f"{_proof(f.evidence)} |")
    for e in eras.ERAS + (eras.NO_PREFIX_CACHE_METRICS,):
        rows.append(f"| metrics | `{e.name}` | {e.versions} | {e.unit}: "
                    f"{', '.join(f'`vllm:{x}`' for x in (e.queries, e.hits) if x) or e.note} | {_proof(e.evidence)} |")
    for g in log_grammar.GRAMMARS:
        rows.append(f"| log line | `{g.kind}` | {g.versions} | written by {g.frontend}; hit rate over "
                    f"{g.hit_basis or '-'}{f'; every {g.interval:g} s' if g.interval else ''} | {_proof(g.evidence)} |")
    for f in eras.FREE_ORDERS:
        rows.append(f"| free queue | `{f.name}` | {f.versions} | `cachemon analyze` simulates: {f.rule} | "
                    f"{_proof(f.evidence)} |")
    for k in kv_decode.ERAS:
        rows.append(f"| KV events | `{k.name}` | {k.first} - {k.last} | {k.layout} events | {_kv_proof(k)} |")
    newer: dict[str, str] = {}           # rows are newest first per platform
    for b in eras.BLOCK_SIZE_DEFAULTS:
        span = f">= {b.first}" if b.first != "0" else (f"< {newer[b.platform]}" if b.platform in newer else "every release")
        newer[b.platform] = b.first
        rows.append(f"| default block size | `{b.platform}` | {span} | {b.block_size} tokens where no server "
                    f"says it: {b.source} | {_proof(b.evidence)} |")
    return "\n".join(rows)


def free_order_table() -> str:
    """docs/analyze.md: where each release puts a finished request's blocks (eras.FREE_ORDERS)."""
    rows = ["| free queue | vLLM | `BlockPool.free_blocks` | proven on |", "|---|---|---|---|"]
    rows += [f"| `{f.name}` | {f.versions} | {f.rule} | {_proof(f.evidence)} |" for f in eras.FREE_ORDERS]
    return "\n".join(rows)


def block_size_table() -> str:
    """docs/analyze.md: vLLM's default KV block size per platform and release (normalise/eras.BLOCK_SIZE_DEFAULTS)."""
    rows = ["| platform | from vLLM | default block size | read in |", "|---|---|---|---|"]
    rows += [f"| {r.platform.upper()} | {'0.8.5' if r.first == '0' else r.first} | {r.block_size} | {r.source} |"
             for r in eras.BLOCK_SIZE_DEFAULTS]
    return "\n".join(rows)


BLOCKS: dict[str, Callable[[], str]] = {"metrics-table": metrics_table, "era-table": era_table,
                                         "proof-table": proof_table, "free-order-table": free_order_table,
                                         "block-size-table": block_size_table,
                                         "cause-table": lambda: cause_table(link=False)}


def _replacement(block: str) -> Callable[[re.Match[str]], str]:
    return lambda m: m.group(1) + block + "\n" + m.group(2)


def render(text: str) -> str:
    for name, fn in BLOCKS.items():
        pattern = re.compile(rf"(<!-- {name}:start -->\n)(?:.*?\n)?(<!-- {name}:end -->)", re.S)
        # a replacement function, not a template: the block may contain backslashes
        text = pattern.sub(_replacement(fn()), text)
    return text


def marked_files() -> list[Path]:
    """README.md and every docs/*.md that holds a marked block, wherever the tables live."""
    candidates = [README, *sorted((README.parent / "docs").glob("*.md"))]
    return [p for p in candidates
            if any(f"<!-- {name}:start -->" in p.read_text(encoding="utf-8") for name in BLOCKS)]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    stale = []
    for path in marked_files():
        text = path.read_text(encoding="utf-8")
        new = render(text)
        if new == text:
            continue
        if "--write" in argv:
            path.write_text(new, encoding="utf-8")
        else:
            stale.append(path.relative_to(README.parent).as_posix())
    if stale:
        print(f"generated tables are stale in {', '.join(stale)}: run `python scripts/readme.py --write`",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
