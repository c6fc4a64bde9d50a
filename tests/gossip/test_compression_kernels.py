"""The codecs' fast kernels equal their definitions, written out plainly here, bit for bit.

qsgd quantizes and packs slab by slab, the sparsifiers select through thresholds and numpy,
error feedback reuses its residual's memory, and ``wire_bytes`` is computed without
encoding: each is compared with a straightforward reference on small inputs, with the slab
size shrunk (``monkeypatch``) so that slab edges, ragged blocks, row groups and partial
bytes all occur. Nothing here is timed.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import msgpack
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from gossip.compression import (
    ErrorFeedback,
    PayloadError,
    RandomK,
    StochasticQuantization,
    TopK,
    build_compressor,
    decode,
    node_generators,
    sparse,
)
from gossip.compression import slabs as layout
from gossip.compression.base import packed_size, uniform
from gossip.compression.selection import exact_largest, largest_above, largest_in_row
from gossip.compression.slabs import Slab, check_generators, draw_uniform, slabs

EVERY_SPEC = [
    "none",
    "fp16",
    "bf16",
    "qsgd:bits=8",
    "qsgd:bits=4,block=5",
    "qsgd:bits=2,block=3",
    "topk:ratio=0.1",
    "randk:ratio=0.1",
    "fp16:feedback=true",
    "qsgd:bits=2,feedback=true",
    "topk:ratio=0.1,feedback=true",
]


@contextmanager
def small_slabs(size: int = 24, long_row: int = 40) -> Iterator[None]:
    """Slabs of ``size`` coordinates and long rows from ``long_row`` on: every edge case of
    the kernels (slab edges, ragged blocks, row groups, partial bytes) on tiny inputs."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(layout, "SLAB", size)
        patch.setattr(sparse, "LONG_ROW", long_row)
        yield


SLAB_SIZES = st.integers(1, 64)


# ----------------------------------------------------------------------------- the stream


@pytest.mark.parametrize("d", [1, 15, 16, 17, 1000, 4099])
def test_a_cpu_generator_is_one_stream_however_it_is_drawn(d: int) -> None:
    """What chunked draws rely on: pieces in order == one draw; rows in order == [n, d]."""
    whole = torch.rand(3 * d, generator=torch.Generator().manual_seed(7))
    generator = torch.Generator().manual_seed(7)
    pieces = []
    for start in range(0, 3 * d, 13):
        piece = torch.empty(min(13, 3 * d - start))
        pieces.append(torch.rand(piece.shape, generator=generator, out=piece))
    assert torch.equal(torch.cat(pieces), whole)
    matrix = torch.rand((3, d), generator=torch.Generator().manual_seed(7))
    assert torch.equal(matrix.reshape(-1), whole)


@given(
    rows=st.integers(0, 7),
    d=st.integers(1, 90),
    align=st.integers(1, 12),
    size=st.integers(1, 64),
)
def test_slabs_cover_every_coordinate_once_in_order(rows, d, align, size) -> None:
    seen = []
    for slab in slabs(rows, d, align=align, size=size):
        r, c = slab.shape
        assert r >= 1 and c >= 1
        assert r * c <= max(size, align, d if d <= size else 0)
        if d > size:
            assert r == 1 and slab.col % align == 0
            assert c % align == 0 or slab.col_end == d
        seen += [
            (row, col)
            for row in range(slab.row, slab.row_end)
            for col in range(slab.col, slab.col_end)
        ]
    assert seen == [(row, col) for row in range(rows) for col in range(d)]


@given(rows=st.integers(1, 5), d=st.integers(1, 60), per_row=st.booleans())
def test_slab_draws_are_the_whole_tensors_draws(rows: int, d: int, per_row: bool) -> None:
    def generators():
        if per_row:
            return node_generators(3, [f"peer-{i}" for i in range(rows)])
        return torch.Generator().manual_seed(3)

    expected = uniform(torch.zeros(rows, d), generators())
    generator = generators()
    got = torch.empty(rows, d)
    for slab in slabs(rows, d, size=7):
        out = torch.empty(slab.shape)
        got[slab.row : slab.row_end, slab.col : slab.col_end] = draw_uniform(
            out, generator, slab, rows
        )
    assert torch.equal(got, expected)


def test_one_generator_per_row_needs_a_batch_of_that_many_rows() -> None:
    with pytest.raises(
        ValueError, match=r"generator: one per row needs x of shape \[n, \.\.\., d\]"
    ):
        check_generators(node_generators(0, ["a", "b"]), torch.zeros(5))
    with pytest.raises(ValueError, match="3 rows"):
        build_compressor("qsgd").compress(torch.zeros(3, 8), node_generators(0, ["a", "b"]))
    check_generators(node_generators(0, ["a", "b"]), torch.zeros(2, 4, 8))  # x[i] per generator


