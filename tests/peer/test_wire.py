"""Wire format: round trips, zero-copy views, and every validation error."""

from __future__ import annotations

import ctypes

import msgpack
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from peer.protocol import wire
from peer.protocol.codecs import DenseCodec
from peer.protocol.errors import (
    BodyTooLarge,
    DTypeMismatch,
    InvalidRound,
    InvalidSender,
    MalformedBody,
    NonFiniteValues,
    ProtocolError,
    ShapeMismatch,
    UnknownCodec,
    UnsupportedVersion,
)

CODECS = {"none"}
SPEC = wire.ModelSpec(numel=4)


def body_for(t: torch.Tensor, **overrides: object) -> bytes:
    obj = {
        "v": wire.PROTOCOL_VERSION,
        "sender": "peer-a",
        "round": 3,
        "step": 30,
        "codec": "none",
        "payload": DenseCodec().encode(t),
    }
    obj.update(overrides)
    return msgpack.packb(obj, use_bin_type=True)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_none_round_trips_every_wire_dtype(dtype: torch.dtype) -> None:
    t = (torch.randn(15) * 10).to(dtype)
    payload = msgpack.unpackb(msgpack.packb(DenseCodec().encode(t)), raw=False)
    back = DenseCodec().decode(payload, wire.ModelSpec(numel=15, dtype=dtype))
    assert back.dtype == dtype
    assert torch.equal(back, t)


def test_bytes_are_little_endian_and_raw() -> None:
    payload = DenseCodec().encode(torch.tensor([1.0], dtype=torch.float32))
    assert payload == {"codec": "none", "dtype": "<f4", "data": b"\x00\x00\x80\x3f"}


def test_decode_views_the_received_bytes_without_copying() -> None:
    data = torch.arange(6, dtype=torch.float32).numpy().tobytes()
    payload = {"codec": "none", "dtype": "<f4", "data": data}
    t = DenseCodec().decode(payload, wire.ModelSpec(numel=6))
    # Same address as the Python bytes object's buffer: a view, not a copy.

    buffer_address = ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value
    assert t.data_ptr() == buffer_address


@given(
    st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), min_size=1, max_size=64)
)
def test_envelope_round_trip(values: list[float]) -> None:
    t = torch.tensor(values, dtype=torch.float32)
    env = wire.Envelope(sender="n1", round=7, step=9, codec="none", payload=DenseCodec().encode(t))
    body = wire.pack_envelope(env)
    back = wire.unpack_envelope(body, max_bytes=wire.max_body_bytes(t.numel() * 4), codecs=CODECS)
    assert (back.sender, back.round, back.step, back.codec) == ("n1", 7, 9, "none")
    got = DenseCodec().decode(back.payload, wire.ModelSpec(numel=len(values)))
    assert torch.equal(got, t)


def test_max_body_bytes_scales_with_model() -> None:
    assert wire.max_body_bytes(0) == wire.HEADER_ROOM
    assert wire.max_body_bytes(4 * 2**20) == 8 * 2**20 + wire.HEADER_ROOM
    with pytest.raises(ValueError, match="factor"):
        wire.max_body_bytes(10, factor=0.5)


def test_model_spec_validates() -> None:
    spec = wire.ModelSpec(numel=10, dtype=torch.bfloat16)
    assert spec.num_bytes == 20
    with pytest.raises(ValueError, match="numel"):
        wire.ModelSpec(numel=0)
    with pytest.raises(ValueError, match="dtype"):
        wire.ModelSpec(numel=3, dtype=torch.int64)


