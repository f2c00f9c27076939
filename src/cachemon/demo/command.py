"""`cachemon demo`: the exporter against real vLLM captures, with no vLLM at hand.

A fake vLLM (demo/replay.py) serves continuous traffic made from the bundled vLLM 0.32.0 pages
(demo/traffic.py: idle, then rounds of static system prompt -> timestamp at the head -> request ID
at the head, one process, counters growing every poll) and publishes real KV-cache events
(demo/kv_replay.py); the very same ``Daemon`` that `cachemon run` uses follows both.
"""
from __future__ import annotations

import re
import signal
import sys
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING

import click

from cachemon import catalog as C
from cachemon.config import (
    DAY,
    ConfigError,
    KvEventsSettings,
    Listen,
    parse_duration,
    parse_listen,
    parse_upstream_spec,
    parse_windows,
)
from cachemon.config.attribution import AttributionConfig
from cachemon.demo.replay import ReplayServer, bundled_pages
from cachemon.demo.traffic import IDLE, ROUND, Phase, Traffic
from cachemon.demo.webhook import AlertWebhook
from cachemon.runconfig import Config
from cachemon.runtime.attribution_stage import AttributionStage
from cachemon.thresholds import HIT_RATIO_CRITICAL

if TYPE_CHECKING:
    from cachemon.daemon import Daemon
    from cachemon.demo.kv_replay import KvReplay

_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
# Named at the first traffic of a process: not a collapse of a warm cache.
_NOT_A_COLLAPSE = frozenset({"cold_cache"})


def plain_event(kind: str, detail: str) -> str:
    """An event of the daemon's EventLog (state/events.py) in plain words."""
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
    with daemon.store.read() as view:
        totals = [st.local_totals() for st in view.upstreams.values()]
    return sum(q for q, _ in totals), sum(h for _, h in totals)


def named_causes(daemon: Daemon) -> list[str]:
    """The causes the exporter names now: its ``cachemon_cause_active`` series, as /metrics serves
    them (the attribution stage's family), in report order."""
    found: list[str] = []
    for comp in daemon.components:
        if isinstance(comp, AttributionStage):
            for fam in comp.collect():
                if fam.name == C.CAUSE_ACTIVE.name:
                    found += [dict(_LABEL.findall(labels))[C.CAUSE] for labels, v in fam.samples if v == 1]
    return list(dict.fromkeys(found))


class PhaseStatus:
    """One phase of the demo (one capture served): its counters, events and the causes cachemon named
    since it began, as one line."""

    def __init__(self, daemon: Daemon, scenario: str, number: int, of: int, after: str = "") -> None:
        """``after``: what preceded the phase, in words (e.g. a restart)."""
        self.daemon, self.scenario, self.number, self.of, self.after = daemon, scenario, number, of, after
        self.base = cache_totals(daemon)
        last = daemon.events.since(0)
        self.seq = last[-1].seq if last else 0
        self.began = time.strftime("%H:%M:%S")     # the wall clock: what Prometheus and Grafana show
        self.causes: list[str] = []                # every cause the exporter named during the phase

    def ratio(self) -> tuple[float, float]:
        """(prompt tokens looked up in this phase, its hit ratio; 0 without tokens)."""
        queries, hits = cache_totals(self.daemon)
        dq, dh = queries - self.base[0], hits - self.base[1]
        return dq, dh / dq if dq > 0 else 0.0

    def collapsed(self) -> bool:
        """The phase's hit ratio is below the critical alert's threshold and cachemon names why
        (a cause other than a cold cache)."""
        dq, ratio = self.ratio()
        return dq > 0 and ratio < HIT_RATIO_CRITICAL and any(c not in _NOT_A_COLLAPSE for c in self.causes)

    def line(self) -> str:
        """Most telling first (a terminal cuts the line at its width): when the phase began, the phase,
        its own hit ratio (counter deltas since it began, not a trailing window that lags the label),
        the total, the causes cachemon named, then the events in plain words."""
        for cause in named_causes(self.daemon):
            if cause not in self.causes:
                self.causes.append(cause)
        queries, hits = cache_totals(self.daemon)
        dq, ratio = self.ratio()
        after = f", {self.after}" if self.after else ""
        parts = [f"{self.began} [{self.number}/{self.of} {self.scenario}{after}] "
                 + (f"this phase: {ratio:.1%} of {dq:.0f} prompt tokens from cache" if dq > 0
                    else "this phase: no prompt tokens"),
                 f"since start {hits / queries:.1%}" if queries > 0 else "since start n/a"]
        if self.causes:
            parts.append(f"cachemon names: {', '.join(self.causes)}")
        elif dq > 0:
            parts.append("cachemon names no cause")
        for ev in self.daemon.events.since(self.seq):
            text = plain_event(ev.kind.value, ev.detail)
            if text not in parts:
                parts.append(text)
        return " | ".join(p for p in parts if p)


