"""The README's metric and era tables are generated from catalog.py / eras.py and must not go stale."""
import sys
from pathlib import Path

from cachemon import catalog

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import readme  # noqa: E402  (scripts/readme.py: a development tool, not in the package)


def test_readme_tables_are_current():
    assert readme.main(["--check"]) == 0, "run: python scripts/readme.py --write"


def test_every_metric_is_documented_in_the_readme():
    text = readme.README.read_text()
    for spec in catalog.ALL:
        assert f"`{spec.sample_name}`" in text


def test_exported_names_follow_prometheus_conventions():
    for spec in catalog.ALL:
        assert ":" not in spec.name and spec.name.startswith("cachemon_")
        assert not spec.name.endswith("_total"), "counters are named without _total; it is added on exposition"
        if spec.unit == "ratio":
            assert spec.name.endswith("_ratio") or spec.name.endswith("_factor")
        if spec.unit == "seconds":
            assert spec.name.endswith("_seconds")
        assert spec.help.endswith(".") or spec.help.endswith(")")