ONES = torch.ones(2)
BAD_BODIES = {
    "not msgpack": (b"\xc1\xc1\xc1", MalformedBody),
    "trailing bytes": (body_for(ONES) + b"\x00", MalformedBody),
    "list not map": (msgpack.packb([1, 2]), MalformedBody),
    "missing key": (msgpack.packb({"v": wire.PROTOCOL_VERSION}), MalformedBody),
    "extension type": (msgpack.packb(msgpack.ExtType(5, b"x")), MalformedBody),
    "bytes key beside str keys": (
        msgpack.packb({**msgpack.unpackb(body_for(ONES)), b"v": 2}, use_bin_type=True),
        MalformedBody,
    ),
    "bytes key instead of a str": (
        msgpack.packb(
            {(b"v" if k == "v" else k): v for k, v in msgpack.unpackb(body_for(ONES)).items()},
            use_bin_type=True,
        ),
        MalformedBody,
    ),
    "version 1 (before signatures named the receiver)": (body_for(ONES, v=1), UnsupportedVersion),
    "version 3": (body_for(ONES, v=3), UnsupportedVersion),
    "version true": (body_for(ONES, v=True), UnsupportedVersion),
    "version 2.0": (body_for(ONES, v=float(wire.PROTOCOL_VERSION)), UnsupportedVersion),
    "version '2'": (body_for(ONES, v=str(wire.PROTOCOL_VERSION)), UnsupportedVersion),
    "version list": (body_for(ONES, v=[wire.PROTOCOL_VERSION]), UnsupportedVersion),
    "version map": (body_for(ONES, v={"major": 2}), UnsupportedVersion),
    "version null": (body_for(ONES, v=None), UnsupportedVersion),
    "version 2**64-1": (body_for(ONES, v=2**64 - 1), UnsupportedVersion),
    "codec zip": (body_for(ONES, codec="zip"), UnknownCodec),
    "codec list": (body_for(ONES, codec=["none"]), UnknownCodec),
    "empty sender": (body_for(ONES, sender=""), InvalidSender),
    "sender with slash": (body_for(ONES, sender="../etc"), InvalidSender),
    "long sender": (body_for(ONES, sender="a" * 65), InvalidSender),
    "sender int": (body_for(ONES, sender=7), InvalidSender),
    "sender map": (body_for(ONES, sender={"id": "a"}), InvalidSender),
    "negative round": (body_for(ONES, round=-1), InvalidRound),
    "huge round": (body_for(ONES, round=2**60), InvalidRound),
    "round 2**64-1": (body_for(ONES, round=2**64 - 1), InvalidRound),
    "float round": (body_for(ONES, round=1.5), InvalidRound),
    "bool round": (body_for(ONES, round=True), InvalidRound),
    "negative step": (body_for(ONES, step=-1), InvalidRound),
    "bool step": (body_for(ONES, step=False), InvalidRound),
    "payload list": (body_for(ONES, payload=[1]), MalformedBody),
    "payload bytes": (body_for(ONES, payload=b"\x00" * 8), MalformedBody),
}


@pytest.mark.parametrize("case", list(BAD_BODIES))
def test_bad_envelopes_raise_typed_errors(case: str) -> None:
    body, error = BAD_BODIES[case]
    with pytest.raises(error) as info:
        wire.unpack_envelope(body, max_bytes=1 << 20, codecs=CODECS)
    assert info.value.detail


def _msgpack_values() -> st.SearchStrategy[object]:
    leaves = (
        st.none()
        | st.booleans()
        | st.integers(min_value=-(2**63), max_value=2**64 - 1)
        | st.floats()
        | st.text(max_size=70)
        | st.binary(max_size=16)
    )
    return st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
        max_leaves=12,
    )


ENVELOPE_FIELDS = msgpack.unpackb(body_for(ONES))


@given(
    st.dictionaries(
        st.sampled_from([*ENVELOPE_FIELDS, "x"]) | st.binary(max_size=3), _msgpack_values()
    )
    | _msgpack_values(),
    st.dictionaries(st.sampled_from(list(ENVELOPE_FIELDS)), _msgpack_values()),
)
def test_every_decoded_object_is_an_envelope_or_a_typed_error(
    anything: object, replaced: dict[str, object]
) -> None:
    """check_envelope raises a ProtocolError and nothing else, for any decoded object: one
    of arbitrary shape, or a valid envelope with some fields replaced by arbitrary values."""
    for obj in (anything, {**ENVELOPE_FIELDS, **replaced}):
        try:
            envelope = wire.check_envelope(obj, codecs=CODECS)
        except ProtocolError as error:
            assert error.detail and len(error.detail) < 1000
        else:  # accepted: then every field is exactly of the protocol's types
            assert type(envelope.version) is int and envelope.version == wire.PROTOCOL_VERSION
            assert type(envelope.round) is int and type(envelope.step) is int
            assert isinstance(envelope.payload, dict)


