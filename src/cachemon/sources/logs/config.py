"""The ``logs:`` section of the config, and the --log-file / --from-beginning / --state-file flags.

::

    logs:
      files:                       # or a plain list of paths; globs allowed
        - path: /var/log/vllm/server.log
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
      rules: [...]                 # see cachemon.sources.logs.rules

Every error names its key, e.g. ``logs.rules[0].regex``.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cachemon.config import ConfigError, check_keys, check_unique_names, parse_duration

DEFAULT_MAX_LINE_BYTES = 1024 * 1024
ON_STATE_ERROR = ("from_end", "from_beginning")


@dataclass
class LogFileSpec:
    path: str                 # a path or a glob
    name: str                 # upstream label
    model_name: str = ""
    upstream: str = ""        # the metrics upstream this log belongs to (its events explain that one)


@dataclass
class LogConfig:
    files: list[LogFileSpec] = field(default_factory=list)
    from_beginning: bool = False
    state_file: str | None = None          # None: default path; "" : persistence disabled
    on_state_error: str = "from_end"
    poll_interval: float = 0.25
    rotate_wait: float = 5.0
    save_interval: float = 5.0
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    stats_interval: float = 10.0
    watch_events: bool = True
    builtin_parsers: bool = True
    rules: list = field(default_factory=list)   # list[rules.Rule]

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


def _bool(v: Any, key: str) -> bool:
    if not isinstance(v, bool):
        raise ConfigError(key, f"expected true or false, got {v!r}")
    return v


def _file(d: Any, key: str) -> LogFileSpec:
    if isinstance(d, str):
        d = {"path": d}
    if not isinstance(d, dict):
        raise ConfigError(key, f"expected a path or a mapping with path, got {type(d).__name__}")
    check_keys(d, ("path", "name", "model_name", "upstream"), key)
    path = d.get("path")
    if not isinstance(path, str) or not path.strip():
        raise ConfigError(f"{key}.path", "required: the log file's path (globs allowed)")
    name = d.get("name") or default_name(path)
    if not isinstance(name, str):
        raise ConfigError(f"{key}.name", "expected a string")
    model = d.get("model_name", "")
    if not isinstance(model, str):
        raise ConfigError(f"{key}.model_name", "expected a string")
    upstream = d.get("upstream", "")
    if not isinstance(upstream, str):
        raise ConfigError(f"{key}.upstream", "expected the name of a configured upstream")
    return LogFileSpec(path=os.path.expanduser(path), name=name, model_name=model, upstream=upstream)


_KEYS = {"files", "from_beginning", "state_file", "on_state_error", "poll_interval", "rotate_wait",
         "save_interval", "max_line_bytes", "stats_interval", "watch_events", "builtin_parsers", "rules"}


def parse_log_config(raw: Any, key: str = "logs") -> LogConfig:
    from cachemon.sources.logs.rules import parse_rules

    if isinstance(raw, (str, list)):
        raw = {"files": [raw] if isinstance(raw, str) else raw}
    if not isinstance(raw, dict):
        raise ConfigError(key, f"expected a mapping (files, rules, ...), got {type(raw).__name__}")
    check_keys(raw, _KEYS, key)
    cfg = LogConfig()
    files = raw.get("files", [])
    if isinstance(files, str):
        files = [files]
    if not isinstance(files, list):
        raise ConfigError(f"{key}.files", "expected a list of paths or {path, name, model_name} mappings")
    cfg.files = [_file(f, f"{key}.files[{i}]") for i, f in enumerate(files)]
    check_unique_names(cfg.files, f"{key}.files")
    if "from_beginning" in raw:
        cfg.from_beginning = _bool(raw["from_beginning"], f"{key}.from_beginning")
    if "state_file" in raw:
        sf = raw["state_file"]
        if sf is None or (isinstance(sf, str) and sf.strip().lower() in ("none", "off", "")):
            cfg.state_file = ""
        elif isinstance(sf, str):
            cfg.state_file = os.path.expanduser(sf)
        else:
            raise ConfigError(f"{key}.state_file", f"expected a path or none, got {sf!r}")
    if "on_state_error" in raw:
        v = raw["on_state_error"]
        if v not in ON_STATE_ERROR:
            raise ConfigError(f"{key}.on_state_error", f"expected one of {', '.join(ON_STATE_ERROR)}, got {v!r}")
        cfg.on_state_error = v
    for name in ("poll_interval", "rotate_wait", "save_interval", "stats_interval"):
        if name in raw:
            setattr(cfg, name, parse_duration(raw[name], f"{key}.{name}"))
    if "max_line_bytes" in raw:
        v = raw["max_line_bytes"]
        if isinstance(v, bool) or not isinstance(v, int) or v < 256:
            raise ConfigError(f"{key}.max_line_bytes", f"expected an integer >= 256, got {v!r}")
        cfg.max_line_bytes = v
    for name in ("watch_events", "builtin_parsers"):
        if name in raw:
            setattr(cfg, name, _bool(raw[name], f"{key}.{name}"))
    cfg.rules = parse_rules(raw.get("rules", []), f"{key}.rules")
    if not cfg.builtin_parsers and not cfg.rules:
        raise ConfigError(f"{key}.builtin_parsers", "false with no rules: nothing would be parsed")
    return cfg


def apply_log_flags(existing: LogConfig | None, log_files, from_beginning: bool | None,
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
