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

from gossip.compression import slabs as layout
from gossip.compression.base import Compressor, Payload, Randomness, uniform
from gossip.compression.errors import PayloadError
from gossip.compression.slabs import (
    Slab,
    check_generators,
    chunked,
    draw_uniform,
    lcm,
    slabs,
)
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
    In float32, in this order: ``t = x_i / s_b`` (``s_b = 1`` for an all-zero block),
    ``t * L``, ``+ u_i``, floor, clamped to ``[-L, L]``. A block holding NaN or infinity has
    a non-finite scale: a receiver refuses it, and the batched path decodes that block to
    non-finite values.

    Args:
        bits: 2, 4 or 8; each coordinate travels as ``bits`` bits (levels ``q + L`` packed
            little-end first into bytes, the last byte padded with level ``L``).
        block: coordinates per scale (the last block may be shorter).

    Wire fields: ``bits``, ``block`` (ints), ``scale`` (``ceil(d/block)`` ``<f4``),
    ``level`` (``ceil(d*bits/8)`` bytes).

    Both halves run one cache-sized slab at a time (:mod:`gossip.compression.slabs`): the
    block maxima, the quantization and the packing (exact float arithmetic,
    ``sum_j u_j 2^(bits j) <= 255``) of a slab happen in a reused workspace, and the noise is
    drawn slab by slab in stream order, so the numbers are the definition's with no
    temporary of the vector's size; decoding looks each byte's levels up in a 256-entry
    table (``q = level - L`` of each field) and scales them in place. On an accelerator the
    same kernels run over the whole tensor as one slab.
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
        self.per_byte = 8 // bits
        cpu = torch.device("cpu")
        fields = (
            torch.arange(256, device=cpu)[:, None] >> torch.arange(0, 8, bits, device=cpu)
        ) & ((1 << bits) - 1)
        self._table = (fields - self.levels).to(torch.float32)  # byte -> its q = level - L
        self._bad_bytes = (fields > 2 * self.levels).any(dim=1).numpy()  # holds a level > 2L

    @property
    def spec(self) -> str:
        return f"qsgd:bits={self.bits},block={self.block}"

    def _width(self, d: int) -> int:
        """Coordinates per block for length d: a block wider than d is one block of width d
        (never allocate more than d, whatever ``block`` a payload claims)."""
        return min(self.block, d)

    def _align(self, d: int) -> int:
        """Slabs start on a block and on a byte of packed levels."""
        return lcm(self._width(d), self.per_byte)

    def _padded(self, columns: int) -> int:
        """A slab's columns rounded up to a whole byte of packed levels."""
        return math.ceil(columns / self.per_byte) * self.per_byte

    def _plan(self, n: int, d: int, whole: bool) -> tuple[list[Slab], int]:
        """The slabs of ``[n, d]`` (one, when ``whole``) and the workspace they need."""
        plan = [Slab(0, n, 0, d)] if whole else list(slabs(n, d, align=self._align(d)))
        size = max((slab.shape[0] * self._padded(slab.shape[1]) for slab in plan), default=0)
        return plan, size

    # -- encode --------------------------------------------------------------------
    def _encode_fields(self, x: Tensor, generator: Randomness) -> dict[str, Tensor]:
        check_generators(generator, x)
        d = x.shape[-1]
        batch = x.shape[:-1]
        x = x.to(torch.float32)
        rows = x.reshape(-1, d)
        n = rows.shape[0]
        width = self._width(d)
        scale = rows.new_empty((n, math.ceil(d / width)))
        level = torch.empty(
            (n, math.ceil(d / self.per_byte)), dtype=torch.uint8, device=rows.device
        )
        whole = not chunked(rows, generator)  # an accelerator: one slab, drawn at once
        plan, size = self._plan(n, d, whole)
        work = rows.new_empty(size)
        scratch = torch.empty_like(work, dtype=torch.int16)
        noise_buffer = uniform(x, generator).reshape(n, d) if whole else torch.empty_like(work)
        for slab in plan:
            r, c = slab.shape
            noise = noise_buffer if whole else noise_buffer[: r * c].view(r, c)
            if not whole:
                draw_uniform(noise, generator, slab, n)
            self._quantize(rows, slab, noise, work, scratch, scale, level)
        return {
            "scale": scale.reshape(*batch, scale.shape[1]),
            "level": level.reshape(*batch, level.shape[1]),
        }

    def _quantize(
        self,
        rows: Tensor,
        slab: Slab,
        noise: Tensor,
        work: Tensor,
        scratch: Tensor,
        scale: Tensor,
        level: Tensor,
    ) -> None:
        """Write one slab's block scales into ``scale`` and its packed levels into ``level``;
        ``work`` (float32) and ``scratch`` (int16) are scratch, and ``noise`` (the slab's
        draws) is consumed."""
        r, c = slab.shape
        d = rows.shape[1]
        width = self._width(d)
        full = c // width * width  # coordinates in full-width blocks
        first = slab.col // width
        blocks = math.ceil(c / width)
        padded = math.ceil(c / self.per_byte) * self.per_byte
        source = rows[slab.row : slab.row_end, slab.col : slab.col_end]
        buffer = work[: r * padded].view(r, padded)
        t = buffer[:, :c]
        torch.abs(source, out=t)
        s = scale[slab.row : slab.row_end, first : first + blocks]
        if full:
            s[:, : full // width] = t[:, :full].unflatten(-1, (-1, width)).amax(dim=-1)
        if full < c:  # the last block of a row, shorter
            s[:, full // width :] = t[:, full:].amax(dim=-1, keepdim=True)
        safe = torch.where(s > 0, s, 1.0)
        if full:
            torch.div(
                source[:, :full].unflatten(-1, (-1, width)),
                safe[:, : full // width, None],
                out=t[:, :full].unflatten(-1, (-1, width)),
            )
        if full < c:
            torch.div(source[:, full:], safe[:, full // width :], out=t[:, full:])
        t.mul_(self.levels).add_(noise).floor_().clamp_(-self.levels, self.levels)
        t.add_(self.levels)  # the unsigned level q + L, in [0, 2L]
        if self.per_byte == 1:
            packed = t
        else:
            buffer[:, c:].fill_(self.levels)  # a row's last byte is padded with level L
            fields = buffer.view(r, padded // self.per_byte, self.per_byte)
            packed = noise.view(-1)[: r * fields.shape[1]].view(r, -1)  # the noise is spent
            torch.mul(fields[..., -1], 1 << self.bits, out=packed)
            for position in range(self.per_byte - 2, 0, -1):  # Horner: sum_j u_j 2^(bits j)
                packed.add_(fields[..., position]).mul_(1 << self.bits)
            packed.add_(fields[..., 0])
        # float -> int16 -> uint8 (exact for 0..255): several times faster than float -> uint8
        narrow = scratch[: packed.numel()].view(packed.shape)
        narrow.copy_(packed)
        start = slab.col // self.per_byte
        level[slab.row : slab.row_end, start : start + packed.shape[1]].copy_(narrow)

    def _empty_fields(self, d: int, dtype: torch.dtype) -> dict[str, Tensor]:
        return {
            "scale": torch.empty(math.ceil(d / self._width(d)), device="cpu"),
            "level": torch.empty(math.ceil(d / self.per_byte), dtype=torch.uint8, device="cpu"),
        }

    # -- decode --------------------------------------------------------------------
    def _unpack(self, packed: Tensor, out: Tensor, whole: bool) -> None:
        """``q = level - L`` (float32) of every field of ``packed [r, b]`` into ``out [r, b *
        per_byte]`` (contiguous; the padding of a last byte included): one look-up per byte
        in the table of its fields, ``(byte >> bits j) & (2^bits - 1)``, minus L."""
        if self.per_byte == 1:  # one field per byte: a widening copy
            out.copy_(packed).sub_(self.levels)
        elif not whole:  # CPU slabs: numpy's take with out= beats torch's gathers here
            table = self._table.numpy()
            fields = out.numpy().reshape(*packed.shape, self.per_byte)
            np.take(table, packed.numpy(), axis=0, out=fields, mode="clip")
        else:
            table = self._table.to(packed.device)
            out.view(*packed.shape, self.per_byte).copy_(table[packed.long()])

    def _decode_fields(self, fields: Mapping[str, Tensor], d: int) -> Tensor:
        level, scale = fields["level"], fields["scale"]
        batch = level.shape[:-1]
        packed = level.reshape(-1, level.shape[-1])
        n = packed.shape[0]
        step = scale.reshape(n, scale.shape[-1]) / self.levels
        out = torch.empty((n, d), dtype=torch.float32, device=level.device)
        whole = not chunked(packed, None)
        plan, size = self._plan(n, d, whole)
        work: Tensor | None = None
        for slab in plan:
            r, c = slab.shape
            target = out[slab.row : slab.row_end, slab.col : slab.col_end]  # contiguous
            start = slab.col // self.per_byte
            padded = self._padded(c)
            raw = packed[slab.row : slab.row_end, start : start + padded // self.per_byte]
            if padded == c:
                unpacked = target
            else:  # a row's last byte holds padding: unpacked aside, then copied
                work = out.new_empty(size) if work is None else work
                unpacked = work[: r * padded].view(r, padded)
            self._unpack(raw, unpacked, whole)
            values = unpacked[:, :c]
            self._scale(values, step, slab, d)
            if values is not target:
                target.copy_(values)
        return out.reshape(*batch, d)

    def _scale(self, values: Tensor, step: Tensor, slab: Slab, d: int) -> None:
        """``values <- q * step_b`` in place over a slab's blocks: one float32 product per
        coordinate, as the definition (``step_b = s_b / L``)."""
        c = slab.shape[1]
        width = self._width(d)
        full = c // width * width
        first = slab.col // width
        rows = step[slab.row : slab.row_end]
        if full:
            values[:, :full].unflatten(-1, (-1, width)).mul_(
                rows[:, first : first + full // width, None]
            )
        if full < c:
            values[:, full:].mul_(rows[:, first + full // width :][:, :1])

    def _levels_in_range(self, level: Tensor, d: int) -> bool:
        """Whether every one of the d levels is at most 2L: a look-up per whole byte in the
        table of bytes holding a level past 2L, then the last byte's levels one by one (its
        padding is not a level: a hostile sender may put anything there)."""
        packed = level.numpy()
        whole = d // self.per_byte
        size = layout.SLAB
        buffer = np.empty(min(whole, size), dtype=bool)
        for start in range(0, whole, size):
            part = packed[start : min(start + size, whole)]
            hits = buffer[: part.shape[0]]
            np.take(self._bad_bytes, part, out=hits, mode="clip")
            if hits.any():
                return False
        if d % self.per_byte:
            last = int(packed[whole])
            mask = (1 << self.bits) - 1
            fields = [(last >> (self.bits * j)) & mask for j in range(d % self.per_byte)]
            return max(fields) <= 2 * self.levels
        return True

    def _serialize(self, fields: Mapping[str, Tensor], d: int) -> Payload:
        return {
            "bits": self.bits,
            "block": self.block,
            "scale": to_bytes(fields["scale"], "<f4"),
            "level": fields["level"].cpu().numpy().data,  # a view of the fresh levels
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
        require_finite(scale, "scale", coordinate_of=lambda i: i * block)  # the block's first
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
        if not self._levels_in_range(level, d):
            raise PayloadError(
                "value",
                f"payload field 'level' holds a level outside [0, {2 * self.levels}]",
                field="level",
            )
        return {"scale": scale, "level": level}
