"""Token ids of a BlockStored kept msgpack-encoded, and their per-block keys.

Turning every token id into a Python int is the decoder's floor (~30 ns an id: at block_size 128
a block event costs more than the 2 us that 500 000 block events/s leave). So the decoder keeps
``token_ids`` as the bytes vLLM sent (``EncodedTokens``), and the ledger needs only one thing of
them: per block, a key that is equal exactly when the block's token ids are equal. That key is the
block's token ids as concatenated *canonical* msgpack integers (each in its smallest encoding,
which is what msgspec, vLLM's encoder in every release, always writes): for encoded tokens a
slice of the received bytes, found by one compiled regex per block; for ints (constructed events,
tests) the same bytes from msgspec's encoder. Both forms therefore give the same key, hence the
same content id. Anything the fast path does not expect (negative ints, non-int items, a count
that does not add up) falls back to decoding the ints and re-encoding them, so correctness never
depends on the fast path; what cannot be read as ints gives ``None`` (the ledger counts it).

Limit: the regex accepts non-canonical unsigned encodings (e.g. 5 as ``cd 00 05``) as they are,
so a sender that is not msgspec could give the same tokens another key than msgspec's bytes would.
No vLLM release does; every stream of a fleet goes through this module. Checking canonical form
in the regex measured 1.6x slower at block_size 128.

Token ids are prompt content: ``repr`` shows their count, never their values.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from typing import overload

__all__ = ["EncodedTokens", "array_header", "block_keys", "decode_ids"]

# One msgpack integer >= 0: uint32 (token ids of vocabularies over 65 535) and uint16 first: sre's
# BRANCH skips an alternative whose leading literal does not match at the cost of a byte compare.
_UINT = rb"(?:\xce....|\xcd..|[\x00-\x7f]|\xcc.|\xcf........)"
# Block sizes up to this are matched by an unrolled pattern (no REPEAT context: ~2x faster in sre);
# larger ones (no vLLM default) by a counted repeat.
_UNROLL_MAX = 256
# Small blocks are matched GROUP at a time (one capture group a block): per-block Python overhead
# (a match call, its end, a slice) was half the cost at block_size 16.
_GROUP, _GROUP_MAX_BS = 8, 32
# A compiled pattern's match, anchored at a position: re.Pattern[bytes].match.
_Match = Callable[[bytes, int], re.Match[bytes] | None]
_PATTERNS: dict[int, tuple[_Match, _Match | None]] = {}   # block_size -> (match one block, match _GROUP blocks or None)
_MAX_PATTERNS = 16           # distinct block sizes compiled (a stream uses one; hostile ones are bounded)

# (Encoder.encode, Decoder(tuple[int, ...]).decode, the errors decoding raises), loaded lazily: msgspec is an extra
_Codec = tuple[Callable[[object], bytes], Callable[[bytes], tuple[int, ...]], tuple[type[Exception], ...]]
_codec: _Codec | None = None


def _msgspec() -> _Codec:
    global _codec
    if _codec is None:
        import msgspec
        _codec = (msgspec.msgpack.Encoder().encode, msgspec.msgpack.Decoder(tuple[int, ...]).decode,
                  (msgspec.DecodeError, msgspec.ValidationError))
    return _codec


def array_header(data: bytes) -> tuple[int, int] | None:
    """(item count, header length) of a msgpack array, or None if ``data`` is not one."""
    if not data:
        return None
    b = data[0]
    if 0x90 <= b <= 0x9F:
        return b - 0x90, 1
    if b == 0xDC and len(data) >= 3:
        return int.from_bytes(data[1:3], "big"), 3
    if b == 0xDD and len(data) >= 5:
        return int.from_bytes(data[1:5], "big"), 5
    return None


def _header_len(count: int) -> int:
    return 1 if count < 16 else 3 if count < 65536 else 5


class EncodedTokens(Sequence[int]):
    """A BlockStored's token ids as received: one msgpack array (``data``), ``size`` items after a
    header of ``offset`` bytes. Reading it as ints (``ids()``, indexing, iteration, equality with a
    tuple) decodes on demand; the ledger's hot path reads only ``block_keys``."""
    __slots__ = ("data", "offset", "size")

    def __init__(self, data: bytes, size: int, offset: int) -> None:
        self.data = data
        self.size = size
        self.offset = offset

    @classmethod
    def of(cls, data: bytes) -> EncodedTokens | None:
        """From the raw bytes of a msgpack value; None if it is not an array."""
        h = array_header(data)
        return None if h is None else cls(data, h[0], h[1])

    def ids(self) -> tuple[int, ...]:
        """The token ids as ints. Raises ValueError if the items are not integers."""
        try:
            ids: tuple[int, ...] = _msgspec()[1](self.data)
            return ids
        except _msgspec()[2] as e:
            raise ValueError(f"token_ids are not integers: {type(e).__name__}") from None

    def __len__(self) -> int:
        return self.size

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[int, ...]: ...
    def __getitem__(self, i: int | slice) -> int | tuple[int, ...]:
        return self.ids()[i]

    def __iter__(self) -> Iterator[int]:
        return iter(self.ids())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, EncodedTokens):
            return self.data == other.data or self.ids() == other.ids()
        if isinstance(other, tuple | list):
            return self.ids() == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.ids())                     # consistent with equality to a tuple

    def __repr__(self) -> str:
        return f"EncodedTokens({self.size} token ids, {len(self.data)} bytes)"


