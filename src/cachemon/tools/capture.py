"""`cachemon capture`: record a fresh fixture set from a running vLLM server.

Drives the standard traffic scenarios (the ones in ``tests/fixtures/vllm-0.32.0-cpu``)
against a running vLLM OpenAI server and writes, into a new directory:

- ``metrics-idle.txt`` (or ``metrics-start.txt`` if the server already saw traffic):
  ``/metrics`` before the first request;
- ``metrics-<scenario>.txt``: ``/metrics`` ``--settle`` seconds after each scenario's last
  request (counters are cumulative over the server process);
- ``requests-<scenario>.jsonl``: one line per request, ``{"scenario", "i", "request", "usage"}``,
  where ``usage.prompt_tokens_details.cached_tokens`` is vLLM's own per-request hit count;
- ``server.log``: the lines the server logged during the capture (with ``--log-file``);
- ``model/``: the tokenizer files (with ``--model-dir``), so the analyzer can be checked
  token-exact against the recorded requests;
- ``manifest.json`` and ``README.md``: version, cache config, counters after each scenario.

The scenario builders are also used by the end-to-end harness (``scripts/e2e``), so the
fixtures and the harness send the very same kind of traffic. Prompt text is never printed.
"""
from __future__ import annotations

import json
import re
import secrets
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TypedDict

import click
import requests

from cachemon import __version__
from cachemon.jsontypes import JsonObject, as_object
from cachemon.normalise.server_profile import ServerProfile
from cachemon.sources.vllm_api import ServedModel, VllmApi, VllmApiError
from cachemon.urls import redact_url

# ~800 tokens with the fixture tokenizer: 6 full blocks of 128 in front of the user message.
SYSTEM_TEXT = "You are the knowledge-base assistant of an online shop. Answer with the context the user gives. " * 12


def _user(i: int) -> str:
    return f"Question {i}: where is my parcel number {1000 + i}?"


def _stamp(i: int) -> str:
    # One second later per request, so every request's timestamp is unique.
    return (datetime(2025, 6, 1, 10, 23, 45) + timedelta(seconds=i)).strftime("%Y-%m-%d %H:%M:%S")


# name -> builder(i) -> (system message, user message). Order is the capture order.
SCENARIOS: dict[str, Callable[[int], tuple[str, str]]] = {
    "static-system-prompt": lambda i: (SYSTEM_TEXT, _user(i)),
    "timestamp-in-system-prompt": lambda i: (f"Current time: {_stamp(i)}. " + SYSTEM_TEXT, _user(i)),
    "request-id-at-head": lambda i: (f"[Request ID: {secrets.token_hex(8)}] " + SYSTEM_TEXT, _user(i)),
    "timestamp-in-user-message": lambda i: (SYSTEM_TEXT, f"Current time: {_stamp(i)}. " + _user(i)),
}
DEFAULT_SCENARIOS = ("static-system-prompt", "timestamp-in-system-prompt", "request-id-at-head")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "config.json",
                   "special_tokens_map.json", "generation_config.json")


class CaptureError(Exception):
    """A failure the user can act on; the message says what to do."""


class Record(TypedDict):
    """One line of requests-<scenario>.jsonl."""
    scenario: str
    i: int
    request: JsonObject
    usage: JsonObject                  # vLLM's usage block, as it answered


class ScenarioEntry(TypedDict):
    """A scenario in manifest.json."""
    scenario: str
    requests: int
    prompt_tokens: int
    cached_tokens: int
    requests_with_hits: int
    counters_after: dict[str, float]


class _ManifestExtras(TypedDict, total=False):
    server_log_lines: int               # with --log-file
    model_files: list[str]              # with --model-dir


class Manifest(_ManifestExtras):
    """manifest.json."""
    captured_by: str
    date: str
    vllm_version: str
    model: str
    cache_config: dict[str, str]
    requests_per_scenario: int
    max_tokens: int
    start_page: str
    server_was_idle: bool
    scenarios: list[ScenarioEntry]


