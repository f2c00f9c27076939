"""`cachemon fingerprint` on the real fixture tokenizer, and constructed edits of it."""
from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from cachemon.analyze.tokenize import TokenizerDirError
from cachemon.cli import main
from cachemon.sources.fingerprint import fingerprint_dir
from helpers import REAL_032

MODEL = REAL_032 / "model"


@pytest.fixture
def copy(tmp_path):
    d = tmp_path / "m"
    shutil.copytree(MODEL, d)
    return d


def test_stable_and_short():
    a, b = fingerprint_dir(MODEL), fingerprint_dir(str(MODEL))
    assert a == b
    assert len(a["tokenizer"]) == 12 and int(a["tokenizer"], 16) >= 0
    assert len(a["chat_template"]) == 12 and a["chat_template"] != a["tokenizer"]


def test_reformatted_json_keeps_the_hash(copy):
    tj = copy / "tokenizer.json"
    tj.write_text(json.dumps(json.loads(tj.read_text()), indent=None, sort_keys=True))
    assert fingerprint_dir(copy) == fingerprint_dir(MODEL)


def test_tokenizer_and_template_change_separately(copy):
    base = fingerprint_dir(MODEL)
    tj = copy / "tokenizer.json"
    data = json.loads(tj.read_text())
    data["model"]["merges"] = data["model"]["merges"][:-1]          # constructed: drop one merge
    tj.write_text(json.dumps(data))
    fp = fingerprint_dir(copy)
    assert fp["tokenizer"] != base["tokenizer"] and fp["chat_template"] == base["chat_template"]
    assert fp["parts"]["merges"] != base["parts"]["merges"] and fp["parts"]["vocab"] == base["parts"]["vocab"]
    (copy / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    fp2 = fingerprint_dir(copy)
    assert fp2["tokenizer"] == fp["tokenizer"] and fp2["chat_template"] != base["chat_template"]


def test_special_tokens_count(copy):
    cfg = copy / "tokenizer_config.json"
    d = json.loads(cfg.read_text())
    d["bos_token"] = "<|system|>"
    cfg.write_text(json.dumps(d))
    assert fingerprint_dir(copy)["tokenizer"] != fingerprint_dir(MODEL)["tokenizer"]


def test_no_template_is_empty_and_template_from_config(copy):
    tmpl = (copy / "chat_template.jinja").read_text()
    (copy / "chat_template.jinja").unlink()
    assert fingerprint_dir(copy)["chat_template"] == ""
    cfg = copy / "tokenizer_config.json"
    d = json.loads(cfg.read_text())
    d["chat_template"] = tmpl
    cfg.write_text(json.dumps(d))
    assert fingerprint_dir(copy)["chat_template"] == fingerprint_dir(MODEL)["chat_template"]


def test_bad_dirs(tmp_path):
    with pytest.raises(TokenizerDirError):
        fingerprint_dir(tmp_path / "nope")
    with pytest.raises(TokenizerDirError):
        fingerprint_dir(tmp_path)
    (tmp_path / "tokenizer.json").write_text("[]")
    with pytest.raises(TokenizerDirError):
        fingerprint_dir(tmp_path)
    r = CliRunner().invoke(main, ["fingerprint", "--tokenizer", str(tmp_path)])
    assert r.exit_code == 2 and "Traceback" not in r.output


def test_cli_prints_hashes():
    r = CliRunner().invoke(main, ["fingerprint", "--tokenizer", str(MODEL), "--format", "json"])
    assert r.exit_code == 0
    d = json.loads(r.output)
    fp = fingerprint_dir(MODEL)
    assert (d["tokenizer"], d["chat_template"]) == (fp["tokenizer"], fp["chat_template"])
    text = CliRunner().invoke(main, ["fingerprint", "--tokenizer", str(MODEL)]).output
    assert fp["tokenizer"] in text and fp["chat_template"] in text


def test_compare_identical_and_changed(copy):
    same = CliRunner().invoke(main, ["fingerprint", "--compare", str(MODEL), str(copy)])
    assert same.exit_code == 0 and "0 tokenise differently" in same.output
    # constructed change: the template emits a space after each role marker
    (copy / "chat_template.jinja").write_text(
        (MODEL / "chat_template.jinja").read_text().replace("|>{{ m['content'] }}", "|> {{ m['content'] }}"))
    prompts = str(REAL_032 / "requests-static-system-prompt.jsonl")
    r = CliRunner().invoke(main, ["fingerprint", "--compare", str(MODEL), str(copy), "--prompts", prompts,
                                  "--format", "json"])
    assert r.exit_code == 1
    d = json.loads(r.output)
    assert d["changed_parts"] == ["chat_template"] and d["differing"] == 16
    # "<|system|>" is token 0 in both; the inserted space changes token 1
    assert {row["first_difference"] for row in d["rows"]} == {1}
