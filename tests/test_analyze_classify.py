"""Classification of the varying segment on constructed request files (labelled
constructed in tests/fixtures/analyze/README.md), tokenised with the real fixture
tokenizer."""
from __future__ import annotations

import json
import shutil

import pytest

from cachemon.analyze.divergence import ID, REORDERED
from cachemon.analyze.pipeline import analyze
from cachemon.analyze.tokenize import ByteTokenizer, ModelTokenizer
from helpers import FIXTURES, REAL_032

CONSTRUCTED = FIXTURES / "analyze"


@pytest.fixture(scope="module")
def tools_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("tools-model")
    shutil.copy(REAL_032 / "model" / "tokenizer.json", d / "tokenizer.json")
    shutil.copy(CONSTRUCTED / "tools_chat_template.jinja", d / "chat_template.jinja")
    return ModelTokenizer(d)


def test_uuid_head():
    path = CONSTRUCTED / "constructed-uuid-head.jsonl"
    res = analyze(str(path), ModelTokenizer(REAL_032 / "model"), block_size=16)
    top = res.causes[0]
    assert top.klass == ID and top.location == "system[0]" and top.pattern == "Session <id>"
    assert top.requests == 11
    first = json.loads(path.read_text().splitlines()[1])["messages"][0]["content"]
    a, b = top.char_span
    assert first[a:b] == top.samples[0] and len(top.samples[0]) == 36
    assert res.total_cached == 0                  # the UUID sits in block 0: nothing hits
    after = {w.fix.kind: w.hit_ratio_after for w in res.what_ifs[0]}
    assert after["move"] > 0.8 and after["constant"] > 0.8


def test_reordered_tools(tools_model):
    res = analyze(str(CONSTRUCTED / "constructed-reordered-tools.jsonl"), tools_model, block_size=16)
    top = res.causes[0]
    assert top.klass == REORDERED and top.location == "tools"
    (fix,) = res.what_ifs[0]
    assert fix.fix.kind == "sort"
    assert fix.hit_ratio_after > fix.hit_ratio_before + 0.5


def test_approximate_mode_finds_the_same_cause():
    res = analyze(str(CONSTRUCTED / "constructed-uuid-head.jsonl"), ByteTokenizer(), block_size=16)
    assert res.approximate and res.causes[0].klass == ID and res.causes[0].pattern == "Session <id>"


def test_no_cause_for_static_prompt():
    res = analyze(str(REAL_032 / "requests-static-system-prompt.jsonl"), ModelTokenizer(REAL_032 / "model"),
                  block_size=128)
    assert res.causes == []                       # the varying question sits after the stable part


def test_completion_prompts_with_interleaved_traffic(tmp_path):
    # Constructed: completions whose prompt starts with a varying hex ID, interleaved with
    # unrelated token-id prompts (so the most recent request is often not the right reference).
    rng = __import__("random").Random(3)
    tail = [rng.randrange(800) for _ in range(300)]
    lines = []
    for i in range(6):
        lines.append(json.dumps({"prompt": [i, i + 1] + tail}))
        lines.append(json.dumps({"prompt": f"Request {i:08x}abcdef: " + "hello world " * 40}))
    p = tmp_path / "completions.jsonl"
    p.write_text("\n".join(lines) + "\n")
    res = analyze(str(p), ModelTokenizer(REAL_032 / "model"), block_size=16)
    by_class = {c.klass: c for c in res.causes}
    rid = by_class[ID]
    assert rid.location == "prompt" and rid.pattern == "Request <id>" and rid.requests == 5
    assert by_class["other"].requests == 5          # the token-id prompts differ in their first ids
    rank = res.causes.index(rid)
    assert all(w.hit_ratio_after > w.hit_ratio_before for w in res.what_ifs[rank])


def test_reordered_lines_in_a_message(tmp_path):
    # Constructed: a system prompt listing the same 8 rules in a different order each time.
    rng = __import__("random").Random(9)
    rules = [f"Rule {n}: always answer about topic {c} politely and with sources." for n, c in enumerate("ABCDEFGH", 1)]
    p = tmp_path / "rules.jsonl"
    with p.open("w") as f:
        for i in range(8):
            r = rules[:]
            rng.shuffle(r)
            f.write(json.dumps({"messages": [{"role": "system", "content": "\n".join(r)},
                                             {"role": "user", "content": f"question {i}"}]}) + "\n")
    res = analyze(str(p), ModelTokenizer(REAL_032 / "model"), block_size=16)
    top = res.causes[0]
    assert top.klass == REORDERED and top.location == "system[0]"
    (w,) = res.what_ifs[0]
    assert w.fix.kind == "sort" and w.hit_ratio_after > 0.7 > w.hit_ratio_before
