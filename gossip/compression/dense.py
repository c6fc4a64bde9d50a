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
    to_bytes,
)

__all__ = ["BFloat16", "Float16", "NoCompression"]


def _dense_fields(
    payload: Mapping[str, Any], d: int, allowed: tuple[str, ...], why: str
) -> dict[str, Tensor]:
    """A dense payload's ``data``: d finite values of one of the ``allowed`` wire dtypes."""
    wire = read_field(payload, "dtype", str)
    if wire not in allowed:
        expected = repr(allowed[0]) if len(allowed) == 1 else f"one of {list(allowed)}"
        raise PayloadError(
            "dtype",
            f"payload field 'dtype' must be {expected}{why}, got {wire!r:.40}",
            field="dtype",
        )
    data = from_bytes(read_field(payload, "data", bytes), wire, d, "data")
    require_finite(data, "data")
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

    def _serialize(self, fields: Mapping[str, Tensor], d: int) -> Payload:
        wire = WIRE_DTYPE_NAMES[fields["data"].dtype]
        return {"dtype": wire, "data": to_bytes(fields["data"], wire)}

    def _parse(self, payload: Mapping[str, Any], d: int) -> dict[str, Tensor]:
        return _dense_fields(payload, d, tuple(WIRE_DTYPES), "")


class _Cast(Compressor):
    """Round to a 16-bit float format: ``C(x) = float32(round(x))``."""

    wire_dtype: ClassVar[str]
    dtype: ClassVar[torch.dtype]
    _fields = frozenset({"dtype", "data"})

    @property
    def spec(self) -> str:
        return self.codec

    def _encode_fields(self, x: Tensor, generator: Randomness) -> dict[str, Tensor]:
        return {"data": x.to(self.dtype)}

    def _decode_fields(self, fields: Mapping[str, Tensor], d: int) -> Tensor:
        return fields["data"].to(torch.float32)

    def _serialize(self, fields: Mapping[str, Tensor], d: int) -> Payload:
        return {"dtype": self.wire_dtype, "data": to_bytes(fields["data"], self.wire_dtype)}

    def _parse(self, payload: Mapping[str, Any], d: int) -> dict[str, Tensor]:
        return _dense_fields(payload, d, (self.wire_dtype,), f" for codec {self.codec!r}")


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
