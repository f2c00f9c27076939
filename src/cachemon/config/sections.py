"""Sections: dataclasses whose fields are declared with ``setting(parse, default)``, read by ``load_section``."""
from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import field
from typing import TypeVar, overload

from cachemon.config.values import (
    ConfigError,
    Parser,
    boolean,
    integer,
    list_of,
    number,
    optional,
    string,
    subkey,
    type_error,
)

T = TypeVar("T")


# The field's type is what its parser returns: a default (or a default factory) of another type is a
# type error where the section is declared.
@overload
def setting(parse: Parser[T], default: T, *, secret: bool = False) -> T: ...
@overload
def setting(parse: Parser[T], *, default_factory: Callable[[], T], secret: bool = False) -> T: ...
@overload
def setting(parse: Parser[T], *, secret: bool = False) -> T: ...


def setting(parse: Parser[object], default: object = dataclasses.MISSING, *,
            default_factory: Callable[[], object] | None = None, secret: bool = False) -> object:
    """A section field read from YAML through ``parse``; without a default it is required. A ``secret``
    stays out of the section's repr."""
    if default_factory is not None:
        return field(default_factory=default_factory, metadata={"parse": parse}, repr=not secret)
    return field(default=default, metadata={"parse": parse}, repr=not secret)


def _inferred(hint: object) -> Parser[object] | None:
    """The parser a plain annotated field gets: str, int, float, bool, X | None, list[X], tuple[X, ...]."""
    simple: dict[object, Parser[object]] = {str: string, int: integer(), float: number(), bool: boolean}
    if hint in simple:
        return simple[hint]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType) and len(args) == 2 and type(None) in args:
        inner = _inferred(next(a for a in args if a is not type(None)))
        return optional(inner) if inner else None
    if origin is list and len(args) == 1 and (inner := _inferred(args[0])):
        return list_of(inner)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis and (inner := _inferred(args[0])):
        item = inner
        return lambda v, k: tuple(list_of(item)(v, k))
    return None


@functools.cache
def section_parsers(cls: type) -> dict[str, Parser[object]]:
    """YAML key -> parser of a section: ``setting(parse)`` fields, and plain fields whose type
    is simple enough to check (so a field added to a section is validated without more code)."""
    hints = typing.get_type_hints(cls)
    out: dict[str, Parser[object]] = {}
    for f in dataclasses.fields(cls):
        parse = f.metadata.get("parse") or (_inferred(hints[f.name]) if f.init else None)
        if parse is not None:
            out[f.name] = parse
    return out


def load_section(cls: type[T], raw: object, key: str) -> T:
    """Build section ``cls`` from the mapping ``raw`` (None = every default); fields without a
    parser (not read from YAML) keep their defaults."""
    if raw is None:
        raw = {}
    parsers = section_parsers(typing.cast(type, cls))
    if not isinstance(raw, dict):
        raise type_error(key or "config", f"a mapping with {', '.join(parsers)}", raw)
    check_keys(raw, parsers, key)
    values: dict[str, object] = {}
    for f in dataclasses.fields(cls):   # type: ignore[arg-type]
        if f.name in raw:
            values[f.name] = parsers[f.name](raw[f.name], subkey(key, f.name))
        elif f.name in parsers and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(subkey(key, f.name), "required")
    return cls(**values)


def section(cls: type[T]) -> Parser[T]:
    return lambda v, k: load_section(cls, v, k)


def check_keys(d: Iterable[object], allowed: Iterable[str], key: str) -> None:
    """Reject a key not in `allowed`, naming it and the allowed key it most likely means (every
    config section uses this)."""
    allowed = list(allowed)
    for k in d:
        if k not in allowed:
            near = difflib.get_close_matches(str(k), allowed, n=1, cutoff=0.6)
            hint = f", did you mean {near[0]!r}?" if near else ""
            raise ConfigError(subkey(key, str(k)), f"unknown key{hint} (allowed: {', '.join(sorted(allowed))})")