def build_request(scenario: str, i: int, model: str, max_tokens: int = 4) -> JsonObject:
    if scenario not in SCENARIOS:
        raise CaptureError(f"unknown scenario {scenario!r} (known: {', '.join(SCENARIOS)})")
    system, user = SCENARIOS[scenario](i)
    return {"model": model, "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}


class VllmClient:
    """The few calls capture (and the e2e harness) make to a vLLM OpenAI server, all with timeouts."""

    def __init__(self, api_url: str, metrics_url: str | None = None, timeout: float = 60.0):
        self.api_url = api_url.rstrip("/")
        if self.api_url.endswith("/v1"):
            self.api_url = self.api_url[:-3]
        self.metrics_url = metrics_url or self.api_url + "/metrics"
        self.shown = redact_url(self.api_url)        # the one form of the URL in messages
        self.timeout = timeout
        self.api = VllmApi(self.api_url, timeout=min(timeout, 10.0))      # the GETs: /metrics, /v1/models, /version
        self.session = requests.Session()                                  # the POSTs

    def _api_error(self, e: VllmApiError) -> CaptureError:
        if e.reason == "refused":
            return CaptureError(f"cannot reach {e.url} (is vLLM running there?): {e}")
        return CaptureError(str(e))

    def metrics(self) -> str:
        try:
            text = self.api.metrics(self.metrics_url)
        except VllmApiError as e:
            raise self._api_error(e) from None
        if "vllm:" not in text:
            raise CaptureError(f"{redact_url(self.metrics_url)} is not a vLLM /metrics page (no 'vllm:' metric in it)")
        return text

    def models(self) -> list[ServedModel]:
        try:
            return self.api.models()
        except VllmApiError as e:
            if e.reason == "bad_answer":
                raise CaptureError(f"{self.shown}/v1/models did not answer a JSON model list ({e})") from None
            raise self._api_error(e) from None

    def version(self) -> str:
        return self.api.version(5.0) or ""

    def chat(self, body: JsonObject) -> JsonObject:
        """POST one chat completion; returns the whole response JSON (its ``usage`` an object)."""
        url = self.api_url + "/v1/chat/completions"
        try:
            resp = self.session.post(url, json=body, timeout=(10.0, self.timeout))
        except requests.exceptions.Timeout as e:
            raise CaptureError(f"chat completion timed out after {self.timeout:g}s ({redact_url(url)})") from e
        except requests.exceptions.RequestException as e:
            raise CaptureError(f"cannot reach {redact_url(url)}: {type(e).__name__}") from e
        if resp.status_code != 200:
            raise CaptureError(f"{redact_url(url)} answered HTTP {resp.status_code}: {resp.text[:200]!r}")
        try:
            data = resp.json()
        except ValueError as e:
            raise CaptureError(f"{redact_url(url)} did not answer JSON") from e
        usage = data.get("usage") if isinstance(data, dict) else None
        if not isinstance(usage, dict) or type(usage.get("prompt_tokens")) is not int:
            raise CaptureError(f"{redact_url(url)} answered without a usage block (an integer prompt_tokens)")
        reply: JsonObject = data
        return reply

    def reset_prefix_cache(self) -> None:
        url = self.api_url + "/reset_prefix_cache"
        try:
            resp = self.session.post(url, timeout=(10.0, 30.0))
        except requests.exceptions.RequestException as e:
            raise CaptureError(f"cannot reach {redact_url(url)}: {type(e).__name__}") from e
        if resp.status_code == 404:
            raise CaptureError(f"{redact_url(url)} is not served: "
                               "start vLLM with VLLM_SERVER_DEV_MODE=1 to use --reset-prefix-cache")
        if resp.status_code != 200:
            raise CaptureError(f"{redact_url(url)} answered HTTP {resp.status_code}")


def prompt_tokens(usage: JsonObject) -> int:
    """The usage block's prompt tokens (``chat`` takes only an integer)."""
    v = usage.get("prompt_tokens")
    if type(v) is not int:
        raise CaptureError(f"a usage block without an integer prompt_tokens: {v!r}")
    return v


def cached_tokens(usage: JsonObject) -> int | None:
    details = usage.get("prompt_tokens_details") or {}
    v = details.get("cached_tokens") if isinstance(details, dict) else None
    return int(v) if isinstance(v, (int, float)) else None


_SAMPLE_RE = re.compile(r'^(vllm:[a-zA-Z0-9_:]+)(\{[^}]*\})?\s+(\S+)', re.M)


def vllm_totals(text: str) -> dict[str, float]:
    """Sum of each vllm:*_total counter over its label sets, plus cache-config labels (for summaries)."""
    out: dict[str, float] = {}
    for m in _SAMPLE_RE.finditer(text):
        name = m.group(1)
        if not name.endswith("_total"):
            continue
        try:
            out[name] = out.get(name, 0.0) + float(m.group(3))
        except ValueError:
            continue
    return out


def cache_config(text: str) -> dict[str, str]:
    m = re.search(r'^vllm:cache_config_info\{([^}]*)\}', text, re.M)
    if not m:
        return {}
    return dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))


