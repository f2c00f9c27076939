"""`make demo-stack` (scripts/demo_stack.py) with the Debian Prometheus and Alertmanager.

One run, played 15 times as fast (``--time-scale 0.0667``: the demo's phases AND copies of the rules'
windows and ``for:`` are scaled, the script's documented test mode; the 5m window is 20 s, ``for: 5m``
is 20 s), and on it:

- the shipped critical hit-ratio alert reaches examples/alertmanager.yml's webhook receiver during
  the timestamp phase, naming the phase's real cause (dynamic_prefix), not a restart; at full speed
  the same run fires about 7 minutes into the phase (docs/demo.md);
- every panel query of every shipped dashboard returns data from the real Prometheus, except the
  few listed in EMPTY_ON_THE_DEMO, each with the reason checked on cachemon's own page;
- the overview is drawn from that data by headless Chromium (scripts/render_dashboards.py) into
  docs/images/, the pictures the README shows (with CACHEMON_UPDATE_IMAGES=1: `make screenshots`;
  otherwise into a temp dir, checked the same way).
"""
from __future__ import annotations

import importlib.util
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from helpers import eventually, free_port, require_binary

ROOT = Path(__file__).resolve().parents[1]
SCALE = 1 / 15
# The README's pictures are rewritten only when asked (`make screenshots`): a test run must not leave the
# checkout modified (the legends carry the run's random ports). Otherwise they are drawn into a temp dir
# and checked all the same.
IMAGES = ROOT / "docs" / "images"
UPDATE_IMAGES = os.environ.get("CACHEMON_UPDATE_IMAGES") == "1"
# panel title -> (why it is empty on the demo, a sample of cachemon's page that shows the reason)
EMPTY_ON_THE_DEMO = {
    "KV block lifetime": ("needs evictions (BlockRemoved events): the demo's KV pool never fills",
                          'cachemon_kv_events_total{upstream="demo",type="removed"} 0.0'),
    "External (KV-connector) cache hit ratio": ("needs a KV connector (LMCache, NIXL): the demo has none",
        'cachemon_prefix_cache_query_tokens_total{upstream="demo",model_name="tiny",engine="0",cache="external"} 0.0'),
    "Hit ratio as vLLM reports it (V0, logs)": ("needs a V0 vLLM or a log source: the demo is V1 by /metrics",
                                                'era="v1-prefix-cache"'),
    "Last poll error": ("needs a failed poll: the demo's vLLM never fails", None),
    "Log lines per second by outcome": ("needs a log source (log_paths)", None),
    "Age of the last stats line": ("needs a log source (log_paths)", None),
    "Log files open, rotations and truncations": ("needs a log source (log_paths)", None),
}
# The fleet's "Router vs engine" row reads a router's page (`routers:`): the demo runs no router.
EMPTY_ON_THE_DEMO.update({title: ("needs a prefix-aware router (`routers:`): the demo has none", None)
                          for title in ("Router prefix decisions", "Requests per upstream by router",
                                        "Routing misses by router policy", "Router causes")})
# The tenant row draws named tenants and adapters only: the demo's requests carry no cache_salt or LoRA
# adapter, so its ledger has only the unnamed tenant (the server's total, drawn by the panels above).
EMPTY_ON_THE_DEMO.update({title: ("needs a cache_salt or a LoRA adapter: the demo sends neither", 'tenant="",adapter=""')
                          for title in ("Missed tokens by tenant", "Missed tokens by adapter",
                                        "Isolation cost by tenant and adapter", "Missed tokens by tenant and reason",
                                        "Hit ratio by tenant (full-report requests)")})


def _render():
    spec = importlib.util.spec_from_file_location("render_dashboards", ROOT / "scripts" / "render_dashboards.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Stack:
    def __init__(self):
        self.ports = dict(zip(("cachemon", "vllm", "prometheus", "alertmanager", "webhook"),
                              (free_port() for _ in range(5)), strict=True))
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "scripts" / "demo_stack.py"), f"--time-scale={SCALE}",
             *(f"--{k}-port={v}" for k, v in self.ports.items()), "--duration=300"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: queue.Queue[tuple[float, str]] = queue.Queue()
        self.seen: list[tuple[float, str]] = []
        self.started = time.time()
        threading.Thread(target=lambda: [self.lines.put((time.monotonic(), ln)) for ln in self.proc.stdout],
                         daemon=True).start()

    def eventually(self, pattern: str, timeout: float, nth: int = 1) -> tuple[float, str]:
        """The ``nth`` output line matching ``pattern`` (already seen or within ``timeout``)."""
        found = [(t, ln) for t, ln in self.seen if re.search(pattern, ln)]
        deadline = time.monotonic() + timeout
        while len(found) < nth and time.monotonic() < deadline:
            try:
                t, ln = self.lines.get(timeout=0.5)
            except queue.Empty:
                continue
            self.seen.append((t, ln))
            if re.search(pattern, ln):
                found.append((t, ln))
        if len(found) >= nth:
            return found[nth - 1]
        raise AssertionError(f"no line matching {pattern!r} in {timeout}s:\n" + "".join(x for _, x in self.seen))

    def stop(self):
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def stack():
    require_binary("prometheus", "prometheus")
    require_binary("alertmanager", "prometheus-alertmanager", "prometheus-alertmanager")
    s = Stack()
    try:
        s.eventually(r"^demo-stack: where to look", 30)
        yield s
    finally:
        s.stop()


