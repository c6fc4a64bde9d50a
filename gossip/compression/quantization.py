"""QSGD-style stochastic quantization (Alistarh et al., NeurIPS 2017), unbiased.

Payload: ``{"codec": "qsgd", "bits", "block", "scale", "level"}``, see
:class:`StochasticQuantization`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from gossip.compression.base import Compressor, Payload, Randomness, uniform
from gossip.compression.errors import PayloadError
from gossip.compression.wire_dtypes import (
    from_bytes,
    read_field,
    require_finite,
    to_bytes,
    view_bytes,
)

__all__ = ["StochasticQuantization"]


class StochasticQuantization(Compressor):
    """QSGD-style stochastic quantization with one float32 scale per block (Alistarh et al. 2017).

    ``C(x)_i = s_b q_i / L`` with ``s_b = max_{i in block b} |x_i|``, ``L = 2^(bits-1) - 1``
    and ``q_i = floor(L x_i / s_b + u_i)``, ``u_i ~ U[0, 1)``: unbiased, ``E[C(x)] = x``.

    Args:
        bits: 2, 4 or 8; each coordinate travels as ``bits`` bits (levels ``q + L`` packed
            little-end first into bytes).
        block: coordinates per scale (the last block may be shorter).

    Wire fields: ``bits``, ``block`` (ints), ``scale`` (``ceil(d/block)`` ``<f4``),
    ``level`` (``ceil(d*bits/8)`` bytes).
    """

    codec = "qsgd"
    _fields = frozenset({"bits", "block", "scale", "level"})
    BITS = (2, 4, 8)

    def __init__(self, bits: int = 8, block: int = 256) -> None:
        super().__init__()
        if isinstance(bits, bool) or bits not in self.BITS:
            raise ValueError(f"qsgd parameter bits must be one of {self.BITS}, got {bits!r}")
        if isinstance(block, bool) or not isinstance(block, int) or block < 1:
            raise ValueError(f"qsgd parameter block must be an int >= 1, got {block!r}")
        self.bits = bits
        self.block = block
        self.levels = 2 ** (bits - 1) - 1

    @property
    def spec(self) -> str:
        return f"qsgd:bits={self.bits},block={self.block}"

    def _blocks(self, x: Tensor) -> Tensor:
        """``[*, d] -> [*, ceil(d / block), width]``, zero padded; a block wider than d is one
        block of width d (never allocate more than 2d, whatever ``block`` a payload claims)."""
        d = x.shape[-1]
        width = min(self.block, d)
        padded = math.ceil(d / width) * width
        x = torch.nn.functional.pad(x, (0, padded - d))
        return x.unflatten(-1, (padded // width, width))

    def _encode_fields(self, x: Tensor, generator: Randomness) -> dict[str, Tensor]:
        d = x.shape[-1]
        x = x.to(torch.float32)
        blocks = self._blocks(x)  # [*, nblocks, block], zero padded
        scale = blocks.abs().amax(dim=-1)  # [*, nblocks]
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        level = (blocks / safe.unsqueeze(-1)).flatten(-2)[..., :d] * self.levels
        noise = uniform(x, generator)
        q = torch.floor(level + noise).clamp_(-self.levels, self.levels)
        return {"scale": scale, "level": self._pack(q.to(torch.int16) + self.levels)}

    def _pack(self, unsigned: Tensor) -> Tensor:
        per_byte = 8 // self.bits
        d = unsigned.shape[-1]
        padded = math.ceil(d / per_byte) * per_byte
        u = torch.nn.functional.pad(unsigned, (0, padded - d), value=self.levels)
        u = u.to(torch.uint8).unflatten(-1, (padded // per_byte, per_byte))
        packed = u[..., 0].clone()
        for position in range(1, per_byte):  # at most 4 bit positions, each one vector op
            packed |= u[..., position] << (position * self.bits)
        return packed

    def _unpack(self, packed: Tensor, d: int) -> Tensor:
        per_byte = 8 // self.bits
        shifts = torch.arange(per_byte, device=packed.device, dtype=torch.int16) * self.bits
        u = (packed.to(torch.int16).unsqueeze(-1) >> shifts) & (2**self.bits - 1)
        return u.flatten(-2)[..., :d]

    def _decode_fields(self, fields: Mapping[str, Tensor], d: int) -> Tensor:
        q = (self._unpack(fields["level"], d) - self.levels).to(torch.float32)
        step = fields["scale"] / self.levels
        return (self._blocks(q) * step.unsqueeze(-1)).flatten(-2)[..., :d]

    def _serialize(self, fields: Mapping[str, Tensor], d: int) -> Payload:
        return {
            "bits": self.bits,
            "block": self.block,
            "scale": to_bytes(fields["scale"], "<f4"),
            "level": fields["level"].cpu().numpy().tobytes(),
        }

    def _parse(self, payload: Mapping[str, Any], d: int) -> dict[str, Tensor]:
        bits = read_field(payload, "bits", int)
        block = read_field(payload, "block", int)
        if bits != self.bits or block != self.block:
            raise PayloadError(
                "parameter",
                f"payload fields bits={bits}, block={block} do not match this codec's "
                f"bits={self.bits}, block={self.block}",
                field="bits" if bits != self.bits else "block",
            )
        scale = from_bytes(
            read_field(payload, "scale", bytes), "<f4", math.ceil(d / block), "scale"
        )
        require_finite(scale, "scale")
        if bool((scale < 0).any()):
            raise PayloadError("value", "payload field 'scale' must be >= 0", field="scale")
        level_bytes = read_field(payload, "level", bytes)
        count = math.ceil(d / (8 // bits))
        if len(level_bytes) != count:
            raise PayloadError(
                "length",
                f"payload field 'level' must hold {count} bytes for d={d}, bits={bits}, "
                f"got {len(level_bytes)}",
                field="level",
            )
        level = view_bytes(level_bytes, np.dtype(np.uint8))
        if bool((self._unpack(level, d) > 2 * self.levels).any()):
            raise PayloadError(
                "value",
                f"payload field 'level' holds a level outside [0, {2 * self.levels}]",
                field="level",
            )
        return {"scale": scale, "level": level}