def test_oversized_body_is_refused_before_parsing() -> None:
    body = body_for(torch.ones(1000))
    with pytest.raises(BodyTooLarge, match="cap is 100"):
        wire.unpack_envelope(body, max_bytes=100, codecs=CODECS)


def encoded(dtype: object = "<f4", data: object = None, **extra: object) -> dict[str, object]:
    """A ``none`` payload for a 4-vector of the local float32 model, some fields replaced."""
    return {"codec": "none", "dtype": dtype, "data": bytes(16) if data is None else data} | extra


BAD_PAYLOADS = {
    "too many values": (encoded(data=bytes(20)), ShapeMismatch),
    "short data": (encoded(data=bytes(15)), ShapeMismatch),
    "unknown dtype": (encoded(dtype="complex64"), DTypeMismatch),
    "old dtype name": (encoded(dtype="float32"), DTypeMismatch),
    "dtype not a str": (encoded(dtype=4), MalformedBody),
    "wrong dtype": (encoded(dtype="<f8", data=bytes(32)), DTypeMismatch),
    "wrong dtype and length": (encoded(dtype="<f2", data=bytes(5)), DTypeMismatch),
    "data as str": (encoded(data="abcd" * 4), MalformedBody),
    "extra key": (encoded(x=1), MalformedBody),
    "missing data": ({"codec": "none", "dtype": "<f4"}, MalformedBody),
    "legacy tensor map": ({"tensor": encoded()}, MalformedBody),
    "another codec": (encoded(codec="fp16"), UnknownCodec),
    "nan": (
        encoded(data=torch.tensor([0, float("nan"), 0, 0]).numpy().tobytes()),
        NonFiniteValues,
    ),
    "inf": (
        encoded(data=torch.tensor([0, 0, 0, float("-inf")]).numpy().tobytes()),
        NonFiniteValues,
    ),
}


@pytest.mark.parametrize("case", list(BAD_PAYLOADS))
def test_bad_payloads_raise_typed_errors_naming_the_payload(case: str) -> None:
    obj, error = BAD_PAYLOADS[case]
    with pytest.raises(error, match=r"^payload"):
        DenseCodec().decode(obj, SPEC)


def test_error_statuses_are_4xx_with_json() -> None:
    from peer.protocol.errors import ERROR_CLASSES

    for cls in ERROR_CLASSES:
        err = cls("why")
        assert 400 <= err.status < 600
        assert err.to_json() == {"error": cls.code, "detail": "why"}
    assert len({cls.code for cls in ERROR_CLASSES}) == len(ERROR_CLASSES)


@pytest.mark.parametrize("numel", [10, wire.SPLICE_BYTES // 4, 100_000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_spliced_body_is_exactly_msgpack(numel: int, dtype: torch.dtype) -> None:
    t = torch.randn(numel).to(dtype)
    payload = DenseCodec().encode(t)
    env = wire.Envelope(sender="a", round=1, step=2, codec="none", payload=payload)
    reference = msgpack.packb(
        {
            "v": wire.PROTOCOL_VERSION,
            "sender": "a",
            "round": 1,
            "step": 2,
            "codec": "none",
            "payload": {**payload, "data": bytes(payload["data"])},
        },
        use_bin_type=True,
    )
    assert wire.pack_envelope(env) == reference


def test_splice_leaves_the_callers_payload_alone() -> None:
    payload = {"codec": "fp16", "dtype": "<f2", "data": bytes(200_000)}
    env = wire.Envelope(sender="a", round=0, codec="fp16", payload=payload)
    body = wire.pack_envelope(env)
    assert len(payload["data"]) == 200_000
    assert msgpack.unpackb(body)["payload"] == payload


def test_the_envelope_keys_are_gossips() -> None:
    """peer.protocol.wire packs the map gossip.compression.envelope_fields defines, in that order."""
    from gossip.compression import ENVELOPE_KEYS

    body = wire.pack_envelope(wire.Envelope(sender="a", round=0, codec="none", payload={}))
    assert tuple(msgpack.unpackb(body)) == ENVELOPE_KEYS
