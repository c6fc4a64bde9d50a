"""chunked-topk (SparseLoCo's codec): the definition against a reference written here in plain
Python, batched == wire, exact bytes, hostile payloads, error feedback, the ratio."""

from __future__ import annotations

import math
import re

import msgpack
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gossip.compression import (
    ChunkedTopK,
    ErrorFeedback,
    PayloadError,
    build_compressor,
    decode,
)
from gossip.compression import slabs as layout


def wire(payload: dict) -> dict:
    """What a receiver holds: the payload after msgpack encoding and decoding."""
    return msgpack.unpackb(msgpack.packb(payload))


def reference(
    x: list[float], chunk: int, k: int, bits: int, group: int = 1, sigmas: float = 6.0
) -> list[float]:
    """The definition, one coordinate at a time: per chunk the k largest |x_i| (ties to the
    lower index), then per group of chunks SparseLoCo's quantizer and each bin's mean."""
    chunks: list[list[int]] = []
    for start in range(0, len(x), chunk):
        members = range(start, min(start + chunk, len(x)))
        ranked = sorted(members, key=lambda i: (-abs(x[i]), i))
        chunks.append(sorted(ranked[: min(k, len(members))]))
    out = [0.0] * len(x)
    for first in range(0, len(chunks), group):
        kept = [i for members in chunks[first : first + group] for i in members]
        values = [x[i] for i in kept]
        m = len(values)
        mu = math.fsum(values) / m
        sigma = math.sqrt(math.fsum((v - mu) ** 2 for v in values) / (m - 1)) if m > 1 else 0.0
        bins = 2**bits
        step = sigmas * sigma / bins or 1.0
        levels = [min(max(round((v - mu) / step + bins // 2), 0), bins - 1) for v in values]
        centroid = {
            b: math.fsum(v for v, q in zip(values, levels) if q == b) / levels.count(b)
            for b in set(levels)
        }
        for i, q in zip(kept, levels):
            out[i] = centroid[q]
    return out


CASES = [  # (d, chunk, k, bits, group): whole chunks, a short last chunk, k past the last
    # chunk, groups of chunks (the last one shorter), one group for the whole message
    (64, 16, 3, 2, 1),
    (70, 16, 3, 2, 1),
    (70, 16, 8, 4, 2),
    (37, 16, 10, 8, 1),
    (5, 16, 3, 2, 1),
    (1, 4096, 64, 2, 1),
    (300, 7, 2, 2, 1),
    (300, 7, 2, 2, 4),
    (300, 7, 2, 4, 1000),
]


@pytest.mark.parametrize(("d", "chunk", "k", "bits", "group"), CASES)
def test_decoded_vector_is_the_definition(d: int, chunk: int, k: int, bits: int, group: int):
    x = torch.randn(d, generator=torch.Generator().manual_seed(d + k), dtype=torch.float64)
    codec = ChunkedTopK(chunk, k, bits, group=group)
    expected = torch.tensor(reference(x.tolist(), chunk, k, bits, group), dtype=torch.float32)
    received = decode(wire(codec.encode(x)), d)
    torch.testing.assert_close(received, expected, rtol=1e-6, atol=0.0)
    assert torch.equal((received != 0), (expected != 0))  # the very same coordinates


def test_ties_go_to_the_lower_index_and_equal_values_share_one_exact_centroid() -> None:
    x = torch.tensor([1.0, -1.0, 1.0, 1.0, 0.5, -1.0, 1.0, 1.0] * 3)  # chunk 8: ties
    codec = build_compressor("chunked-topk:chunk=8,k=3")
    out = decode(wire(codec.encode(x)), 24)
    kept = (out != 0).nonzero().flatten().tolist()
    assert kept == [0, 1, 2, 8, 9, 10, 16, 17, 18]
    assert out[kept].tolist() == [1.0, -1.0, 1.0] * 3  # one value per bin: its mean is it


def test_an_all_zero_vector_decodes_to_zeros() -> None:
    codec = build_compressor("chunked-topk:chunk=16,k=4")
    assert torch.equal(decode(wire(codec.encode(torch.zeros(50))), 50), torch.zeros(50))


def test_selection_does_not_depend_on_the_slab_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """The encoder walks groups of chunks; groups of one chunk give the same payload."""
    x = torch.randn(3, 1000, generator=torch.Generator().manual_seed(3))
    x[1, 100:300] = 0.0  # whole chunks of ties (the exact fallback) beside plain ones
    x[2, 5] = math.nan
    codec = build_compressor("chunked-topk:chunk=32,k=4")
    whole = codec.compress(x).values
    monkeypatch.setattr(layout, "SLAB", 32)
    torch.testing.assert_close(codec.compress(x).values, whole, rtol=0, atol=0, equal_nan=True)


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(min_value=1, max_value=4),
    d=st.integers(min_value=1, max_value=400),
    chunk=st.integers(min_value=1, max_value=70),
    k=st.integers(min_value=1, max_value=70),
    bits=st.sampled_from([2, 4, 8]),
    zeros=st.booleans(),
    group=st.sampled_from([1, 2, 3, 1000]),
)
def test_batched_rows_equal_the_wire_path_and_the_bytes_are_exact(
    rows: int, d: int, chunk: int, k: int, bits: int, zeros: bool, group: int
) -> None:
    k = min(k, chunk)
    codec = ChunkedTopK(chunk, k, bits, group=group)
    x = torch.randn(rows, d, generator=torch.Generator().manual_seed(d * chunk + k))
    if zeros:
        x[:, ::3] = 0.0  # many ties
    batched = codec.compress(x)
    for i in range(rows):
        body = msgpack.packb(codec.encode(x[i]))
        assert len(body) == batched.wire_bytes == codec.wire_bytes(d)
        assert torch.equal(decode(msgpack.unpackb(body), d), batched.values[i])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_float_dtypes_select_as_their_float32_values(dtype: torch.dtype) -> None:
    x = torch.randn(2, 300, generator=torch.Generator().manual_seed(0)).to(dtype)
    codec = build_compressor("chunked-topk:chunk=64,k=6,bits=4")
    out = codec.compress(x)
    assert out.values.dtype == dtype
    widened = decode(wire(codec.encode(x[1].to(torch.float32))), 300)
    assert torch.equal((out.values[1] != 0), (widened != 0))
    torch.testing.assert_close(out.values[1].to(torch.float32), widened, rtol=1e-2, atol=0.0)


def test_a_tensor_that_requires_grad_is_encoded_as_its_values() -> None:
    x = torch.randn(3, 200, generator=torch.Generator().manual_seed(6))
    codec = build_compressor("chunked-topk:chunk=64,k=4")
    expected = codec.compress(x).values
    assert torch.equal(codec.compress(x.clone().requires_grad_()).values, expected)
    assert torch.equal(decode(wire(codec.encode(x[0].clone().requires_grad_())), 200), expected[0])


def test_a_message_holding_nan_decodes_to_nan_and_is_refused_on_the_wire() -> None:
    x = torch.randn(2, 100, generator=torch.Generator().manual_seed(1))
    x[0, 42] = math.nan
    codec = build_compressor("chunked-topk:chunk=32,k=2")
    values = codec.compress(x).values
    kept = values[0] != 0  # NaN != 0
    assert bool(kept[42]) and bool(values[0, 32:64][kept[32:64]].isnan().all())  # its chunk's
    assert bool(values[0, :32].isfinite().all()) and bool(values[0, 64:].isfinite().all())
    assert bool(values[1].isfinite().all())  # the other row is untouched
    whole = build_compressor("chunked-topk:chunk=32,k=2,group=4").compress(x).values
    assert bool(whole[0][whole[0] != 0].isnan().all())  # one table: the whole row
    with pytest.raises(PayloadError, match="'centroid' contains NaN") as caught:
        decode(wire(codec.encode(x[0])), 100)
    assert caught.value.kind == "non_finite"


# ----------------------------------------------------------------------------- bytes


def test_the_payload_is_128_times_smaller_than_dense_float32_at_100m_parameters() -> None:
    """At chunk 4096, k = 64, 2 bits: m = 24414 * 64 + 64 = 1,562,560 values, each 12 bits of
    position and 2 of level, and one table of four float32 centroids per chunk (24,415): 128
    bits per 4096 coordinates, plus framing; one table per message (``group`` past the
    chunks) saves the tables' 390,640 bytes: 146 times."""
    d = 100_000_000
    codec = build_compressor("chunked-topk")
    m, chunks = 24_414 * 64 + 64, 24_415
    framing = (
        1  # fixmap
        + 6 + 13  # codec: "chunked-topk"
        + 6 + 3  # chunk: 4096 (uint16)
        + 2 + 1  # k: 64
        + 5 + 1  # bits: 2
        + 6 + 1  # group: 1
        + 6 + 5  # index: bin 32
        + 9 + 5  # centroid: bin 32
        + 6 + 5  # level: bin 32
    )  # fmt: skip
    body = math.ceil(12 * m / 8) + 16 * chunks + math.ceil(2 * m / 8)
    assert codec.wire_bytes(d) == body + framing == 3_125_201
    dense = build_compressor("none").wire_bytes(d)
    assert round(dense / codec.wire_bytes(d), 1) == 128.0
    one_table = build_compressor("chunked-topk:group=30000").wire_bytes(d)
    assert one_table == codec.wire_bytes(d) - 16 * chunks + 16 + 2 - 3  # uint16 group, bin 8
    assert round(dense / one_table, 1) == 146.3


def test_positions_travel_in_ceil_log2_chunk_bits() -> None:
    x = torch.tensor([0.0, 5.0, 0.0, -7.0, 0.0, 0.0, 3.0, 0.0])
    payload = build_compressor("chunked-topk:chunk=8,k=3").encode(x)
    # positions 1, 3, 6 in 3 bits each, little-end first: 001 | 011 << 3 | 110 << 6
    assert bytes(payload["index"]) == (1 | 3 << 3 | 6 << 6).to_bytes(2, "little")
    assert len(bytes(payload["level"])) == 1  # three 2-bit levels


# ----------------------------------------------------------------------------- hostile


def good(d: int = 7, spec: str = "chunked-topk:chunk=3,k=2") -> dict:
    """chunk 3 (positions of 2 bits: 3 is out of range), d = 7: chunks of 3, 3 and 1."""
    return wire(build_compressor(spec).encode(torch.tensor([1.0, -2.0, 3.0, 4.0, 0.5, -6.0, 7.0])))


def _index(*positions: int) -> bytes:
    """Five 2-bit positions, packed little-end first."""
    return sum(p << (2 * j) for j, p in enumerate(positions)).to_bytes(2, "little")


HOSTILE = [
    ({"index": _index(1, 2, 0, 2, 1)}, "position outside its chunk [0, 1)", "index"),
    ({"index": _index(1, 3, 0, 2, 0)}, "position outside its chunk [0, 3)", "index"),
    ({"index": _index(1, 1, 0, 2, 0)}, "strictly increasing within each chunk", "index"),
    ({"index": _index(2, 1, 0, 2, 0)}, "strictly increasing within each chunk", "index"),
    ({"index": b"\x00"}, "'index' must hold 5 values of 2 bits = 2 bytes, got 1", "length"),
    ({"level": b"\x00"}, "'level' must hold 5 values of 2 bits = 2 bytes, got 1", "length"),
    ({"centroid": b"\x00" * 16}, "'centroid' must hold 12 values of <f4 = 48 bytes", "length"),
    ({"centroid": b"\x00\x00\xc0\x7f" * 12}, "'centroid' contains NaN", "non_finite"),
    ({"centroid": b"\x00" * 44 + b"\x00\x00\x80\x7f"}, "'centroid' contains NaN", "non_finite"),
    ({"group": 0}, "'group' must be in [1, 1073741824], got 0", "parameter"),
    ({"bits": 3}, "'bits' must be one of (2, 4, 8), got 3", "parameter"),
    ({"k": 4}, "'k' must be in [1, chunk=3], got 4", "parameter"),
    ({"k": 0}, "'k' must be in [1, chunk=3], got 0", "parameter"),
    ({"chunk": 0}, "'chunk' must be in [1, 1073741824], got 0", "parameter"),
    ({"chunk": 2**40}, "'chunk' must be in [1, 1073741824]", "parameter"),
    ({"chunk": True}, "'chunk' must be an int", "field"),
    ({"index": "text"}, "'index' must be bytes", "field"),
    ({"extra": 1}, "must be exactly", "field"),
]


@pytest.mark.parametrize(("change", "message", "kind"), HOSTILE)
def test_hostile_payloads_are_refused_naming_the_field(change: dict, message: str, kind: str):
    payload = good()
    assert torch.equal(decode(payload, 7), decode(dict(payload), 7))  # the base is valid
    with pytest.raises(PayloadError, match=re.escape(message)) as caught:
        decode(payload | change, 7)
    assert caught.value.kind == kind


def test_a_missing_field_and_another_codecs_parameters_are_refused() -> None:
    payload = good()
    with pytest.raises(PayloadError, match=r"must be exactly \[.*'level'\]"):
        decode({key: value for key, value in payload.items() if key != "level"}, 7)
    receiver = build_compressor("chunked-topk:chunk=3,k=1")  # a decoder built from a spec
    with pytest.raises(PayloadError, match="do not match this codec's chunk=3, k=1") as caught:
        receiver.decode(payload, 7)
    assert (caught.value.kind, caught.value.field) == ("parameter", "k")
    assert decode(payload, 7).count_nonzero() == 5  # the registry reads k from the payload


@settings(max_examples=60, deadline=None)
@given(data=st.data(), d=st.integers(min_value=1, max_value=40))
def test_random_bytes_of_the_right_lengths_decode_finite_or_are_refused(data, d: int) -> None:
    payload = wire(
        build_compressor("chunked-topk:chunk=6,k=3").encode(torch.randn(d))
    )  # positions of 3 bits: 6 and 7 are out of range
    for key in ("index", "level", "centroid"):
        size = len(payload[key])
        payload[key] = data.draw(st.binary(min_size=size, max_size=size))
    try:
        out = decode(payload, d)
    except PayloadError as error:
        assert error.kind in {"index", "non_finite"}
        return
    assert out.shape == (d,) and bool(out.isfinite().all())
    assert int(out.count_nonzero()) <= 3 * math.ceil(d / 6)


# ----------------------------------------------------------------------------- parameters


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("chunked-topk:chunk=0", "chunked-topk parameter chunk must be an int in [1, 1073741824]"),
        ("chunked-topk:chunk=8,k=9", "chunked-topk parameter k must be an int in [1, chunk=8]"),
        ("chunked-topk:k=0", "chunked-topk parameter k must be an int in [1, chunk=4096]"),
        ("chunked-topk:bits=3", "chunked-topk parameter bits must be one of (2, 4, 8), got 3"),
        ("chunked-topk:sigmas=0", "chunked-topk parameter sigmas must be a number > 0"),
        ("chunked-topk:sigmas=nan", "chunked-topk parameter sigmas must be a number > 0"),
        ("chunked-topk:group=0", "chunked-topk parameter group must be an int in [1, 1073741824]"),
        ("chunked-topk:ratio=0.1", "has no parameter 'ratio'; choose from ['bits', 'chunk', "),
    ],
)
def test_bad_parameters_are_one_line_naming_them(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        build_compressor(spec)


def test_spec_round_trips_and_names_every_parameter() -> None:
    codec = build_compressor("chunked-topk")
    assert codec.spec == "chunked-topk:chunk=4096,k=64,bits=2,sigmas=6,group=1"
    spec = "chunked-topk:chunk=100,k=7,bits=8,sigmas=2.5,group=3,feedback=true"
    assert build_compressor(build_compressor(spec).spec).spec == build_compressor(spec).spec


def test_a_narrower_range_moves_the_bins() -> None:
    x = torch.randn(4096, generator=torch.Generator().manual_seed(2))
    wide = build_compressor("chunked-topk:chunk=512,k=64,sigmas=6,group=8").compress(x).values
    narrow = build_compressor("chunked-topk:chunk=512,k=64,sigmas=2,group=8").compress(x).values
    assert torch.equal(wide != 0, narrow != 0) and not torch.equal(wide, narrow)
    assert wide.unique().numel() <= 5 and narrow.unique().numel() <= 5  # 4 centroids and 0


# ----------------------------------------------------------------------------- lossy


def test_error_feedback_keeps_what_was_not_sent() -> None:
    """``e <- x + e - C(x + e)``: after T messages, everything sent plus the residual is
    the sum of the inputs (nothing is lost, only delayed)."""
    codec = build_compressor("chunked-topk:chunk=32,k=2,feedback=true")
    assert isinstance(codec, ErrorFeedback)
    generator = torch.Generator().manual_seed(5)
    inputs = [torch.randn(200, generator=generator) for _ in range(6)]
    first = decode(wire(codec.encode(inputs[0])), 200)
    assert codec.residual is not None
    torch.testing.assert_close(codec.residual, inputs[0] - first, rtol=0, atol=1e-6)
    second = decode(wire(codec.encode(inputs[1])), 200)
    plain = build_compressor("chunked-topk:chunk=32,k=2")
    assert not torch.equal(second, plain.compress(inputs[1]).values)  # it sent C(x + e)
    sent = first + second
    for x in inputs[2:]:
        sent += decode(wire(codec.encode(x)), 200)
    torch.testing.assert_close(sent + codec.residual, sum(inputs), rtol=0, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(
    d=st.integers(min_value=1, max_value=300),
    chunk=st.integers(min_value=1, max_value=64),
    k=st.integers(min_value=1, max_value=64),
    bits=st.sampled_from([2, 4, 8]),
    sigmas=st.floats(min_value=0.1, max_value=20),
    seed=st.integers(min_value=0, max_value=2**16),
    group=st.sampled_from([1, 3, 1000]),
)
def test_it_is_a_contraction(
    d: int, chunk: int, k: int, bits: int, sigmas: float, seed: int, group: int
) -> None:
    """``|x - C(x)| <= |x|``: a centroid is the least-squares constant of its bin (0 is
    another), so CHOCO's contraction assumption holds for every input."""
    x = torch.randn(d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    out = ChunkedTopK(chunk, min(k, chunk), bits, sigmas, group).compress(x).values
    assert float((x - out).norm()) <= float(x.norm()) * (1 + 1e-6)


def test_the_relative_error_shrinks_with_more_bits_and_more_coordinates() -> None:
    x = torch.randn(20_000, generator=torch.Generator().manual_seed(4))

    def error(spec: str) -> float:
        out = build_compressor(spec).compress(x).values
        return float((out - x).norm() / x.norm())

    assert error("chunked-topk:chunk=1024,k=64,bits=8") < error("chunked-topk:chunk=1024,k=64")
    assert error("chunked-topk:chunk=1024,k=256") < error("chunked-topk:chunk=1024,k=64")
    assert error("chunked-topk:chunk=1024,k=1024,bits=8") < 0.05