def next_steps(url: str) -> str:
    """What to do after the demo: the same exporter, pointed at by Prometheus and Grafana."""
    return "\n".join([
        "What next:",
        f"  1. Point Prometheus at {url}: prometheus/prometheus-demo.yml scrapes the demo as it runs "
        "(cachemon :9867, its vLLM :18000); `make demo-stack` starts Prometheus and Alertmanager for you.",
        "  2. Import the Grafana dashboards: dashboards/*.json (cachemon-overview.json first).",
        "  3. Load the alerts: alerts/cachemon-alerts.yaml (and prometheus/recording_rules.yaml).",
        "  4. Next to a real vLLM: cachemon run --upstream vllm=http://VLLM_HOST:8000/metrics",
    ])


class StatusLine:
    """ONE status line per phase: rewritten in place (carriage return) on a terminal; elsewhere
    (a pipe, a log, the tests) printed once, when its phase ends."""

    def __init__(self, tty: bool, width: int = 0) -> None:
        self.tty, self.width, self.shown = tty, width, 0
        self.lock = threading.Lock()     # the alert webhook's thread writes lines too

    def update(self, text: str) -> None:
        if not self.tty:
            return
        if self.width > 1:
            text = text[: self.width - 1]
        with self.lock:
            click.echo("\r" + text.ljust(self.shown), nl=False)
            self.shown = len(text)

    def finish(self, text: str) -> None:
        if self.tty:
            self.update(text)
            with self.lock:
                click.echo()
                self.shown = 0
        else:
            click.echo(text)

    def say(self, text: str) -> None:
        """A line of its own (an alert notification): over the status line on a terminal, which the next
        update draws again below it."""
        with self.lock:
            click.echo(("\r" + text.ljust(self.shown)) if self.tty else text)
            self.shown = 0


# Example list prices (per million tokens), so the cost panels have data; not any provider's.
EXAMPLE_COST = {"currency": "USD", "per_million_tokens": {"uncached_input": 3.00, "cached_input": 0.30, "output": 15.00}}