def server_profile(labels: dict[str, str], log_file: Path | None) -> ServerProfile:
    """The server's one profile (normalise/server_profile.py): its first page's cache_config_info labels,
    else, where the page has none (vLLM 0.32's Rust frontend), its log's start-up lines."""
    from cachemon.analyze.server_config import LogConfigError, read_log_config
    if labels or log_file is None:
        return ServerProfile.from_cache_config_info(labels)
    try:
        return read_log_config(str(log_file))
    except LogConfigError as e:
        raise CaptureError(str(e)) from None


def logged_cache_config(profile: ServerProfile) -> dict[str, str]:
    """block_size / num_gpu_blocks / enable_prefix_caching of a log's profile, as the manifest records labels."""
    found = {k: str(v) for k, v in (("block_size", profile.block_size), ("num_gpu_blocks", profile.num_blocks),
             ("enable_prefix_caching", {"true": "True", "false": "False"}.get(profile.prefix_caching))) if v is not None}
    return found | {"source": "the server log's start-up lines"} if found else {}


def run_scenario(client: VllmClient, scenario: str, n: int, model: str, max_tokens: int = 4,
                 start: int = 0, sink: Callable[[Record], None] | None = None) -> list[Record]:
    """Send n sequential requests of one scenario; returns the fixture records."""
    records = []
    for i in range(start, start + n):
        body = build_request(scenario, i, model, max_tokens)
        data = client.chat(body)
        rec = Record(scenario=scenario, i=i, request=body, usage=as_object(data["usage"]))
        records.append(rec)
        if sink:
            sink(rec)
    return records


def _log_offset(path: Path | None) -> int:
    if path is None:
        return 0
    try:
        return path.stat().st_size
    except OSError as e:
        raise CaptureError(f"cannot read the log file {path}: {e.strerror}") from e


def _check_capture_args(n: int, out: Path, model_dir: Path | None) -> None:
    if n < 1:
        raise CaptureError("--requests must be at least 1")
    if out.exists() and any(out.iterdir()):
        raise CaptureError(f"{out} exists and is not empty; choose a new directory")
    if model_dir is not None and not (model_dir / "tokenizer.json").is_file():
        raise CaptureError(f"{model_dir} has no tokenizer.json")


def _first_model(client: VllmClient) -> str:
    models = client.models()
    if not models:
        raise CaptureError(f"{client.shown}/v1/models lists no model; pass --model")
    return models[0].id


def _record_scenario(client: VllmClient, out: Path, scenario: str, recs: list[Record],
                     settle: float) -> ScenarioEntry:
    """A scenario's requests and the page after them into ``out``; its manifest entry."""
    with open(out / f"requests-{scenario}.jsonl", "w", encoding="utf-8") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")
    time.sleep(settle)
    page = client.metrics()
    (out / f"metrics-{scenario}.txt").write_text(page, encoding="utf-8")
    t = vllm_totals(page)
    return {
        "scenario": scenario, "requests": len(recs),
        "prompt_tokens": sum(prompt_tokens(r["usage"]) for r in recs),
        "cached_tokens": sum(cached_tokens(r["usage"]) or 0 for r in recs),
        "requests_with_hits": sum(1 for r in recs if cached_tokens(r["usage"])),
        "counters_after": {k: t[k] for k in sorted(t) if "prefix_cache" in k or k.startswith("vllm:prompt_tokens")},
    }


