"""User-supplied files, read small, regular and bounded (the config file, tokenizer files), and YAML within bounds."""
from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import yaml

from cachemon.config.values import ConfigError, subkey

# Caps on what cachemon reads whole into memory. A config of thousands of log rules is well under
# 4 MiB; tokenizer.json of the largest vocabularies (Gemma 3: 33 MB) is under 256 MiB.
MAX_CONFIG_BYTES = 4 * 1024 * 1024
MAX_TOKENIZER_FILE_BYTES = 256 * 1024 * 1024
# YAML structure bounds: no config is nested more than a handful of levels or needs an integer of
# more than a few digits; past these PyYAML recurses into a RecursionError and Python's int()
# refuses 4300 digits (sys.int_info.default_max_str_digits), both as tracebacks.
MAX_YAML_DEPTH = 64
# libyaml's safe loader where PyYAML was built with it (the wheels are): the same documents and
# errors about ten times faster than the pure-Python one (a 256 KiB web config: 0.07 s, not 0.7 s).
_SAFE_LOADER: type[yaml.SafeLoader] | type[yaml.CSafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
MAX_INT_DIGITS = 64

_FILE_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
               (stat.S_ISDIR, "a directory"), (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str:
    return next((name for test, name in _FILE_KINDS if test(mode)), "of an unknown type")


def read_small_file(path: str | Path, key: str, max_bytes: int, *, what: str = "file") -> bytes:
    """The whole of the regular file ``path``, at most ``max_bytes``; else one ConfigError(key) line.

    Opened non-blocking, so a FIFO is refused at once instead of waiting for a writer; a device
    (/dev/zero), directory or socket is refused by its type before any byte is read; the read is
    capped too, since st_size is only a hint (a file being written, /proc files report 0)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise ConfigError(key, f"cannot read {what} {path}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(key, f"{what} {path} is {_kind(st.st_mode)}, not a regular file")
        if st.st_size > max_bytes:
            raise ConfigError(key, f"{what} {path} is larger than {max_bytes} bytes ({st.st_size})")
        chunks, total = [], 0
        while total <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > max_bytes:
            raise ConfigError(key, f"{what} {path} is larger than {max_bytes} bytes")
        return b"".join(chunks)
    except OSError as e:
        raise ConfigError(key, f"cannot read {what} {path}: {e.strerror or e}") from None
    finally:
        os.close(fd)


def regular_file(path: str | Path, key: str, *, what: str = "file") -> str:
    """``path`` if it names a regular file, for readers that take a path (ssl's load_cert_chain):
    a FIFO there would block the reader, a device would be read forever."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise ConfigError(key, f"cannot read {what} {path}: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(key, f"{what} {path} is {_kind(st.st_mode)}, not a regular file")
    return str(path)


def _path_text(path: list[str | int], limit: int = 8) -> str:
    key = ""
    for name in path[:limit]:
        key = subkey(key, name)
    return key + ("..." if len(path) > limit else "")


_INT_TAG = "tag:yaml.org,2002:int"


class _Mark(Protocol):
    """Where in the text an event starts (PyYAML's pure and libyaml marks alike)."""

    @property
    def line(self) -> int: ...
    @property
    def column(self) -> int: ...


def _at(mark: _Mark | None) -> str:
    return f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""


def _check_yaml_bounds(text_: str, what: str, path_: str | Path, key: str) -> None:
    """Walk the event stream (PyYAML's parser is not recursive, its composer is) and refuse, naming
    the key path, nesting deeper than MAX_YAML_DEPTH and integers longer than MAX_INT_DIGITS digits."""
    try:
        _walk_bounds(yaml.parse(text_, Loader=_SAFE_LOADER), what, path_, key)
    except yaml.YAMLError:
        # libyaml reads ahead of the events it hands out (and stops at its own depth of 1000 first):
        # the pure parser walks again, to name the key path, or the error where it is
        _walk_bounds(yaml.parse(text_, Loader=yaml.SafeLoader), what, path_, key)


def _walk_bounds(events: Iterable[yaml.Event], what: str, path_: str | Path, key: str) -> None:
    walk = _BoundsWalk(what, path_, key)
    for ev in events:
        if isinstance(ev, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            walk.open(ev)
        elif isinstance(ev, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            walk.stack.pop()
            walk.advance()
        elif isinstance(ev, yaml.ScalarEvent):
            walk.scalar(ev)
        elif isinstance(ev, yaml.AliasEvent):
            walk.advance()


@dataclass
class _Open:
    """One open collection of the event stream."""
    is_seq: bool
    index: int = 0                 # a sequence's next item
    key: str | None = None         # a mapping's key whose value is being read
    expecting_key: bool = False    # a mapping's next node is a key


class _BoundsWalk:
    """Where the event stream is (the key path, for the error) and the two bounds it checks."""

    def __init__(self, what: str, path_: str | Path, key: str):
        self.what, self.path = what, path_
        self.resolver = yaml.resolver.Resolver()
        self.stack: list[_Open] = []
        self.base = [key] if key else []

    def where(self) -> list[str | int]:
        out: list[str | int] = list(self.base)
        for o in self.stack:
            if o.is_seq:
                out.append(o.index)
            elif not o.expecting_key and o.key is not None:
                out.append(o.key)
        return out

    def advance(self, scalar: str | None = None) -> None:
        """A node ended inside the innermost collection."""
        if not self.stack:
            return
        top = self.stack[-1]
        if top.is_seq:
            top.index += 1
        elif top.expecting_key:            # that node was a key
            top.key, top.expecting_key = (scalar if scalar is not None else "?"), False
        else:
            top.key, top.expecting_key = None, True

    def open(self, ev: yaml.SequenceStartEvent | yaml.MappingStartEvent) -> None:
        if len(self.stack) >= MAX_YAML_DEPTH:
            raise ConfigError(_path_text(self.where()), f"{self.what} {self.path} is nested deeper than "
                                                        f"{MAX_YAML_DEPTH} levels{_at(ev.start_mark)}")
        is_seq = isinstance(ev, yaml.SequenceStartEvent)
        self.stack.append(_Open(is_seq, expecting_key=not is_seq))

    def scalar(self, ev: yaml.ScalarEvent) -> None:
        tag = ev.tag if ev.tag not in (None, "!") else \
            self.resolver.resolve(yaml.ScalarNode, ev.value, ev.implicit)  # type: ignore[no-untyped-call]
        if tag == _INT_TAG:
            digits = sum(c.isalnum() for c in ev.value.lower().removeprefix("0x").removeprefix("0o")
                         .removeprefix("0b").lstrip("+-"))
            if digits > MAX_INT_DIGITS:
                raise ConfigError(_path_text(self.where()), f"an integer of {digits} digits (at most {MAX_INT_DIGITS}) "
                                                            f"in {self.what} {self.path}{_at(ev.start_mark)}")
        self.advance(ev.value)


def load_yaml(path: str | Path, *, what: str = "config file", key: str = "",
              max_bytes: int = MAX_CONFIG_BYTES) -> dict[str, object]:
    """A YAML file whose top level is a mapping; every failure is one ConfigError line. ``key``
    prefixes the key paths of structural errors (the web config's ``web_config``)."""
    data_bytes = read_small_file(path, "", max_bytes, what=what)
    try:
        text_ = data_bytes.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError("", f"{what} {path} is not valid UTF-8 (byte {e.start}: {e.reason})") from None
    try:
        _check_yaml_bounds(text_, what, path, key)
        data = yaml.load(text_, Loader=_SAFE_LOADER)  # noqa: S506 (a safe loader)
    except ConfigError:
        raise
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = str(getattr(e, "problem", None) or e).replace("\n", " ")
        raise ConfigError("", f"{what} {path} is not valid YAML{where}: {problem}") from None
    except (RecursionError, ValueError) as e:     # belt and braces: the bounds above come first
        raise ConfigError("", f"{what} {path}: {type(e).__name__}: {str(e)[:200]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("", f"{what} {path}: the top level must be a mapping")
    return data
