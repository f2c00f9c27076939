"""sources/vllm_api.py: the one client for a vLLM server's /version, /v1/models and /metrics.

The happy path runs against ReplayServer (real capture pages, vLLM's answer shapes); the odd
answers come from a small constructed server in this file (`_Odd`), built to answer what a
non-vLLM or broken server might."""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from cachemon.demo.replay import ReplayServer, load_pages
from cachemon.sources.scrape import FetchError
from cachemon.sources.vllm_api import ServedModel, VllmApi, VllmApiError
from helpers import REAL_032


class _Odd:
    """Constructed: answers each path with a fixed (status, body)."""

    def __init__(self, answers: dict[str, tuple[int, bytes]]):
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, body = answers.get(self.path, (404, b"{}"))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_reads_version_models_and_metrics_of_a_vllm_server():
    with ReplayServer(load_pages([str(REAL_032 / "metrics-idle.txt")])) as srv:
        api = VllmApi(srv.base_url)
        assert api.version() == "0.32.0"
        assert api.models() == [ServedModel("tiny", "/models/tiny", 4096)]
        assert "vllm:" in api.metrics()


def test_version_is_optional_and_models_errors_name_the_redacted_url():
    with ReplayServer(load_pages([str(REAL_032 / "metrics-idle.txt")]), version=None) as srv:
        assert VllmApi(srv.base_url).version() is None          # 404: older server or another engine
    api = VllmApi("http://alice:s3cret@127.0.0.1:9", timeout=2.0)      # nothing listens on port 9
    assert api.version() is None
    with pytest.raises(VllmApiError) as e:
        api.models()
    assert e.value.reason == "refused" and isinstance(e.value, FetchError)
    assert e.value.url == "http://alice:xxxxx@127.0.0.1:9/v1/models"
    assert "s3cret" not in str(e.value)


@pytest.mark.parametrize(("body", "message"), [
    (b"<html>login</html>", "Expecting value"),
    (b'{"object": "list"}', "no 'data' list in the answer"),
    (b'["tiny"]', "no 'data' list in the answer"),
])
@pytest.mark.slow
def test_an_answer_that_is_not_a_model_list_is_bad_answer(body, message):
    with _Odd({"/v1/models": (200, body)}) as base:
        with pytest.raises(VllmApiError, match=message) as e:
            VllmApi(base).models()
    assert e.value.reason == "bad_answer"


@pytest.mark.slow
def test_odd_rows_and_versions_are_typed_not_trusted():
    rows = b'{"data": ["x", {"id": "m", "max_model_len": "4096"}, {"id": "n", "root": null, "max_model_len": true}]}'
    with _Odd({"/v1/models": (200, rows), "/version": (200, b'{"version": "' + b"9" * 100 + b'"}')}) as base:
        api = VllmApi(base)
        assert api.models() == [ServedModel("m"), ServedModel("n")]     # non-dict rows skipped; no int, no length
        assert api.version() == "9" * 64                                # a label value: bounded
    with _Odd({"/version": (200, b'["0.1"]')}) as base:
        assert VllmApi(base).version() is None
    with _Odd({"/version": (200, b'{"v": 1}')}) as base:
        assert VllmApi(base).version() == ""
