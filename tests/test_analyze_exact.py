"""Exactness against real vLLM 0.32.0 traffic (tests/fixtures/vllm-0.32.0-cpu).

The three request files are one stream on one server process, in the order static ->
timestamp -> request-id, block size 128. Every line carries vLLM's own usage block;
the prediction must equal it for every request.
"""
from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from cachemon.analyze.divergence import ID, TIMESTAMP
from cachemon.analyze.pipeline import analyze
from cachemon.analyze.tokenize import ModelTokenizer
from cachemon.cli import main
from helpers import REAL_032

ORDER = ["static-system-prompt", "timestamp-in-system-prompt", "request-id-at-head"]
FILES = [str(REAL_032 / f"requests-{s}.jsonl") for s in ORDER]
MODEL = str(REAL_032 / "model")


def vllm_usage(path):
    out = []
    with open(path) as f:
        for line in f:
            u = json.loads(line)["usage"]
            out.append((u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"]))
    return out


@pytest.fixture(scope="module")
def tok():
    return ModelTokenizer(MODEL)


def test_whole_stream_matches_vllm_per_request(tok):
    res = analyze(FILES, tok, block_size=128, what_if=False)
    expected = [u for p in FILES for u in vllm_usage(p)]
    assert len(expected) == 48
    got = list(zip(res.prompt_tokens, res.cached_tokens, strict=False))
    assert got == expected
    assert res.observed_compared == 48 and res.observed_cached_match == 48 and res.observed_prompt_match == 48


def test_whole_stream_totals_match_vllm_counters(tok):
    # vLLM's own cumulative counters after the last scenario (real /metrics capture)
    page = (REAL_032 / "metrics-request-id-at-head.txt").read_text()
    queries = float(re.search(r"^vllm:prefix_cache_queries_total\{[^}]*\} (\S+)", page, re.MULTILINE).group(1))
    hits = float(re.search(r"^vllm:prefix_cache_hits_total\{[^}]*\} (\S+)", page, re.MULTILINE).group(1))
    res = analyze(FILES, tok, block_size=128, what_if=False)
    assert (res.total_prompt, res.total_cached) == (queries, hits)


@pytest.mark.parametrize("name", ORDER)
def test_each_file_alone(tok, name):
    # The static file is exactly what vLLM saw first on a fresh server. The other two
    # missed on every request even with the earlier traffic cached, so alone they must
    # also give vLLM's numbers.
    path = str(REAL_032 / f"requests-{name}.jsonl")
    res = analyze(path, tok, block_size=128, what_if=False)
    assert list(zip(res.prompt_tokens, res.cached_tokens, strict=False)) == vllm_usage(path)


def test_small_cache_changes_the_prediction(tok):
    # A pool big enough for everything gives vLLM's numbers; a pool of 7 (6 usable after
    # vLLM's null block) cannot hold one 831-token prompt (7 blocks), so nothing is cached.
    big = analyze(FILES[:1], tok, block_size=128, cache_blocks=1000, what_if=False)
    assert list(big.cached_tokens) == [u[1] for u in vllm_usage(FILES[0])]
    tiny = analyze(FILES[:1], tok, block_size=128, cache_blocks=7, what_if=False)   # 6 usable < 7 needed
    assert tiny.oversized == 16 and tiny.total_cached == 0


def test_timestamp_cause_and_what_if(tok):
    res = analyze(FILES[1], tok, block_size=128)
    top = res.causes[0]
    assert top.klass == TIMESTAMP
    assert (top.role, top.msg_index, top.location) == ("system", 0, "system[0]")
    assert top.pattern == "Current time: <timestamp>."
    assert top.requests == 15          # every request after the first diverges from its predecessor
    # char span is the timestamp inside the system message
    content = json.loads(open(FILES[1]).readline())["request"]["messages"][0]["content"]
    a, b = top.char_span
    assert content[a:b] == "2025-06-01 10:23:45"
    what = {w.fix.kind: w for w in res.what_ifs[0]}
    assert what["move"].hit_ratio_before == 0.0
    # Moved into the user message, the system prompt is the static text again: vLLM hit
    # 768 tokens (6 blocks) of it on every repeat in the static scenario, so 15 repeats
    # must hit 15 x 768.
    assert what["move"].cached_tokens_after == 15 * 768
    assert what["move"].hit_ratio_after > 0.8


def test_whole_stream_ranks_both_causes(tok):
    res = analyze(FILES, tok, block_size=128)
    classes = {c.klass: c for c in res.causes}
    assert set(classes) == {TIMESTAMP, ID}
    rid = classes[ID]
    assert rid.pattern == "[Request ID: <id>]" and rid.requests == 16
    for rank, _ in enumerate(res.causes):
        for w in res.what_ifs[rank]:
            assert w.hit_ratio_after > w.hit_ratio_before
    assert res.causes[0].tokens_lost >= res.causes[1].tokens_lost


def test_cli_json_numbers_and_redaction():
    r = CliRunner().invoke(main, ["analyze", *FILES, "--tokenizer", MODEL, "--block-size", "128",
                                  "--format", "json", "--redact"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    expected = [u for p in FILES for u in vllm_usage(p)]
    assert [(x["prompt_tokens"], x["cached_tokens"]) for x in d["per_request"]] == expected
    assert d["mode"] == "exact" and d["requests"] == 48
    assert d["hit_ratio"] == pytest.approx(11520 / 40627, abs=1e-6)
    assert all("pattern" not in c and "samples" not in c for c in d["causes"])
    assert "knowledge-base" not in r.output and "Current time" not in r.output and "Request ID" not in r.output


def test_cli_text_shows_offending_text_unless_redacted():
    args = ["analyze", FILES[1], "--tokenizer", MODEL, "--block-size", "128"]
    shown = CliRunner().invoke(main, args)
    assert shown.exit_code == 0
    assert "Current time: <timestamp>." in shown.output and "2025-06-01 10:23:46" in shown.output
    assert "0.0 % -> 8" in shown.output          # before -> after of the what-if
    hidden = CliRunner().invoke(main, args + ["--redact"])
    assert "Current time" not in hidden.output and "2025-06-01" not in hidden.output
    assert "timestamp in system[0]" in hidden.output


def test_approximate_mode_is_labelled():
    r = CliRunner().invoke(main, ["analyze", FILES[1], "--format", "json"])
    d = json.loads(r.output)
    assert d["mode"] == "approximate" and d["approximate_note"]
    assert d["observed"] is None            # vLLM's numbers are not compared against bytes
    assert d["causes"][0]["class"] == TIMESTAMP
    text = CliRunner().invoke(main, ["analyze", FILES[1]]).output
    assert "APPROXIMATE" in text


def test_fixing_both_causes_together(tok):
    # Timestamp moved and request ID moved: every system prompt is the static text, so
    # all 48 requests but the very first hit the 6 static blocks vLLM hit (768 tokens).
    res = analyze(FILES, tok, block_size=128)
    assert res.combined is not None
    assert res.combined.cached_tokens_after == 47 * 768
    assert res.combined.hit_ratio_after > max(w.hit_ratio_after for ws in res.what_ifs.values() for w in ws)