# ----------------------------------------------------------------------------- qsgd


def qsgd_reference(x: torch.Tensor, bits: int, block: int, noise: torch.Tensor):
    """The definition, one block and one byte at a time: scales, packed bytes, decoded."""
    levels = 2 ** (bits - 1) - 1
    x = x.to(torch.float32)
    d = x.shape[0]
    width = min(block, d)
    scales, unsigned = [], []
    for start in range(0, d, width):
        part = x[start : start + width]
        scale = part.abs().max()
        safe = scale if scale > 0 else torch.tensor(1.0)
        q = torch.floor(part / safe * levels + noise[start : start + width])
        unsigned += (q.clamp(-levels, levels) + levels).to(torch.int64).tolist()
        scales.append(scale)
    per_byte = 8 // bits
    padded = unsigned + [levels] * (-d % per_byte)
    packed = bytes(
        sum(padded[i + j] << (bits * j) for j in range(per_byte))
        for i in range(0, len(padded), per_byte)
    )
    scale_tensor = torch.stack(scales)
    steps = (scale_tensor / levels).repeat_interleave(width)[:d]
    decoded = (torch.tensor(unsigned, dtype=torch.float32) - levels) * steps
    return scale_tensor, packed, decoded


@given(
    d=st.integers(1, 130),
    bits=st.sampled_from([2, 4, 8]),
    block=st.integers(1, 40),
    seed=st.integers(0, 2**16),
    slab=SLAB_SIZES,
)
def test_qsgd_encode_is_the_definition_bit_for_bit(d, bits, block, seed, slab) -> None:
    x = torch.randn(d, generator=torch.Generator().manual_seed(seed)) * 3
    x[::4] = 0.0  # zero coordinates, and (with block 1) all-zero blocks
    codec = StochasticQuantization(bits, block)
    with small_slabs(slab):
        payload, decoded = codec.encode_and_decode(x, torch.Generator().manual_seed(seed))
        received = codec.decode(msgpack.unpackb(msgpack.packb(payload)), d)
        again = codec.encode(x, torch.Generator().manual_seed(seed))  # encode alone
    noise = torch.rand(d, generator=torch.Generator().manual_seed(seed))
    scale, packed, expected = qsgd_reference(x, bits, block, noise)
    assert bytes(payload["scale"]) == scale.numpy().astype("<f4").tobytes()
    assert bytes(payload["level"]) == packed
    assert torch.equal(decoded, expected)
    assert torch.equal(received, expected)
    assert msgpack.packb(again) == msgpack.packb(payload)


@given(
    n=st.integers(1, 6),
    d=st.integers(1, 70),
    bits=st.sampled_from([2, 4, 8]),
    block=st.integers(1, 30),
    per_row=st.booleans(),
    slab=SLAB_SIZES,
)
def test_qsgd_batched_rows_are_the_wire_vectors(n, d, bits, block, per_row, slab) -> None:
    """Row groups and row pieces draw what each node's vector draws alone, and the rows
    are the definition over each node's own draws."""
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(n * d))
    names = [f"peer-{i}" for i in range(n)]
    codec = StochasticQuantization(bits, block)
    batch_generator = node_generators(1, names) if per_row else torch.Generator().manual_seed(1)
    with small_slabs(slab):
        batched = codec.compress(x, batch_generator).values
    shared = torch.Generator().manual_seed(1)
    noise = uniform(torch.zeros(n, d), node_generators(1, names) if per_row else shared)
    shared = torch.Generator().manual_seed(1)
    for i in range(n):
        generator = node_generators(1, names)[i] if per_row else shared
        _, row = codec.encode_and_decode(x[i], generator)
        assert torch.equal(batched[i], row)
        assert torch.equal(row, qsgd_reference(x[i], bits, block, noise[i])[2])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_qsgd_quantizes_other_dtypes_after_rounding_to_float32(dtype) -> None:
    x = (torch.randn(3, 50) * 4).to(dtype)
    codec = StochasticQuantization(4, 7)
    with small_slabs():
        got = codec.compress(x, torch.Generator().manual_seed(2)).values
    noise = torch.rand(150, generator=torch.Generator().manual_seed(2)).view(3, 50)
    for i in range(3):
        expected = qsgd_reference(x[i].float(), 4, 7, noise[i])[2]
        assert torch.equal(got[i], expected.to(dtype))


