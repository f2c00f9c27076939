"""The JSON data model as one recursive type: what a JSON or YAML document cachemon builds can hold.
A document the code only builds (dashboards, manifests, reports) is a ``JsonObject``; a document read
from outside is ``object`` until it is checked, then narrowed with isinstance."""
from __future__ import annotations

from typing import TypeAlias

JsonValue: TypeAlias = dict[str, "JsonValue"] | list["JsonValue"] | str | int | float | bool | None
JsonObject: TypeAlias = dict[str, JsonValue]


def as_object(value: JsonValue) -> JsonObject:
    """``value`` as the object it must be here (a document's own structure, not user input)."""
    if not isinstance(value, dict):
        raise TypeError(f"expected a JSON object, got {type(value).__name__}")
    return value


def as_list(value: JsonValue) -> list[JsonValue]:
    """``value`` as the array it must be here (a document's own structure, not user input)."""
    if not isinstance(value, list):
        raise TypeError(f"expected a JSON array, got {type(value).__name__}")
    return value


def as_str(value: JsonValue) -> str:
    """``value`` as the string it must be here (a document's own structure, not user input)."""
    if not isinstance(value, str):
        raise TypeError(f"expected a JSON string, got {type(value).__name__}")
    return value
