#!/usr/bin/env python3
"""Seeded before/after equivalence of `cachemon run`'s stages: identical snapshots, verdicts and pages.

CONSTRUCTED traffic: the pages are the real vLLM 0.32.0 CPU capture
(tests/fixtures/vllm-0.32.0-cpu/metrics-static-system-prompt.txt) with its prefix-cache counters,
prompt-length histogram and process start time rewritten by a seeded random walk (requests, restarts,
hit collapses that recover, model and version changes), served by two local HTTP servers; the log is
the capture's own stats and reset lines (server.log), appended on a seeded schedule.

Everything runs on one thread with one injected clock: a tick polls each upstream, reads the log,
samples change detection (and checks metadata every 15 ticks, or at once after a restart), evaluates
attribution, and renders /metrics. Written per tick: every ModelSnapshot the builder returned, every
Attribution, and the /metrics page without the lines that depend on the wall clock or on timing
(durations, process_*, log stats age). Then, per seed, `cachemon check`'s reports (run_checks) of the
first upstream and the log, read twice 30 s apart with traffic and a logged reset between the reads.
A snapshot's ``events`` are written as the engine reads them
(judge/attribute.py: the events within the lookback, newest per (kind, detail)).

    python scripts/equivalence.py --seeds 20 --ticks 300 --records out.jsonl   # on each tree, then cmp
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import random
import re
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CAPTURE = ROOT / "tests" / "fixtures" / "vllm-0.32.0-cpu"
T0 = 1_800_000_000.0
STEP = 2.0
VOLATILE = re.compile(r"^(process_|cachemon_stage_collect_duration|cachemon_upstream_scrape_duration|"
                      r"cachemon_log_stats_age|python_|cachemon_build_info)")
LES = ("1.0", "8.0", "16.0", "32.0", "64.0", "128.0", "256.0", "512.0", "1024.0", "2048.0", "4096.0", "+Inf")


class Vllm:
    """One constructed vLLM process behind a real HTTP server: counters that only the walk moves."""

    def __init__(self, rng: random.Random, template: str) -> None:
        self.rng, self.template = rng, template
        self.q = self.h = 0.0
        self.requests = 0
        self.start = T0 - 600.0
        self.version = "0.32.0"
        self.models = ["tiny"]
        self.collapse = 0        # ticks left of a hit collapse (a cache reset)
        self.asked: dict[str, int] = {}     # requests by path (reported on stderr, not recorded)
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/metrics"

    def tick(self, t: float) -> None:
        r = self.rng.random()
        with self.lock:
            if r < 0.01:
                self.q = self.h = 0.0
                self.requests = 0
                self.start = t - 1.0
                if self.rng.random() < 0.5:
                    self.version = f"0.32.{self.rng.randint(1, 9)}"
            elif r < 0.02:
                self.collapse = self.rng.randint(1, 3)
            elif r < 0.025:
                self.models = [self.rng.choice(["tiny", "tiny-v2"])]
            n = self.rng.choice([0, 0, 1, 2, 3, 5])
            for _ in range(n):
                prompt = 831.0
                hit = 0.0 if self.collapse else self.rng.choice([768.0, 768.0, 640.0, 0.0])
                self.q += prompt
                self.h += hit
                self.requests += 1
            self.collapse = max(0, self.collapse - 1)

    def page(self) -> str:
        with self.lock:
            q, h, start, reqs = self.q, self.h, self.start, self.requests
        out = []
        for line in self.template.splitlines():
            if line.startswith("process_start_time_seconds "):
                line = f"process_start_time_seconds {start}"
            elif line.startswith("vllm:prefix_cache_queries_total{"):
                line = f'{line.rsplit(" ", 1)[0]} {q}'
            elif line.startswith("vllm:prefix_cache_hits_total{"):
                line = f'{line.rsplit(" ", 1)[0]} {h}'
            elif line.startswith("vllm:request_prompt_tokens_bucket{"):
                le = re.search(r'le="([^"]+)"', line)
                v = reqs if le and (le.group(1) == "+Inf" or float(le.group(1)) >= 831.0) else 0
                line = f'{line.rsplit(" ", 1)[0]} {float(v)}'
            elif line.startswith(("vllm:request_prompt_tokens_count{", "vllm:request_success_total{")):
                line = f'{line.rsplit(" ", 1)[0]} {float(reqs)}'
            elif "_created{" in line and line.startswith("vllm:"):
                line = f'{line.rsplit(" ", 1)[0]} {start + 0.5}'
            out.append(line)
        return "\n".join(out) + "\n"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        vllm = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                pass

            def do_GET(self) -> None:
                with vllm.lock:
                    vllm.asked[self.path] = vllm.asked.get(self.path, 0) + 1
                if self.path.startswith("/metrics"):
                    body, ctype = vllm.page(), "text/plain; version=0.0.4"
                elif self.path == "/version":
                    body, ctype = json.dumps({"version": vllm.version}), "application/json"
                elif self.path == "/v1/models":
                    body = json.dumps({"object": "list", "data": [
                        {"id": m, "object": "model", "root": f"/models/{m}", "max_model_len": 4096}
                        for m in vllm.models]})
                    ctype = "application/json"
                else:
                    self.send_error(404)
                    return
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler


def plain(x: Any) -> Any:
    """A JSON-able copy of a snapshot or verdict (dataclasses, tuples, floats as repr)."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, dict):
        return {str(k): plain(v) for k, v in sorted(x.items(), key=lambda kv: str(kv[0]))}
    if isinstance(x, (list, tuple, frozenset, set)):
        items = [plain(v) for v in x]
        return sorted(items, key=json.dumps) if isinstance(x, (frozenset, set)) else items
    if isinstance(x, float):
        return repr(x)
    if hasattr(x, "value") and isinstance(x.value, str):   # an Enum with a str value
        return x.value
    return x