def test_qsgd_ignores_the_last_bytes_padding_but_not_its_levels() -> None:
    """d = 5 at 2 bits: the second byte holds one level and three padding fields."""
    codec = StochasticQuantization(2, 8)
    payload = msgpack.unpackb(msgpack.packb(codec.encode(torch.randn(5))))
    level = payload["level"]
    padded_with_threes = level[:1] + bytes([(level[1] & 0b11) | 0b11111100])
    assert codec.decode(payload | {"level": padded_with_threes}, 5).shape == (5,)
    with pytest.raises(PayloadError, match="outside") as caught:
        codec.decode(payload | {"level": level[:1] + bytes([0b11])}, 5)
    assert caught.value.kind == "value"
    with pytest.raises(PayloadError, match="outside"):
        codec.decode(payload | {"level": bytes([0b11000000]) + level[1:]}, 5)


@given(bits=st.sampled_from([2, 4, 8]), d=st.integers(1, 80), slab=SLAB_SIZES, data=st.data())
def test_qsgd_refuses_exactly_the_payloads_with_a_level_past_2L(bits, d, slab, data) -> None:
    codec = StochasticQuantization(bits, 16)
    payload = msgpack.unpackb(msgpack.packb(codec.encode(torch.randn(d))))
    raw = data.draw(st.binary(min_size=len(payload["level"]), max_size=len(payload["level"])))
    fields = [(byte >> (bits * j)) & ((1 << bits) - 1) for byte in raw for j in range(8 // bits)]
    valid = max(fields[:d]) <= 2 * codec.levels
    with small_slabs(slab):
        try:
            codec.decode(payload | {"level": raw}, d)
        except PayloadError as error:
            assert not valid and error.kind == "value"
        else:
            assert valid


def test_a_non_finite_block_is_refused_on_the_wire_and_non_finite_in_the_batch() -> None:
    x = torch.randn(2, 12)
    x[0, 1] = math.inf
    x[1, 9] = math.nan
    codec = StochasticQuantization(8, 4)
    values = codec.compress(x).values
    assert not bool(values[0, :4].isfinite().any()) and bool(values[0, 4:].isfinite().all())
    assert not bool(values[1, 8:].isfinite().any()) and bool(values[1, :8].isfinite().all())
    with pytest.raises(PayloadError) as caught:
        decode(msgpack.unpackb(msgpack.packb(codec.encode(x[0]))), 12)
    assert caught.value.kind == "non_finite"


# ----------------------------------------------------------------------------- selection


def largest_reference(scores: np.ndarray, k: int) -> np.ndarray:
    """The k largest per row, ties to the lower index, increasing: a full lexicographic sort."""
    rows = [np.sort(np.lexsort((np.arange(row.size), -row))[:k]) for row in scores]
    return np.stack(rows)


@given(
    g=st.integers(1, 5),
    m=st.integers(1, 60),
    k=st.integers(1, 70),
    values=st.integers(1, 6),
    seed=st.integers(0, 2**16),
)
def test_exact_largest_is_the_definition_in_numpy_and_in_torch(g, m, k, values, seed) -> None:
    from gossip.compression.selection import _largest_torch

    rng = np.random.default_rng(seed)
    scores = rng.integers(0, values, size=(g, m)).astype(np.float32)  # many ties
    expected = largest_reference(scores, min(k, m))
    assert np.array_equal(exact_largest(torch.from_numpy(scores), k).numpy(), expected)
    if k < m:
        assert np.array_equal(_largest_torch(torch.from_numpy(scores), k).numpy(), expected)


@given(
    d=st.integers(1, 200),
    k=st.integers(1, 60),
    threshold=st.integers(0, 5),
    size=st.integers(1, 50),
    seed=st.integers(0, 2**16),
)
def test_a_threshold_gives_the_same_answer_or_none(d, k, threshold, size, seed) -> None:
    rng = np.random.default_rng(seed)
    scores = torch.from_numpy(rng.integers(0, 5, size=d).astype(np.float32))

    def fill(out: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        return out.copy_(scores[start:stop])

    k = min(k, d)
    expected = largest_reference(scores.numpy()[None], k)[0]
    assert np.array_equal(largest_in_row(fill, d, k).numpy(), expected)
    found = largest_above(fill, d, k, float(threshold), size=size)
    if int((scores >= threshold).sum()) >= k:
        assert found is not None and np.array_equal(found.numpy(), expected)
    else:
        assert found is None


def topk_reference(x: torch.Tensor, k: int) -> torch.Tensor:
    magnitudes = x.abs().double().numpy().reshape(-1, x.shape[-1])
    magnitudes = np.where(np.isnan(magnitudes), np.inf, magnitudes)
    return torch.from_numpy(largest_reference(magnitudes, k))


@given(
    n=st.integers(1, 4),
    d=st.integers(1, 150),
    ratio=st.sampled_from([0.01, 0.05, 0.1, 0.3, 1.0]),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16]),
    seed=st.integers(0, 2**16),
    slab=SLAB_SIZES,
)
def test_topk_keeps_the_definitions_coordinates(n, d, ratio, dtype, seed, slab) -> None:
    """Ties in magnitude to the lower index, NaN above everything, in every path: short rows
    in groups, long rows through a sampled threshold (d >= 40 here), and the full pass."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randint(-3, 4, (n, d), generator=generator).to(dtype)  # ties everywhere
    x.view(-1)[torch.randint(0, n * d, (n * d // 9,), generator=generator)] = math.nan
    x.view(-1)[torch.randint(0, n * d, (n * d // 11,), generator=generator)] = -math.inf
    before = x.clone()
    codec = TopK(ratio)
    k = codec.k(d)
    expected = topk_reference(x, k)
    with small_slabs(slab):
        batched = codec.compress(x).values
        payloads = [codec.encode(row) for row in x]
    for row, payload, index in zip(x, payloads, expected):
        sent = np.frombuffer(payload["index"], "<i4")
        np.testing.assert_array_equal(sent, index.numpy())
        values = np.frombuffer(payload["value"], "<f4")
        np.testing.assert_array_equal(values, row[index].float().numpy())  # NaN == NaN
    kept = torch.zeros(n, d, dtype=torch.bool).scatter_(1, expected, True)
    np.testing.assert_array_equal(  # the batched path keeps the same coordinates, x's values
        batched.float().numpy(), torch.where(kept, x, torch.zeros_like(x)).float().numpy()
    )
    np.testing.assert_array_equal(x.float().numpy(), before.float().numpy())  # x not written


def test_topk_on_random_values_matches_torch_topk() -> None:
    """Without ties the definition is torch.topk's set, for short and long rows alike."""
    x = torch.randn(3, 500)
    for ratio in (0.01, 0.1, 0.5):
        with small_slabs():
            values = TopK(ratio).compress(x).values
        expected = x.abs().topk(TopK(ratio).k(500), dim=1).indices.sort(dim=1).values
        assert torch.equal(values.ne(0).nonzero()[:, 1].view(3, -1), expected)  # no 0 in randn
        assert torch.equal(values.gather(1, expected), x.gather(1, expected))


class _BadGuess(TopK):
    """A threshold nobody reaches: the full second pass must give the same answer."""

    def _threshold(self, row, k, dtype):
        return math.inf


class _BadGuessRandomK(RandomK):
    def _threshold(self, row, k, dtype):
        return 1.0


@pytest.mark.parametrize("per_row", [False, True])
def test_a_threshold_that_fails_falls_back_to_the_same_answer(per_row: bool) -> None:
    x = torch.randn(2, 300)

    def generators():
        if per_row:
            return node_generators(4, ["a", "b"])
        return torch.Generator().manual_seed(4)

    good, bad = generators(), generators()
    with small_slabs():
        fallback = _BadGuess(0.05).compress(x).values
        assert torch.equal(fallback, TopK(0.05).compress(x).values)
        expected = RandomK(0.05).compress(x, good).values
        assert torch.equal(_BadGuessRandomK(0.05).compress(x, bad).values, expected)
    after_good = good if isinstance(good, list) else [good]
    after_bad = bad if isinstance(bad, list) else [bad]
    for g1, g2 in zip(after_good, after_bad):  # both consumed the same draws
        assert torch.equal(torch.rand(5, generator=g1), torch.rand(5, generator=g2))


@given(
    n=st.integers(1, 4),
    d=st.integers(1, 120),
    ratio=st.sampled_from([0.02, 0.1, 0.5]),
    per_row=st.booleans(),
    seed=st.integers(0, 2**10),
    slab=SLAB_SIZES,
)
def test_randk_keeps_the_largest_keys_drawn_in_order(n, d, ratio, per_row, seed, slab) -> None:
    names = [f"peer-{i}" for i in range(n)]

    def generators():
        if per_row:
            return node_generators(seed, names)
        return torch.Generator().manual_seed(seed)

    keys = uniform(torch.zeros(n, d), generators())
    codec = RandomK(ratio)
    x = torch.randn(n, d) + 10  # no coordinate is 0: the kept ones are the nonzero ones
    with small_slabs(slab):
        values = codec.compress(x, generators()).values
    expected = torch.from_numpy(largest_reference(keys.numpy(), codec.k(d)))
    assert torch.equal(values.ne(0).nonzero()[:, 1].view(n, -1), expected)
    assert torch.equal(values.gather(1, expected), x.gather(1, expected))


# ----------------------------------------------------------------------------- every codec


@pytest.mark.parametrize("spec", EVERY_SPEC)
def test_encoding_never_writes_its_input_and_encode_is_encode_and_decode(spec: str) -> None:
    x = torch.randn(3, 100)
    before = x.clone()
    one, two = build_compressor(spec), build_compressor(spec)
    with small_slabs():
        build_compressor(spec).compress(x, torch.Generator().manual_seed(0))
        for row in x:
            payload = one.encode(row, torch.Generator().manual_seed(1))
            other, _ = two.encode_and_decode(row, torch.Generator().manual_seed(1))
            assert msgpack.packb(payload) == msgpack.packb(other)
    assert torch.equal(x, before)


@pytest.mark.parametrize("spec", EVERY_SPEC)
@pytest.mark.parametrize("d", [1, 63, 64, 255, 256, 257, 16383, 16384, 16385, 70000])
def test_wire_bytes_without_encoding_is_the_packed_length(spec: str, d: int) -> None:
    """Sizes that cross msgpack's bin 8 / bin 16 / bin 32 headers, counted without packing."""
    codec = build_compressor(spec)
    payload = codec.encode(torch.randn(d), torch.Generator().manual_seed(0))
    assert codec.wire_bytes(d) == len(msgpack.packb(payload)) == packed_size(payload)


def test_error_feedback_reuses_its_residual_and_never_alters_a_sent_payload() -> None:
    """fp16 of a float16 vector (lossless, so e stays 0 and x + e is x) is where a payload
    could view the codec's input: the residual's buffer, which the next message rewrites."""
    codec = build_compressor("fp16:feedback=true")
    assert isinstance(codec, ErrorFeedback)
    inputs = torch.randn(4, 50).to(torch.float16)
    payloads, buffers = [], set()
    for x in inputs:
        payloads.append(codec.encode(x))
        assert codec.residual is not None and not bool(codec.residual.any())
        buffers.add(codec.residual.data_ptr())
    assert len(buffers) == 1  # one buffer, written in place after the first message
    for payload, x in zip(payloads, inputs):  # each payload still holds what was sent
        assert bytes(payload["data"]) == x.numpy().astype("<f2").tobytes()


def test_error_feedback_forgets_a_residual_that_a_failed_send_left_half_updated() -> None:
    codec = build_compressor("qsgd:feedback=true")
    codec.compress(torch.randn(2, 10), torch.Generator().manual_seed(0))
    assert isinstance(codec, ErrorFeedback) and codec.residual is not None
    with pytest.raises(ValueError, match="one per row"):
        codec.compress(torch.randn(2, 10), node_generators(0, ["only-one"]))
    assert codec.residual is None


def test_a_slab_knows_its_shape() -> None:
    assert Slab(2, 5, 10, 17).shape == (3, 7)


@pytest.mark.parametrize("spec", ["qsgd:bits=8", "qsgd:bits=4,block=5", "qsgd:bits=2,block=3"])
def test_the_accelerator_path_one_slab_in_torch_gives_the_same_numbers(spec: str) -> None:
    """Off the CPU a codec runs over the whole tensor at once (torch's gathers, one draw):
    forced here on the CPU, it must equal the slab path."""
    from gossip.compression import quantization

    x = torch.randn(3, 101)
    names = ["a", "b", "c"]
    codec = build_compressor(spec)
    with small_slabs():
        expected = codec.compress(x, node_generators(0, names)).values
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(quantization, "chunked", lambda *args: False)
        assert torch.equal(codec.compress(x, node_generators(0, names)).values, expected)


@pytest.mark.parametrize("spec", ["topk:ratio=0.1", "randk:ratio=0.1"])
def test_the_accelerator_path_of_the_sparsifiers_selects_the_same(spec: str) -> None:
    x = torch.randint(-2, 3, (3, 101)).float()  # ties
    names = ["a", "b", "c"]
    codec = build_compressor(spec)
    with small_slabs():
        expected = codec.compress(x, node_generators(0, names)).values
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sparse, "chunked", lambda *args: False)
        assert torch.equal(codec.compress(x, node_generators(0, names)).values, expected)


@pytest.mark.parametrize("spec", EVERY_SPEC)
def test_an_empty_batch_compresses_to_an_empty_batch(spec: str) -> None:
    for shape in [(0, 10), (0, 70), (2, 0, 10)]:
        with small_slabs():
            out = build_compressor(spec).compress(torch.zeros(shape), torch.Generator())
        assert out.values.shape == shape
