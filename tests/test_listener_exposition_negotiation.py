"""What /metrics sends: text 0.0.4 by default, OpenMetrics 1.0 and gzip when the scraper asks,
process_* metrics of cachemon itself. OpenMetrics output is checked with prometheus_client's
strict OpenMetrics parser."""
from __future__ import annotations

import gzip
import http.client
import math
import time

import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)

from cachemon.demo.replay import ReplayServer, bundled_pages
from cachemon.expose.render import Family, render, render_openmetrics
from helpers import CachemonProcess, samples, value

# Captured from Debian's Prometheus 2.42 scraping a test server (it also sends Accept-Encoding: gzip).
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
Q = "cachemon_prefix_cache_query_tokens_total"


def om_samples(text: str) -> dict[tuple[str, tuple], float]:
    return samples(text, parse_openmetrics)


def get(port: int, accept: str | None = None, encoding: str | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {k: v for k, v in (("Accept", accept), ("Accept-Encoding", encoding)) if v is not None}
    conn.request("GET", "/metrics", headers=headers)
    r = conn.getresponse()
    body = r.read()
    conn.close()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, body


@pytest.fixture(scope="module")
def running():
    with ReplayServer(bundled_pages()) as replay:
        replay.show(1)
        cm = CachemonProcess("--upstream", f"vllm={replay.url}", "--poll-interval", "200ms")
        try:
            cm.wait_for(lambda m: (value(m, Q, upstream="vllm", cache="local") or 0) > 0)
            yield cm
        finally:
            cm.stop()


def test_default_is_text_0_0_4(running):
    status, headers, body = get(running.port)
    assert status == 200 and headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert "content-encoding" not in headers
    assert value(samples(body.decode()), Q, upstream="vllm", cache="local") > 0


def test_openmetrics_when_prometheus_asks_and_same_numbers_as_text(running):
    status, headers, body = get(running.port, PROMETHEUS_ACCEPT)
    assert status == 200
    assert headers["content-type"] == "application/openmetrics-text; version=1.0.0; charset=utf-8"
    text = body.decode()
    assert text.endswith("# EOF\n")
    om = om_samples(text)                        # raises on any OpenMetrics violation
    plain = samples(get(running.port)[2].decode())
    counters = {k: v for k, v in plain.items() if k[0].startswith("cachemon_prefix_cache_")}
    assert counters and all(om[k] == v for k, v in counters.items())
    assert value(om, "cachemon_build_info") == 1.0


def test_openmetrics_refused_with_q_0_falls_back_to_text(running):
    _, headers, _ = get(running.port, "application/openmetrics-text;q=0,text/plain")
    assert headers["content-type"].startswith("text/plain; version=0.0.4")


@pytest.mark.parametrize("accept", [None, PROMETHEUS_ACCEPT])
def test_gzip_when_asked(running, accept):
    _, headers, body = get(running.port, accept, "gzip")
    assert headers["content-encoding"] == "gzip" and "Accept-Encoding" in headers["vary"]
    assert int(headers["content-length"]) == len(body)
    text = gzip.decompress(body).decode()
    parsed = om_samples(text) if accept else samples(text)
    assert value(parsed, Q, upstream="vllm", cache="local") > 0


def test_process_metrics_of_cachemon_itself(running):
    m = samples(get(running.port)[2].decode())
    assert value(m, "process_resident_memory_bytes") > 1e6
    assert value(m, "process_cpu_seconds_total") > 0
    assert value(m, "process_open_fds") >= 3
    assert time.time() - 3600 < value(m, "process_start_time_seconds") <= time.time()


class _Awkward:
    def collect(self):
        f = Family("test_awkward", "gauge", 'Help with "quotes", a \\ backslash\nand a newline.')
        f.add('v="a\\"b\\\\c\\nd"', math.nan)
        f.add('v="inf"', math.inf)
        f.add('v="neg"', -math.inf)
        f.add('v="big"', 1.5e300)
        yield f
        c = Family("test_events", "counter", "Events.")
        c.add("", 3.0)
        yield c
        i = Family("test_build", "info", "Build.")
        i.add('version="1"', 1.0)
        yield i


def test_openmetrics_renderer_escapes_and_types_like_the_spec():
    fams = {f.name: f for f in parse_openmetrics(render_openmetrics([_Awkward()]).decode())}
    assert fams["test_awkward"].documentation == 'Help with "quotes", a \\ backslash\nand a newline.'
    vals = {s.labels["v"]: s.value for s in fams["test_awkward"].samples}
    assert math.isnan(vals['a"b\\c\nd']) and vals["inf"] == math.inf and vals["neg"] == -math.inf
    assert vals["big"] == 1.5e300
    assert fams["test_events"].type == "counter" and fams["test_events"].samples[0].name == "test_events_total"
    assert fams["test_build"].type == "info" and fams["test_build"].samples[0].name == "test_build_info"
    # and the text format of the same families still parses with the text parser
    assert samples(render([_Awkward()]).decode())[("test_events_total", ())] == 3.0
