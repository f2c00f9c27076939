"""Test helpers shared across test modules: fixture paths, a real `cachemon run` subprocess, scraping."""
from __future__ import annotations

import math
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

FIXTURES = Path(__file__).resolve().parent / "fixtures"
REAL_032 = FIXTURES / "vllm-0.32.0-cpu"


def read_fixture(rel: str) -> str:
    return (FIXTURES / rel).read_text(encoding="utf-8")


def self_signed_cert(d: Path) -> Path:
    """A self-signed certificate for 127.0.0.1 made by openssl: d/c.pem and d/k.pem."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(d / "k.pem"), "-out", str(d / "c.pem")],
                   check=True, capture_output=True, timeout=60)
    return d


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def samples(text: str, parser=text_string_to_metric_families) -> dict[tuple[str, tuple], float]:
    """Parse an exposition with prometheus_client's own parser (text format by default; pass the
    OpenMetrics parser for OpenMetrics): {(sample name, sorted labels): value}."""
    out = {}
    for fam in parser(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(parsed: dict, name: str, **labels) -> float | None:
    """The one sample of `name` whose labels include `labels` (None if absent)."""
    hits = [v for (n, ls), v in parsed.items() if n == name and all(dict(ls).get(k) == w for k, w in labels.items())]
    assert len(hits) <= 1, f"{name} {labels}: {len(hits)} samples match"
    return hits[0] if hits else None


class CachemonProcess:
    """`cachemon run` as a real subprocess on an ephemeral port."""

    def __init__(self, *args: str, env: dict | None = None):
        self.port = free_port()
        cmd = [sys.executable, "-m", "cachemon.cli", "run", "--listen", f"127.0.0.1:{self.port}", *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=dict(os.environ, **(env or {})))
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"cachemon exited {self.proc.returncode}: {self.proc.stdout.read()}")
            try:
                requests.get(self.url, timeout=1)
                return
            except requests.RequestException:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("cachemon did not start listening within 20 s")

    def scrape(self) -> dict:
        r = requests.get(self.url, timeout=5)
        r.raise_for_status()
        return samples(r.text)

    def text(self) -> str:
        return requests.get(self.url, timeout=5).text

    def wait_for(self, predicate, timeout: float = 15.0, interval: float = 0.1):
        """Scrape until predicate(parsed) is truthy; return the last parse (assert on it)."""
        deadline = time.monotonic() + timeout
        parsed = self.scrape()
        while not predicate(parsed) and time.monotonic() < deadline:
            time.sleep(interval)
            parsed = self.scrape()
        return parsed

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.stdout.read() if self.proc.stdout else ""


class NotReached(AssertionError):
    """The awaited state did not come within the timeout."""


def eventually(check, timeout: float = 10.0, what: str = "", interval: float = 0.02, ignore=()):
    """The one way tests wait for a state (never a bare sleep): call ``check`` until it returns a
    truthy value (returned) without raising AssertionError (or one of ``ignore``); raise NotReached
    after ``timeout`` seconds, saying what was awaited and the last value or error."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except (AssertionError, *ignore) as e:
            last = e
        else:
            if value:
                return value
            last = value
        if time.monotonic() >= deadline:
            raise NotReached(f"not reached within {timeout:g}s: {what or getattr(check, '__name__', 'check')} "
                             f"(last: {last!r})")
        time.sleep(interval)


def wait_until(predicate, timeout: float, interval: float = 0.05) -> bool:
    """``eventually`` as a bool, for helper threads (a test never sees their exceptions): the test
    asserts on what the thread recorded."""
    try:
        eventually(predicate, timeout, interval=interval)
    except NotReached:
        return False
    return True


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require_binary(name: str, package: str, *aliases: str) -> str:
    """Path of a system binary (or of an alias: Debian's names differ); skip locally if absent,
    fail under CI (which installs it)."""
    for candidate in (name, *aliases):
        path = shutil.which(candidate)
        if path:
            return path
    msg = f"{name} not found on PATH (Debian package '{package}': apt-get install -y {package})"
    if in_ci():
        pytest.fail(f"{msg}; CI is set, so this is an error, not a skip")
    pytest.skip(msg)


def exposition(series: list[tuple[str, dict[str, str], float]], process_start: float | None = None) -> str:
    """A CONSTRUCTED text exposition: (sample name, labels, value) in order, a TYPE line per family."""
    out, typed = [], set()
    for name, labels, v in series:
        family = name[:-len("_total")] if name.endswith("_total") else name.removesuffix("_created")
        if family not in typed:
            typed.add(family)
            kind = "counter" if name.endswith(("_total", "_created")) else "gauge"
            out.append(f"# TYPE {family} {kind}")
        lab = ",".join(f'{k}="{w}"' for k, w in labels.items())
        val = "NaN" if math.isnan(v) else "+Inf" if v == float("inf") else "-Inf" if v == float("-inf") else repr(float(v))
        out.append(f"{name}{{{lab}}} {val}" if lab else f"{name} {val}")
    if process_start is not None:
        out.append(f"process_start_time_seconds {process_start}")
    return "\n".join(out) + "\n"


def scrapes(parsed: dict, upstream: str) -> float:
    return value(parsed, "cachemon_upstream_scrapes_total", upstream=upstream) or 0.0


def wait_polls(proc: CachemonProcess, upstream: str, n: int = 2, timeout: float = 15.0) -> dict:
    """Scrape until cachemon has polled `upstream` n more times (so the page now served was read)."""
    start = scrapes(proc.scrape(), upstream)
    return proc.wait_for(lambda p: scrapes(p, upstream) >= start + n, timeout)


def one_line_error(args: list[str]) -> str:
    """Run the CLI in-process; assert exit 2 with exactly one stderr line and no traceback."""
    from click.testing import CliRunner

    from cachemon.cli import main
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    assert r.exception is None or isinstance(r.exception, SystemExit)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.output, r.output
    return lines[0]
