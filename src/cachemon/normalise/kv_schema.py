"""The KV-event wire schema, once: the era table (which release or engine publishes which fields, in which
layout) and the field table (each field's type and default); the msgspec Structs of both layouts are
generated from the two (docs/kv-events.md)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec

from cachemon.normalise.kv_limits import (
    MAX_HASH_BYTES,
    MAX_MEDIUM_CHARS,
    MAX_NAME_CHARS,
    MAX_SALT_CHARS,
    MAX_TS,
)

Layout = Literal["array", "map"]


@dataclass(frozen=True)
class KvEra:
    """One encoding of the event payload, as some vLLM releases publish it."""
    first: str                           # first release with this encoding
    last: str                            # last release with it (as of 0.34.0)
    layout: Layout                       # events as positional arrays or as tagged maps
    stored: tuple[str, ...]              # BlockStored fields in declaration order (after the tag)
    stored_required: int                 # how many of them are always present (no default)
    removed: tuple[str, ...]             # BlockRemoved fields in order
    removed_required: int
    batch_dp_rank: bool                  # the batch has data_parallel_rank (3rd element)
    hashes: str                          # what the hash values are
    engine: str = "vllm"                 # its engines.ENGINES row (first/last: that engine's releases)
    source: str = ""                     # where another engine's row was read (file:line)

    @property
    def name(self) -> str:
        name = self.first if self.first == self.last else f"{self.first}-{self.last}"
        return name if self.engine == "vllm" else f"{self.engine} {name}"


_S0 = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id")


_S1 = _S0 + ("medium",)


_S2 = _S1 + ("lora_name",)


_S3 = _S2 + ("extra_keys",)


_S4 = _S3 + ("group_idx",)


_S5 = _S4 + ("kv_cache_spec_kind", "kv_cache_spec_sliding_window")


_INT = "Python hash() ints (signed 64-bit; per process unless PYTHONHASHSEED is set)"


_EXT = "low 64 bits as unsigned int (default) or digest bytes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0)"


# Every release of vllm/distributed/kv_events.py, oldest first (one row per encoding change). msgspec
# writes every field of an array_like struct (omit_defaults only drops map keys), so an array era's
# events always carry all their fields; a map era's omit the optional ones that are None.
_R0, _R1 = ("block_hashes",), ("block_hashes", "medium")


_R2 = _R1 + ("group_idx",)


ERAS: tuple[KvEra, ...] = (
    KvEra("0.9.0", "0.9.0.1", "array", _S0, 5, _R0, 1, False, _INT),
    KvEra("0.9.1", "0.10.1.1", "array", _S0, 5, _R0, 1, True, _INT),
    KvEra("0.10.2", "0.13.0", "array", _S1, 6, _R1, 2, True, _EXT),   # real: vllm-0.1{0,1}.2-cpu-kv-events
    KvEra("0.14.0", "0.16.0", "array", _S2, 7, _R1, 2, True, _EXT),
    KvEra("0.17.0", "0.19.1", "array", _S3, 8, _R1, 2, True, _EXT),
    KvEra("0.20.0", "0.21.0", "array", _S4, 9, _R2, 3, True, _EXT),
    KvEra("0.22.0", "0.23.0", "array", _S5, 11, _R2, 3, True, _EXT),
    KvEra("0.24.0", "0.25.1", "map", _S5, 7, _R2, 2, True, _EXT),
    KvEra("0.26.0", "0.28.0", "map", _S5 + ("locality",), 7, _R2 + ("locality",), 2, True, _EXT),
    KvEra("0.29.0", "0.29.0", "map", _S5 + ("locality", "ownership"), 7, _R2 + ("locality", "ownership"), 2, True,
          _EXT),
    KvEra("0.30.0", "0.32.0", "map", _S5 + ("locality", "ownership", "session_id"), 7, _R2 + ("locality", "ownership"),
          2, True, _EXT),
    # 0.34.0's vllm/distributed/kv_events.py is byte for byte 0.33.0's (the PyPI wheels, diffed 2026-12-06)
    KvEra("0.33.0", "0.34.0", "map", _S5 + ("locality", "ownership", "session_id", "lookahead_token_ids"), 7,
          _R2 + ("locality", "ownership"), 2, True, _EXT),
    # Other engines on vLLM's wire (engines.ENGINES). SGLang's maps omit medium and lora_name when None (never
    # a vLLM map's shape); `cache_salt` is the raw salt (the tenant split; never kept); one hash per token.
    KvEra("0.5.23", "0.5.23", "map", _S0 + ("medium", "cache_salt", "session_id", "lora_name"), 5, _R1, 1, True,
          "signed 64-bit ints, namespaced by the salt", "sglang", "sglang/srt/disaggregation/kv_events.py:233-303"),
    # TensorRT-LLM: vLLM 0.26's map fields plus mm_keys; token ids int or str (multimodal digests).
    KvEra("13599e9", "13599e9", "map", _S5 + ("locality", "mm_keys"), 7, _R2 + ("locality",), 2, True, "ints",
          "tensorrt-llm", "tensorrt_llm/_torch/pyexecutor/kv_cache_events.py (PR #17023)"),
)


KNOWN_TYPES = ("BlockStored", "BlockRemoved", "AllBlocksCleared")


# bounded: the ledger keeps up to max_blocks hashes, and a label per LoRA name (kv_limits.py)
HashT = int | Annotated[bytes, msgspec.Meta(max_length=MAX_HASH_BYTES)]


LoraName = Annotated[str, msgspec.Meta(max_length=MAX_NAME_CHARS)]


_Medium = Annotated[str, msgspec.Meta(max_length=MAX_MEDIUM_CHARS)]


Timestamp = Annotated[float, msgspec.Meta(ge=0, le=MAX_TS)]    # unix seconds: NaN, inf, 1e300 fail


_Salt = Annotated[str, msgspec.Meta(max_length=MAX_SALT_CHARS)]


Hashes = tuple[HashT, ...]


# The schema, once: each field the decoder reads, its type and its default (NODEFAULT: always
# present). The eras above say which release has which field, in which order; the Structs of both
# layouts are generated from these two tables, so a new field is a row here and a name in its eras.
_NODEFAULT = msgspec.NODEFAULT


FIELD_TYPES: dict[str, tuple[Any, Any]] = {
    "block_hashes": (Hashes, _NODEFAULT),
    "parent_block_hash": (HashT | None, _NODEFAULT),
    "token_ids": (msgspec.Raw, _NODEFAULT),         # kept encoded (normalise/kv_tokens.py): ints cost ~30 ns each
    "block_size": (int, _NODEFAULT),
    "lora_id": (int | None, None),
    "medium": (_Medium | None, None),
    "lora_name": (LoraName | None, None),
    "cache_salt": (_Salt | None, None),      # SGLang: the raw salt (a secret: only its tenant label leaves)
    "mm_keys": (list[Any] | None, None),      # TensorRT-LLM: its multimodal items per block (ids may be digests)
    "extra_keys": (list[Any] | None, None),
    "group_idx": (int | None, None),
    "kv_cache_spec_kind": (str | None, None),
    "kv_cache_spec_sliding_window": (int | None, None),
    "lookahead_token_ids": (list[tuple[int, ...]] | None, None),
}


def _wire_fields(layout: Layout, kind: str) -> list[str]:
    """The fields one layout's Struct declares: an array layout's in the newest array era's order (each
    older era's are a prefix of it), a map layout's the union of its eras' (unread ones left out:
    msgspec skips a map's unknown keys)."""
    names: list[str] = []
    for era in ERAS:
        if era.layout != layout:
            continue
        fields = era.stored if kind == "BlockStored" else era.removed
        if layout == "array":
            if fields[:len(names)] != tuple(names):
                raise AssertionError(f"array era {era.name}: {kind} fields are not an extension of the older ones")
            names = list(fields)
        else:
            names += [f for f in fields if f not in names]
    return [f for f in names if f in FIELD_TYPES] if layout == "map" else names