def _pattern(bs: int) -> tuple[_Match, _Match | None]:
    pats = _PATTERNS.get(bs)
    if pats is None:
        if len(_PATTERNS) >= _MAX_PATTERNS:
            _PATTERNS.pop(next(iter(_PATTERNS)))
        src = _UINT * bs if bs <= _UNROLL_MAX else _UINT + b"{%d}" % bs
        group = re.compile((b"(" + src + b")") * _GROUP, re.DOTALL).match if bs <= _GROUP_MAX_BS else None
        pats = _PATTERNS[bs] = (re.compile(src, re.DOTALL).match, group)
    return pats


def _fast(tok: EncodedTokens, n: int, bs: int) -> list[bytes] | None:
    """Split the array body into n blocks of bs unsigned msgpack ints at C speed; None if anything
    else is there (negative ints, floats, a count or length that does not add up). Every match is
    anchored where the previous one ended (``match``, not a search): linear whatever the bytes."""
    data = tok.data
    match, group = _pattern(bs)
    pos = tok.offset
    out: list[bytes] = []
    left = n
    if group is not None:
        while left >= _GROUP:
            m = group(data, pos)
            if m is None:
                return None
            out.extend(m.groups())
            pos = m.end()
            left -= _GROUP
    for _ in range(left):
        m = match(data, pos)
        if m is None:
            return None
        end = m.end()
        out.append(data[pos:end])
        pos = end
    return out if pos == len(data) else None


def block_keys(tokens: Sequence[int], n: int, bs: int) -> list[bytes] | None:
    """Per block, its token ids as concatenated canonical msgpack ints (equal exactly when the ids
    are equal, whichever form they came in), or None if ``tokens`` is not n x bs integers that
    msgpack can hold (-2^63 .. 2^64-1)."""
    if n <= 0 or bs <= 0 or len(tokens) != n * bs:
        return None
    if type(tokens) is EncodedTokens:
        keys = _fast(tokens, n, bs)
        if keys is not None:
            return keys
        try:
            tokens = tokens.ids()
        except ValueError:
            return None
        if len(tokens) != n * bs:
            return None
    elif type(tokens) is not tuple:
        tokens = tuple(tokens)
    enc = _msgspec()[0]
    hl = _header_len(bs)
    try:
        return [enc(tokens[i:i + bs])[hl:] for i in range(0, n * bs, bs)]
    except (TypeError, OverflowError, ValueError):
        return None                                 # not ints, or ints msgpack cannot hold


def decode_ids(key: bytes, count: int, limit: int) -> tuple[int, ...]:
    """A block key back to at most ``limit`` token ids (keep_text samples; never on the hot path)."""
    data = (bytes([0x90 + count]) if count < 16 else b"\xdc" + count.to_bytes(2, "big") if count < 65536
            else b"\xdd" + count.to_bytes(4, "big")) + key
    return tuple(_msgspec()[1](data)[:limit])
