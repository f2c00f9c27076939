"""`cachemon capture` against real sockets: ReplayServer for /metrics + a tiny fake chat endpoint."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner

from cachemon.cli import main
from cachemon.demo.replay import ReplayServer, bundled_pages
from cachemon.tools.capture import SCENARIOS, SYSTEM_TEXT, CaptureError, build_request, cache_config, capture, vllm_totals


class FakeChat:
    """POST /v1/chat/completions with a usage block that mimics block-granular prefix caching."""

    def __init__(self, details: bool = True, status: int = 200, dev_mode: bool = True, prompt_as=int):
        self.dev_mode = dev_mode
        self.prompt_as = prompt_as        # the type prompt_tokens is sent as (a broken server: str)
        self.resets = 0
        self.seen: set[str] = set()
        self.bodies: list[dict] = []
        self.details = details
        self.status = status
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _json(self, code, obj):
                body = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path == "/v1/models":
                    self._json(200, {"data": [{"id": "tiny"}]})
                elif self.path == "/version":
                    self._json(200, {"version": "9.9.9"})
                else:
                    self._json(404, {"detail": "Not Found"})

            def do_POST(self):
                if self.path == "/reset_prefix_cache":
                    if not owner.dev_mode:
                        self._json(404, {"detail": "Not Found"})
                        return
                    owner.resets += 1
                    owner.seen.clear()
                    self._json(200, {})
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.bodies.append(body)
                if owner.status != 200:
                    self._json(owner.status, {"error": "boom"})
                    return
                system = body["messages"][0]["content"]
                prompt = len(system) // 4 + 10
                cached = (prompt - 1) // 16 * 16 if system in owner.seen else 0
                owner.seen.add(system)
                usage = {"prompt_tokens": owner.prompt_as(prompt), "completion_tokens": 4, "total_tokens": prompt + 4}
                if owner.details:
                    usage["prompt_tokens_details"] = {"cached_tokens": cached}
                self._json(200, {"choices": [{"message": {"content": "x"}}], "usage": usage})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def replay():
    with ReplayServer(bundled_pages()) as srv:
        yield srv


@pytest.fixture
def chat():
    c = FakeChat()
    yield c
    c.close()


@pytest.mark.slow
def test_capture_writes_fixture_set(tmp_path, replay, chat):
    log = tmp_path / "server.log"
    log.write_text("old line /home/me/model\n")
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_text("{}")
    (model / "config.json").write_text("{}")
    out = tmp_path / "out"
    m = capture(chat.url, out, n=3, metrics_url=replay.url, log_file=log, model_dir=model, settle=0,
                redact=("/home/me",), echo=lambda s: None)
    names = sorted(p.name for p in out.iterdir())
    assert names == ["README.md", "manifest.json", "metrics-idle.txt", "metrics-request-id-at-head.txt",
                     "metrics-static-system-prompt.txt", "metrics-timestamp-in-system-prompt.txt", "model",
                     "requests-request-id-at-head.jsonl", "requests-static-system-prompt.jsonl",
                     "requests-timestamp-in-system-prompt.jsonl", "server.log"]
    recs = [json.loads(line) for line in (out / "requests-static-system-prompt.jsonl").read_text().splitlines()]
    assert [r["i"] for r in recs] == [0, 1, 2]
    assert recs[0]["request"]["messages"][0]["content"] == SYSTEM_TEXT
    assert [r["usage"]["prompt_tokens_details"]["cached_tokens"] > 0 for r in recs] == [False, True, True]
    ts = [json.loads(line) for line in (out / "requests-timestamp-in-system-prompt.jsonl").read_text().splitlines()]
    assert all(r["usage"]["prompt_tokens_details"]["cached_tokens"] == 0 for r in ts)
    assert m["vllm_version"] == "9.9.9" and m["model"] == "tiny"
    assert m["cache_config"]["block_size"] == "128"
    assert [s["requests_with_hits"] for s in m["scenarios"]] == [2, 0, 0]
    # only the lines logged during the capture: the fake server logged none
    assert (out / "server.log").read_text() == ""
    assert sorted(p.name for p in (out / "model").iterdir()) == ["config.json", "tokenizer.json"]
    assert len(chat.bodies) == 9
    assert "| `static-system-prompt` | 3 |" in (out / "README.md").read_text()


@pytest.mark.slow
def test_capture_log_slice_and_redaction(tmp_path, replay, chat):
    log = tmp_path / "server.log"
    log.write_text("before\n")
    out = tmp_path / "out"

    class Appending:
        def __call__(self, s):
            with open(log, "a") as f:
                f.write(f"loaded /home/me/x {len(s)}\n")

    capture(chat.url, out, scenarios=("static-system-prompt",), n=1, metrics_url=replay.url, log_file=log,
            settle=0, redact=("/home/me",), echo=Appending())
    text = (out / "server.log").read_text()
    assert "before" not in text and "/home/me" not in text and "<redacted>/x" in text


@pytest.mark.slow
def test_capture_cli_runs_and_prints_no_prompt(tmp_path, replay, chat):
    out = tmp_path / "cli"
    res = CliRunner().invoke(main, ["capture", "--api", chat.url, "--metrics-url", replay.url, "--out", str(out),
                                    "--requests", "2", "--settle", "0", "--scenario", "request-id-at-head"])
    assert res.exit_code == 0, res.output
    assert "request-id-at-head: 2 requests" in res.output
    assert "knowledge-base" not in res.output
    assert (out / "requests-request-id-at-head.jsonl").is_file()


@pytest.mark.slow
def test_capture_refuses_nonempty_out(tmp_path, replay, chat):
    (tmp_path / "x").write_text("keep me")
    res = CliRunner().invoke(main, ["capture", "--api", chat.url, "--metrics-url", replay.url, "--out", str(tmp_path)])
    assert res.exit_code == 1
    assert "not empty" in res.output
    assert (tmp_path / "x").read_text() == "keep me"
    assert chat.bodies == []


def test_capture_unreachable_server_is_a_clear_error(tmp_path):
    res = CliRunner().invoke(main, ["capture", "--api", "http://127.0.0.1:9", "--out", str(tmp_path / "o")])
    assert res.exit_code == 1
    assert "cannot reach http://127.0.0.1:9/v1/models" in res.output


@pytest.mark.slow
def test_capture_needs_prompt_tokens_details(tmp_path, replay):
    chat = FakeChat(details=False)
    try:
        with pytest.raises(CaptureError, match="--enable-prompt-tokens-details"):
            capture(chat.url, tmp_path / "o", n=1, metrics_url=replay.url, settle=0, echo=lambda s: None)
    finally:
        chat.close()


@pytest.mark.slow
def test_a_usage_block_without_an_integer_prompt_count_is_a_clear_error(tmp_path, replay):
    """CONSTRUCTED server answering prompt_tokens as text ("N tokens"): one CaptureError (b966c57 took it,
    and int() of it ended the capture in a ValueError traceback)."""
    chat = FakeChat(prompt_as=lambda n: f"{n} tokens")
    try:
        with pytest.raises(CaptureError, match="an integer prompt_tokens"):
            capture(chat.url, tmp_path / "o", n=1, metrics_url=replay.url, settle=0, echo=lambda s: None)
    finally:
        chat.close()


@pytest.mark.slow
def test_capture_http_error_from_chat(tmp_path, replay):
    chat = FakeChat(status=500)
    try:
        with pytest.raises(CaptureError, match="HTTP 500"):
            capture(chat.url, tmp_path / "o", n=1, metrics_url=replay.url, settle=0, echo=lambda s: None)
    finally:
        chat.close()


@pytest.mark.slow
def test_capture_rejects_non_vllm_metrics(tmp_path, chat):
    with ReplayServer([("x", "some_metric 1\n")]) as srv:
        with pytest.raises(CaptureError, match="not a vLLM /metrics page"):
            capture(chat.url, tmp_path / "o", n=1, metrics_url=srv.url, settle=0, echo=lambda s: None)


def test_capture_marks_busy_server_start_page(tmp_path, chat):
    pages = [p for p in bundled_pages() if p[0] == "static-system-prompt"]
    with ReplayServer(pages) as srv:
        m = capture(chat.url, tmp_path / "o", scenarios=("static-system-prompt",), n=1, metrics_url=srv.url,
                    settle=0, echo=lambda s: None)
    assert m["start_page"] == "metrics-start.txt" and not m["server_was_idle"]


def test_scenario_builders_match_the_recorded_fixture_requests():
    from pathlib import Path
    base = Path(__file__).parent / "fixtures" / "vllm-0.32.0-cpu"
    for scenario in ("static-system-prompt", "timestamp-in-system-prompt"):
        for line in (base / f"requests-{scenario}.jsonl").read_text().splitlines():
            rec = json.loads(line)
            assert build_request(scenario, rec["i"], "tiny") == rec["request"]
    ids = {build_request("request-id-at-head", 0, "tiny")["messages"][0]["content"][:30] for _ in range(5)}
    assert len(ids) == 5
    assert set(SCENARIOS) >= {"static-system-prompt", "timestamp-in-system-prompt", "request-id-at-head"}


def test_totals_and_cache_config_from_a_real_page():
    page = dict(bundled_pages())["static-system-prompt"]
    t = vllm_totals(page)
    assert t["vllm:prefix_cache_queries_total"] == 13296 and t["vllm:prefix_cache_hits_total"] == 11520
    assert cache_config(page)["block_size"] == "128"


@pytest.mark.slow
def test_capture_reset_prefix_cache(tmp_path, replay, chat):
    chat.seen.add(SYSTEM_TEXT)   # the server already cached the stable prompt
    m = capture(chat.url, tmp_path / "o", scenarios=("static-system-prompt",), n=2, metrics_url=replay.url,
                settle=0, reset=True, echo=lambda s: None)
    assert chat.resets == 1
    assert m["scenarios"][0]["requests_with_hits"] == 1     # request 0 misses again after the reset


@pytest.mark.slow
def test_capture_reset_needs_dev_mode(tmp_path, replay):
    chat = FakeChat(dev_mode=False)
    try:
        with pytest.raises(CaptureError, match="VLLM_SERVER_DEV_MODE=1"):
            capture(chat.url, tmp_path / "o", n=1, metrics_url=replay.url, settle=0, reset=True, echo=lambda s: None)
        assert chat.bodies == []
    finally:
        chat.close()


@pytest.mark.slow
def test_credentials_in_the_urls_never_appear_in_output_or_files(tmp_path, replay, chat):
    """userinfo and query values of --api / --metrics-url are shown redacted (cachemon.urls),
    in what capture prints and in every file it writes; the requests still carry them."""
    host = chat.url.removeprefix("http://")
    out = tmp_path / "cli"
    res = CliRunner().invoke(main, ["capture", "--api", f"http://alice:s3cret-pw@{host}",
                                    "--metrics-url", replay.url + "?token=tok-98765", "--out", str(out),
                                    "--requests", "1", "--settle", "0", "--scenario", "request-id-at-head"])
    assert res.exit_code == 0, res.output
    assert f"capturing from http://alice:xxxxx@{host} " in res.output
    written = "".join(p.read_text() for p in out.rglob("*") if p.is_file())
    for secret in ("s3cret-pw", "tok-98765"):
        assert secret not in res.output and secret not in written
    assert len(chat.bodies) == 1


def test_unreachable_server_with_credentials_is_shown_redacted(tmp_path):
    res = CliRunner().invoke(main, ["capture", "--api", "http://alice:s3cret-pw@127.0.0.1:9",
                                    "--out", str(tmp_path / "o")])
    assert res.exit_code == 1
    assert "cannot reach http://alice:xxxxx@127.0.0.1:9/v1/models" in res.output
    assert "s3cret-pw" not in res.output
