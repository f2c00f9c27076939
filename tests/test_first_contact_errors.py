"""The errors a new user meets first, on real sockets: each is a sentence with the likely fix, never
urllib3's internals (``_WatchedHTTPConnection(...)``, ``WRONG_VERSION_NUMBER``); extras hints name the
install that works today; cachemon pointed at a cachemon refuses loudly."""
from __future__ import annotations

import logging
import urllib.request

import pytest

from cachemon import install_hint
from cachemon.check import check_upstream
from cachemon.config import KV_EVENTS_EXTRA
from cachemon.demo.replay import ReplayServer, bundled_pages
from cachemon.sources.scrape import FetchError, fetch_text
from helpers import free_port, wait_until


@pytest.fixture
def vllm():
    srv = ReplayServer(bundled_pages()).start()
    yield srv
    srv.stop()


def error_of(url: str) -> FetchError:
    with pytest.raises(FetchError) as e:
        fetch_text(None, url, 3.0, 1 << 20)
    return e.value


def test_a_wrong_port_says_nothing_listens_there_and_how_vllm_is_started():
    port = free_port()
    e = error_of(f"http://127.0.0.1:{port}/metrics")
    assert e.reason == "refused"
    assert f"nothing is listening at 127.0.0.1:{port} — is vLLM running? (vllm serve MODEL --port {port}" in str(e)
    assert "Connection(" not in str(e) and "Errno" not in str(e)


def test_vllms_root_url_suggests_metrics(vllm):
    e = error_of(vllm.base_url + "/")
    assert e.reason == "http_status"
    assert str(e).endswith(f"answered HTTP 404 Not Found — did you mean {vllm.base_url}/metrics? "
                           "(vLLM serves its metrics there)")
    # any other failure of /metrics itself: no suggestion
    vllm.set_fault("http500")
    assert "did you mean" not in str(error_of(vllm.url))


def test_https_to_plain_http_is_a_sentence_not_an_openssl_code(vllm):
    host_port = vllm.base_url.removeprefix("http://")
    e = error_of(f"https://{host_port}/metrics")
    assert f"{host_port} answers plain HTTP, not HTTPS — use http://{host_port}/metrics" in str(e)
    assert "WRONG_VERSION_NUMBER" not in str(e) and "_ssl.c" not in str(e)


def test_extras_hints_name_the_clone_and_the_wheel_install():
    hint = install_hint("kv-events")
    assert ".venv/bin/pip install -e '.[kv-events]'" in hint
    assert "pip install 'cachemon-0.1.0-py3-none-any.whl[kv-events]'" in hint
    assert KV_EVENTS_EXTRA == hint and "pip install 'cachemon[" not in hint


@pytest.mark.slow
def test_cachemon_pointed_at_a_cachemon_refuses_in_check_and_run(vllm, caplog):
    from cachemon.config import Listen, parse_upstream_spec
    from cachemon.daemon import Daemon
    from cachemon.runconfig import Config
    first = Daemon(Config(upstreams=[parse_upstream_spec(f"vllm={vllm.url}", "upstream")], poll_interval=0.2,
                          listen=Listen(address="127.0.0.1", port=0)))
    first.start()
    url = f"http://127.0.0.1:{first.port}/metrics"
    try:
        # a real cachemon page
        assert "# TYPE cachemon_upstream_up gauge" in urllib.request.urlopen(url, timeout=5).read().decode()
        rep = check_upstream(f"self={url}", 0, 5)
        (down,) = [f for f in rep["findings"] if f["code"] == "upstream_down"]
        assert not rep["up"] and down["severity"] == "critical"
        assert f"127.0.0.1:{first.port} serves cachemon's own /metrics, not vLLM's" in down["message"]
        # `run` on it: the upstream is down (never "up, era none"), and it says so at ERROR level
        second = Daemon(Config(upstreams=[parse_upstream_spec(f"self={url}", "upstream")], poll_interval=0.2,
                               listen=Listen(address="127.0.0.1", port=0)))
        with caplog.at_level(logging.WARNING, logger="cachemon"):
            second.start()
            try:
                page = lambda: urllib.request.urlopen(f"http://127.0.0.1:{second.port}/metrics", timeout=5).read().decode()  # noqa: E731
                assert wait_until(lambda: 'cachemon_upstream_scrape_errors_total{upstream="self",reason="not_exposition"}'
                                  in page(), 10)
                assert 'cachemon_upstream_up{upstream="self"} 0.0' in page()
            finally:
                second.shutdown()
        loud = [r for r in caplog.records if "pointed at a cachemon" in r.getMessage()]
        assert loud and all(r.levelno == logging.ERROR for r in loud)
    finally:
        first.shutdown()


def test_no_metrics_suggestion_for_vllms_api_paths():
    from cachemon.sources import hints
    for path in ("/version", "/v1/models", "/metrics", "/metrics/"):
        assert hints.not_found(f"http://127.0.0.1:8000{path}", 404) == "", path
    assert hints.not_found("http://u:p@127.0.0.1:8000/prometheus", 404) == \
        "did you mean http://127.0.0.1:8000/metrics? (vLLM serves its metrics there)"     # never the userinfo
