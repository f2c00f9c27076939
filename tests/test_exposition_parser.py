"""The selective exposition parser: bad bodies become clear errors, never wrong numbers."""
from __future__ import annotations

import pytest

from assert_support import nonempty
from cachemon.normalise.normaliser import HELP_WANTED, WANTED, normalise_text
from cachemon.sources.exposition import ExpositionError, parse
from helpers import REAL_032

PAGE = (REAL_032 / "metrics-static-system-prompt.txt").read_text()


@pytest.mark.parametrize("body,reason", [
    ("", "not_exposition"),
    ("   \n", "not_exposition"),
    ("<html><body>Sign in</body></html>\n", "not_exposition"),
    ("{\"detail\": \"Not Found\"}\n", "not_exposition"),
    ("vllm:prefix_cache_hits_total 1\x00\n", "not_exposition"),
    (PAGE[: len(PAGE) // 2], "truncated"),
    ('vllm:prefix_cache_hits_total{engine="0"} abc\n', "parse"),
    ("process_start_time_seconds notanumber\n", "parse"),
])
def test_bad_bodies_raise_with_a_reason(body, reason):
    with pytest.raises(ExpositionError) as e:
        parse(body, WANTED, HELP_WANTED)
    assert e.value.reason == reason


def test_truncated_page_never_yields_partial_counters():
    # Cut right after the queries line: without the newline check, hits would be missing.
    cut = PAGE.index("vllm:prefix_cache_hits_total")
    with pytest.raises(ExpositionError):
        normalise_text(PAGE[:cut - 1])


def test_label_escapes_and_timestamps():
    body = ('# a comment\nvllm:prefix_cache_queries_total{model_name="a\\"b\\\\c",engine="0"} 5 1700000000000\n'
            'vllm:prefix_cache_hits_total{model_name="a\\"b\\\\c",engine="0"} 2\n')
    page = parse(body, WANTED, HELP_WANTED)
    labels, v = page.samples["prefix_cache_queries_total"][0]
    assert labels["model_name"] == 'a"b\\c' and v == 5.0


def test_process_start_time_is_read():
    assert parse(PAGE, WANTED, HELP_WANTED).process_start_time == pytest.approx(1.79596798377e9)


def test_unwanted_families_are_skipped():
    page = parse(PAGE, WANTED, HELP_WANTED)
    # (request_prompt_tokens_bucket is wanted since the attribution engine reads prompt lengths)
    assert "time_to_first_token_seconds_bucket" not in page.samples
    assert "request_prompt_tokens_bucket" in page.samples
    assert page.samples["prefix_cache_hits_total"] == [({"engine": "0", "model_name": "tiny"}, 11520.0)]


TRICKY = ['ti}ny', 'a"b', 'back\\slash', 'two\nlines', '{"json": [1, 2]}', '}', 'x}",y="z', '\\n literally']


@pytest.mark.parametrize("model", TRICKY)
def test_label_values_are_read_as_prometheus_client_reads_them(model):
    from prometheus_client.parser import text_string_to_metric_families
    esc = model.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    body = ("# TYPE vllm:prefix_cache_hits counter\n"
            f'vllm:prefix_cache_hits_total{{engine="0",model_name="{esc}"}} 7 1700000000000\n')
    theirs = [(s.labels, s.value) for f in text_string_to_metric_families(body) for s in f.samples]
    assert parse(body, WANTED, HELP_WANTED).samples["prefix_cache_hits_total"] == theirs
    assert theirs[0][0]["model_name"] == model


@pytest.mark.parametrize("line", [
    'vllm:prefix_cache_hits_total{engine="0" 5',              # brace never closed
    'vllm:prefix_cache_hits_total{engine="0} 5',              # quote never closed
    'vllm:prefix_cache_hits_total{engine="0"}',               # no value
])
def test_a_wanted_line_that_cannot_be_read_is_an_error_not_a_skip(line):
    body = "# HELP x y\nprocess_start_time_seconds 1.0\n" + line + "\n"
    with pytest.raises(ExpositionError) as e:
        parse(body, WANTED, HELP_WANTED)
    assert e.value.reason == "parse"


@pytest.mark.parametrize("body", ["OK", "OK\n", "Hello world\n", "# Title\n\nSome prose here.\n",
                                  "ok 200\nall good\n", "process_start_time_seconds 1\n<html>\n"])
def test_plain_text_is_not_an_exposition(body):
    with pytest.raises(ExpositionError) as e:
        parse(body, WANTED, HELP_WANTED)
    assert e.value.reason == "not_exposition"


def test_openmetrics_eof_without_final_newline_is_complete():
    body = ('# TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits_total{engine="0"} 3.0\n'
            'vllm:prefix_cache_hits_created{engine="0"} 1.7e9\n# EOF')
    assert parse(body, WANTED, HELP_WANTED).samples["prefix_cache_hits_total"] == [({"engine": "0"}, 3.0)]
    with pytest.raises(ExpositionError) as e:                 # cut before its # EOF: truncated
        parse(body[:-8], WANTED, HELP_WANTED)
    assert e.value.reason == "truncated"


@pytest.mark.parametrize("tail,ok", [
    (" 7", 7.0),
    (" 7 1700000000000", 7.0),
    (" 7 # a comment with } in it", 7.0),
    (" 7 1 2", None),            # two timestamps
    ("7", None),                 # no blank before the value
    ("} 7", None),               # a stray brace after the label set
    (' 7 # x} 8', 7.0),
])
def test_memoised_label_sets_still_read_the_whole_line(tail, ok):
    """Polls reuse parsed label sets (and whole repeated lines): a known label set, even
    one with `}` and escapes in its values, must not let a malformed rest of the line through."""
    labels = '{model_name="a}\\"b",engine="0"}'
    for _ in nonempty(range(2)):      # the second poll takes the memoised paths
        page = parse(f"vllm:prefix_cache_queries_total{labels} 5\n", WANTED, HELP_WANTED)
        assert page.samples["prefix_cache_queries_total"] == [({"model_name": 'a}"b', "engine": "0"}, 5.0)]
        # a good first line, so the check of the page's first sample is not what refuses it
        body = f"vllm:num_requests_running 0\nvllm:prefix_cache_queries_total{labels}{tail}\n"
        if ok is None:
            with pytest.raises(ExpositionError) as e:
                parse(body, WANTED, HELP_WANTED)
            assert e.value.reason == "parse"
        else:
            assert parse(body, WANTED, HELP_WANTED).samples["prefix_cache_queries_total"][0][1] == ok
