"""The golden whole page: cachemon's entire /metrics after polling the recorded vLLM captures and one
constructed page sequence of each other engine (SGLang, MindIE).

The very Daemon `cachemon run` builds (its registry: every stage's collector) polls one replay
server per capture of a vLLM release, page by page in traffic order, the last page three times (so
the one-page-behind miss counter settles), on a fixed clock. What depends on the machine or the run
(durations, the process_* metrics, timestamps, the build's revision and Python) is set to a
placeholder, so the file changes only when the exported surface does.

Regenerate: `make golden` (python tests/golden_page.py --write); review the diff like code.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures"
GOLDEN = HERE / "golden" / "whole-page.prom"
# (upstream, capture directory, the version its /version answers: None where the release had none)
CAPTURES = [("v0-0.8.5", "vllm-0.8.5-cpu-v0", "0.8.5"), ("v1-0.10.2", "vllm-0.10.2-cpu", "0.10.2"),
            ("v1-0.11.2", "vllm-0.11.2-cpu", "0.11.2"), ("v1-0.32.0", "vllm-0.32.0-cpu", "0.32.0"),
            # one of each other engine (engines.ENGINES): constructed pages, a restart between p1 and p2
            ("sglang-0.5.23", "sglang-constructed", None), ("mindie", "mindie-constructed", None)]
T0, STEP = 1_800_000_000.0, 15.0
HEADER = ("# cachemon golden page (tests/golden_page.py): cachemon's /metrics after polling the recorded\n"
          "# vLLM captures; durations, timestamps, process_* and build details are placeholders (0 / \"x\").\n")
_VOLATILE = re.compile(r"^((?:process_\w+|\w+_seconds(?:_total)?)(?:\{[^}]*\})?) \S+$")
_BUILD = re.compile(r'(cachemon_build_info\{version="[^"]*",revision=")[^"]*(",python_version=")[^"]*(")')


def whole_page() -> str:
    """The raw page (values as served)."""
    from cachemon.daemon import Daemon
    from cachemon.demo.replay import DEMO_SCENARIOS, ReplayServer
    from cachemon.runconfig import from_dict

    servers = []
    try:
        for _, capture, version in CAPTURES:
            pages = [(s, (FIXTURES / capture / f"metrics-{s}.txt").read_text()) for s in DEMO_SCENARIOS
                     if (FIXTURES / capture / f"metrics-{s}.txt").exists()]
            # a constructed engine's pages: metrics-p<process>-t<step>.txt, in order
            pages = pages or [(f.stem, f.read_text()) for f in sorted((FIXTURES / capture).glob("metrics-p*-t*.txt"))]
            servers.append(ReplayServer(pages, version=version).start())
        daemon = Daemon(from_dict({"upstreams": [{"name": name, "url": srv.url}
                                                 for (name, _, _), srv in zip(CAPTURES, servers, strict=True)]}))
        try:
            now = [T0]
            for p in daemon.pollers:
                p.clock = lambda: now[0]
            for i in range(max(len(s.pages) for s in servers) + 2):
                for srv, p in zip(servers, daemon.pollers, strict=True):
                    srv.show(min(i, len(srv.pages) - 1))
                    p.poll_once()
                now[0] += STEP
            return daemon.registry.render().decode()
        finally:
            daemon.shutdown()
    finally:
        for srv in servers:
            srv.stop()


def normalised(page: str) -> str:
    out = []
    for line in page.splitlines():
        m = _VOLATILE.match(line)
        if m:
            line = f"{m.group(1)} 0"
        line = _BUILD.sub(r'\1x\2x\3', line)
        out.append(line)
    return HEADER + "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    text = normalised(whole_page())
    if sys.argv[1:] == ["--write"]:
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(text)
        print(f"wrote {GOLDEN} ({len(text.splitlines())} lines)")
    else:
        sys.stdout.write(text)
