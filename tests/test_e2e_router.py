"""scripts/e2e/router.py, the router in front of the live vLLM pairs, against two stand-in
replicas (loopback HTTP servers that answer like vLLM's /tokenize and completions)."""
from __future__ import annotations

import io
import json
import sys
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from cachemon.analyze.sim.fleet import Fleet

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts" / "e2e"))
from router import Router  # noqa: E402


class Replica:
    """Answers /tokenize with one token id per character (stand-in tokenizer) and
    completions with cached_tokens = its index; counts what reached it."""

    def __init__(self, index: int):
        self.paths: list[str] = []
        replica = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                replica.paths.append(self.path)
                if self.path == "/tokenize":
                    text = body.get("prompt") or "".join(m["content"] for m in body["messages"])
                    out = {"tokens": [ord(c) for c in text]}
                else:
                    out = {"usage": {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": index}}}
                raw = json.dumps(out).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *_a: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def replicas():
    reps = [Replica(0), Replica(1)]
    yield reps
    for r in reps:
        r.server.shutdown()
        r.server.server_close()


def post(url: str, body: dict | None) -> dict:
    data = json.dumps(body).encode() if body is not None else b""
    with urllib.request.urlopen(urllib.request.Request(url, data=data, method="POST"), timeout=10) as r:
        return json.loads(r.read() or b"{}")


def chat(text: str) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": text}]}


PROMPTS = ["[Tenant 000] a", "[Tenant 001] b", "[Tenant 000] c", "[Tenant 002] d", "[Tenant 000] e"]


def route_all(replicas, policy: str, prompts: list, **kw) -> tuple[Router, list[dict]]:
    log = io.BytesIO()
    router = Router([r.url for r in replicas], policy, log=log, **kw)
    url = router.start()
    try:
        for p in prompts:
            post(url + ("/v1/completions" if isinstance(p, list) else "/v1/chat/completions"),
                 {"model": "tiny", "prompt": p} if isinstance(p, list) else chat(p))
        post(url + "/reset_prefix_cache", None)
    finally:
        router.stop()
    return router, [json.loads(ln) for ln in log.getvalue().decode().splitlines()]


@pytest.mark.slow
def test_pin_sends_the_shared_prefix_to_replica_0_only(replicas):
    router, log = route_all(replicas, "pin", PROMPTS, pin_prefix="[Tenant 000] ")
    assert [x["replica"] for x in log] == [0, 1, 0, 1, 0]
    assert [x["cached_tokens"] for x in log] == [0, 1, 0, 1, 0]       # read from the replica's usage
    assert router.per_replica == [3, 2]
    # the reset reached both replicas; completions reached only the chosen one
    assert [r.paths.count("/reset_prefix_cache") for r in replicas] == [1, 1]
    assert [r.paths.count("/v1/chat/completions") for r in replicas] == [3, 2]


@pytest.mark.slow
def test_round_robin_alternates(replicas):
    _, log = route_all(replicas, "round-robin", PROMPTS)
    assert [x["replica"] for x in log] == [0, 1, 0, 1, 0]


@pytest.mark.slow
def test_prefix_routes_token_prompts_like_cachemon_analyze(replicas):
    # token-id prompts need no /tokenize; the replica must be Fleet.route's (CRC-32 of 256 tokens)
    prompts = [[(7 * k + s) % 500 + 10 for k in range(300)] for s in range(12)]
    prompts += [p[:200] + [1] * 100 for p in prompts[:4]]          # same first 200 tokens only
    _, log = route_all(replicas, "prefix", prompts)
    fleet = Fleet(2, "prefix", 128, None)
    assert [x["replica"] for x in log] == [fleet.route(p, None) for p in prompts]
    assert {x["replica"] for x in log} == {0, 1} and not any(x["fallback"] for x in log)
    assert all("/tokenize" not in r.paths for r in replicas)


def test_prefix_tokenizes_chat_on_a_replica_and_keeps_a_shared_head_together(replicas):
    head = "S" * 300                                                 # 300 stand-in tokens
    _, log = route_all(replicas, "prefix", [head + "a", head + "b", head + "c"])
    assert len({x["replica"] for x in log}) == 1 and not any(x["fallback"] for x in log)
    assert replicas[0].paths.count("/tokenize") == 3


def test_bad_setup_is_a_clear_error(replicas):
    with pytest.raises(ValueError, match="pin policy needs"):
        Router([r.url for r in replicas], "pin")
    with pytest.raises(ValueError, match="unknown policy"):
        Router([r.url for r in replicas], "random")
    with pytest.raises(ValueError, match="at least two"):
        Router([replicas[0].url], "round-robin")