def capture(api_url: str, out: Path, scenarios: Sequence[str] = DEFAULT_SCENARIOS, n: int = 16, model: str | None = None,
            metrics_url: str | None = None, log_file: Path | None = None, model_dir: Path | None = None,
            settle: float = 3.0, timeout: float = 60.0, max_tokens: int = 4, reset: bool = False,
            redact: tuple[str, ...] = (), echo: Callable[[str], None] = print) -> Manifest:
    """Record one fixture set; returns the manifest (also written to out/manifest.json)."""
    _check_capture_args(n, out, model_dir)
    client = VllmClient(api_url, metrics_url, timeout)
    model = model or _first_model(client)
    version = client.version()
    if reset:
        client.reset_prefix_cache()
    offset = _log_offset(log_file)
    out.mkdir(parents=True, exist_ok=True)
    first = client.metrics()
    labels = cache_config(first)             # recorded as vLLM wrote them
    profile = server_profile(labels, log_file)
    cfg = labels or logged_cache_config(profile)
    totals = vllm_totals(first)
    idle = totals.get("vllm:prefix_cache_queries_total", totals.get("vllm:gpu_prefix_cache_queries_total", 0.0)) == 0
    start_name = "metrics-idle.txt" if idle else "metrics-start.txt"
    (out / start_name).write_text(first, encoding="utf-8")
    manifest: Manifest = {
        "captured_by": f"cachemon {__version__}", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "vllm_version": version, "model": model, "cache_config": cfg, "requests_per_scenario": n,
        "max_tokens": max_tokens, "start_page": start_name, "server_was_idle": idle, "scenarios": [],
    }
    size = f"block_size {profile.block_size} from {profile.source}" if profile.block_size else "block_size unknown"
    echo(f"capturing from {client.shown} (vLLM {version or 'unknown'}, model {model}, {size}) into {out}")
    with_details = 0
    for scenario in scenarios:
        recs = run_scenario(client, scenario, n, model, max_tokens)
        # vLLM sends prompt_tokens_details null when nothing was cached (the Rust frontend of 0.32 on
        # every miss) and always without --enable-prompt-tokens-details: null is 0 once any line has them
        with_details += sum(cached_tokens(r["usage"]) is not None for r in recs)
        entry = _record_scenario(client, out, scenario, recs, settle)
        manifest["scenarios"].append(entry)
        echo(f"  {scenario}: {entry['requests']} requests, {entry['prompt_tokens']} prompt tokens, "
             f"{entry['cached_tokens']} cached ({entry['requests_with_hits']} requests hit)")
    if not with_details:
        raise CaptureError("no response carried usage.prompt_tokens_details.cached_tokens (vLLM leaves it null "
                           "when nothing was cached, and always without --enable-prompt-tokens-details): start "
                           "vLLM with --enable-prompt-tokens-details, and capture a scenario that hits")
    if log_file is not None:
        try:
            with open(log_file, "rb") as f:
                f.seek(offset)
                text = f.read().decode("utf-8", errors="replace")
        except OSError as e:
            raise CaptureError(f"cannot read the log file {log_file}: {e.strerror}") from e
        for secret in redact:
            if secret:
                text = text.replace(secret, "<redacted>")
        (out / "server.log").write_text(text, encoding="utf-8")
        manifest["server_log_lines"] = text.count("\n")
    if model_dir is not None:
        (out / "model").mkdir(exist_ok=True)
        manifest["model_files"] = []
        for name in TOKENIZER_FILES:
            if (model_dir / name).is_file():
                shutil.copyfile(model_dir / name, out / "model" / name)
                manifest["model_files"].append(name)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    (out / "README.md").write_text(_readme(manifest), encoding="utf-8")
    return manifest


