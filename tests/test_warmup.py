"""`cachemon warmup` against a local OpenAI-compatible test server that serves real vLLM 0.32.0 /metrics pages.

The test server (``FakeVllm``) answers /v1/chat/completions and /v1/completions like vLLM (usage block,
vLLM's 404 body for an unknown model) and serves recorded /metrics pages: the idle page before the
warm-up and, once all 16 requests of the real static-system-prompt capture were answered, the page vLLM
itself produced after those 16 requests. Pages with a busy server are CONSTRUCTED: the real idle page
with ``vllm:num_requests_running`` / ``_waiting`` edited (said where).
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from cachemon import catalog as C
from cachemon.config import ConfigError
from cachemon.config.warmup import load_prompts, parse_warmup_config
from cachemon.runtime.warmup import WarmupTrigger
from cachemon.runtime.warmup_run import RateLimiter, run_warmup

REAL_032 = Path(__file__).resolve().parent / "fixtures" / "vllm-0.32.0-cpu"
STATIC_REQUESTS = REAL_032 / "requests-static-system-prompt.jsonl"


def page(name: str) -> str:
    return (REAL_032 / f"metrics-{name}.txt").read_text(encoding="utf-8")


def busy_page(running: int, waiting: int) -> str:
    """CONSTRUCTED: the real idle page with the running/waiting gauges edited."""
    text = page("idle")
    a = 'vllm:num_requests_running{engine="0",model_name="tiny"} 0.0'
    b = 'vllm:num_requests_waiting{engine="0",model_name="tiny"} 0.0'
    assert a in text and b in text
    return text.replace(a, a[:-3] + f"{running}.0").replace(b, b[:-3] + f"{waiting}.0")


class FakeVllm:
    def __init__(self, before: str, after: str | None = None, switch_after: int = 0, delay: float = 0.0):
        self.before, self.after, self.switch_after = before, after, switch_after
        self.delay = delay
        self.lock = threading.Lock()
        self.posts: list[tuple[float, str, dict]] = []     # (monotonic time, path, body)
        self.in_flight = 0
        self.max_in_flight = 0
        owner = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _send(self, code, obj, ctype="application/json"):
                body = obj.encode() if isinstance(obj, str) else json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path == "/metrics":
                    with owner.lock:
                        done = sum(1 for _, p, _ in owner.posts if p.startswith("/v1/"))
                    text = owner.after if owner.after is not None and done >= owner.switch_after else owner.before
                    self._send(200, text, "text/plain; version=0.0.4")
                elif self.path == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": "tiny", "root": "/models/tiny",
                                                                 "max_model_len": 4096}]})
                else:
                    self._send(404, {"detail": "Not Found"})

            def do_POST(self):
                n = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(n) or b"{}")
                with owner.lock:
                    owner.in_flight += 1
                    owner.max_in_flight = max(owner.max_in_flight, owner.in_flight)
                try:
                    if owner.delay:
                        time.sleep(owner.delay)
                    if self.path not in ("/v1/chat/completions", "/v1/completions"):
                        return self._send(404, {"detail": "Not Found"})
                    if body.get("model") != "tiny":
                        # vLLM's answer for an unknown model
                        return self._send(404, {"object": "error", "type": "NotFoundError", "code": 404,
                                                "message": f"The model `{body.get('model')}` does not exist."})
                    self._send(200, {"id": "x", "object": "chat.completion", "model": "tiny",
                                     "choices": [{"index": 0, "message": {"role": "assistant", "content": "."}}],
                                     "usage": {"prompt_tokens": 831, "completion_tokens": body.get("max_tokens"),
                                               "total_tokens": 832}})
                finally:
                    with owner.lock:
                        owner.in_flight -= 1
                        owner.posts.append((time.monotonic(), self.path, body))

        class S(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                pass       # clients hanging up on keep-alive connections at shutdown

        self.httpd = S(("127.0.0.1", 0), H)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *a):
        self.httpd.shutdown()
        self.httpd.server_close()


def cli(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "cachemon.cli", "warmup", *args],
                          capture_output=True, text=True, timeout=timeout)


# --- prompts file ---------------------------------------------------------------------------------

def test_reads_the_analyzer_request_format():
    p = load_prompts(str(STATIC_REQUESTS))
    assert len(p.items) == 16 and not p.skipped and p.duplicates == 0
    assert all(x.endpoint == "/v1/chat/completions" for x in p.items)
    assert p.items[0].body["messages"][1]["content"] == "Question 0: where is my parcel number 1000?"


def test_bad_lines_are_counted_and_named_by_line(tmp_path):
    f = tmp_path / "p.jsonl"
    lines = STATIC_REQUESTS.read_text().splitlines()
    f.write_text("\n".join([
        lines[0],
        "{not json",
        "# a comment",
        "",
        '{"messages": "hello"}',
        "[1, 2]",
        '{"model": "tiny"}',
        '{"prompt": "Once upon a time", "model": "tiny"}',
        lines[0],                     # duplicate of line 1
    ]) + "\n")
    p = load_prompts(str(f))
    assert [x.line for x in p.items] == [1, 8]
    assert p.items[1].endpoint == "/v1/completions"
    assert [n for n, _ in p.skipped] == [2, 5, 6, 7]
    assert "not JSON" in p.skipped[0][1]
    assert p.duplicates == 1


@pytest.mark.slow
def test_missing_or_empty_prompts_file_exits_2_with_a_clear_message(tmp_path):
    r = cli("--api", "http://127.0.0.1:9", "--prompts", str(tmp_path / "nope.jsonl"))
    assert r.returncode == 2 and "cannot read prompts file" in r.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{oops\n")
    r = cli("--api", "http://127.0.0.1:9", "--prompts", str(bad))
    assert r.returncode == 2 and "no usable prompt" in r.stderr and "line 1" in r.stderr


# --- the run ---------------------------------------------------------------------------------------

@pytest.mark.slow
def test_warms_up_and_reports_hit_ratio_before_and_after():
    """16 real static-system-prompt requests; /metrics moves from the real idle page to the real page vLLM
    served after those 16 requests: warm-up hit ratio 11520 / 13296."""
    with FakeVllm(page("idle"), page("static-system-prompt"), switch_after=16) as srv:
        r = cli("--api", srv.url, "--prompts", str(STATIC_REQUESTS), "--rate", "50/s", "--concurrency", "4", "--json")
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["sent"] == 16 and out["ok"] == 16 and out["failed"] == []
        assert out["before"]["query_tokens"] == 0.0 and out["before"]["hit_ratio"] is None
        assert out["after"]["query_tokens"] == 13296.0 and out["after"]["hit_tokens"] == 11520.0
        assert out["warmup_hit_ratio"] == pytest.approx(11520 / 13296)
        # every request went out with max_tokens=1, non-streaming
        assert [b["max_tokens"] for _, _, b in srv.posts] == [1] * 16
        assert all(b["stream"] is False for _, _, b in srv.posts)
        assert srv.max_in_flight <= 4


@pytest.mark.slow
def test_text_output_never_prints_prompt_text():
    with FakeVllm(page("idle"), page("static-system-prompt"), switch_after=16) as srv:
        r = cli("--api", srv.url, "--prompts", str(STATIC_REQUESTS), "--rate", "100/s", "--concurrency", "4")
    assert r.returncode == 0, r.stderr
    assert "16 ok, 0 failed" in r.stdout
    assert "hit ratio during the warm-up" in r.stdout and "86.6 %" in r.stdout
    assert "knowledge-base assistant" not in r.stdout + r.stderr
    assert "parcel" not in r.stdout + r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("running, waiting", [(3, 2), (0, 5)])
def test_refuses_under_load_unless_forced(running, waiting):
    with FakeVllm(busy_page(running, waiting)) as srv:
        r = cli("--api", srv.url, "--prompts", str(STATIC_REQUESTS), "--max-load", "4", "--rate", "100/s")
        assert r.returncode == 3
        assert "REFUSED" in r.stdout and f"{running + waiting} requests running + waiting" in r.stdout
        assert srv.posts == []                    # nothing was sent
        r = cli("--api", srv.url, "--prompts", str(STATIC_REQUESTS), "--max-load", "4", "--rate", "100/s",
                "--concurrency", "4", "--force")
        assert r.returncode == 0, r.stdout + r.stderr
        assert len(srv.posts) == 16


@pytest.mark.slow
def test_load_at_the_limit_is_allowed():
    with FakeVllm(busy_page(2, 2)) as srv:
        r = cli("--api", srv.url, "--prompts", str(STATIC_REQUESTS), "--max-load", "4", "--rate", "100/s",
                "--concurrency", "4")
        assert r.returncode == 0, r.stdout


@pytest.mark.slow
def test_unreachable_server_refuses_with_a_clear_message(tmp_path):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]      # closed again: nothing listens there
    r = cli("--api", f"http://127.0.0.1:{port}", "--prompts", str(STATIC_REQUESTS), "--timeout", "2s")
    assert r.returncode == 3
    assert "cannot read the server's load" in r.stdout and "--force" in r.stdout


@pytest.mark.slow
def test_respects_the_rate():
    prompts = load_prompts(str(STATIC_REQUESTS))
    prompts.items = prompts.items[:6]
    with FakeVllm(page("idle")) as srv:
        res = run_warmup(srv.url, prompts, concurrency=4, rate=5.0)
        starts = sorted(t for t, _, _ in srv.posts)
    assert res.ok == 6
    # 6 requests at 5/s: starts at least 0.2 s apart -> the last completes >= 1.0 s after the first started
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert sum(gaps) >= 5 * 0.2 * 0.9, gaps
    assert res.seconds >= 1.0


def test_rate_limiter_spacing_with_an_injected_clock():
    now = [0.0]
    slept = []
    lim = RateLimiter(4.0, clock=lambda: now[0], sleep=lambda d: (slept.append(d), now.__setitem__(0, now[0] + d)))
    for _ in range(5):
        lim.wait()
    assert now[0] == pytest.approx(1.0)        # 5 starts at 4/s: 0, .25, .5, .75, 1.0
    assert slept == pytest.approx([0.25] * 4)


@pytest.mark.slow
def test_per_prompt_errors_are_reported_not_silent(tmp_path):
    lines = STATIC_REQUESTS.read_text().splitlines()
    wrong = json.loads(lines[2])
    wrong["request"]["model"] = "no-such-model"
    f = tmp_path / "p.jsonl"
    f.write_text("\n".join([lines[0], lines[1], json.dumps(wrong), lines[3]]) + "\n")
    with FakeVllm(page("idle")) as srv:
        r = cli("--api", srv.url, "--prompts", str(f), "--rate", "100/s")
    assert r.returncode == 1
    assert "3 ok, 1 failed" in r.stdout
    assert "FAILED prompt 3 (line 3): HTTP 404: The model `no-such-model` does not exist." in r.stdout


def test_a_server_that_drops_requests_is_reported_per_prompt():
    prompts = load_prompts(str(STATIC_REQUESTS))
    prompts.items = prompts.items[:2]
    with FakeVllm(page("idle"), delay=3.0) as srv:
        res = run_warmup(srv.url, prompts, concurrency=2, rate=None, timeout=0.5)
    assert res.ok == 0 and len(res.failed) == 2
    assert all("timed out" in r.error for r in res.failed)


# --- daemon: warmup_on -------------------------------------------------------------------------------

class _Up:
    def __init__(self, base):
        self.name, self.base_url, self.url = "vllm", base, base + "/metrics"


class _Poller:
    def __init__(self, base):
        self.upstream = _Up(base)


@pytest.mark.slow
def test_daemon_warmup_once_per_event_with_load_guard(tmp_path):
    cfg = parse_warmup_config({"prompts": str(STATIC_REQUESTS), "warmup_on": ["restart", "model_change"],
                               "rate": 100, "concurrency": 4, "delay": "1ms"})
    with FakeVllm(page("idle")) as srv:
        trig = WarmupTrigger(cfg, {"vllm": _Poller(srv.url)})
        assert trig.trigger("vllm", "restart")
        assert not trig.trigger("vllm", "model_change")    # joins the pending one: one warm-up
        trig.run_pending()
        assert len(srv.posts) == 16
        assert trig.counts[("vllm", "restart", "done")] == 1
        assert trig.counts[("vllm", "model_change", "done")] == 0
        trig.run_pending()                                  # nothing pending: nothing sent
        assert len(srv.posts) == 16
    with FakeVllm(busy_page(8, 3)) as srv:
        trig = WarmupTrigger(cfg, {"vllm": _Poller(srv.url)})
        trig.trigger("vllm", "model_change")
        trig.run_pending()
        assert srv.posts == []
        assert trig.counts[("vllm", "model_change", "refused_load")] == 1
        fam = trig.family()
        assert fam.name == C.WARMUPS.name
        assert ('upstream="vllm",trigger="model_change",result="refused_load"', 1) in fam.samples


@pytest.mark.parametrize("raw, key", [
    ({}, "warmup.prompts"),
    ({"prompts": "/no/such/file"}, "warmup.prompts"),
    ({"prompts": str(STATIC_REQUESTS), "warmup_on": ["deploy"]}, "warmup.warmup_on[0]"),
    ({"prompts": str(STATIC_REQUESTS), "rate": "fast"}, "warmup.rate"),
    ({"prompts": str(STATIC_REQUESTS), "concurrency": 0}, "warmup.concurrency"),
    ({"prompts": str(STATIC_REQUESTS), "api": "ftp://x"}, "warmup.api"),
    ({"prompts": str(STATIC_REQUESTS), "on": ["restart"]}, "warmup.on"),
    ("x", "warmup"),
])
def test_malformed_warmup_config_names_the_key(raw, key):
    with pytest.raises(ConfigError) as ei:
        parse_warmup_config(raw)
    assert ei.value.key == key


@pytest.mark.slow
def test_malformed_warmup_config_exits_2_from_cachemon_run(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"upstreams": ["http://127.0.0.1:9/metrics"],
                                   "warmup": {"prompts": str(tmp_path / "missing.jsonl")}}))
    p = subprocess.run([sys.executable, "-m", "cachemon.cli", "run", "--config", str(cfg), "--listen", "127.0.0.1:0"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "warmup.prompts" in p.stderr


@pytest.mark.slow
def test_cachemon_run_warms_up_once_after_a_real_restart(tmp_path):
    """End to end in the daemon: the upstream serves the real static page, then the real idle page (counters
    drop: a restart). cachemon detects the restart and warms up once with the 16 prompts."""
    from prometheus_client.parser import text_string_to_metric_families

    from cachemon.daemon import Daemon
    from cachemon.runconfig import from_dict
    from helpers import wait_until

    with FakeVllm(page("static-system-prompt")) as srv:
        d = Daemon(from_dict({
            "upstreams": [{"name": "vllm", "url": srv.url + "/metrics"}], "poll_interval": "100ms",
            "listen": {"address": "127.0.0.1", "port": 0}, "events": {"interval": "200ms"},
            "warmup": {"prompts": str(STATIC_REQUESTS), "rate": 100, "concurrency": 4, "delay": "10ms"}}))
        d.start()
        try:
            def warmups():
                return {(s.labels["trigger"], s.labels["result"]): s.value
                        for f in text_string_to_metric_families(d.registry.render().decode())
                        for s in f.samples if s.name == C.WARMUPS.sample_name}
            assert wait_until(lambda: d.store.upstreams["vllm"].scrapes >= 2, 10)
            assert srv.posts == [] and warmups()[("restart", "done")] == 0.0
            srv.before = page("idle")
            assert wait_until(lambda: warmups().get(("restart", "done")) == 1.0, 20), warmups()
            assert len(srv.posts) == 16
            assert d.store.upstreams["vllm"].restarts == 1
            time.sleep(0.5)                      # no second warm-up for the same event
            assert len(srv.posts) == 16 and warmups()[("model_change", "done")] == 0.0
        finally:
            d.shutdown()
