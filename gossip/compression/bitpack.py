"""Unsigned integers of any width from 1 to 32 bits packed end to end into bytes, and back.

The layout is one little-endian bit stream per row: value ``j`` of a row occupies bits
``[j w, (j + 1) w)`` of it, bit ``b`` being bit ``b mod 8`` (least significant first) of byte
``b div 8``; a row of m values takes ``ceil(m w / 8)`` bytes and the last byte's unused high
bits are zero. So 2-bit levels travel four to a byte (``q_0 | q_1 << 2 | ...``, as qsgd's)
and 12-bit indices two to three bytes.

Both directions are vectorized over every value at once: eight consecutive values fill ``w``
bytes exactly, so a row is cut into groups of eight and each group is assembled in
``ceil(w / 8)`` 64-bit words by eight shifted ORs (one per position in the group, each over
all groups of all rows); the bytes of those words are the stream. There is no loop over
values or bytes.
"""

from __future__ import annotations

import math
import sys

import numpy as np

__all__ = ["pack_uints", "packed_bytes", "unpack_uints"]

_GROUP = 8
"""Values per group: eight values of w bits are exactly w bytes."""


def packed_bytes(count: int, width: int) -> int:
    """Bytes that ``count`` values of ``width`` bits take: ``ceil(count * width / 8)``."""
    return math.ceil(count * width / 8)


def _check_width(width: int) -> None:
    if isinstance(width, bool) or not isinstance(width, int) or not 1 <= width <= 32:
        raise ValueError(f"width must be an int in [1, 32], got {width!r}")


def _words(width: int) -> int:
    """64-bit words that one group of eight ``width``-bit values spans."""
    return math.ceil(_GROUP * width / 64)


def pack_uints(values: np.ndarray, width: int) -> np.ndarray:
    """``values [n, m]`` (non-negative integers below ``2^width``) -> ``uint8 [n, B]``,
    ``B = ceil(m width / 8)``, each row its own bit stream (the module's layout).

    Values of ``width`` bits or more are not checked: the caller's values fit (a chunk's
    positions, a quantizer's levels)."""
    _check_width(width)
    if values.ndim != 2:
        raise ValueError(f"values must have shape [n, m], got {values.shape}")
    n, m = values.shape
    groups = math.ceil(m / _GROUP)
    padded = np.zeros((n, groups * _GROUP), dtype=np.uint64)
    padded[:, :m] = values
    lanes = padded.reshape(n, groups, _GROUP)
    words = np.zeros((n, groups, _words(width)), dtype=np.uint64)
    for j in range(_GROUP):  # the eight positions of a group, each over every group at once
        offset = j * width
        word, shift = divmod(offset, 64)
        words[:, :, word] |= lanes[:, :, j] << np.uint64(shift)
        if shift + width > 64:  # the value straddles two words: its high bits go next
            words[:, :, word + 1] |= lanes[:, :, j] >> np.uint64(64 - shift)
    if sys.byteorder != "little":
        words = words.astype("<u8")
    stream = words.view(np.uint8).reshape(n, groups, 8 * words.shape[2])[:, :, :width]
    return np.ascontiguousarray(stream.reshape(n, groups * width)[:, : packed_bytes(m, width)])


def unpack_uints(packed: np.ndarray, width: int, count: int) -> np.ndarray:
    """``uint8 [n, ceil(count width / 8)]`` -> the ``int64 [n, count]`` values
    :func:`pack_uints` packed (bits past the last value are ignored)."""
    _check_width(width)
    if packed.ndim != 2 or packed.shape[1] != packed_bytes(count, width):
        raise ValueError(
            f"packed must have shape [n, {packed_bytes(count, width)}] for {count} values of "
            f"{width} bits, got {packed.shape}"
        )
    n = packed.shape[0]
    groups = math.ceil(count / _GROUP)
    span = _words(width) * 8
    raw = np.zeros((n, groups, span), dtype=np.uint8)
    flat = np.zeros((n, groups * width), dtype=np.uint8)
    flat[:, : packed.shape[1]] = packed
    raw[:, :, :width] = flat.reshape(n, groups, width)
    words = raw.view("<u8")
    if sys.byteorder != "little":
        words = words.astype(np.uint64)
    mask = np.uint64((1 << width) - 1)
    lanes = np.empty((n, groups, _GROUP), dtype=np.uint64)
    for j in range(_GROUP):
        offset = j * width
        word, shift = divmod(offset, 64)
        lane = words[:, :, word] >> np.uint64(shift)
        if shift + width > 64:
            lane |= words[:, :, word + 1] << np.uint64(64 - shift)
        np.bitwise_and(lane, mask, out=lanes[:, :, j])
    return lanes.reshape(n, groups * _GROUP)[:, :count].astype(np.int64)