def engine_events(events: Any, now: float, lookback: float) -> list[list[Any]]:
    """A snapshot's events as the engine reads them: within the lookback, the newest of each (kind, detail)."""
    newest: dict[tuple[str, str], float] = {}
    for e in events:
        kind = getattr(e.kind, "value", e.kind)
        if now - e.at <= lookback:
            newest[(kind, e.detail)] = max(newest.get((kind, e.detail), e.at), e.at)
    return [[k, d, repr(at)] for (k, d), at in sorted(newest.items())]


def run_check(vllms: list[Vllm], cfg: Any, t: float, rng: random.Random, log_path: Path, reset: str,
              stats: list[str]) -> list[Any]:
    """`cachemon check` of the first upstream and the log, read twice 30 s apart (the clock injected),
    with traffic, a stats line and a reset line between the two reads: its reports, verdicts included."""
    from cachemon.check import run_checks
    now = [t]

    def sleep(seconds: float) -> None:
        for _ in range(int(seconds // STEP)):
            now[0] += STEP
            for v in vllms:
                v.tick(now[0])
        with log_path.open("a") as f:
            f.write(rng.choice(stats) + "\n" + reset + "\n")

    reports = run_checks(cfg.upstreams[:1], 30.0, {}, logs=cfg.logs, sleep=sleep, clock=lambda: now[0])
    text = json.dumps(reports, default=str).replace(vllms[0].url, "URL").replace(str(log_path.parent), "TMP")
    return list(json.loads(text))


def run(seed: int, ticks: int, tmp: Path, out: Any) -> str:
    from cachemon.daemon import Daemon
    from cachemon.runconfig import from_dict

    rng = random.Random(seed)
    template = (CAPTURE / "metrics-static-system-prompt.txt").read_text()
    lines = (CAPTURE / "server.log").read_text().splitlines()
    stats = [ln for ln in lines if "Prefix cache hit rate" in ln]
    reset = next(ln for ln in lines if "reset prefix cache" in ln.lower() and "Successfully" in ln) \
        if any("Successfully reset prefix cache" in ln for ln in lines) else \
        "(APIServer pid=22255) INFO 11-29 15:56:46 [block_pool.py:300] Successfully reset prefix cache"
    vllms = [Vllm(random.Random(rng.random()), template) for _ in range(2)]
    log_path = tmp / f"vllm-{seed}.log"
    log_path.write_text("")
    cfg = from_dict({
        "upstreams": [{"name": f"u{i}", "url": v.url} for i, v in enumerate(vllms)],
        "poll_interval": "2s", "listen": {"address": "127.0.0.1", "port": 0},
        "events": {"interval": "1h"},
        "logs": {"files": [{"path": str(log_path), "name": "log0", "upstream": "u0", "model_name": "tiny"}],
                 "state_file": "", "watch_events": False, "from_beginning": True},
        "cost": {"per_million_tokens": {"uncached_input": 3.0, "cached_input": 0.3, "output": 15.0}},
    })
    d = Daemon(cfg)
    clock = [T0]
    comps, built = _wire(d, clock)
    changes = comps["ChangeDetector"]
    attributor = comps["AttributionStage"].attributor
    lookback = attributor.settings.lookback
    digest = hashlib.sha256()
    try:
        for i in range(ticks):
            clock[0] = T0 + i * STEP
            for v in vllms:
                v.tick(clock[0])
            if rng.random() < 0.3:
                with log_path.open("a") as f:
                    f.write(rng.choice(stats) + "\n")
                    if rng.random() < 0.08:
                        f.write(reset + "\n")
            for p in d.pollers:
                p.poll_once()
            comps["LogSource"].poll()
            changes.sample()
            if i % 15 == 0 or changes._recheck.is_set():
                changes._recheck.clear()
                changes.check_metadata()
            built.clear()
            results = attributor.evaluate(clock[0])
            snaps = []
            for s in built:
                row = plain(s)
                row["events"] = engine_events(s.events, s.now, lookback)
                snaps.append(row)
            page = [ln.replace(str(tmp), "TMP") for ln in d.registry.render().decode().splitlines()
                    if not ln.startswith("#") and not VOLATILE.match(ln)]
            rec = {"seed": seed, "tick": i, "snapshots": snaps, "verdicts": plain(results), "page": page}
            text = json.dumps(rec, sort_keys=True)
            digest.update(text.encode())
            if out is not None:
                out.write(text + "\n")
        check = run_check(vllms, cfg, clock[0], rng, log_path, reset, stats)
        text = json.dumps({"seed": seed, "check": check}, sort_keys=True)
        digest.update(text.encode())
        if out is not None:
            out.write(text + "\n")
    finally:
        _close(seed, vllms, d)
    return digest.hexdigest()


def _wire(d: Any, clock: list[float]) -> tuple[dict[str, Any], list[Any]]:
    """The daemon's stages on the seeded clock, and the list every snapshot the attributor builds goes to."""
    def now() -> float:
        return clock[0]

    comps = {type(c).__name__: c for c in d.components}
    for p in d.pollers:
        p.clock = now
    comps["LogSource"].clock = now
    comps["ChangeDetector"].clock = now
    builder = comps["AttributionStage"].attributor.builder
    built: list[Any] = []
    build = builder.build

    def recording_build(*args: Any, **kwargs: Any) -> Any:
        snaps = build(*args, **kwargs)
        built.extend(snaps)
        return snaps

    builder.build = recording_build
    return comps, built


def _close(seed: int, vllms: list[Any], d: Any) -> None:
    asked: dict[str, int] = {}
    for v in vllms:
        for path, n in v.asked.items():
            asked[path] = asked.get(path, 0) + n
    print(f"# seed {seed} requests {json.dumps(asked, sort_keys=True)}", file=sys.stderr)
    for v in vllms:
        v.server.shutdown()
        v.server.server_close()
    d.shutdown()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--ticks", type=int, default=300)
    ap.add_argument("--records", help="write every tick's record (JSON lines) here")
    a = ap.parse_args()
    import cachemon
    logging.disable(logging.CRITICAL)     # the stages' warnings are not the record
    print(f"# cachemon from {Path(cachemon.__file__).parent}", file=sys.stderr)
    out = open(a.records, "w") if a.records else None   # noqa: SIM115
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for seed in range(a.seeds):
                print(f"seed {seed} {run(seed, a.ticks, Path(tmp), out)}")
    finally:
        if out is not None:
            out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
