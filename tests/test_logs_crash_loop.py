"""`cachemon run` killed with SIGKILL at random instants, again and again, while the log it
follows is written and rotated (renamed to app.log.1, .2, ... with a late write through
the old descriptor). After the last restart the exported counters equal what was
written: no line lost, none counted twice.

The configured path is the live file only, so a rotated file is found again after a
restart by its device+inode (it is in the state file) or, if the state file does not
know it, read whole under its rotated name. Kills come sooner than save_interval, so
only the save after the first pass of each run makes progress. Under CPU load this
used to lose 4-10 % of the lines in about 1 run of 6 (a directory listed half-way
through the writer's rename cascade; deterministic versions in test_logs_restart.py).

Before the very first save there is nothing to resume from (a file rotated away then is
history, like one rotated away before the first start): writing starts once the first
run has saved; every kill comes at any instant after that, even before a restarted
process has finished starting.
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers import CachemonProcess, free_port, value
from logs_support import gw

UP = "app"
HIT = "cachemon_prefix_cache_hit_tokens_total"
MISS = "cachemon_prefix_cache_miss_tokens_total"


class RotatingWriter(threading.Thread):
    """Writes unique gateway lines (exact hit/miss counts) and rotates the file now and then;
    keeps every rotated file, so everything written can still be re-read."""

    def __init__(self, log: Path, rng: random.Random):
        super().__init__(daemon=True)
        self.log, self.rng = log, rng
        self.stop = threading.Event()
        self.hit = self.miss = self.lines = self.rotations = 0
        self.seq = 0

    def _line(self) -> str:
        self.seq += 1
        h, m = self.rng.randint(1, 999), self.rng.randint(0, 99)
        self.hit += h
        self.miss += m
        self.lines += 1
        return gw(h, m, seq=self.seq)

    def _rotate(self, fd: int) -> int:
        rotated = sorted((p for p in self.log.parent.glob(self.log.name + ".*") if p.suffix[1:].isdigit()),
                         key=lambda p: int(p.suffix[1:]), reverse=True)
        for p in rotated:
            os.rename(p, p.with_suffix(f".{int(p.suffix[1:]) + 1}"))
        os.rename(self.log, self.log.with_name(self.log.name + ".1"))
        os.write(fd, self._line().encode())            # a late write through the old descriptor
        os.close(fd)
        self.rotations += 1
        return os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def run(self) -> None:
        fd = os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        next_rotation = time.monotonic() + self.rng.uniform(0.2, 1.2)
        while not self.stop.is_set():
            os.write(fd, "".join(self._line() for _ in range(self.rng.randint(1, 20))).encode())
            if time.monotonic() >= next_rotation:
                fd = self._rotate(fd)
                next_rotation = time.monotonic() + self.rng.uniform(0.2, 1.2)
            time.sleep(self.rng.uniform(0.005, 0.05))
        os.close(fd)


# Fixed seeds, so a failure can be replayed: the two that once lost lines on a loaded machine (the
# race test_logs_restart.py now reproduces with injected clocks). The seed fixes the plan (kill and
# restart instants, writes, rotations); how those instants interleave with cachemon's own threads still
# depends on the machine. CACHEMON_CRASH_SEED=N runs seed N instead, to explore.
SEEDS = [int(os.environ["CACHEMON_CRASH_SEED"])] if os.environ.get("CACHEMON_CRASH_SEED") else [2480805513, 765884545]


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_sigkill_at_random_instants_while_the_log_rotates_loses_and_doubles_nothing(tmp_path, seed):
    rng = random.Random(seed)
    log = tmp_path / "app.log"
    log.touch()
    cfg = tmp_path / "cachemon.yaml"
    cfg.write_text(f"""
upstreams: []
logs:
  files: [{{path: {log}, name: {UP}}}]
  from_beginning: true
  state_file: {tmp_path / 'state.json'}
  poll_interval: 50ms
  rotate_wait: 1s
  save_interval: 5s
  watch_events: false
  rules:
    - regex: 'cache_hit=(?P<hit>\\d+) cache_miss=(?P<miss>\\d+)'
      counters: {{hit_tokens: hit, miss_tokens: miss}}
""")
    writer = RotatingWriter(log, rng)
    kills = []
    state = tmp_path / "state.json"
    try:
        for round_ in range(8):
            port = free_port()
            proc = subprocess.Popen([sys.executable, "-m", "cachemon.cli", "run", "--config", str(cfg),
                                     "--listen", f"127.0.0.1:{port}"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            t0 = time.monotonic()
            if round_ == 0:
                deadline = t0 + 30
                while not state.exists() and time.monotonic() < deadline and proc.poll() is None:
                    time.sleep(0.01)
                assert state.exists(), "the first run never saved its state"
                writer.start()
            alive = rng.uniform(0.3, 2.5)          # often before, sometimes long after the first save
            time.sleep(max(0.0, alive - (time.monotonic() - t0)))
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            kills.append(round(alive, 2))
            time.sleep(rng.uniform(0.0, 1.0))      # down: the log goes on (and rotates)
    finally:
        writer.stop.set()
        if writer.is_alive():
            writer.join(10)
    assert writer.rotations >= 3, "the writer should have rotated the log several times"
    cm = CachemonProcess("--config", str(cfg))
    try:
        page = cm.wait_for(lambda m: value(m, HIT, upstream=UP) == writer.hit
                           and value(m, MISS, upstream=UP) == writer.miss, timeout=30)
    finally:
        out = cm.stop()
    why = (f"seed {seed} (CACHEMON_CRASH_SEED), kills after {kills} s, {writer.lines} lines, "
           f"{writer.rotations} rotations; cachemon's log:\n{out[-3000:]}")
    assert value(page, HIT, upstream=UP) == writer.hit, why
    assert value(page, MISS, upstream=UP) == writer.miss, why
