#!/usr/bin/env python3
"""A small HTTP router in front of N live vLLM servers, for the real-server routing proofs.

    python scripts/e2e/router.py --replica http://127.0.0.1:8001 --replica http://127.0.0.1:8002 \
        --policy prefix --port 9000 --log routed.jsonl

Standard library only; listens on loopback. Policies:

* ``round-robin`` — request k goes to replica k mod N;
* ``prefix`` — by the CRC-32 of the first ``--prefix-tokens`` prompt tokens (4 little-endian
  bytes each), the rule of ``cachemon analyze --routing prefix`` (``Fleet.route``), so the
  prediction can be compared request by request. The token ids come from the replicas' own
  ``POST /tokenize`` (the router holds no tokenizer); a prompt that cannot be tokenized is
  routed by the CRC-32 of its first ``--prefix-tokens`` characters and counted
  (``fallback`` in the log);
* ``pin`` — a request whose prompt text starts with ``--pin-prefix`` goes to replica 0 only;
  every other request goes round-robin over replicas 1..N-1 (the routing-skew scenario).

``POST /reset_prefix_cache`` is sent to every replica. Each routed request is logged as one
JSON line: ``{"n", "path", "replica", "status", "prompt_tokens", "cached_tokens", "fallback"}``.
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import urllib.error
import urllib.request
import zlib
from array import array
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, BinaryIO

POLICIES = ("round-robin", "prefix", "pin")


def _post(url: str, body: bytes, timeout: float) -> tuple[int, bytes, str]:
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read(), r.headers.get("Content-Type", "application/json")
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers.get("Content-Type", "application/json")


def prompt_text(body: dict[str, Any]) -> str:
    """The prompt as text, for the pin rule and the character fallback: chat message contents in
    order, or a completion's prompt (token ids as their repr)."""
    if "messages" in body:
        return "".join(m.get("content") or "" if isinstance(m.get("content"), (str, type(None)))
                       else json.dumps(m["content"]) for m in body["messages"])
    p = body.get("prompt", "")
    return p if isinstance(p, str) else repr(p)


class Router:
    def __init__(self, replicas: list[str], policy: str, prefix_tokens: int = 256, pin_prefix: str = "",
                 log: BinaryIO | None = None, timeout: float = 300.0):
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r} (known: {', '.join(POLICIES)})")
        if len(replicas) < 2:
            raise ValueError("a router needs at least two replicas")
        if policy == "pin" and not pin_prefix:
            raise ValueError("the pin policy needs --pin-prefix")
        self.replicas = [r.rstrip("/") for r in replicas]
        self.policy, self.prefix_tokens, self.pin_prefix = policy, prefix_tokens, pin_prefix
        self.timeout = timeout
        self.log = log
        self._lock = threading.Lock()
        self._next = 0
        self.routed = 0
        self.per_replica = [0] * len(replicas)
        self.fallbacks = 0
        self.server: ThreadingHTTPServer | None = None

    # -- routing ---------------------------------------------------------------------------
    def _round_robin(self, among: range) -> int:
        with self._lock:
            k = self._next
            self._next += 1
        return among[k % len(among)]

    def _token_ids(self, body: dict[str, Any]) -> list[int] | None:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return prompt
        tok: dict[str, Any] = {"model": body.get("model")}
        if "messages" in body:
            tok.update(messages=body["messages"], add_generation_prompt=True)
            for key in ("tools", "chat_template_kwargs", "add_generation_prompt", "continue_final_message"):
                if key in body:
                    tok[key] = body[key]
        elif isinstance(prompt, str):
            tok["prompt"] = prompt
        else:
            return None
        status, out, _ = _post(self.replicas[0] + "/tokenize", json.dumps(tok).encode(), self.timeout)
        if status != 200:
            return None
        ids = json.loads(out).get("tokens")
        return ids if isinstance(ids, list) else None

    def choose(self, body: dict[str, Any]) -> tuple[int, bool]:
        """(replica index, whether the prefix policy fell back to characters)."""
        n = len(self.replicas)
        if self.policy == "round-robin":
            return self._round_robin(range(n)), False
        if self.policy == "pin":
            if prompt_text(body).startswith(self.pin_prefix):
                return 0, False
            return self._round_robin(range(1, n)), False
        ids = self._token_ids(body)
        if ids is None:
            return zlib.crc32(prompt_text(body)[:self.prefix_tokens].encode()) % n, True
        return zlib.crc32(array("I", ids[:self.prefix_tokens]).tobytes()) % n, False

    # -- HTTP ------------------------------------------------------------------------------
    def handle_post(self, path: str, raw: bytes) -> tuple[int, bytes, str]:
        if path == "/reset_prefix_cache":
            results = [_post(r + path, raw, self.timeout) for r in self.replicas]
            worst = max(results, key=lambda x: x[0])
            return worst[0], worst[1], worst[2]
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return 400, b'{"error": "request body is not JSON"}', "application/json"
        if not isinstance(body, dict):
            return 400, b'{"error": "request body is not a JSON object"}', "application/json"
        replica, fallback = self.choose(body)
        status, out, ctype = _post(self.replicas[replica] + path, raw, self.timeout)
        usage: dict[str, Any] = {}
        if status == 200:
            try:
                usage = json.loads(out).get("usage") or {}
            except ValueError:
                pass
        with self._lock:
            self.routed += 1
            self.per_replica[replica] += 1
            self.fallbacks += fallback
            line = {"n": self.routed, "path": path, "replica": replica, "status": status,
                    "prompt_tokens": usage.get("prompt_tokens"),
                    "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
                    "fallback": fallback}
            if self.log is not None:
                self.log.write((json.dumps(line) + "\n").encode())
                self.log.flush()
        return status, out, ctype

    def start(self, port: int = 0) -> str:
        router = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, out, ctype = router.handle_post(self.path, raw)
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def do_GET(self) -> None:  # noqa: N802 - /v1/models and the like: replica 0 answers
                try:
                    with urllib.request.urlopen(router.replicas[0] + self.path, timeout=router.timeout) as r:
                        status, out = r.status, r.read()
                except urllib.error.HTTPError as e:
                    status, out = e.code, e.read()
                self.send_response(status)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replica", action="append", required=True, help="a vLLM server's base URL (repeat)")
    ap.add_argument("--policy", choices=POLICIES, default="round-robin")
    ap.add_argument("--prefix-tokens", type=int, default=256,
                    help="tokens hashed by the prefix policy (cachemon analyze: 2 blocks of 128 on CPU)")
    ap.add_argument("--pin-prefix", default="", help="the pin policy's shared prompt prefix")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--log", default="", help="append one JSON line per routed request here")
    args = ap.parse_args()
    log = open(args.log, "ab") if args.log else None
    try:
        r = Router(args.replica, args.policy, args.prefix_tokens, args.pin_prefix, log)
    except ValueError as e:
        sys.exit(f"router: {e}")
    print(r.start(args.port), flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        r.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