def _parse_scale(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.001 <= value <= 100:
        raise ConfigError("--time-scale", f"a number between 0.001 and 100 (0.05: 20 times faster), not {text!r}")
    return value


def scaled_attribution(time_scale: float, poll_interval: float) -> AttributionConfig:
    """The exporter's attribution timings played as fast as the phases: its trailing window (the shortest
    of the demo's windows, 1m), the 30 s hold-down of a cause and the events' lookback. Unscaled, at
    1/15 a cause held down 30 s would outlive its 16 s phase and be named in the next one. Never below
    what a poll can see: the window at least 4 polls (the short window's), the hold-down one."""
    base = AttributionConfig()
    if time_scale == 1:
        return base
    window = max(60.0 * time_scale, 4 * poll_interval)
    return replace(base, window=window, hold_down=max(base.hold_down * time_scale, poll_interval),
                   lookback=max(base.lookback * time_scale, window))


# A new replica's and tenant's ledger series are served at 0 this long before their counts
# (kv_events.new_series_hold): three of the demo Prometheus' 5 s scrapes (deploy/compose/prometheus-demo.yml),
# not the shipped 90 s meant for 1 m scrapes, so the demo's KV-event and tenant panels fill within its first round.
DEMO_NEW_SERIES_HOLD = 15.0


def start_demo(listen: str, vllm_listen: str, kv_events: bool, time_scale: float, dwell: float | None,
               poll_interval: str) -> tuple[Traffic, ReplayServer, KvReplay | None, Daemon, str]:
    """The fake vLLM (traffic + KV events) and the exporter following it, all started."""
    from cachemon.config import KvEventsEndpoint, check_kv_event_deps
    from cachemon.config.cost import parse_cost_config
    from cachemon.daemon import Daemon
    from cachemon.demo.kv_replay import KvReplay, bundled_capture
    kv_note = ""
    if kv_events:
        try:
            check_kv_event_deps("demo")
        except ConfigError as e:
            kv_events, kv_note = False, f"off ({e})"
    rates = {}
    for p in ROUND:
        if p.kv and p.kv not in rates:
            rates[p.kv] = bundled_capture(p.kv).rate     # the captured request rate
    idle: Phase = IDLE
    round_: tuple[Phase, ...] = ROUND
    if dwell is not None:
        idle = replace(IDLE, seconds=dwell)
        round_ = tuple(replace(p, seconds=dwell) for p in ROUND)
    traffic = Traffic(bundled_pages(), time_scale=time_scale, idle=idle, round_=round_, rates=rates)
    v_host, v_port = parse_listen(vllm_listen)
    replay = ReplayServer(bundled_pages(), host=v_host or "127.0.0.1", port=v_port)
    replay.live = lambda: (traffic.position()[2].scenario, traffic.page())
    replay.start()
    publisher = KvReplay(traffic).start() if kv_events else None
    address, port = parse_listen(listen)
    up = parse_upstream_spec(f"demo={replay.url}", "upstream")
    if publisher is not None:
        up.kv_events = KvEventsEndpoint(endpoint=publisher.endpoint)
    poll = parse_duration(poll_interval, "--poll-interval")
    cfg = Config(upstreams=[up], poll_interval=poll, windows=parse_windows(["1m", "5m"], "windows"),
                 listen=Listen(address=address, port=port), cost=parse_cost_config(EXAMPLE_COST),
                 attribution=scaled_attribution(time_scale, poll),
                 kv_events=KvEventsSettings(new_series_hold=DEMO_NEW_SERIES_HOLD))
    daemon = Daemon(cfg)
    daemon.start()
    return traffic, replay, publisher, daemon, kv_note


def _stop(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


@click.command("demo")
@click.option("--listen", default="127.0.0.1:9867", show_default=True, metavar="[ADDRESS]:PORT",
              help="cachemon's /metrics.")
@click.option("--vllm-listen", default="127.0.0.1:18000", show_default=True, metavar="[ADDRESS]:PORT",
              help="The fake vLLM's /metrics (prometheus/prometheus-demo.yml scrapes it; :0 = any free port).")
@click.option("--kv-events/--no-kv-events", default=True, show_default=True,
              help="Replay real KV-cache events too (needs the kv-events extra).")
@click.option("--time-scale", default="1", show_default=True, metavar="FACTOR",
              help="Multiply every phase length (0.05: twenty times faster, for tests).")
@click.option("--dwell", default=None, metavar="DURATION", help="Every phase this long (overrides the schedule).")
@click.option("--poll-interval", default="1s", show_default=True, metavar="DURATION")
@click.option("--duration", default=None, metavar="DURATION", help="Stop after this long (default: until Ctrl-C).")
@click.option("--alert-webhook", default=None, metavar="[ADDRESS]:PORT",
              help="Also receive Alertmanager's webhook here and print each notification "
                   "(examples/alertmanager.yml posts to the compose demo's cachemon:5001).")
def demo_command(listen: str, vllm_listen: str, kv_events: bool, time_scale: str, dwell: str | None, poll_interval: str,
                 duration: str | None, alert_webhook: str | None) -> None:
    """A miniature vLLM server replaying real captures (traffic and KV events) through the exporter."""
    tty = sys.stdout.isatty()
    import shutil
    status = StatusLine(tty, shutil.get_terminal_size().columns if tty else 0)
    try:
        scale = _parse_scale(time_scale)
        dwell_s = parse_duration(dwell, "--dwell") if dwell else None
        stop_after = parse_duration(duration, "--duration", hi=365 * DAY) if duration else None
        hook_at = parse_listen(alert_webhook) if alert_webhook else None
        webhook = AlertWebhook(hook_at[0] or "0.0.0.0", hook_at[1], status.say) if hook_at else None
        traffic, replay, publisher, daemon, kv_note = start_demo(listen, vllm_listen, kv_events, scale, dwell_s,
                                                                 poll_interval)
    except ConfigError as e:
        click.echo(f"cachemon: config error: {e}", err=True)
        sys.exit(2)
    except OSError as e:
        click.echo(f"cachemon: {e} (--listen {listen}, --vllm-listen {vllm_listen}"
                   f"{f', --alert-webhook {alert_webhook}' if alert_webhook else ''}: choose other ports; "
                   ":0 = any free port)", err=True)
        sys.exit(1)
    address, _ = parse_listen(listen)
    shown = address if address not in ("0.0.0.0", "") else "127.0.0.1"
    url = f"http://{shown}:{daemon.port}/metrics"
    import logging
    logging.getLogger("cachemon").setLevel(logging.ERROR)   # the status line says it in plain words
    of = 1 + len(traffic.round)
    # Before the banner: whoever reads "cachemon metrics" and sends SIGTERM stops the demo as Ctrl-C does.
    signal.signal(signal.SIGTERM, _stop)
    cur = traffic.position()[2]
    phase = PhaseStatus(daemon, cur.scenario, 1, of)
    told = False
    try:
        click.echo(f"cachemon demo: a vLLM 0.32.0 miniature on {replay.url} (real captures, continuous traffic)")
        click.echo(f"KV-cache events: {publisher.endpoint}" if publisher else f"KV-cache events: {kv_note or 'off'}")
        ts = traffic.round[1]
        click.echo(f"Phases: idle, then rounds of {', '.join(p.scenario for p in traffic.round)}; "
                   f"the critical alert fires about {7 * traffic.time_scale:.2g} min into {ts.scenario} "
                   f"(make demo-stack shows it)" if dwell_s is None else
                   f"Phases: every phase {dwell_s:g}s")
        click.echo("Cost panels: example prices, USD 3.00 / 0.30 / 15.00 per million uncached / cached / output "
                   "tokens")
        if webhook is not None:
            click.echo(f"Alertmanager webhook: http://{shown}:{webhook.port}/alerts (notifications printed here)")
        click.echo(f"cachemon metrics: {url}  (Ctrl-C to stop)")
        started = time.monotonic()
        traffic.hold = traffic.next_boundary()
        while stop_after is None or time.monotonic() - started < stop_after:
            time.sleep(max(0.0, min(0.25, traffic.hold - time.monotonic())))
            status.update(phase.line())
            if time.monotonic() >= traffic.hold:
                # The page stands at the phase boundary: poll it there, so the phase's line holds all
                # of its traffic and the next phase's counters start from exactly here.
                for poller in daemon.pollers:
                    poller.poll_if_stale(0)
                status.finish(phase.line())
                _, rnd, cur, _, _ = traffic.position()
                idx = 2 + traffic.round.index(cur)
                phase = PhaseStatus(daemon, cur.scenario, idx, of, f"round {rnd}" if rnd > 1 else "")
                traffic.hold = traffic.next_boundary(traffic.hold)
                if rnd > 1 and not told:    # a round without a collapse (short --dwell phases)
                    click.echo(next_steps(url))
                    told = True
            elif not told and phase.collapsed():
                # The story's point (the ratio fell and cachemon says why): the line as it stands, then
                # what to do next, once, without waiting for the round to end.
                status.finish(phase.line())
                click.echo(next_steps(url))
                told = True
    except KeyboardInterrupt:
        pass
    finally:
        status.finish(phase.line() + " (stopped)")
        click.echo(f"Prometheus: scrape {url}; see 'What next' above." if told else next_steps(url))
        daemon.shutdown()
        if webhook is not None:
            webhook.stop()
        if publisher is not None:
            publisher.stop()
        replay.stop()
