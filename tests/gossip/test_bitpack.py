"""Integers of any width packed end to end: the layout against a bit string built here."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gossip.compression.bitpack import pack_uints, packed_bytes, unpack_uints


def reference(values: list[int], width: int) -> bytes:
    """Value j at bits [j w, (j + 1) w) of one stream, least significant bit first."""
    stream = sum(value << (j * width) for j, value in enumerate(values))
    return stream.to_bytes(packed_bytes(len(values), width), "little")


@settings(max_examples=80, deadline=None)
@given(data=st.data(), width=st.integers(min_value=1, max_value=32), rows=st.integers(0, 3))
def test_rows_pack_to_the_reference_stream_and_back(data, width: int, rows: int) -> None:
    count = data.draw(st.integers(min_value=0, max_value=40))
    values = np.array(
        data.draw(
            st.lists(
                st.lists(st.integers(0, 2**width - 1), min_size=count, max_size=count),
                min_size=rows,
                max_size=rows,
            )
        ),
        dtype=np.int64,
    ).reshape(rows, count)
    packed = pack_uints(values, width)
    assert packed.dtype == np.uint8 and packed.shape == (rows, packed_bytes(count, width))
    for row, line in zip(values, packed):
        assert line.tobytes() == reference(row.tolist(), width)
    assert np.array_equal(unpack_uints(packed, width, count), values)


def test_twelve_bit_positions_take_three_bytes_per_pair() -> None:
    packed = pack_uints(np.array([[0xABC, 0x123, 0xFFF]]), 12)
    assert packed.tobytes() == bytes([0xBC, 0x3A, 0x12, 0xFF, 0x0F])


@pytest.mark.parametrize("width", [0, 33, True, 2.0])
def test_widths_outside_1_to_32_are_refused(width: object) -> None:
    with pytest.raises(ValueError, match=r"width must be an int in \[1, 32\]"):
        pack_uints(np.zeros((1, 3), dtype=np.int64), width)  # type: ignore[arg-type]


def test_unpacking_checks_the_byte_count() -> None:
    with pytest.raises(ValueError, match=r"packed must have shape \[n, 2\] for 5 values of 3"):
        unpack_uints(np.zeros((1, 3), dtype=np.uint8), 3, 5)
