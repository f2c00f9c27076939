"""Child processes of the e2e harness: each in its own process group, always cleaned up.

Every process is started with ``start_new_session=True`` so that stopping it stops its
whole tree (vLLM forks an engine core process). ``Procs.stop_all`` is called from the
harness's ``finally`` and from its signal handlers; it never touches a process the
harness did not start.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path


def pick(samples, name: str, **labels) -> list[tuple[dict, float]]:
    """The (labels, value) of the samples named `name` whose labels include `labels`."""
    return [(lab, v) for n, lab, v in samples if n == name and all(lab.get(k) == w for k, w in labels.items())]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    def __init__(self, name: str, argv: list[str], log: Path, env: dict | None = None, cwd: Path | None = None,
                 stop_signal: int = signal.SIGTERM, stop_timeout: float = 15.0, append: bool = False):
        self.name = name
        self.argv = argv
        self.log = log
        self.stop_signal = stop_signal
        self.stop_timeout = stop_timeout
        self._fh = open(log, "ab" if append else "wb")
        self.popen = subprocess.Popen(argv, stdout=self._fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      env=env, cwd=cwd, start_new_session=True)
        self.pid = self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self) -> float:
        """Signal the process group, wait up to stop_timeout, then SIGKILL it. Returns seconds taken."""
        t0 = time.monotonic()
        if self.alive():
            self._signal(self.stop_signal)
            try:
                self.popen.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                try:
                    self.popen.wait(10)
                except subprocess.TimeoutExpired:
                    pass
        # Children of the group may outlive the leader (vLLM's engine core): kill leftovers.
        self._signal(signal.SIGKILL)
        self._fh.close()
        return time.monotonic() - t0

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)   # the group id is the leader's pid (start_new_session)
        except (ProcessLookupError, PermissionError):
            pass


class Procs:
    """The harness's own children, stopped in reverse start order."""

    def __init__(self):
        self.procs: list[Proc] = []

    def start(self, *args, **kwargs) -> Proc:
        p = Proc(*args, **kwargs)
        self.procs.append(p)
        return p

    def stop(self, p: Proc) -> float:
        took = p.stop()
        if p in self.procs:
            self.procs.remove(p)
        return took

    def stop_all(self) -> None:
        while self.procs:
            p = self.procs.pop()
            try:
                p.stop()
            except Exception:   # cleanup must go on for the others
                pass


def wait_for(predicate, timeout: float, interval: float = 0.5, what: str = "condition", alive=None):
    """Poll predicate() until it returns a truthy value; raise TimeoutError (or RuntimeError if alive() turns false)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            v = predicate()
        except Exception:   # not ready yet (connection refused, ...)
            v = None
        if v:
            return v
        if alive is not None and not alive():
            raise RuntimeError(f"{what}: the process exited")
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what}: not reached within {timeout:g}s")
        time.sleep(interval)
