"""`cachemon demo`: the exporter against real vLLM captures, with no vLLM at hand.

A ReplayServer plays the bundled vLLM 0.32.0 pages (idle -> static system prompt ->
timestamp at the head -> request ID at the head -> start over, which is an upstream
restart) and the very same ``Daemon`` that `cachemon run` uses polls it.
"""
from __future__ import annotations

import sys
import time

import click

from cachemon import catalog as C
from cachemon.config import DAY, ConfigError, Listen, parse_duration, parse_listen, parse_upstream_spec, parse_windows
from cachemon.demo.replay import ReplayServer, bundled_pages
from cachemon.runconfig import Config

_NOTE = {
    "idle": "server just started, no traffic",
    "static-system-prompt": "16 requests, same system prompt -> hits",
    "timestamp-in-system-prompt": "16 requests, timestamp at the head -> 0 hits",
    "request-id-at-head": "16 requests, request ID at the head -> 0 hits",
}


def summary(daemon, scenario: str) -> str:
    st = daemon.store.upstreams.get("demo")
    if st is None:
        return f"[{scenario}] waiting for the first poll"
    with daemon.store.lock:
        key = ("tiny", "0", "local")
        q = st.counters.get((C.QUERY_TOKENS.name, key))
        h = st.counters.get((C.HIT_TOKENS.name, key))
        win = st.windows.get(key)
        r = win.ratio(60.0) if win else None
        restarts = st.restarts
        era = st.info.era
    ratio = f"{r[0] / r[1]:.1%}" if r else "n/a (idle)"
    return (f"[{scenario}: {_NOTE.get(scenario, '')}] era={era} query_tokens={q.value if q else 0:.0f} "
            f"hit_tokens={h.value if h else 0:.0f} hit_ratio_1m={ratio} restarts={restarts}")


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
    click.echo(f"cachemon demo: replaying real vLLM 0.32.0 captures on {replay.url}")
    click.echo(f"cachemon metrics: http://{shown}:{daemon.port}/metrics  (Ctrl-C to stop)")
    started = last_switch = time.monotonic()
    try:
        while stop_after is None or time.monotonic() - started < stop_after:
            time.sleep(min(2.0, dwell_s))
            # Summarise before switching, so the line shows the scenario it names after polls of it.
            click.echo(summary(daemon, replay.scenario))
            if time.monotonic() - last_switch >= dwell_s:
                replay.advance()
                last_switch = time.monotonic()
    except KeyboardInterrupt:
        pass
    finally:
        daemon.shutdown()
        replay.stop()
