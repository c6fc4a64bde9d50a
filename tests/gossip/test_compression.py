"""Compressors: exact round trips, unbiasedness, exact wire bytes, hostile payloads."""

from __future__ import annotations

import math

import msgpack
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from gossip.compression import (
    COMPRESSORS,
    PAYLOAD_ERROR_KINDS,
    ErrorFeedback,
    NoCompression,
    PayloadError,
    StochasticQuantization,
    TopK,
    build_compressor,
    decode,
)

SPECS = [
    "none",
    "fp16",
    "bf16",
    "qsgd",
    "qsgd:bits=4,block=64",
    "qsgd:bits=2,block=7",
    "topk:ratio=0.01",
    "topk:ratio=0.3",
    "randk:ratio=0.05",
    "chunked-topk:chunk=64,k=5",
    "chunked-topk:chunk=100,k=7,bits=4",
]


def wire(payload: dict) -> dict:
    """What a receiver holds: the payload after msgpack encoding and decoding."""
    return msgpack.unpackb(msgpack.packb(payload))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_none_round_trips_exactly_in_every_dtype(dtype: torch.dtype) -> None:
    x = (torch.randn(333) * 100).to(dtype)
    codec = NoCompression()
    out = decode(wire(codec.encode(x)), 333)
    assert out.dtype == dtype
    assert torch.equal(out, x)
    assert torch.equal(codec.compress(x.unsqueeze(0)).values[0], x)


