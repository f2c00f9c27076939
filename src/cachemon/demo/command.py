"""`cachemon demo`: the exporter against real vLLM captures, with no vLLM at hand.

A ReplayServer plays the bundled vLLM 0.32.0 pages (idle -> static system prompt ->
timestamp at the head -> request ID at the head -> start over, which is an upstream
restart) and the very same ``Daemon`` that `cachemon run` uses polls it.
"""
from __future__ import annotations

import signal
import sys
import time
from typing import TYPE_CHECKING

import click

from cachemon import catalog as C
from cachemon.config import DAY, ConfigError, Listen, parse_duration, parse_listen, parse_upstream_spec, parse_windows
from cachemon.demo.replay import ReplayServer, bundled_pages
from cachemon.runconfig import Config

if TYPE_CHECKING:
    from cachemon.daemon import Daemon

_NOTE = {
    "idle": "server just started, no traffic",
    "static-system-prompt": "16 requests, same system prompt -> hits",
    "timestamp-in-system-prompt": "16 requests, timestamp at the head -> 0 hits",
    "request-id-at-head": "16 requests, request ID at the head -> 0 hits",
}


def plain_event(kind: str, detail: str) -> str:
    """An event of the daemon's EventLog (runtime/events.py) in plain words."""
    changes = {"model": "the served model changed", "version": "vLLM's version changed",
               "cache_config": "vLLM's cache settings changed", "tokenizer": "the tokenizer changed",
               "chat_template": "the chat template changed"}
    words = {"restart": "vLLM restarted: counters corrected",
             "cache_reset_suspected": "the prefix cache looks reset (hit ratio collapsed at steady traffic)",
             "kv_restart": "KV-event stream restarted: a new vLLM process",
             "kv_cleared": "prefix cache cleared (every cached block dropped)"}
    if kind == "change":
        return changes.get(detail, f"{detail.replace('_', ' ')} changed")
    return words.get(kind, kind.replace("_", " "))


def cache_totals(daemon: Daemon) -> tuple[float, float]:
    """(prompt tokens looked up, of which served from the prefix cache), vLLM's local prefix cache,
    reset-corrected (cachemon's own counters, read through the store's read API)."""
    queries = hits = 0.0
    with daemon.store.read() as view:
        for st in view.upstreams.values():
            for key, counter in st.counters.items():
                if key.labels[-1:] != ("local",):
                    continue
                if key.metric == C.QUERY_TOKENS.name:
                    queries += counter.value
                elif key.metric == C.HIT_TOKENS.name:
                    hits += counter.value
    return queries, hits


class PhaseStatus:
    """One phase of the demo (one capture served): its counters and events since it began, as one line."""

    def __init__(self, daemon: Daemon, scenario: str, number: int, of: int, after: str = "") -> None:
        """``after``: what preceded the phase, in words (e.g. a restart)."""
        self.daemon, self.scenario, self.number, self.of, self.after = daemon, scenario, number, of, after
        self.base = cache_totals(daemon)
        last = daemon.events.since(0)
        self.seq = last[-1].seq if last else 0

    def line(self) -> str:
        """Most telling first (a terminal cuts the line at its width): the phase, its own hit ratio
        (counter deltas since it began, not a trailing window that lags the label), the total, the
        events in plain words, then what the phase replays."""
        queries, hits = cache_totals(self.daemon)
        dq, dh = queries - self.base[0], hits - self.base[1]
        after = f", {self.after}" if self.after else ""
        parts = [f"[{self.number}/{self.of} {self.scenario}{after}] "
                 + (f"this phase: {dh / dq:.1%} of {dq:.0f} prompt tokens from cache" if dq > 0
                    else "this phase: no prompt tokens"),
                 f"since start {hits / queries:.1%}" if queries > 0 else "since start n/a"]
        for ev in self.daemon.events.since(self.seq):
            text = plain_event(ev.kind.value, ev.detail)
            if text not in parts:
                parts.append(text)
        parts.append(_NOTE.get(self.scenario, ""))
        return " | ".join(p for p in parts if p)


def next_steps(url: str) -> str:
    """What to do after the demo: the same exporter, pointed at by Prometheus and Grafana."""
    return "\n".join([
        "What next:",
        f"  1. Point Prometheus at {url}: prometheus/prometheus-static.yml is a ready scrape config "
        "(set its cachemon target to this host:port).",
        "  2. Import the Grafana dashboards: dashboards/*.json (cachemon-overview.json first).",
        "  3. Load the alerts: alerts/cachemon-alerts.yaml (and prometheus/recording_rules.yaml).",
        "  4. Next to a real vLLM: cachemon run --upstream vllm=http://VLLM_HOST:8000/metrics",
    ])


