"""CONSTRUCTED inputs for fuzzing cachemon's two hand-written parsers, and the oracles.

Shared by tests/test_fuzz_parsers.py (Hypothesis, a short budget in the suite) and
benchmarks/fuzz_parsers.py (the long run: atheris, else Hypothesis).

- The exposition parser (sources/exposition.py) is checked differentially against
  prometheus_client's text parser: on every page both accept, every wanted sample cachemon
  reads is one prometheus_client reads, with the same labels and the same number.
- The KV-event decoder (normalise/kv_decode.py) may raise KvDecodeError and nothing else, and
  must return within a bounded time per input.
"""
from __future__ import annotations

import base64
import functools
import json
import math
import time
from pathlib import Path

from hypothesis import strategies as st

from cachemon.sources.exposition import ExpositionError, parse
from cachemon.sources.wire_label import wire_label

WANTED = frozenset({"prefix_cache_queries_total", "prefix_cache_hits_total", "num_requests_running"})
NAMES = ["vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:num_requests_running",
         "vllm:prefix_cache_queries_created", "vllm:other_total", "process_start_time_seconds", "up"]
TYPES = {"vllm:prefix_cache_queries": "counter", "vllm:prefix_cache_hits": "counter",
         "vllm:num_requests_running": "gauge"}
VALUES = ["0", "1", "7", "-1", "1.5", "1e3", "1E-3", "+Inf", "-Inf", "NaN", "0x10", "1_000", ".5", "5.",
          "+3", "1e400", "00012", "inf", "nan", "Infinity", "1.0e+2", " 4", "4 ", ""]
LABEL_VALUES = ["0", "", "tiny", 'a"b', "back\\slash", "two\nlines", "}", "x}\",y=\"z", "ü", "a b", "=", ","]
SEPARATORS = [" ", "  ", "\t", " \t "]


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@st.composite
def label_text(draw) -> str:
    if draw(st.integers(0, 5)) == 0:
        return ""
    pairs = []
    for _ in range(draw(st.integers(0, 3))):
        key = draw(st.sampled_from(["model_name", "engine", "le", "x", "model_name", "0bad", "a-b"]))
        raw = draw(st.sampled_from(LABEL_VALUES) | st.text(max_size=6))
        val = draw(st.sampled_from([_esc(raw), raw]))      # escaped, or raw (often not valid)
        pairs.append(f'{key}{draw(st.sampled_from(["=", " = ", "="]))}"{val}"')
    sep = draw(st.sampled_from([",", ", ", ","]))
    trailing = draw(st.sampled_from(["", "", ","]))
    return "{" + sep.join(pairs) + trailing + "}"


@st.composite
def page_line(draw) -> str:
    kind = draw(st.sampled_from(["sample"] * 6 + ["type", "help", "comment", "blank", "junk"]))
    if kind == "type":
        fam = draw(st.sampled_from(sorted(TYPES)))
        return f"# TYPE {fam} {draw(st.sampled_from([TYPES[fam], 'untyped', 'counter', 'gauge']))}"
    if kind == "help":
        return f"# HELP {draw(st.sampled_from(sorted(TYPES)))} {draw(st.text(max_size=12))}"
    if kind == "comment":
        return "# " + draw(st.text(max_size=12))
    if kind == "blank":
        return ""
    if kind == "junk":
        return draw(st.text(max_size=20))
    name = draw(st.sampled_from(NAMES))
    value = draw(st.sampled_from(VALUES) | st.floats(allow_nan=True).map(repr)
                 | st.integers(-10**20, 10**20).map(str))
    ts = draw(st.sampled_from(["", "", " 1700000000000", " -5", " 1.5", " x"]))
    return f"{name}{draw(label_text())}{draw(st.sampled_from(SEPARATORS))}{value}{ts}"


@st.composite
def pages(draw) -> str:
    lines = draw(st.lists(page_line(), max_size=8))
    end = draw(st.sampled_from(["\n", "\n", "", "\r\n"]))
    return "\n".join(lines) + end


def theirs(body: str) -> list[tuple[str, dict[str, str], float]] | None:
    """prometheus_client's reading of the wanted samples, or None if it rejects the page."""
    from prometheus_client.parser import text_string_to_metric_families
    try:
        out = [(s.name, s.labels, s.value) for f in text_string_to_metric_families(body) for s in f.samples]
    except Exception:      # its parser raises ValueError, TypeError, IndexError... on what it rejects
        return None
    got = []
    for name, lab, v in out:
        stem = name.removeprefix("vllm:")
        if stem not in WANTED and stem.removesuffix("_total") in WANTED:
            stem = stem.removesuffix("_total")    # it names a sample of a family TYPEd counter name_total
        if name.startswith("vllm:") and stem in WANTED:
            # cachemon makes every label value printable and bounded on purpose (sources/wire_label.py)
            got.append((stem, {k: wire_label(w) for k, w in lab.items()}, v))
    return got


def ours(body: str) -> list[tuple[str, dict[str, str], float]] | None:
    try:
        got = parse(body, WANTED)
    except ExpositionError:
        return None
    return [(stem, lab, v) for stem, rows in got.samples.items() for lab, v in rows]


def _same(a: float, b: float) -> bool:
    # prometheus_client keeps an integer literal as a Python int; a sample value is a float64
    b = float(b)
    return (math.isnan(a) and math.isnan(b)) or a == b


