"""The streaming msgpack halves: segments are msgpack's bytes; the reader is msgpack's decoder
(bounded, typed errors), whatever the chunking; large bins land in the arena."""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from peer.protocol.errors import BodyTooLarge, MalformedBody
from peer.protocol.msgpack_stream import (
    MAX_DEPTH,
    SPLICE_BYTES,
    StreamReader,
    arena_bytes,
    segments,
    segments_length,
)

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=40)
    | st.binary(max_size=300)
)
big_bins = st.integers(min_value=SPLICE_BYTES, max_value=SPLICE_BYTES + 5000).map(
    lambda n: bytes(range(256)) * (n // 256) + bytes(n % 256)
)
objects = st.recursive(
    scalars | big_bins,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5)
    ),
    max_leaves=12,
)


def _plain(obj: Any) -> Any:
    """The object with memoryviews as bytes and tuples as lists (msgpack's view of it)."""
    if isinstance(obj, memoryview):
        return bytes(obj)
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    return obj


def _source(data: bytes, chunk: int) -> Any:
    pieces = [data[i : i + chunk] for i in range(0, len(data), chunk)]

    async def read() -> bytes:
        return pieces.pop(0) if pieces else b""

    return read


def _read(data: bytes, chunk: int, **kwargs: Any) -> tuple[Any, StreamReader]:
    kwargs.setdefault("length", len(data))
    kwargs.setdefault("cap", max(len(data), 1))

    async def main() -> tuple[Any, StreamReader]:
        reader = StreamReader(_source(data, chunk), **kwargs)
        obj = await reader.read_object()
        await reader.read_rest(0)
        return obj, reader

    return asyncio.run(main())


@settings(max_examples=40, deadline=None)
@given(obj=objects)
def test_segments_join_to_msgpack_bytes(obj: Any) -> None:
    pieces = segments(obj)
    packed = msgpack.packb(obj, use_bin_type=True)
    assert b"".join(bytes(p) for p in pieces) == packed
    assert segments_length(pieces) == len(packed)


@settings(max_examples=40, deadline=None)
@given(obj=objects, chunk=st.sampled_from([5, 4096, 1 << 16, 1 << 20]))
def test_reader_decodes_what_msgpack_decodes_for_any_chunking(obj: Any, chunk: int) -> None:
    packed = msgpack.packb(obj, use_bin_type=True)
    decoded, reader = _read(packed, chunk)
    assert _plain(decoded) == msgpack.unpackb(packed, raw=False, strict_map_key=False)
    assert reader.consumed == len(packed)


def test_large_bins_are_views_of_the_arena_aligned() -> None:
    data = torch.arange(100_000, dtype=torch.float32)
    raw = memoryview(data.numpy()).cast("B")
    packed = msgpack.packb({"a": b"x", "data": bytes(raw), "b": bytes(raw)}, use_bin_type=True)
    arena = torch.zeros(arena_bytes(len(packed)), dtype=torch.uint8)
    obj, _ = _read(packed, 65536, arena=arena)
    for key in ("data", "b"):
        view = obj[key]
        assert isinstance(view, memoryview) and view.readonly
        assert torch.equal(torch.frombuffer(bytearray(view), dtype=torch.float32), data)
    base = arena.data_ptr()
    offsets = {key: _address(obj[key]) - base for key in ("data", "b")}
    assert all(0 <= o < arena.numel() and o % 64 == 0 for o in offsets.values())


def _address(view: memoryview) -> int:
    import numpy as np

    return int(np.frombuffer(view, dtype=np.uint8).__array_interface__["data"][0])


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"\xc1", "0xc1"),
        (b"\xd4\x01\x00", "extension"),
        (b"\xc7\x01\x05\x00", "extension"),
        (b"\x81\x01\x02", "keys must be strings"),
        (b"\xa3ab", "ended"),
        (b"\xda\xff\xff" + b"a" * 10, "ended"),
        (b"\xdb\x7f\xff\xff\xff", "longer than"),
        (b"\xdd\x7f\xff\xff\xff", "larger than allowed"),
        (b"\xc6\x00\x10\x00\x00" + b"\x00" * 100, "past the body's end"),
        (b"\x91" * (MAX_DEPTH + 1) + b"\x00", "deeper"),
        (b"\xa2\xff\xfe", "UTF-8"),
        (b"\x82\xa1v\x01\xa1v\x02", "duplicate"),
    ],
)
def test_hostile_bodies_are_typed_errors(body: bytes, match: str) -> None:
    with pytest.raises(MalformedBody, match=match):
        _read(body, 3)


def test_trailing_bytes_and_lengths_are_checked() -> None:
    packed = msgpack.packb({"a": 1})
    with pytest.raises(MalformedBody, match="follow the msgpack object"):
        _read(packed + b"extra", 4)
    with pytest.raises(MalformedBody, match="longer than its Content-Length"):
        _read(packed + b"extra", 100, length=len(packed))
    with pytest.raises(BodyTooLarge):
        StreamReader(_source(packed, 1), length=10_000, cap=100)
    with pytest.raises(BodyTooLarge, match="cap"):
        _read(b"\xc5\x03\xe8" + b"\x00" * 1000, 50, length=None, cap=100)
