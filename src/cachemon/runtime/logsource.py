"""LogSource: followers (tailer) -> streams (parsers, rules) -> store, plus the state file
and the log source's own metrics.

One configured file entry = one upstream of kind "log" in the store. A reset vLLM logged (the
entry's reset counter grew since its last write) is published on the event log as CACHE_RESET of
the entry's upstream; the snapshot builder maps it to the metrics upstream it belongs to. ``poll()`` is one
deterministic pass (tests call it directly, with an injected clock); ``start()`` runs it
in a thread every poll_interval, woken early by watchdog events when available.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from cachemon import catalog as C
from cachemon.config import ConfigError
from cachemon.expose.render import Family, format_labels
from cachemon.normalise.log_stream import LogStream
from cachemon.normalise.log_updates import log_update
from cachemon.normalise.updates import SeriesKey
from cachemon.sources.logs import statefile
from cachemon.sources.logs.openfile import OpenFile
from cachemon.sources.logs.paths import watch_dir
from cachemon.sources.logs.refusals import REFUSAL_REASONS
from cachemon.sources.logs.settings import LogConfig, LogFileSpec
from cachemon.sources.logs.state_doc import StatePayload
from cachemon.sources.logs.tailer import SHUTDOWN_BUDGET, Follower
from cachemon.state.events import EventKind, EventLog
from cachemon.state.views import StoreWriter

if TYPE_CHECKING:   # watchdog is imported when file-system events are turned on
    from watchdog.events import FileSystemEvent
    from watchdog.observers.api import BaseObserver

log = logging.getLogger("cachemon.logs")

# The store's ratio windows need a point now and then even while the log is quiet.
HEARTBEAT = 2.0
# Poll at most this often however many file-system events arrive.
MIN_POLL_SPACING = 0.02
# vLLM's "Successfully reset prefix cache" lines, as the stream counts them.
RESETS_DONE = SeriesKey(C.LOG_CACHE_RESETS.name, ("done",))


class LogEntry:
    """One configured log file: its follower (bytes) and stream (lines -> counters)."""
    def __init__(self, spec: LogFileSpec, cfg: LogConfig, initial: str, wall: Callable[[], float] = time.time) -> None:
        self.spec = spec
        self.stream = LogStream(spec.name, spec.model_name, cfg.rules, cfg.builtin_parsers, cfg.stats_interval)
        self.follower = Follower(spec.path, self._sink, max_line_bytes=cfg.max_line_bytes,
                                 rotate_wait=cfg.rotate_wait, initial=initial, wall=wall,
                                 expected_owner=cfg.expected_owner, follow_symlinks=cfg.follow_symlinks)
        self.now = 0.0
        self.last_status = "init"
        self.last_apply = float("-inf")
        self.resets_done: float | None = None     # the reset count at the last write (None: none yet)

    def _sink(self, block: bytes, f: OpenFile) -> None:
        if self.stream.feed(block):
            f.last_stats_wall = self.now


class LogSource:
    def __init__(self, cfg: LogConfig, store: StoreWriter, clock: Callable[[], float] = time.time,
                 wall: Callable[[], float] = time.time, events: EventLog | None = None) -> None:
        """``clock``: the poll clock; ``wall``: the file system's clock (mtimes), for tests. ``events``:
        where logged resets are published (the daemon's shared log; a private one without it)."""
        self.cfg = cfg
        self.store = store
        self.events = events if events is not None else EventLog()
        self.clock = clock
        self.lock = threading.Lock()       # one poll at a time; ``collect`` reads under it
        self.wake = threading.Event()
        self.state_path = cfg.state_path()
        self.state_problem = ""
        self.state_load_errors = 0         # exported: a fallback at start is visible, not only logged
        self.state_lock = self._lock_state()
        payload = self._load_state()
        initial = "beginning" if cfg.from_beginning else "end"
        if self.state_problem and cfg.on_state_error == "from_beginning":
            initial = "beginning"
        self.entries: list[LogEntry] = []
        for spec in cfg.files:
            saved = payload["sources"].get(spec.name) if payload is not None else None
            # a file we have no record of, with a state file present, appeared while we
            # were stopped: read it whole
            e = LogEntry(spec, cfg, "beginning" if payload is not None else initial, wall)
            if saved:
                try:
                    e.stream.restore(saved.get("stream", {}))
                    e.follower.restore(saved.get("files", []), _opt_float(saved.get("scanned_at")),
                                       _opt_float(saved.get("history_before")))
                except (KeyError, TypeError, ValueError, IndexError) as err:
                    log.warning("log state for %s unusable (%s): starting it fresh", spec.name, err)
                    e = LogEntry(spec, cfg, initial, wall)
            self.entries.append(e)
            store.upstream(spec.name, kind="log")
        self.last_save = clock()
        self.saved_this_run = False
        self.saves_failed = 0
        self._thread: threading.Thread | None = None
        self._observer: BaseObserver | None = None     # once file-system events are on
        self._closed = False
        now = clock()
        for e in self.entries:
            if e.stream.counters:
                self._apply(e, now, force=True)

    # -- state file ---------------------------------------------------------------------
    def _lock_state(self) -> statefile.StateLock | None:
        if self.state_path is None:
            return None
        try:
            return statefile.StateLock(self.state_path)
        except statefile.StateLocked as e:
            raise ConfigError("logs.state_file", str(e)) from None

    def _load_state(self) -> StatePayload | None:
        if self.state_path is None:
            return None
        try:
            payload = statefile.load(self.state_path)
        except statefile.StateError as e:
            self.state_problem = str(e)
            self.state_load_errors += 1
            fallback = ("reading every file from its start (on_state_error: from_beginning; lines "
                        "counted before are counted again)" if self.cfg.on_state_error == "from_beginning"
                        else "starting at the end of each file with counters at 0 (on_state_error: from_end)")
            aside = statefile.set_aside(self.state_path)
            log.warning("log state file unusable: %s; %s%s", e, fallback,
                        f"; the unusable file is kept as {aside}" if aside else "")
            return None
        if payload is None:
            log.info("no log state file at %s yet: first start", self.state_path)
        return payload

    def state_payload(self) -> StatePayload:
        """What the state file holds: per entry, its stream's counters and its follower's files."""
        return {"sources": {e.spec.name: {"stream": e.stream.saved_state(), "files": e.follower.saved_state(),
                                          "scanned_at": e.follower.scanned_at,
                                          "history_before": e.follower.history_before}
                            for e in self.entries}}

    def save_state(self) -> bool:
        if self.state_path is None:
            return True
        lock = self.state_lock
        if lock is not None and not lock.held():
            # another cachemon owns the state file now: writing it too would double or lose counts
            self.saves_failed += 1
            if self.saves_failed in (1, 10, 100) or self.saves_failed % 1000 == 0:
                log.error("not writing log state file %s: %s; this cachemon keeps counting but its offsets "
                          "are not saved (%d saves withheld so far): give each cachemon its own state file "
                          "and restart it", self.state_path, lock.lost, self.saves_failed)
            return False
        try:
            statefile.save(self.state_path, self.state_payload())
        except OSError as e:
            self.saves_failed += 1
            if self.saves_failed in (1, 10, 100) or self.saves_failed % 1000 == 0:
                log.warning("cannot write log state file %s: %s (%d failures so far); offsets and "
                            "counters will be re-derived from the last good save after a restart",
                            self.state_path, e.strerror or e, self.saves_failed)
            return False
        return True

    # -- polling --------------------------------------------------------------------------
    def poll(self) -> bool:
        """One pass over every file. Returns True if some file still has unread data."""
        with self.lock:
            now = self.clock()
            more = False
            for e in self.entries:
                e.now = now
                more |= e.follower.poll(now)
                self._apply(e, now)
            # The first pass of a run saves at once: a process killed again and again
            # sooner than save_interval still makes progress.
            if not self.saved_this_run or now - self.last_save >= self.cfg.save_interval:
                self.last_save = now
                self.saved_this_run = True
                self.save_state()
            return more

    def _apply(self, e: LogEntry, now: float, force: bool = False) -> None:
        status = e.follower.status
        due = now - e.last_apply >= HEARTBEAT
        if status is not None and e.follower.first_poll is False and not e.follower.files:
            if e.last_status != status[0] and status[0] not in REFUSAL_REASONS:
                # at start, and again whenever it changes: a --log-file that matches nothing is said (a
                # refused file was said once already, by the refusals that refused it)
                log.warning("log %s: %s (nothing read; waiting for it to appear)", e.spec.name, status[1])
            if e.last_status != status[0] or due:
                self.store.record_error(e.spec.name, status[0], status[1], kind="log")
                e.last_status, e.last_apply = status[0], now
            return
        if not (force or e.stream.changed or due or e.last_status != "ok"):
            return
        s = e.stream
        upd = log_update(s)
        self.store.apply(e.spec.name, upd, now, kind="log")
        s.changed = False
        e.last_status, e.last_apply = "ok", now
        with self.store.read() as view:
            c = view.upstreams[e.spec.name].counters.get(RESETS_DONE)
            done = c.value if c is not None else 0.0
        if e.resets_done is not None and done > e.resets_done:
            self.events.publish(EventKind.CACHE_RESET, e.spec.name, now, "vLLM log")
        e.resets_done = done

    # -- lifecycle (the daemon's Component protocol) ----------------------------------------
    def collect(self) -> Iterator[Family]:
        """The log source's own metrics, and the estimated prompt-token counter."""
        fams = {spec.name: Family.of(spec) for spec in (
            C.LOG_LINES, C.LOG_BYTES, C.LOG_ROTATIONS, C.LOG_TRUNCATIONS, C.LOG_FILES_OPEN, C.LOG_STATS_AGE,
            C.LOG_STATE_SAVE_ERRORS, C.LOG_STATE_LOAD_ERRORS, C.PROMPT_TOKENS_ESTIMATED, C.LOG_FILES_REFUSED,
            C.LOG_FILES_FORGOTTEN)}

        def put(spec: C.MetricSpec, values: tuple[str, ...], v: float) -> None:
            fams[spec.name].add(format_labels(spec.labels, values), v)

        with self.lock:
            if self.state_path:
                put(C.LOG_STATE_SAVE_ERRORS, (), self.saves_failed)
                put(C.LOG_STATE_LOAD_ERRORS, (), self.state_load_errors)
            for e in self.entries:
                self._collect_entry(e, put)
        yield from (f for f in fams.values() if f.samples)

    @staticmethod
    def _collect_entry(e: LogEntry, put: Callable[[C.MetricSpec, tuple[str, ...], float], None]) -> None:
        name, fo, s = e.spec.name, e.follower, e.stream
        too_long = sum(f.framer.too_long for f in fo.files.values()) + getattr(fo, "too_long_closed", 0)
        for outcome in ("parsed", "unmatched", "malformed"):
            put(C.LOG_LINES, (name, outcome), s.lines[outcome])
        put(C.LOG_LINES, (name, "too_long"), too_long)
        put(C.LOG_BYTES, (name,), fo.bytes_read)
        put(C.LOG_ROTATIONS, (name,), fo.rotations)
        put(C.LOG_TRUNCATIONS, (name,), fo.truncations)
        put(C.LOG_FILES_OPEN, (name,), len(fo.files))
        put(C.LOG_FILES_FORGOTTEN, (name,), fo.memory.forgotten)
        for reason, n in sorted(fo.refused.items()):
            put(C.LOG_FILES_REFUSED, (name, reason), n)
        wall = fo.last_stats_wall()     # the newest of its files: one series per configured path
        if wall is not None:
            put(C.LOG_STATS_AGE, (name, e.spec.path), wall)
        for (metric, labels), v in s.counters.items():
            if metric == C.PROMPT_TOKENS_ESTIMATED.name:
                put(C.PROMPT_TOKENS_ESTIMATED, (name,) + labels, v)

    def start(self, stop_event: threading.Event) -> None:
        self._start_watching()
        self._thread = threading.Thread(target=self._run, args=(stop_event,), name="log-source", daemon=True)
        self._thread.start()

    def _run(self, stop_event: threading.Event) -> None:
        while not stop_event.is_set() and not self._closed:
            t0 = time.monotonic()
            try:
                more = self.poll()
            except Exception:     # a bug must not stop the tailer silently
                log.exception("log source poll failed; retrying")
                more = False
            if more:
                continue
            self.wake.wait(self.cfg.poll_interval)
            self.wake.clear()
            spent = time.monotonic() - t0
            if spent < MIN_POLL_SPACING:
                stop_event.wait(MIN_POLL_SPACING - spent)

    def _start_watching(self) -> None:
        if not self.cfg.watch_events:
            return
        try:
            from watchdog.events import FileSystemEventHandler
            from watchdog.observers import Observer
        except ImportError:
            return
        import os

        wake, entries = self.wake, self.entries
        # watchdog's debug lines describe every inotify event: with cachemon's own log in a watched
        # directory, each of them is an event that logs another (a loop of MiB/s at --log-level debug)
        wd_log = logging.getLogger("watchdog")
        if wd_log.getEffectiveLevel() < logging.INFO:
            wd_log.setLevel(logging.INFO)

        class _Wake(FileSystemEventHandler):
            def on_any_event(self, event: FileSystemEvent) -> None:      # any event only means "poll now"
                path = event.src_path.decode() if isinstance(event.src_path, bytes) else event.src_path
                if not any(path in e.follower.refused_paths for e in entries):   # e.g. our own log
                    wake.set()

        dirs = {watch_dir(e.spec.path) for e in self.entries}
        try:
            obs = Observer()
            n = 0
            for d in dirs:
                if os.path.isdir(d) and "*" not in d and "?" not in d and "[" not in d:
                    obs.schedule(_Wake(), d, recursive=False)
                    n += 1
            if n:
                obs.daemon = True
                obs.start()
                self._observer = obs
        except Exception as e:  # e.g. inotify watch limit: polling still works
            log.info("file-system events unavailable (%s); polling every %.3gs", e, self.cfg.poll_interval)
            self._observer = None

    def close(self) -> None:
        """Stop, read what is left, save the state, close the files."""
        if self._closed:
            return
        self._closed = True
        for e in self.entries:       # a poll under way stops reading within a chunk
            e.follower.budget_cap = SHUTDOWN_BUDGET
        self.wake.set()
        if self._observer is not None:
            try:
                self._observer.stop()
                self._observer.join(timeout=2)
            except Exception:
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            self.poll()
        finally:
            with self.lock:
                self.save_state()
                for e in self.entries:
                    e.follower.close()
                if self.state_lock is not None:
                    self.state_lock.release()


def _opt_float(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