class StatusLine:
    """ONE status line per phase: rewritten in place (carriage return) on a terminal; elsewhere
    (a pipe, a log, the tests) printed once, when its phase ends."""

    def __init__(self, tty: bool, width: int = 0) -> None:
        self.tty, self.width, self.shown = tty, width, 0

    def update(self, text: str) -> None:
        if not self.tty:
            return
        if self.width > 1:
            text = text[: self.width - 1]
        click.echo("\r" + text.ljust(self.shown), nl=False)
        self.shown = len(text)

    def finish(self, text: str) -> None:
        if self.tty:
            self.update(text)
            click.echo()
            self.shown = 0
        else:
            click.echo(text)


def _stop(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


@click.command("demo")
@click.option("--listen", default="127.0.0.1:9867", show_default=True, metavar="[ADDRESS]:PORT")
@click.option("--dwell", default="20s", show_default=True, metavar="DURATION", help="Time spent on each capture.")
@click.option("--poll-interval", default="1s", show_default=True, metavar="DURATION")
@click.option("--duration", default=None, metavar="DURATION", help="Stop after this long (default: until Ctrl-C).")
def demo_command(listen, dwell, poll_interval, duration):
    """Replay real vLLM captures through the exporter and print a live summary."""
    from cachemon.daemon import Daemon
    try:
        dwell_s = parse_duration(dwell, "--dwell")
        stop_after = parse_duration(duration, "--duration", hi=365 * DAY) if duration else None
        replay = ReplayServer(bundled_pages()).start()
        address, port = parse_listen(listen)
        cfg = Config(upstreams=[parse_upstream_spec(f"demo={replay.url}", "upstream")],
                     poll_interval=parse_duration(poll_interval, "--poll-interval"),
                     windows=parse_windows(["1m", "5m"], "windows"), listen=Listen(address=address, port=port))
        daemon = Daemon(cfg)
        daemon.start()
    except ConfigError as e:
        click.echo(f"cachemon: config error: {e}", err=True)
        sys.exit(2)
    except OSError as e:
        click.echo(f"cachemon: {e}", err=True)
        sys.exit(1)
    shown = address if address not in ("0.0.0.0", "") else "127.0.0.1"
    url = f"http://{shown}:{daemon.port}/metrics"
    import logging
    import shutil

    from cachemon.config import format_duration
    logging.getLogger("cachemon").setLevel(logging.ERROR)   # the status line says it in plain words
    of = len(replay.pages)
    click.echo(f"cachemon demo: replaying real vLLM 0.32.0 captures on {replay.url}, "
               f"{format_duration(dwell_s)} each")
    click.echo(f"cachemon metrics: {url}  (Ctrl-C to stop)")
    signal.signal(signal.SIGTERM, _stop)     # SIGTERM stops the demo as Ctrl-C does: shut down, say so
    tty = sys.stdout.isatty()
    status = StatusLine(tty, shutil.get_terminal_size().columns if tty else 0)
    phase = PhaseStatus(daemon, replay.scenario, replay.index + 1, of)
    told, rounds = False, 1
    started = phase_start = time.monotonic()
    try:
        while stop_after is None or time.monotonic() - started < stop_after:
            time.sleep(min(0.5, dwell_s / 4))
            status.update(phase.line())
            if time.monotonic() - phase_start >= dwell_s:
                # The phase's line shows the polls of the page it names; the next phase's counters
                # and events start from here, read before the next page is served.
                status.finish(phase.line())
                nxt = (replay.index + 1) % of
                wrapped = nxt == 0
                rounds += wrapped
                phase = PhaseStatus(daemon, replay.pages[nxt][0], nxt + 1, of, f"round {rounds}" if rounds > 1 else "")
                replay.advance()
                phase_start = time.monotonic()
                if wrapped and not told:    # one round done: what to do next, once
                    click.echo(next_steps(url))
                    told = True
    except KeyboardInterrupt:
        pass
    finally:
        status.finish(phase.line() + " (stopped)")
        click.echo(f"Prometheus: scrape {url}; see 'What next' above." if told else next_steps(url))
        daemon.shutdown()
        replay.stop()
