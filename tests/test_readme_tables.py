"""The docs' metric, era and cause tables are generated from catalog/ / eras.py / attribution.py
and must not go stale, wherever they live (README.md or docs/*.md)."""
import sys
from pathlib import Path

from cachemon import catalog

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import readme  # noqa: E402  (scripts/readme.py: a development tool, not in the package)

METRICS_DOC = readme.README.parent / "docs" / "metrics.md"


def test_readme_tables_are_current():
    assert readme.main(["--check"]) == 0, "run: python scripts/readme.py --write"


def test_every_generated_table_lives_in_exactly_one_checked_file():
    files = readme.marked_files()
    assert readme.BLOCKS and files
    for name in readme.BLOCKS:
        holders = [p for p in files if f"<!-- {name}:start -->" in p.read_text(encoding="utf-8")]
        assert len(holders) == 1, (name, holders)


def test_stale_tables_in_a_docs_page_are_found(tmp_path, monkeypatch):
    # constructed: a copy of the tree's README and metrics page, the metrics table emptied
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(readme.README.read_text(encoding="utf-8"), encoding="utf-8")
    text = METRICS_DOC.read_text(encoding="utf-8")
    start, end = "<!-- metrics-table:start -->\n", "<!-- metrics-table:end -->"
    emptied = text[:text.index(start) + len(start)] + text[text.index(end):]
    (tmp_path / "docs" / "metrics.md").write_text(emptied, encoding="utf-8")
    monkeypatch.setattr(readme, "README", tmp_path / "README.md")
    assert readme.main(["--check"]) == 1
    assert readme.main(["--write"]) == 0
    assert (tmp_path / "docs" / "metrics.md").read_text(encoding="utf-8") == text


def test_every_metric_is_documented_in_the_metrics_page():
    text = METRICS_DOC.read_text()
    assert catalog.ALL
    for spec in catalog.ALL:
        assert f"`{spec.sample_name}`" in text


def test_exported_names_follow_prometheus_conventions():
    assert catalog.ALL
    for spec in catalog.ALL:
        assert ":" not in spec.name and spec.name.startswith("cachemon_")
        assert not spec.name.endswith("_total"), "counters are named without _total; it is added on exposition"
        if spec.unit == "ratio":
            assert spec.name.endswith("_ratio") or spec.name.endswith("_factor")
        if spec.unit == "seconds":
            assert spec.name.endswith("_seconds")
        assert spec.help.endswith(".") or spec.help.endswith(")")
