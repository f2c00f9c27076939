"""The log source's state file: read offsets and the counters derived from the lines
before them, in ONE snapshot, replaced atomically.

Write: temp file in the same directory, fsync, ``os.replace``, fsync the directory.
A crash at any point leaves either the old or the new snapshot, never a mix: each is
self-consistent (offset and counters agree), so resuming from either counts every
line exactly once. A leftover temp file is ignored and removed (it may be half
written; the stable file is complete). The payload carries a SHA-256 so a file that
parses as JSON but was damaged is still rejected.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

SCHEMA = "cachemon-log-state/1"
_replace = os.replace        # the commit point of a save (tests simulate a crash just before it)


class StateError(Exception):
    """The state file exists but cannot be used (unreadable, corrupt, other schema)."""


def _canonical(payload: dict) -> bytes:
    return json.dumps(payload, sort_keys=True, separators=(",", ":")).encode("utf-8")


def tmp_path(path: Path) -> Path:
    return path.with_name(path.name + ".tmp")


def save(path: Path, payload: dict) -> None:
    """Atomically replace the state file. Raises OSError (caller logs and retries later)."""
    body = _canonical(payload)
    doc = {"schema": SCHEMA, "saved_at": time.time(), "sha256": hashlib.sha256(body).hexdigest(),
           "payload": payload}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_path(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, json.dumps(doc, sort_keys=True).encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    _replace(tmp, path)
    try:
        dfd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)      # make the rename itself durable
    except OSError:
        pass
    finally:
        os.close(dfd)


def load(path: Path) -> dict | None:
    """The saved payload; None if there is no state file yet. Raises StateError if unusable."""
    tmp = tmp_path(path)
    if tmp.exists():
        try:
            tmp.unlink()          # an interrupted save: the stable file is the consistent one
        except OSError:
            pass
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise StateError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise StateError(f"{path} is not valid JSON ({len(raw)} bytes)") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise StateError(f"{path} is not a {SCHEMA} file")
    payload = doc.get("payload")
    if not isinstance(payload, dict) or hashlib.sha256(_canonical(payload)).hexdigest() != doc.get("sha256"):
        raise StateError(f"{path}: checksum mismatch (damaged file)")
    return payload
