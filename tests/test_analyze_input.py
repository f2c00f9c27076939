"""Bad input: malformed lines, bad tokenizer dirs, missing files — a clear error or a
counted, visible skip with line numbers; never a crash or a silent drop."""
from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from cachemon.analyze.requests_io import Request, Skip, iter_requests, parse_line
from cachemon.cli import main
from helpers import FIXTURES, REAL_032

MALFORMED = str(FIXTURES / "analyze" / "constructed-malformed.jsonl")   # constructed, see its README
MODEL = str(REAL_032 / "model")


def test_malformed_lines_are_skipped_with_line_numbers():
    items = list(iter_requests(MALFORMED))
    assert [i.line for i in items if isinstance(i, Request)] == [1, 3, 8, 12]
    assert [i.line for i in items if isinstance(i, Skip)] == [2, 4, 5, 7, 9, 10, 11]


def test_cli_reports_skips_and_keeps_good_numbers():
    r = CliRunner().invoke(main, ["analyze", MALFORMED, "--tokenizer", MODEL, "--block-size", "128",
                                  "--format", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["skipped"]["count"] == 7
    assert [s["line"] for s in d["skipped"]["lines"]] == [2, 4, 5, 7, 9, 10, 11]
    # the 4 good lines are real requests 0-3 of the static scenario, same order: vLLM's numbers
    with open(REAL_032 / "requests-static-system-prompt.jsonl") as f:
        usage = [json.loads(next(f))["usage"] for _ in range(4)]
    assert [(x["line"], x["prompt_tokens"], x["cached_tokens"]) for x in d["per_request"]] == \
        [(ln, u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"])
         for ln, u in zip([1, 3, 8, 12], usage, strict=False)]
    text = CliRunner().invoke(main, ["analyze", MALFORMED, "--tokenizer", MODEL]).output
    assert "Skipped 7 lines" in text and "line 2: not valid JSON" in text and "line 11:" in text


def test_wrapped_and_bare_bodies_and_completions():
    wrapped = list(parse_line(json.dumps({"request": {"messages": [{"role": "user", "content": "hi"}]}}), 1))
    bare = list(parse_line(json.dumps({"messages": [{"role": "user", "content": "hi"}]}), 2))
    assert isinstance(wrapped[0], Request) and isinstance(bare[0], Request)
    many = list(parse_line(json.dumps({"prompt": ["a", "b"]}), 3))
    assert [r.prompt for r in many] == ["a", "b"]
    ids = list(parse_line(json.dumps({"prompt": [1, 2, 3], "cache_salt": "x"}), 4))
    assert ids[0].prompt_ids == [1, 2, 3] and ids[0].cache_salt == "x"
    bad = list(parse_line(json.dumps({"prompt": [1, "a"]}), 5))
    assert isinstance(bad[0], Skip)


def test_bad_tokenizer_dirs_give_clear_errors(tmp_path):
    runner = CliRunner()
    args = ["analyze", str(REAL_032 / "requests-static-system-prompt.jsonl"), "--tokenizer"]
    r = runner.invoke(main, args + [str(tmp_path / "missing")])
    assert r.exit_code == 2 and "not a directory" in r.output
    r = runner.invoke(main, args + [str(tmp_path)])
    assert r.exit_code == 2 and "no tokenizer.json" in r.output
    (tmp_path / "tokenizer.json").write_text("{ not json")
    r = runner.invoke(main, args + [str(tmp_path)])
    assert r.exit_code == 2 and "cannot load tokenizer.json" in r.output
    assert "Traceback" not in r.output


def test_missing_chat_template_skips_chat_requests_visibly(tmp_path):
    shutil.copy(REAL_032 / "model" / "tokenizer.json", tmp_path / "tokenizer.json")
    r = CliRunner().invoke(main, ["analyze", str(REAL_032 / "requests-static-system-prompt.jsonl"),
                                  "--tokenizer", str(tmp_path), "--format", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["requests"] == 0 and d["skipped"]["count"] == 16
    assert "no chat template" in d["skipped"]["lines"][0]["reason"]


def test_template_that_raises_is_a_skip(tmp_path):
    shutil.copy(REAL_032 / "model" / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "chat_template.jinja").write_text(
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first message must be user') }}{% endif %}"
        "{% for m in messages %}{{ m['content'] }}{% endfor %}")
    src = tmp_path / "reqs.jsonl"
    src.write_text(json.dumps({"messages": [{"role": "system", "content": "s"}]}) + "\n"
                   + json.dumps({"messages": [{"role": "user", "content": "hello there"}]}) + "\n")
    d = json.loads(CliRunner().invoke(main, ["analyze", str(src), "--tokenizer", str(tmp_path),
                                             "--format", "json"]).output)
    assert d["requests"] == 1
    assert d["skipped"]["lines"] == [{"line": 1, "reason": "first message must be user"}]


def test_missing_requests_file():
    r = CliRunner().invoke(main, ["analyze", "/nonexistent/requests.jsonl"])
    assert r.exit_code == 2 and "cannot read" in r.output


def test_segment_cache_equals_full_encode_on_real_prompts():
    # The per-segment cache must give the ids a full encode gives, on every real prompt
    # and on constructed edge cases (labelled: made-up texts around the added tokens).
    from cachemon.analyze.tokenize import ModelTokenizer
    tok = ModelTokenizer(MODEL)
    seg = tok.segments
    assert seg is not None and seg.enabled
    texts = []
    for name in ("static-system-prompt", "timestamp-in-system-prompt", "request-id-at-head"):
        for item in iter_requests(str(REAL_032 / f"requests-{name}.jsonl")):
            texts.append(tok.renderer.render(item)[0])
    texts += ["<|user|><|user|>", " <|system|> x", "<|assist<|user|>ant|>", "Grüße\n\n<|user|>  \t", "", "<s></s>"]
    got = seg.encode_batch(texts)
    full = [e.ids for e in tok.tok.encode_batch(texts, add_special_tokens=False)]
    assert got == full
    assert seg.encode_batch(texts) == full      # second time from the cache


def test_segment_cache_turns_itself_off_on_mismatch():
    from cachemon.analyze.tokenize import ModelTokenizer
    seg = ModelTokenizer(MODEL).segments
    seg.check([[1, 2]], [[1, 2]])
    assert seg.enabled
    seg.check([[1, 2]], [[1, 3]])
    assert not seg.enabled


def _run_blocked(code: str):
    # A fresh interpreter where importing tokenizers / jinja2 fails, as without the extra.
    import subprocess
    import sys
    prelude = ("import sys\n"
               "class _Block:\n"
               "    def find_spec(self, name, path=None, target=None):\n"
               "        if name.split('.')[0] in ('tokenizers', 'jinja2'):\n"
               "            raise ImportError('blocked: ' + name)\n"
               "sys.meta_path.insert(0, _Block())\n")
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_without_the_extra_exact_mode_says_how_to_install():
    code = ("from click.testing import CliRunner\nfrom cachemon.cli import main\n"
            f"r = CliRunner().invoke(main, ['analyze', {str(REAL_032 / 'requests-static-system-prompt.jsonl')!r}, "
            f"'--tokenizer', {MODEL!r}])\nprint(r.exit_code); print(r.output)")
    p = _run_blocked(code)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("2") and ".venv/bin/pip install -e '.[analyze]'" in p.stdout


@pytest.mark.slow
def test_without_the_extra_approximate_mode_and_fingerprint_work():
    code = ("from click.testing import CliRunner\nfrom cachemon.cli import main\nimport sys, json\n"
            f"r = CliRunner().invoke(main, ['analyze', {str(REAL_032 / 'requests-timestamp-in-system-prompt.jsonl')!r}, "
            "'--format', 'json'])\n"
            "d = json.loads(r.output); print(d['mode'], d['causes'][0]['class'])\n"
            f"r = CliRunner().invoke(main, ['fingerprint', '--tokenizer', {MODEL!r}]); print(r.exit_code)\n"
            "print(sorted(m for m in ('torch', 'transformers', 'vllm', 'tokenizers', 'jinja2') if m in sys.modules))")
    p = _run_blocked(code)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["approximate timestamp", "0", "[]"]