def differential(body: str) -> str:
    """"" when the parsers agree on the page (or one rejects it); else what differs. Raises what
    cachemon's parser raises other than ExpositionError (a crash)."""
    mine = ours(body)
    other = theirs(body) if mine is not None else None
    if mine is None or other is None:
        return ""
    for stem, lab, v in mine:
        match = [w for n, lab2, w in other if n == stem and lab2 == lab]
        if not match:
            return f"{stem}{lab}: cachemon read {v!r}, prometheus_client has no such sample ({other!r})"
        if not any(_same(v, w) for w in match):
            return f"{stem}{lab}: cachemon read {v!r}, prometheus_client {match!r}"
    return ""


# -- the KV-event decoder ---------------------------------------------------------------------------
KV_BUDGET_SECONDS = 0.5     # per input, far above the ~10 us a real batch takes
CAPTURE = Path(__file__).parent / "fixtures" / "vllm-0.32.0-cpu-kv-events"


@functools.lru_cache(maxsize=4)
def real_payloads(limit: int = 64) -> list[bytes]:
    """Payloads of the real vLLM 0.32.0 capture (the seeds mutations start from)."""
    out: list[bytes] = []
    for path in sorted(CAPTURE.glob("*/events.jsonl")):
        for line in path.read_text().splitlines()[:8]:
            if line.strip():
                out.append(base64.b64decode(json.loads(line)["payload_b64"]))
        if len(out) >= limit:
            break
    return out[:limit]


# msgpack bombs: nesting far past any limit, and headers that declare more than the payload holds
BOMBS = [
    b"\x91" * 200_000 + b"\xc0",                       # 200 000 nested one-element arrays
    b"\x81\xa1a" * 100_000 + b"\xc0",                  # 100 000 nested one-key maps
    b"\x92\xcb" + bytes(8) + b"\x91" * 100_000,        # a batch whose events nest deep
    b"\xdd\xff\xff\xff\xff",                           # an array of 4 294 967 295 items, none sent
    b"\xdf\xff\xff\xff\xff",                           # a map of as many pairs
    b"\xc6\xff\xff\xff\xff",                           # bin of 4 GiB
    b"\xdb\xff\xff\xff\xff",                           # str of 4 GiB
    b"\x93\xcb" + bytes(8) + b"\xdd\xff\xff\xff\xff",  # [ts, <4G events>, ...]
    b"\x92\xcb" + bytes(8) + b"\x91\x82\xa4type\xabBlockStored\xacblock_hashes\xdd\xff\xff\xff\xff",
    b"\x92\xcb" + bytes(8) + b"\x91\x93\xabBlockStored\xdd\x00\x10\x00\x00" + b"\x01" * 1000,
    b"\xc7\xff\xff\xff\xff\x01",                      # ext of 4 GiB
]

_leaf = st.one_of(st.none(), st.booleans(), st.integers(-2**64, 2**64 - 1), st.floats(), st.binary(max_size=8),
                  st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared", "type", "block_hashes",
                                   "token_ids", "block_size", "parent_block_hash", "medium", "lora_id", "x"]))
_values = st.recursive(_leaf, lambda c: st.lists(c, max_size=5) | st.dictionaries(
    st.sampled_from(["type", "block_hashes", "token_ids", "block_size", "parent_block_hash", "medium",
                     "lora_id", "group_idx", "x"]), c, max_size=5), max_leaves=30)


def _encode(v) -> bytes:
    import msgspec
    try:
        return msgspec.msgpack.encode(v)
    except (OverflowError, TypeError, ValueError):
        return b"\xc1"


@st.composite
def kv_payloads(draw) -> bytes:
    kind = draw(st.sampled_from(["shaped", "mutated", "bomb", "bytes"]))
    if kind == "bomb":
        return draw(st.sampled_from(BOMBS))
    if kind == "bytes":
        return draw(st.binary(max_size=64))
    if kind == "shaped":        # a batch-shaped value: [ts, [events...], dp_rank?]
        events = draw(st.lists(_values, max_size=4))
        batch = [draw(st.floats() | st.integers()), events] + draw(st.lists(_leaf, max_size=1))
        return _encode(batch)
    seeds = real_payloads()
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "cut", "insert", "splice"]))
        i = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "cut":
            del data[i:]
        elif op == "insert":
            data[i:i] = draw(st.sampled_from([b"\xdd\xff\xff\xff\xff", b"\x91" * 64, b"\xc1", b"\xff"]))
        else:
            other = draw(st.sampled_from(seeds))
            data[i:] = other[draw(st.integers(0, len(other))):]
    return bytes(data)


def kv_decode_checked(payload: bytes, decoder=None) -> str:
    """Decode one payload (with ``decoder``, a stream's KvDecoder, or a fresh one); "" if only
    KvDecodeError (or nothing) came out within the time budget, else how long it took. Any other
    exception propagates (the finding)."""
    from cachemon.normalise.kv_decode import KvDecodeError, KvDecoder
    t0 = time.perf_counter()
    try:
        (decoder or KvDecoder()).decode(payload, 1)
    except KvDecodeError:
        pass
    took = time.perf_counter() - t0
    return "" if took <= KV_BUDGET_SECONDS else f"took {took:.3f} s"