def _readme(m: Manifest) -> str:
    lines = [
        f"# Captures from vLLM {m['vllm_version'] or '(version unknown)'}, {m['date'][:10]}",
        "",
        f"Recorded by `{m['captured_by']}` (`cachemon capture`) from a running server serving `{m['model']}`; "
        f"cache config: {', '.join(f'{k}={v}' for k, v in sorted(m['cache_config'].items())) or 'not exposed'}.",
        f"Every request is a chat completion (`max_tokens` {m['max_tokens']}, `temperature` 0) with one system and "
        f"one user message, {m['requests_per_scenario']} per scenario, sent one at a time in this order.",
        "",
        "| scenario | requests | prompt tokens | cached tokens | requests that hit |",
        "|---|---|---|---|---|",
    ]
    for s in m["scenarios"]:
        lines.append(f"| `{s['scenario']}` | {s['requests']} | {s['prompt_tokens']} | {s['cached_tokens']} "
                     f"| {s['requests_with_hits']} |")
    lines += [
        "",
        f"- `{m['start_page']}` — `/metrics` before the first request"
        + ("" if m["server_was_idle"] else " (the server had already seen traffic)") + ".",
        "- `metrics-<scenario>.txt` — `/metrics` after the scenario; counters are cumulative over the process.",
        "- `requests-<scenario>.jsonl` — `{scenario, i, request, usage}` per request; "
        "`usage.prompt_tokens_details.cached_tokens` is vLLM's own count.",
    ]
    if "server_log_lines" in m:
        lines.append("- `server.log` — what the server logged during the capture.")
    if m.get("model_files"):
        lines.append(f"- `model/` — {', '.join(m['model_files'])}.")
    return "\n".join(lines) + "\n"


@click.command("capture")
@click.option("--api", "api_url", default="http://127.0.0.1:8000", show_default=True, metavar="URL",
              help="Base URL of the vLLM OpenAI server.")
@click.option("--metrics-url", metavar="URL", help="Its /metrics URL (default: API URL + /metrics).")
@click.option("--out", "out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="New directory to write the fixtures into.")
@click.option("--scenario", "scenarios", multiple=True, type=click.Choice(list(SCENARIOS)),
              help=f"Scenario to record, repeatable, in order (default: {', '.join(DEFAULT_SCENARIOS)}).")
@click.option("--requests", "n", default=16, show_default=True, type=int, help="Requests per scenario.")
@click.option("--model", help="Served model name (default: the first one in /v1/models).")
@click.option("--log-file", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="The server's log file: the lines written during the capture are saved as server.log.")
@click.option("--model-dir", type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="The served model directory: its tokenizer files are copied into model/.")
@click.option("--redact", multiple=True, metavar="TEXT", help="Replace TEXT (e.g. a machine path) in server.log.")
@click.option("--settle", default=3.0, show_default=True, type=float,
              help="Seconds to wait after a scenario before reading /metrics.")
@click.option("--timeout", default=60.0, show_default=True, type=float, help="Seconds allowed per request.")
@click.option("--reset-prefix-cache", "reset", is_flag=True,
              help="POST /reset_prefix_cache first (needs VLLM_SERVER_DEV_MODE=1 on the server).")
def capture_command(api_url: str, metrics_url: str | None, out: Path, scenarios: tuple[str, ...], n: int,
                    model: str | None, log_file: Path | None, model_dir: Path | None, redact: tuple[str, ...],
                    settle: float, timeout: float, reset: bool) -> None:
    """Record a fresh fixture set (expositions, log, requests with cached_tokens) from a running vLLM."""
    try:
        capture(api_url, out, scenarios or DEFAULT_SCENARIOS, n, model, metrics_url, log_file, model_dir,
                settle, timeout, reset=reset, redact=tuple(redact), echo=click.echo)
    except CaptureError as e:
        click.echo(f"cachemon capture: {e}", err=True)
        sys.exit(1)
    click.echo(f"done: {out}")
