"""The ``logs:`` section of the config, and the --log-file / --from-beginning / --state-file flags.

::

    logs:
      files:                       # or a plain list of paths; globs allowed
        - path: /var/log/vllm/server.log   # a path, a glob, or a directory (its *.log files):
                                           # ~/ascend/log/vllm_ascend/ for vllm-ascend (sources/logs/paths.py)
          name: vllm-0             # upstream label; default log:<basename of path>
          model_name: llama-3-8b   # model_name label (the log line does not carry one)
          upstream: vllm-0         # the /metrics upstream it belongs to (reset lines explain its drops)
      from_beginning: false        # first sight of a file present at start: read it whole
      state_file: /var/lib/cachemon/logs.json   # offsets + counters; "none" disables
      on_state_error: from_end     # corrupt state file: from_end | from_beginning
      poll_interval: 250ms
      rotate_wait: 5s              # keep reading a rotated/deleted file this long
      save_interval: 5s
      max_line_bytes: 1048576
      stats_interval: 10s          # vLLM's VLLM_LOG_STATS_INTERVAL, caps the token estimate
      watch_events: true           # watchdog wakes the poll loop early (never relied on)
      builtin_parsers: true
      expected_owner: vllm         # running as root: read only files this user could read
                                   # (default: the owner of each watched file's directory)
      follow_symlinks: false       # glob / directory: follow a symlink only to a file in the same
                                   # directory owned by its owner (true: follow every symlink)
      rules: [...]                 # see cachemon.sources.logs.user_rules

Every error names its key, e.g. ``logs.rules[0].regex``.
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from cachemon.config import (
    ConfigError,
    boolean,
    check_unique_names,
    choice,
    duration,
    integer,
    load_section,
    optional,
    or_empty,
    setting,
    text,
)
from cachemon.sources.logs.user_rules import Rule, parse_rules

DEFAULT_MAX_LINE_BYTES = 1024 * 1024
ON_STATE_ERROR = ("from_end", "from_beginning")


def _model_name(v: object, key: str) -> str:
    return "" if v is None else text(v, key)


@dataclass
class LogFileSpec:
    path: str = setting(text)                 # a path or a glob
    name: str = setting(or_empty(text), "")   # upstream label; default log:<basename>
    model_name: str = setting(_model_name, "")
    # the /metrics upstream this log belongs to: its reset lines explain that upstream's drops
    upstream: str = setting(_model_name, "")

    def __post_init__(self) -> None:
        self.name = self.name or default_name(self.path)
        self.path = os.path.expanduser(self.path)


def _file(v: object, key: str) -> LogFileSpec:
    return load_section(LogFileSpec, {"path": v} if isinstance(v, str) else v, key)


def _files(v: object, key: str) -> list[LogFileSpec]:
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list):
        raise ConfigError(key, "expected a list of paths or {path, name, model_name, upstream} mappings")
    files = [_file(f, f"{key}[{i}]") for i, f in enumerate(v)]
    check_unique_names(files, key)
    return files


def _owner(v: object, key: str) -> tuple[int, int]:
    """A user name or uid -> (uid, gid of that user; -1 when the uid has no account)."""
    import pwd
    if isinstance(v, bool) or not isinstance(v, (str, int)) or (isinstance(v, int) and v < 0):
        raise ConfigError(key, f"expected a user name or uid, got {v!r}")
    try:
        pw = pwd.getpwnam(v) if isinstance(v, str) else pwd.getpwuid(v)
    except KeyError:
        if isinstance(v, int):
            return v, -1
        raise ConfigError(key, f"no such user {v!r}") from None
    return pw.pw_uid, pw.pw_gid


def _state_file(v: object, key: str) -> str:
    if v is None or (isinstance(v, str) and v.strip().lower() in ("none", "off", "")):
        return ""
    if not isinstance(v, str):
        raise ConfigError(key, f"expected a path or none, got {v!r}")
    return os.path.expanduser(v)


@dataclass
class LogConfig:
    files: list[LogFileSpec] = setting(_files, default_factory=list)
    from_beginning: bool = setting(boolean, False)
    state_file: str | None = setting(_state_file, None)     # None: default path; "" : persistence disabled
    on_state_error: str = setting(choice(*ON_STATE_ERROR), "from_end")
    poll_interval: float = setting(duration(lo=0.01, hi=60.0), 0.25)
    rotate_wait: float = setting(duration(hi=3600.0), 5.0)
    save_interval: float = setting(duration(hi=3600.0), 5.0)
    max_line_bytes: int = setting(integer(lo=256, hi=64 * 1024 * 1024), DEFAULT_MAX_LINE_BYTES)
    stats_interval: float = setting(duration(hi=3600.0), 10.0)
    watch_events: bool = setting(boolean, True)
    builtin_parsers: bool = setting(boolean, True)
    # running as root: files the service user could not read are refused (refusals.foreign_owner)
    expected_owner: tuple[int, int] | None = setting(optional(_owner), None)
    # glob / directory: follow every symlink, not only one to a file beside it of the directory's owner
    follow_symlinks: bool = setting(boolean, False)
    rules: list[Rule] = setting(parse_rules, default_factory=list)

    def state_path(self) -> Path | None:
        """Where offsets + counters are persisted (None: persistence disabled)."""
        if self.state_file == "":
            return None
        if self.state_file:
            return Path(self.state_file)
        # Default: one file per set of watched paths, so two sidecars with different
        # logs on one host never share (and overwrite) a state file.
        base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "cachemon"
        digest = hashlib.sha1("\n".join(sorted(f.path for f in self.files)).encode()).hexdigest()[:12]
        return base / f"logs-{digest}.json"


def default_name(path: str) -> str:
    return "log:" + (os.path.basename(path.rstrip("/")) or path)


def parse_log_config(raw: object, key: str = "logs") -> LogConfig:
    """The ``logs:`` section; a path or a list of paths is shorthand for ``files``."""
    if isinstance(raw, (str, list)):
        raw = {"files": raw}
    cfg = load_section(LogConfig, raw, key)
    if not cfg.builtin_parsers and not cfg.rules:
        raise ConfigError(f"{key}.builtin_parsers", "false with no rules: nothing would be parsed")
    return cfg


def apply_log_flags(existing: LogConfig | None, log_files: Sequence[str], from_beginning: bool | None,
                    state_file: str | None) -> LogConfig:
    """--log-file PATH (repeatable) adds to the config's files; the other flags win over it."""
    cfg = replace(existing) if existing is not None else LogConfig()
    cfg.files = list(cfg.files)
    known = {f.path for f in cfg.files}
    for p in log_files or ():
        p = os.path.expanduser(p)
        if p not in known:
            cfg.files.append(LogFileSpec(path=p, name=default_name(p)))
            known.add(p)
    check_unique_names(cfg.files, "--log-file")
    if from_beginning is not None:
        cfg.from_beginning = bool(from_beginning)
    if state_file:
        cfg.state_file = "" if state_file.strip().lower() == "none" else os.path.expanduser(state_file)
    if not cfg.files:
        raise ConfigError("--log-file", "no log file given (use --log-file PATH or logs.files in the config)")
    return cfg
