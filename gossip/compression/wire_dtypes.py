"""The wire's one dtype vocabulary, and how tensors become payload bytes and back, checked.

Every number on the wire is little-endian with its dtype spelled out. The names are numpy's
explicit-byte-order type strings, plus ``bf16`` (which numpy lacks: raw bfloat16 bits,
carried as little-endian int16):

=======  ==============  =================================
name     torch dtype     bytes per value
=======  ==============  =================================
``<f8``  float64         8
``<f4``  float32         4
``<f2``  float16         2
``bf16`` bfloat16        2
=======  ==============  =================================

Integer fields (sparse indices ``<i4``, qsgd's packed ``uint8`` levels) have a fixed dtype
per codec and no ``dtype`` field. :func:`to_bytes` writes a tensor in a wire dtype (a
view of its memory where that is free), :func:`from_bytes` reads one back as a view of the
received bytes after checking the length (byte-swapped once on a big-endian host).
:func:`read_field` and :func:`require_finite` are the checks every decoder runs; each
raises :class:`~gossip.compression.errors.PayloadError` naming the field.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from consensus import all_finite
from gossip.compression.errors import PayloadError

__all__ = [
    "WIRE_DTYPES",
    "WIRE_DTYPE_NAMES",
    "from_bytes",
    "read_field",
    "require_finite",
    "same_coordinate",
    "to_bytes",
    "view_bytes",
]

WIRE_DTYPES: dict[str, torch.dtype] = {
    "<f8": torch.float64,
    "<f4": torch.float32,
    "<f2": torch.float16,
    "bf16": torch.bfloat16,
}
"""Wire dtype name -> the torch dtype it decodes to: the only dtype vocabulary of the wire."""

WIRE_DTYPE_NAMES: dict[torch.dtype, str] = {dtype: name for name, dtype in WIRE_DTYPES.items()}
"""torch dtype -> its wire name (the inverse of :data:`WIRE_DTYPES`)."""

_STORAGE: dict[str, np.dtype[Any]] = {
    "<f8": np.dtype("<f8"),
    "<f4": np.dtype("<f4"),
    "<f2": np.dtype("<f2"),
    "bf16": np.dtype("<i2"),  # raw bfloat16 bits as little-endian int16
}


def to_bytes(t: Tensor, wire: str) -> bytes | memoryview:
    """``t`` flattened to raw little-endian values of wire dtype ``wire``.

    Converted (dtype, device, layout) only where needed: a contiguous CPU tensor already in
    that dtype on a little-endian host comes back as a ``memoryview`` of its own memory, so
    the only copy is msgpack's into the body. Such a result aliases ``t``: serialize it
    before writing into ``t``.
    """
    torch_dtype = WIRE_DTYPES[wire]
    flat = t.detach().to("cpu", torch_dtype).contiguous().reshape(-1)
    if torch_dtype == torch.bfloat16:
        flat = flat.view(torch.int16)
    array = flat.numpy()
    if sys.byteorder != "little":
        return array.astype(_STORAGE[wire]).tobytes()  # swapped into the wire's byte order
    return array.data.cast("B")


def view_bytes(data: bytes | memoryview, dtype: np.dtype[Any]) -> Tensor:
    """``data`` as a 1-D tensor of ``dtype`` values, sharing its memory when ``dtype`` is native.

    ``dtype`` carries an explicit byte order (the wire's little-endian): on a little-endian
    host it is native and the tensor views the bytes (read-only, never write into it); on a
    big-endian host the values are byte-swapped once into a new native array.
    """
    array = np.frombuffer(data, dtype=dtype)
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    with warnings.catch_warnings():
        # received bytes are immutable; decoded views are read-only by contract
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)


def from_bytes(data: bytes | memoryview, wire: str, count: int, field: str) -> Tensor:
    """``count`` values of wire dtype ``wire`` viewed from ``data``; the length is checked.

    Raises :class:`PayloadError` (``length``) naming ``field`` when ``data`` does not hold
    exactly ``count`` values.
    """
    storage = _STORAGE[wire]
    expected = count * storage.itemsize
    if len(data) != expected:
        raise PayloadError(
            "length",
            f"payload field {field!r} must hold {count} values of {wire} = {expected} "
            f"bytes, got {len(data)} bytes",
            field=field,
        )
    t = view_bytes(data, storage)
    return t.view(torch.bfloat16) if WIRE_DTYPES[wire] == torch.bfloat16 else t


def read_field(payload: Mapping[str, Any], name: str, kind: type) -> Any:
    """``payload[name]``, which must be present and of msgpack type ``kind`` (bools are not
    ints; for ``bytes`` a sender's own contiguous byte ``memoryview`` also passes, so a
    payload decodes the same before and after msgpack); else :class:`PayloadError`
    (``field``)."""
    if name not in payload:
        raise PayloadError("field", f"payload field {name!r} is missing", field=name)
    value = payload[name]
    if (
        kind is bytes
        and isinstance(value, memoryview)
        and (value.format, value.ndim, value.c_contiguous) == ("B", 1, True)
    ):
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise PayloadError(
                "field",
                f"payload field {name!r} must be an int, got {type(value).__name__}",
                field=name,
            )
    elif not isinstance(value, kind):
        raise PayloadError(
            "field",
            f"payload field {name!r} must be {kind.__name__}, got {type(value).__name__}",
            field=name,
        )
    return value


def require_finite(
    t: Tensor, field: str, *, coordinate_of: Callable[[int], int] | None = None
) -> None:
    """Refuse NaN and infinity (:class:`PayloadError` ``non_finite``): one sum over ``t``, the
    exact elementwise check only if that sum is not finite (``consensus.all_finite``).

    The error names the first bad element's position in the field; ``coordinate_of`` maps
    that position to the coordinate of the decoded ``[d]`` vector it lands on (the identity
    for a dense ``data``, the index for a sparse ``value``), the error's
    :attr:`~PayloadError.coordinate`, so a receiver can name the tensor."""
    if not all_finite(t):
        position = int(torch.nonzero(~torch.isfinite(t.reshape(-1)))[0, 0])  # error path only
        raise PayloadError(
            "non_finite",
            f"payload field {field!r} contains NaN or infinite values (first at element "
            f"{position})",
            field=field,
            coordinate=None if coordinate_of is None else coordinate_of(position),
        )


def same_coordinate(position: int) -> int:
    """``coordinate_of`` for a field that holds one value per coordinate, in order."""
    return position
