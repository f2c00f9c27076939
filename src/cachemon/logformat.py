"""cachemon's own log lines: logfmt (the exporters' default) or JSON, one line per record.

``--log.level debug|info|warn|error`` and ``--log.format logfmt|json``, as exporter-toolkit's
flags. A traceback stays on the record's one line (``err="...\\n..."``), so a log shipper never
splits a record.
"""
from __future__ import annotations

import json
import logging
import time

LEVELS = ("debug", "info", "warn", "warning", "error")
FORMATS = ("logfmt", "json")
_LEVEL_NAMES = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warn",
                logging.ERROR: "error", logging.CRITICAL: "error"}


def _timestamp(record: logging.LogRecord) -> str:
    t = time.gmtime(record.created)
    return time.strftime("%Y-%m-%dT%H:%M:%S", t) + f".{int(record.msecs):03d}Z"


def _fields(record: logging.LogRecord, formatter: logging.Formatter) -> dict[str, str]:
    out = {"ts": _timestamp(record), "level": _LEVEL_NAMES.get(record.levelno, record.levelname.lower()),
           "logger": record.name, "msg": record.getMessage()}
    if record.exc_info:
        out["err"] = formatter.formatException(record.exc_info)
    return out


_ESCAPES = {ord("\\"): "\\\\", ord('"'): '\\"', ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"}
_ESCAPES.update({c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F) if c not in _ESCAPES})


def _logfmt_value(v: str) -> str:
    if v and v.isprintable() and not any(c in v for c in ' ="\\'):
        return v
    return '"' + v.translate(_ESCAPES) + '"'


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{k}={_logfmt_value(v)}" for k, v in _fields(record, self).items())


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_fields(record, self), ensure_ascii=False)


def setup_logging(level: str = "info", fmt: str = "logfmt") -> None:
    """Root logger to stderr at `level` (``warn`` = ``warning``) in `fmt`."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else LogfmtFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel({"warn": logging.WARNING}.get(level.lower(), getattr(logging, level.upper(), logging.INFO)))