def _event_struct(layout: Layout, kind: str) -> type[msgspec.Struct]:
    fields = [(f, FIELD_TYPES[f][0]) if FIELD_TYPES[f][1] is _NODEFAULT else (f, FIELD_TYPES[f][0], FIELD_TYPES[f][1])
              for f in _wire_fields(layout, kind)]
    return msgspec.defstruct(f"{layout}_{kind}", fields, array_like=layout == "array", tag=kind, gc=False)


STRUCTS: dict[tuple[Layout, str], type[msgspec.Struct]] = {
    (layout, kind): _event_struct(layout, kind) if kind != "AllBlocksCleared"
    else msgspec.defstruct(f"{layout}_{kind}", [], array_like=layout == "array", tag=kind, gc=False)
    for layout in ("array", "map") for kind in KNOWN_TYPES}


STORED_TYPES = frozenset(STRUCTS[(lay, "BlockStored")] for lay in ("array", "map"))


REMOVED_TYPES = frozenset(STRUCTS[(lay, "BlockRemoved")] for lay in ("array", "map"))


def batch_struct(layout: Layout) -> type[msgspec.Struct]:
    events = STRUCTS[(layout, "BlockStored")] | STRUCTS[(layout, "BlockRemoved")] | STRUCTS[(layout, "AllBlocksCleared")]
    return msgspec.defstruct(f"{layout}_batch", [("ts", Timestamp), ("events", list[events]),  # type: ignore[valid-type]
                                                 ("data_parallel_rank", int | None, None)], array_like=True, gc=False)


def era(name: str) -> KvEra:
    """The era row by its first release (for tests and docs)."""
    for e in ERAS:
        if e.first == name:
            return e
    raise KeyError(name)
