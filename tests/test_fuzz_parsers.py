"""Fuzzing the two hand-written parsers with Hypothesis, on a short budget (the long run of 10^6
inputs each is benchmarks/fuzz_parsers.py). Inputs are CONSTRUCTED by tests/fuzz_support.py; the
KV mutations start from the real vLLM 0.32.0 capture. Every input that found a bug is kept below
as a regression case."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from cachemon.normalise.kv_decode import KvDecoder
from fuzz_support import BOMBS, differential, kv_decode_checked, kv_payloads, pages, real_payloads

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(pages())
def test_exposition_parser_agrees_with_prometheus_client_on_every_page_both_accept(body):
    assert differential(body) == ""


@FUZZ
@given(kv_payloads())
def test_kv_decoder_raises_only_kv_decode_error_in_bounded_time(payload):
    assert kv_decode_checked(payload) == ""


@settings(max_examples=100, deadline=None)
@given(kv_payloads())
def test_kv_decoder_of_a_real_stream_survives_a_hostile_payload(payload):
    dec = KvDecoder()
    for good in real_payloads(4):
        dec.decode(good, 0)                    # a stream that learnt the 0.32.0 layout
    assert kv_decode_checked(payload, dec) == ""
    for good in real_payloads(4):
        dec.decode(good, 0)                    # ... and still decodes the real payloads after it


@pytest.mark.parametrize("bomb", BOMBS, ids=range(len(BOMBS)))
def test_msgpack_bombs(bomb):
    assert kv_decode_checked(bomb) == ""


# -- inputs that found bugs (kept as regression cases) ---------------------------------------------
# The first two found a difference of the oracle, not of cachemon: prometheus_client keeps an integer
# literal as a Python int (1e20 != 99999999999999999999 in Python), and renames the sample of a family
# TYPEd counter without _total to name_total. No input has made the KV decoder raise anything but
# KvDecodeError or exceed its time budget; one that does goes here as bytes.
EXPOSITION_FOUND = [
    "vllm:prefix_cache_hits_total 99999999999999999999\n",
    "# TYPE vllm:num_requests_running counter\nvllm:num_requests_running\t3436462747 -5\n",
]
# A cachemon bug (found by atheris in benchmarks/fuzz_parsers.py, 66 000 inputs in): a label name
# with a colon, `eng:ne="0"`, was read as ne="0" (the label regex skipped what it could not read), a
# series of another label set. Now the page is an error (Prometheus' own parser rejects the name).
MISREAD = ['vllm:prefix_cache_queries_total{eng:ne="0",model_name="deepseek-v4"} 9000\n',
           'vllm:prefix_cache_queries_total{engine="0" model_name="m"} 1\n',
           'vllm:prefix_cache_queries_total{engine="0",,model_name="m"} 1\n',
           'vllm:prefix_cache_queries_total{engine="0",x,model_name="m"} 1\n',
           'vllm:prefix_cache_queries_total{,} 1\n']


@pytest.mark.parametrize("body", MISREAD)
def test_a_label_set_cachemon_cannot_read_whole_is_an_error(body):
    from fuzz_support import ours
    assert ours(body) is None
    assert differential(body) == ""


@pytest.mark.parametrize("body", EXPOSITION_FOUND)
def test_exposition_regressions(body):
    from fuzz_support import ours
    assert ours(body)                  # cachemon reads the sample ...
    assert differential(body) == ""    # ... as prometheus_client does
