"""Dense codecs: every coordinate travels, as is (``none``) or rounded to 16 bits.

Payload of all three: ``{"codec", "dtype", "data"}`` with ``dtype`` a wire dtype name
(:data:`~gossip.compression.wire_dtypes.WIRE_DTYPES`) and ``data`` d raw little-endian
values of it. ``none`` sends the vector's own dtype and decodes to it, as a view of the
received bytes (no copy); ``fp16`` and ``bf16`` always send ``<f2`` / ``bf16`` and decode to
float32.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor

from gossip.compression.base import Compressor, Payload, Randomness
from gossip.compression.errors import PayloadError
from gossip.compression.wire_dtypes import (
    WIRE_DTYPE_NAMES,
    WIRE_DTYPES,
    from_bytes,
    read_field,
    require_finite,
    same_coordinate,
    to_bytes,
)

__all__ = ["BFloat16", "Float16", "NoCompression"]


def _dense_fields(
    payload: Mapping[str, Any], d: int, allowed: tuple[str, ...], why: str, *, finite: bool = True
) -> dict[str, Tensor]:
    """A dense payload's ``data``: d values of one of the ``allowed`` wire dtypes, checked
    finite unless the caller checks what it decodes them to (``finite=False``)."""
    wire = read_field(payload, "dtype", str)
    if wire not in allowed:
        expected = repr(allowed[0]) if len(allowed) == 1 else f"one of {list(allowed)}"
        raise PayloadError(
            "dtype",
            f"payload field 'dtype' must be {expected}{why}, got {wire!r:.40}",
            field="dtype",
        )
    data = from_bytes(read_field(payload, "data", bytes), wire, d, "data")
    if finite:
        require_finite(data, "data", coordinate_of=same_coordinate)
    return {"data": data}


class NoCompression(Compressor):
    """Send x as is, in its own dtype (float64/32/16 or bfloat16): ``C(x) = x``.

    The wire path neither copies on send (``data`` views a contiguous CPU ``x``) nor on
    receipt (the decoded vector views the payload's bytes, read-only).
    """

    codec = "none"
    lossless = True
    _fields = frozenset({"dtype", "data"})

    @property
    def spec(self) -> str:
        return "none"

    def _encode_fields(self, x: Tensor, generator: Randomness) -> dict[str, Tensor]:
        if x.dtype not in WIRE_DTYPE_NAMES:
            raise ValueError(f"x dtype {x.dtype} is not one of {list(WIRE_DTYPE_NAMES)}")
        return {"data": x}

    def _decode_fields(self, fields: Mapping[str, Tensor], d: int) -> Tensor:
        return fields["data"]

    def _empty_fields(self, d: int, dtype: torch.dtype) -> dict[str, Tensor]:
        return self._encode_fields(torch.empty(d, dtype=dtype, device="cpu"), None)

    def _serialize(self, fields: Mapping[str, Tensor], d: int) -> Payload:
        wire = WIRE_DTYPE_NAMES[fields["data"].dtype]
        return {"dtype": wire, "data": to_bytes(fields["data"], wire)}

    def _parse(self, payload: Mapping[str, Any], d: int) -> dict[str, Tensor]:
        return _dense_fields(payload, d, tuple(WIRE_DTYPES), "", finite=False)

    def decode(self, payload: Mapping[str, Any], d: int) -> Tensor:
        """Validate and view the payload's bytes (finite values only)."""
        values = super().decode(payload, d)
        require_finite(values, "data", coordinate_of=same_coordinate)
        return values


class _Cast(Compressor):
    """Round to a 16-bit float format: ``C(x) = float32(round(x))``."""

    wire_dtype: ClassVar[str]
    dtype: ClassVar[torch.dtype]
    _fields = frozenset({"dtype", "data"})

    @property
    def spec(self) -> str:
        return self.codec

    def _encode_fields(self, x: Tensor, generator: Randomness) -> dict[str, Tensor]:
        # always a new tensor: a lossy codec's payload never views its input (ErrorFeedback
        # reuses the input's memory)
        return {"data": x.to(self.dtype, copy=True)}

    def _decode_fields(self, fields: Mapping[str, Tensor], d: int) -> Tensor:
        return fields["data"].to(torch.float32)

    def _empty_fields(self, d: int, dtype: torch.dtype) -> dict[str, Tensor]:
        return {"data": torch.empty(d, dtype=self.dtype, device="cpu")}

    def _serialize(self, fields: Mapping[str, Tensor], d: int) -> Payload:
        return {"dtype": self.wire_dtype, "data": to_bytes(fields["data"], self.wire_dtype)}

    def _parse(self, payload: Mapping[str, Any], d: int) -> dict[str, Tensor]:
        why = f" for codec {self.codec!r}"
        return _dense_fields(payload, d, (self.wire_dtype,), why, finite=False)

    def decode(self, payload: Mapping[str, Any], d: int) -> Tensor:
        """Validate and widen to float32; the finiteness check runs on the float32 result
        (widening keeps NaN and infinity, and a float32 sum is one cheap pass, where a sum
        of 16-bit values would first widen a copy of them)."""
        values = super().decode(payload, d)
        require_finite(values, "data", coordinate_of=same_coordinate)
        return values


class Float16(_Cast):
    """IEEE half precision, round to nearest (values beyond ±65504 become inf and are refused)."""

    codec = "fp16"
    wire_dtype = "<f2"
    dtype = torch.float16


class BFloat16(_Cast):
    """bfloat16 (8-bit exponent, 7-bit mantissa), round to nearest even."""

    codec = "bf16"
    wire_dtype = "bf16"
    dtype = torch.bfloat16