@pytest.mark.slow
@pytest.mark.alertmanager
def test_the_critical_alert_reaches_the_webhook_in_the_timestamp_phase_with_its_cause(stack):
    # the static phase's line is printed when it ends: the timestamp phase starts then
    t_phase, _ = stack.eventually(r"^(?:\d\d:\d\d:\d\d )?\[2/4 static-system-prompt\]", 60)
    t_alert, alert = stack.eventually(r"^NOTIFICATION firing: CachemonPrefixCacheHitRatioLow \(critical\)", 60)
    # the timestamp phase's line: printed at its collapse (with "What next"), then again when it ends
    t_end, _ = stack.eventually(r"^(?:\d\d:\d\d:\d\d )?\[3/4 timestamp-in-system-prompt\]", 60, nth=2)
    # fired within the timestamp phase, after its (scaled) `for:` held, near the documented time
    into = (t_alert - t_phase) / SCALE / 60
    print(f"critical notification {into:.1f} min (scaled back) into the timestamp phase")
    assert t_alert < t_end
    assert 5.0 <= into <= 8.5, into
    assert "Active cause(s): dynamic_prefix" in alert and "restart" not in alert


@pytest.mark.slow
@pytest.mark.alertmanager
def test_every_panel_has_data_on_the_demo_and_the_overview_is_drawn(stack, tmp_path):
    # the whole story: static, timestamp, request ID, and back to static, hits again
    stack.eventually(r"^(?:\d\d:\d\d:\d\d )?\[4/4 request-id-at-head\]", 150)
    render = _render()
    prom = f"http://127.0.0.1:{stack.ports['prometheus']}"
    ratio = ('sum(rate(cachemon_prefix_cache_hit_tokens_total{cache="local"}[4s])) / '
             'sum(rate(cachemon_prefix_cache_query_tokens_total{cache="local"}[4s]))')
    def recovered() -> bool:
        now = time.time()
        got = render.query_range(prom, ratio, now - 6, now, 1)     # hits again for 6 s running
        assert got and len(got[0]["values"]) >= 6 and all(float(v) > 0.8 for _, v in got[0]["values"]), got
        return True
    eventually(recovered, 30, "the hit ratio recovered in round 2", interval=0.5)
    page = urllib.request.urlopen(f"http://127.0.0.1:{stack.ports['cachemon']}/metrics", timeout=10).read().decode()
    end = time.time()
    minutes = (end - stack.started) / 60
    with_data, empty, says, queries, unreadable = [], [], {}, [0, 0], []
    for name in ("cachemon-overview", "cachemon-fleet", "cachemon-exporter"):
        data = render.panel_data(prom, render.load(name), end - minutes * 60, end, 1.0, 1.0)
        for p in data:
            if p["type"] != "row":
                (with_data if p["series"] else empty).append(p["title"])
                says[p["title"]] = p["description"]
                queries[0] += p["queries"]
                queries[1] += p["answered"]
                # drawn as Grafana draws it: several series in one colour, or a nameless one, cannot be read
                unreadable += [m for m in render.problems(p) if p["series"]]
    print(f"\n{len(with_data)} panels with data, {len(empty)} empty: {empty}; "
          f"{queries[1]} of {queries[0]} panel queries answered")
    unexpected = [t for t in empty if t not in EMPTY_ON_THE_DEMO]
    assert not unexpected, f"panels with no data on the demo: {unexpected}"
    assert not unreadable, unreadable
    # the figure docs/demo.md states (its denominator and the panel counts: tests/test_doc_counts.py)
    assert f"panel queries with data on the demo: {queries[1]} of {queries[0]}," in \
        (ROOT / "docs" / "demo.md").read_text(encoding="utf-8"), queries
    for title in empty:
        # the panel itself tells a reader why it may be empty
        assert re.search(r"Needs|[Ee]mpty", says[title]), (title, says[title])
        shows = EMPTY_ON_THE_DEMO[title][1]
        if shows:
            assert shows in page, (title, shows)
    # the pictures: the whole overview, and the story (ratio -> where the misses go -> why)
    images = IMAGES if UPDATE_IMAGES else tmp_path
    render.render(prom, "cachemon-overview", images / "overview.png", minutes, 1.0, end=end)
    render.render(prom, "cachemon-overview", images / "overview-story.png", minutes, 1.0, end=end, panels_only=[
        "Prefix-cache hit ratio", "Query tokens per second", "Estimated cost-saving factor", "Hit tokens per day",
        "Hit ratio per instance", "Hit vs miss tokens per second", "Where the misses go", "Missed tokens by cause",
        "Why: active causes"])
    render.render(prom, "cachemon-fleet", images / "fleet.png", minutes, 1.0, end=end)
    for name in ("overview.png", "overview-story.png", "fleet.png"):
        assert (images / name).stat().st_size > 20_000 and (images / name).stat().st_mtime >= end - 1


@pytest.mark.slow
@pytest.mark.alertmanager
def test_the_example_alertmanager_config_is_valid_and_pages_on_critical():
    amtool = require_binary("amtool", "prometheus-alertmanager")
    cfg = str(ROOT / "examples" / "alertmanager.yml")
    r = subprocess.run([amtool, "check-config", cfg], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([amtool, "config", "routes", "test", f"--config.file={cfg}", "severity=critical",
                        "alertname=CachemonPrefixCacheHitRatioLow"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "cachemon-webhook", r.stdout + r.stderr
