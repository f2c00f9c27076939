"""SIGTERM while busy ends every command within a few seconds, with state saved.

- run: tailing a 60 MB log from its beginning while its one upstream hangs; it shuts down (rc 0)
  and the state file holds offsets past the last save made before the signal, consistent with the
  counters (a restart reads on from there).
- demo: stops as on Ctrl-C (rc 0, "(stopped)").
- check, warmup: waiting on an upstream that hangs: one line and exit code 143 (128 + SIGTERM).
- analyze: busy on 300 000 requests. It holds no state: the default disposition ends it at once (-SIGTERM).
The log and the requests are CONSTRUCTED (a gateway-style line; chat requests of one template).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cachemon.demo.replay import ReplayServer, bundled_pages
from cachemon.sources.logs import statefile
from helpers import free_port, wait_until

CLI = [sys.executable, "-m", "cachemon.cli"]
GRACE = 5.0


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _term(proc: subprocess.Popen) -> tuple[float, int]:
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(GRACE * 3)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        return float("inf"), -9
    return time.monotonic() - t0, rc


def _offsets(state: Path) -> int:
    payload = statefile.load(state) or {}
    return sum(f["offset"] for s in payload.get("sources", {}).values() for f in s["files"])


def _busy_run(tmp: Path, hang_url: str) -> dict:
    log = tmp / "big.log"
    block = "".join(f"2026-12-02T07:00:00.{i:06d}Z INFO gateway model=m cache_hit=3 cache_miss=1\n"
                    for i in range(10_000)).encode()
    with open(log, "wb") as f:
        for _ in range(80):               # ~60 MB: seconds of tailing
            f.write(block)
    cfg = tmp / "c.yaml"
    cfg.write_text("logs:\n  save_interval: 1s\n  rules:\n    - regex: 'cache_hit=(?P<h>\\d+) cache_miss=(?P<m>\\d+)'\n"
                   "      counters: {hit_tokens: h, miss_tokens: m}\n")
    state = tmp / "state.json"
    proc = subprocess.Popen(CLI + ["run", "--listen", f"127.0.0.1:{free_port()}", "--config", str(cfg),
                                   "--upstream", f"hang={hang_url}", "--log-file", str(log), "--from-beginning",
                                   "--state-file", str(state)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    assert wait_until(lambda: state.exists() and _offsets(state) > 0, 30), "no first save"
    before = _offsets(state)
    took, rc = _term(proc)
    after = _offsets(state)
    payload = statefile.load(state)
    hits = sum(c[2] for s in payload["sources"].values() for c in s["stream"]["counters"] if "hit" in c[0])
    lines = len(block.splitlines()) * 80
    return {"took": took, "rc": rc, "before": before, "after": after, "size": log.stat().st_size,
            "hits": hits, "lines_per_byte": lines / log.stat().st_size, "stderr": proc.stderr.read()}


@pytest.mark.slow
def test_sigterm_while_busy_ends_every_command_within_seconds(tmp_path):
    results = {}
    with ReplayServer(bundled_pages()) as hang:
        hang.set_fault("hang")
        # run: tailing and polling a hanging upstream
        r = _busy_run(tmp_path, hang.url)
        results["run"] = (r["took"], r["rc"])
        assert r["rc"] == 0 and "Traceback" not in r["stderr"], r["stderr"][-2000:]
        assert r["before"] <= r["after"] <= r["size"]          # saved at the signal, never past the file
        # the counters saved match the offset saved: 3 hit tokens a line, whole lines only
        line_len = r["size"] // (10_000 * 80)
        assert r["after"] % line_len == 0 and r["hits"] == 3 * (r["after"] // line_len), r

        # check and warmup: waiting on the upstream
        for name, args in (("check", ["check", "--upstream", hang.url, "--timeout", "60s"]),
                           ("warmup", ["warmup", "--api", hang.base_url, "--prompts", str(_prompts(tmp_path)),
                                       "--timeout", "60s", "--force"])):
            seen = hang.requests
            proc = subprocess.Popen(CLI + args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            assert wait_until(lambda: hang.requests > seen, 30), f"{name} never reached the upstream"   # noqa: B023
            results[name] = _term(proc)

    # demo: replaying, then stopped
    demo = subprocess.Popen(CLI + ["demo", "--listen", f"127.0.0.1:{free_port()}",
                                   "--vllm-listen", f"127.0.0.1:{free_port()}", "--dwell", "1s"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert "cachemon demo" in demo.stdout.readline()
    banner = []                              # the banner ends with where its metrics are
    while len(banner) < 8 and not any("cachemon metrics" in line for line in banner):
        banner.append(demo.stdout.readline())
    assert "cachemon metrics" in banner[-1], banner
    results["demo"] = _term(demo)
    assert "(stopped)" in demo.stdout.read()

    # analyze: busy on a large request file
    reqs = tmp_path / "requests.jsonl"
    with open(reqs, "w") as f:
        for i in range(300_000):
            f.write(json.dumps({"model": "m", "messages": [{"role": "system", "content": "You are helpful. " * 8},
                                                          {"role": "user", "content": f"question {i}"}]}) + "\n")
    proc = subprocess.Popen(CLI + ["analyze", str(reqs)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert wait_until(lambda: _cpu_seconds(proc.pid) > 1.0 or proc.poll() is not None, 60)
    assert proc.poll() is None, "analyze finished before it could be signalled: give it more requests"
    results["analyze"] = _term(proc)

    print("SIGTERM -> exit (seconds, rc):", {k: (round(v[0], 2), v[1]) for k, v in results.items()})
    slow = {k: v for k, v in results.items() if v[0] > GRACE}
    assert not slow, results
    assert results["demo"][1] == 0
    for k in ("check", "warmup"):
        assert results[k][1] == 128 + signal.SIGTERM, results
    assert results["analyze"][1] in (-signal.SIGTERM, 128 + signal.SIGTERM), results


def _prompts(tmp: Path) -> Path:
    p = tmp / "prompts.jsonl"
    p.write_text(json.dumps({"model": "tiny", "messages": [{"role": "system", "content": "stable prefix"}]}) + "\n")
    return p
