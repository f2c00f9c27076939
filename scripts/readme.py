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
from cachemon.normalise import eras
from cachemon.runtime.attribution import cause_table

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


BLOCKS: dict[str, Callable[[], str]] = {"metrics-table": catalog.markdown_table, "era-table": era_table,
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