@pytest.mark.parametrize(("spec", "dtype"), [("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_half_precision_codecs_decode_to_the_rounded_values(spec: str, dtype: torch.dtype) -> None:
    x = torch.randn(1000)
    expected = x.to(dtype).to(torch.float32)
    codec = build_compressor(spec)
    assert torch.equal(decode(wire(codec.encode(x)), 1000), expected)
    assert torch.equal(codec.compress(x).values, expected)


def test_byte_order_is_little_endian_and_dtype_explicit() -> None:
    payload = NoCompression().encode(torch.tensor([1.0, -2.0]))
    assert payload == {"codec": "none", "dtype": "<f4", "data": b"\x00\x00\x80?\x00\x00\x00\xc0"}
    payload = build_compressor("topk:ratio=0.5").encode(torch.tensor([0.0, 3.0, 0.0, -1.0]))
    assert payload["index"] == b"\x01\x00\x00\x00\x03\x00\x00\x00"
    assert payload["value"] == b"\x00\x00\x40\x40\x00\x00\x80\xbf"


@pytest.mark.parametrize("spec", SPECS)
def test_batched_path_equals_wire_path_row_by_row(spec: str) -> None:
    """Same generator state -> the simulator's rows decode exactly as the peers' payloads."""
    x = torch.randn(6, 517)
    batched_codec, wire_codec = build_compressor(spec), build_compressor(spec)
    batched = batched_codec.compress(x, torch.Generator().manual_seed(11))
    generator = torch.Generator().manual_seed(11)
    rows = []
    for row in x:
        payload, own = wire_codec.encode_and_decode(row, generator)
        packed = msgpack.packb(payload)
        assert len(packed) == batched.wire_bytes
        received = wire_codec.decode(msgpack.unpackb(packed), 517)
        assert torch.equal(received, own)
        rows.append(received)
    assert torch.equal(torch.stack(rows).to(x.dtype), batched.values)


@given(
    spec=st.sampled_from(SPECS),
    d=st.integers(min_value=1, max_value=3000),
    scale=st.floats(min_value=1e-3, max_value=1e3),
)
def test_reported_bytes_are_the_msgpack_length(spec: str, d: int, scale: float) -> None:
    codec = build_compressor(spec)
    x = torch.randn(d, generator=torch.Generator().manual_seed(d)) * scale
    payload = codec.encode(x, torch.Generator().manual_seed(0))
    assert codec.wire_bytes(d) == len(msgpack.packb(payload))
    assert codec.compress(x.unsqueeze(0)).wire_bytes == len(msgpack.packb(payload))


def test_compression_ratios_are_what_the_codecs_promise() -> None:
    """Payload bytes plus msgpack framing, counted by hand: 1 byte map header, each key and
    short string 1 + len, ints 1 (< 128) or 3 (< 65536), bin headers 3 (< 65536) or 5."""
    d = 100_000
    framing = 1 + 6 + 5 + 6 + 4 + 5 + 5  # codec:none|fp16, dtype:<f4|<f2, data:bin32
    assert build_compressor("none").wire_bytes(d) == 4 * d + framing
    assert build_compressor("fp16").wire_bytes(d) == 2 * d + framing
    blocks = math.ceil(d / 256)
    qsgd = 1 + 6 + 5 + 5 + 1 + 6 + 3 + 6 + 3 + 6  # ... scale:bin16, level: header below
    assert build_compressor("qsgd:bits=8,block=256").wire_bytes(d) == d + 4 * blocks + qsgd + 5
    assert build_compressor("qsgd:bits=2,block=256").wire_bytes(d) == d // 4 + 4 * blocks + qsgd + 3
    topk = 1 + 6 + 5 + 2 + 3 + 6 + 3 + 6 + 4 + 6 + 3
    assert build_compressor("topk:ratio=0.01").wire_bytes(d) == 8 * 1000 + topk


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_stochastic_quantization_is_unbiased(bits: int) -> None:
    """Mean of N independent draws is within 5 standard errors of x, coordinate by coordinate.

    Each coordinate's decoded value lies in a cell of width s/L around x and the draw is a
    two-point distribution on its ends, so Var <= (s/L)^2 / 4 and the standard error of the
    mean of N draws is at most s / (2 L sqrt(N)). Deterministic rounding fails this test.
    """
    codec = StochasticQuantization(bits=bits, block=32)
    x = torch.randn(96, dtype=torch.float64)
    draws = 4000
    out = codec.compress(x.expand(draws, -1), torch.Generator().manual_seed(5)).values
    scale = x.unflatten(0, (3, 32)).abs().amax(-1).repeat_interleave(32)
    bound = 5 * scale / (2 * codec.levels * math.sqrt(draws))
    assert bool(((out.mean(0) - x).abs() <= bound).all())
    # and it is genuinely random: draws differ, every value is on the grid
    assert out.std(0).max() > 0
    grid = out / (scale / codec.levels)
    assert torch.allclose(grid, grid.round(), atol=1e-4)
    rounded = (x / scale * codec.levels).round() * scale / codec.levels
    assert ((rounded - x).abs() > bound).any(), "deterministic rounding would be caught"


def test_topk_keeps_the_largest_magnitudes_and_randk_draws_distinct_indices() -> None:
    x = torch.randn(4, 1000)
    out = build_compressor("topk:ratio=0.01").compress(x).values
    kept = out != 0
    assert kept.sum(1).tolist() == [10] * 4
    assert torch.equal(out[kept], x[kept])
    assert bool(
        (x.abs()[~kept].reshape(4, -1).amax(1) <= x.abs()[kept].reshape(4, -1).amin(1)).all()
    )
    randk = build_compressor("randk:ratio=0.02")
    first = randk.compress(x, torch.Generator().manual_seed(1)).values
    again = randk.compress(x, torch.Generator().manual_seed(1)).values
    other = randk.compress(x, torch.Generator().manual_seed(2)).values
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert ((first != 0).sum(1) == 20).all()


def test_error_feedback_sends_everything_eventually() -> None:
    """Sum of what was sent plus the residual equals the sum of what was fed in."""
    codec = build_compressor("topk:ratio=0.05,feedback=true")
    assert isinstance(codec, ErrorFeedback)
    inputs = torch.randn(20, 3, 200, dtype=torch.float64)
    sent = sum(codec.compress(x).values for x in inputs)
    assert codec.residual is not None
    assert torch.allclose(sent + codec.residual, inputs.sum(0), atol=1e-12)
    # one message alone would drop 95% of it
    assert (TopK(0.05).compress(inputs[0]).values - inputs[0]).norm() > 0.5 * inputs[0].norm()
    codec.reset()
    assert codec.residual is None


def test_error_feedback_on_the_wire_keeps_its_residual_per_peer() -> None:
    codec = build_compressor("qsgd:bits=2,feedback=true")
    total = torch.zeros(300)
    inputs = torch.randn(30, 300)
    generator = torch.Generator().manual_seed(0)
    for x in inputs:
        total += decode(wire(codec.encode(x, generator)), 300)
    assert isinstance(codec, ErrorFeedback) and codec.residual is not None
    assert torch.allclose(total + codec.residual, inputs.sum(0), atol=1e-4)


# ----------------------------------------------------------------------------- hostile input


def good(spec: str, d: int = 64) -> dict:
    return wire(build_compressor(spec).encode(torch.randn(d)))


HOSTILE = [
    ("none", lambda p: p | {"data": p["data"][:-1]}, "'data' must hold 64", "length"),
    ("none", lambda p: p | {"dtype": "<i4"}, "'dtype' must be one of", "dtype"),
    ("none", lambda p: p | {"dtype": "<f8"}, "'data' must hold 64 values of <f8", "length"),
    ("none", lambda p: p | {"data": b"\x00\x00\xc0\x7f" * 64}, "NaN", "non_finite"),
    ("none", lambda p: p | {"data": "text"}, "'data' must be bytes", "field"),
    ("fp16", lambda p: p | {"dtype": "<f4"}, "'dtype' must be '<f2'", "dtype"),
    ("bf16", lambda p: p | {"data": p["data"] + b"\x00\x00"}, "'data' must hold 64", "length"),
    ("qsgd", lambda p: p | {"scale": b"\x00\x00\xc0\x7f"}, "NaN", "non_finite"),
    ("qsgd", lambda p: p | {"scale": b"\x00\x00\x80\xbf"}, "'scale' must be >= 0", "value"),
    ("qsgd", lambda p: p | {"scale": b""}, "'scale' must hold 1", "length"),
    ("qsgd", lambda p: p | {"level": p["level"][:10]}, "'level' must hold 64 bytes", "length"),
    ("qsgd", lambda p: p | {"level": b"\xff" * 64}, "outside [0, 254]", "value"),
    (
        "qsgd",
        lambda p: p | {"bits": 4},
        "'level' must hold 32 bytes for d=64, bits=4, got 64",
        "length",
    ),
    ("qsgd", lambda p: p | {"bits": True}, "'bits' must be an int", "field"),
    ("qsgd", lambda p: p | {"bits": 3}, "'bits' must be one of (2, 4, 8)", "parameter"),
    ("qsgd", lambda p: p | {"block": 0}, "'block' must be >= 1", "parameter"),
    ("qsgd", lambda p: {k: v for k, v in p.items() if k != "block"}, "'block' is missing", "field"),
    ("qsgd:bits=2", lambda p: p | {"level": b"\xff" * 16}, "outside [0, 2]", "value"),
    (
        "topk:ratio=0.1",
        lambda p: p | {"index": b"\x40\x00\x00\x00" + p["index"][4:]},
        "outside [0, 64)",
        "index",
    ),
    (
        "topk:ratio=0.1",
        lambda p: p | {"index": b"\xff\xff\xff\xff" + p["index"][4:]},
        "outside [0, 64)",
        "index",
    ),
    ("topk:ratio=0.1", lambda p: p | {"index": p["index"][:4] * 7}, "strictly increasing", "index"),
    ("topk:ratio=0.1", lambda p: p | {"index": p["index"][:-2]}, "'index' must hold k=7", "length"),
    ("topk:ratio=0.1", lambda p: p | {"k": 65}, "'k' must be in [0, d=64]", "length"),
    ("topk:ratio=0.1", lambda p: p | {"k": -1}, "'k' must be in [0, d=64]", "parameter"),
    ("topk:ratio=0.1", lambda p: p | {"dtype": "<f2"}, "'dtype' must be '<f4'", "dtype"),
    ("randk:ratio=0.1", lambda p: p | {"value": p["value"][:-1]}, "'value' must hold 7", "length"),
    (
        "topk:ratio=0.1",
        lambda p: {k: v for k, v in p.items() if k != "value"},
        "must be exactly",
        "field",
    ),
    ("fp16", lambda p: p | {"extra": 1}, "must be exactly", "field"),
    ("fp16", lambda p: p | {"codec": "zstd"}, "unknown", "codec"),
]


@pytest.mark.parametrize(("spec", "corrupt", "message", "kind"), HOSTILE)
def test_hostile_payloads_raise_payload_errors_naming_the_field_and_kind(
    spec, corrupt, message, kind
) -> None:
    payload = corrupt(good(spec))
    with pytest.raises(PayloadError, match=_escape(message)) as caught:
        decode(payload, 64)
    assert caught.value.kind == kind
    assert isinstance(caught.value, ValueError)
    if caught.value.field is not None:
        assert f"'{caught.value.field}'" in str(caught.value)


def test_every_payload_error_kind_is_reachable_from_the_hostile_table() -> None:
    assert {row[3] for row in HOSTILE} == set(PAYLOAD_ERROR_KINDS)
    with pytest.raises(ValueError, match="kind must be one of"):
        PayloadError("typo", "x")  # type: ignore[arg-type]


def _escape(text: str) -> str:
    import re

    return re.escape(text)


_FIELD_VALUES = st.one_of(
    st.binary(max_size=80),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.booleans(),
    st.sampled_from(["<f4", "<f2", "<f8", "bf16", "<i4", "x"]),
    st.none(),
    st.floats(allow_nan=True),
)


@given(
    codec=st.sampled_from(
        ["none", "fp16", "bf16", "qsgd", "topk", "randk", "chunked-topk", "zstd"]
    ),
    fields=st.dictionaries(
        st.sampled_from(
            [
                "dtype",
                "data",
                "bits",
                "block",
                "scale",
                "level",
                "k",
                "index",
                "value",
                "chunk",
                "centroid",
            ]
        ),
        _FIELD_VALUES,
        max_size=6,
    ),
    d=st.integers(min_value=1, max_value=20),
)
def test_random_payloads_decode_or_raise_value_error(codec: str, fields: dict, d: int) -> None:
    """Whatever arrives, decode either returns d finite values or raises a PayloadError."""
    try:
        out = decode(wire({"codec": codec, **fields}), d)
    except PayloadError as error:
        assert error.kind in PAYLOAD_ERROR_KINDS
        return
    assert out.shape == (d,) and bool(torch.isfinite(out).all())


@given(
    spec=st.sampled_from(
        [
            "none",
            "fp16",
            "bf16",
            "qsgd:bits=2,block=3",
            "qsgd",
            "topk:ratio=0.3",
            "chunked-topk:chunk=6,k=3",
            "chunked-topk:chunk=8,k=2,bits=8",
        ]
    ),
    d=st.integers(min_value=1, max_value=20),
    data=st.data(),
)
def test_random_bytes_of_the_right_length_decode_or_raise_value_error(spec, d, data) -> None:
    """Field lengths right, contents hostile (NaN patterns, wild indices, levels past 2L)."""
    payload = good(spec, d)
    key = data.draw(st.sampled_from([k for k, v in payload.items() if isinstance(v, bytes)]))
    payload[key] = data.draw(st.binary(min_size=len(payload[key]), max_size=len(payload[key])))
    try:
        out = decode(payload, d)
    except PayloadError as error:
        assert error.kind in {"index", "value", "non_finite"}  # lengths are right
        return
    assert out.shape == (d,) and bool(torch.isfinite(out).all())


def test_a_huge_claimed_block_allocates_nothing_big() -> None:
    payload = good("qsgd", 10) | {"block": 2**40}
    assert decode(payload, 10).shape == (10,)


@given(d=st.integers(min_value=1, max_value=64), cut=st.integers(min_value=1, max_value=8))
def test_every_truncation_of_a_real_payload_is_refused(d: int, cut: int) -> None:
    for spec in [
        "none",
        "fp16",
        "bf16",
        "qsgd:bits=4,block=8",
        "topk:ratio=0.5",
        "chunked-topk:chunk=16,k=8,bits=8",
    ]:
        payload = good(spec, d)
        for key, value in payload.items():
            if isinstance(value, bytes) and value:
                with pytest.raises(PayloadError, match=f"'{key}' must hold"):
                    decode(payload | {key: value[: max(0, len(value) - cut)]}, d)


def test_decode_refuses_non_maps_codec_mismatch_and_bad_d() -> None:
    with pytest.raises(PayloadError, match="payload must be a map") as caught:
        decode([1, 2], 4)  # type: ignore[arg-type]
    assert (caught.value.kind, caught.value.field) == ("field", None)
    with pytest.raises(PayloadError, match="does not match this codec 'topk'") as caught:
        build_compressor("topk").decode(good("fp16"), 64)
    assert (caught.value.kind, caught.value.field) == ("codec", "codec")
    with pytest.raises(
        PayloadError, match="bits=8, block=256 do not match this codec's bits=4"
    ) as caught:
        build_compressor("qsgd:bits=4").decode(good("qsgd"), 64)
    assert (caught.value.kind, caught.value.field) == ("parameter", "bits")
    with pytest.raises(ValueError, match="d must be a positive int") as bad_d:
        build_compressor("fp16").decode(good("fp16"), 0)
    assert not isinstance(bad_d.value, PayloadError)  # the caller's mistake, not the sender's


def test_dense_fields_are_viewed_without_a_copy() -> None:
    """`none` decodes to a view of the received bytes; 16-bit codecs convert once."""
    import numpy as np

    x = torch.randn(1000)
    payload = wire(NoCompression().encode(x))
    decoded = NoCompression().decode(payload, 1000)
    assert torch.equal(decoded, x)
    address = np.frombuffer(payload["data"], dtype=np.uint8).ctypes.data
    assert decoded.data_ptr() == address  # no copy of the payload's bytes
    for spec in ("fp16", "bf16"):
        received = wire(build_compressor(spec).encode(x))
        assert decode(received, 1000).dtype == torch.float32


@pytest.mark.parametrize("order", ["<", ">"])
@pytest.mark.parametrize("dtype", ["f8", "f4", "f2", "i2"])
def test_bytes_in_either_byte_order_decode_to_native_values(order: str, dtype: str) -> None:
    """The wire's explicit byte order is honoured whatever the host's (swapped when foreign)."""
    import numpy as np

    from gossip.compression.wire_dtypes import view_bytes

    values = np.arange(-5, 6).astype(dtype)
    data = values.astype(order + dtype).tobytes()
    viewed = view_bytes(data, np.dtype(order + dtype))
    assert viewed.numpy().dtype.isnative
    np.testing.assert_array_equal(viewed.numpy(), values)


def test_none_sends_without_a_copy_and_decodes_the_same_before_msgpack() -> None:
    """A contiguous CPU vector's bytes are viewed, not copied, until msgpack packs them; the
    sender's payload (memoryviews) decodes exactly as the received one (bytes)."""
    import numpy as np

    x = torch.randn(1000)
    payload = NoCompression().encode(x)
    assert isinstance(payload["data"], memoryview)
    assert np.frombuffer(payload["data"], dtype=np.uint8).ctypes.data == x.data_ptr()
    assert bytes(payload["data"]) == x.numpy().astype("<f4").tobytes()
    for spec in SPECS:
        sent = build_compressor(spec).encode(x, torch.Generator().manual_seed(1))
        assert torch.equal(decode(sent, 1000), decode(wire(sent), 1000)), spec
    strided = torch.randn(2000)[::2]  # not contiguous: converted once, still exact
    assert torch.equal(decode(wire(NoCompression().encode(strided)), 1000), strided)


def test_only_contiguous_byte_views_pass_as_bytes() -> None:
    payload = good("fp16", 4)
    as_words = memoryview(payload["data"]).cast("H")  # 4 items of 2 bytes: not a byte field
    with pytest.raises(PayloadError, match="'data' must be bytes") as caught:
        decode(payload | {"data": as_words}, 4)
    assert caught.value.kind == "field"


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_wire_bytes_of_none_follows_the_dtype(dtype: torch.dtype) -> None:
    x = torch.randn(3, 500).to(dtype)
    codec = NoCompression()
    assert codec.compress(x).wire_bytes == len(msgpack.packb(codec.encode(x[0])))
    assert codec.wire_bytes(500, dtype) == len(msgpack.packb(codec.encode(x[0])))
    assert build_compressor("fp16").compress(x).wire_bytes == build_compressor("fp16").wire_bytes(
        500
    )


def test_the_wire_has_one_dtype_vocabulary() -> None:
    from gossip.compression import WIRE_DTYPE_NAMES, WIRE_DTYPES

    assert list(WIRE_DTYPES) == ["<f8", "<f4", "<f2", "bf16"]
    assert {WIRE_DTYPE_NAMES[dtype] for dtype in WIRE_DTYPES.values()} == set(WIRE_DTYPES)
    for dtype, name in WIRE_DTYPE_NAMES.items():
        assert NoCompression().encode(torch.zeros(2, dtype=dtype))["dtype"] == name


# ----------------------------------------------------------------------------- registry


def test_registry_lists_every_codec_and_specs_round_trip() -> None:
    assert sorted(COMPRESSORS) == [
        "bf16",
        "chunked-topk",
        "fp16",
        "none",
        "qsgd",
        "randk",
        "topk",
    ]
    for spec in [
        *SPECS,
        "topk:ratio=0.01,feedback=true",
        "qsgd:bits=4,block=8,feedback=yes",
        "chunked-topk",
        "chunked-topk:bits=8,sigmas=3.5,feedback=true",
    ]:
        codec = build_compressor(spec)
        assert build_compressor(codec.spec).spec == codec.spec


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("zip", "unknown compressor 'zip'; choose one of ['bf16', 'chunked-topk', 'fp16'"),
        ("topk:k=3", "has no parameter 'k'; choose from ['feedback', 'ratio']"),
        ("topk:ratio=0", "ratio must be in (0, 1]"),
        ("topk:ratio=abc", "parameter 'ratio' must be float"),
        ("qsgd:bits=3", "bits must be one of (2, 4, 8)"),
        ("qsgd:block=0", "block must be an int >= 1"),
        ("qsgd:bits", "compressor spec 'qsgd:bits': parameter 'bits' is not KEY=VALUE"),
        ("fp16:feedback=maybe", "parameter 'feedback' must be bool"),
        ("none:feedback=true", "has no parameter 'feedback'"),
        ("", "compressor spec '': must be NAME or NAME:KEY=VALUE,...; got no NAME"),
        (
            "qsgd:bits=4,bits=8",
            "compressor spec 'qsgd:bits=4,bits=8': parameter 'bits' is given twice",
        ),
    ],
)
def test_bad_specs_raise_clear_errors(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=_escape(message)):
        build_compressor(spec)


def test_inputs_are_checked() -> None:
    with pytest.raises(ValueError, match="floating-point"):
        build_compressor("fp16").compress(torch.arange(4))
    with pytest.raises(ValueError, match=r"shape \[d\] on the wire path"):
        build_compressor("fp16").encode(torch.zeros(2, 3))
    codec = build_compressor("topk:feedback=true")
    codec.compress(torch.zeros(2, 10))
    with pytest.raises(ValueError, match="call reset"):
        codec.compress(torch.zeros(3, 10))
