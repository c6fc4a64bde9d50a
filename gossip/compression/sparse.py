"""Sparsifiers: send k = ceil(ratio d) coordinates as (index, value) pairs (biased).

Payload: ``{"codec": "topk" | "randk", "k", "index", "dtype", "value"}`` with ``index`` k
strictly increasing ``<i4`` and ``value`` k ``<f4``. Unsent coordinates decode as zeros, so
a sparsifier suits messages that are deltas (CHOCO, Koloskova et al. 2019), not models.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from gossip.compression.base import Compressor, Payload, Randomness, uniform
from gossip.compression.errors import PayloadError
from gossip.compression.wire_dtypes import from_bytes, read_field, require_finite, to_bytes

__all__ = ["RandomK", "TopK"]


class _Sparse(Compressor):
    """Send k = ceil(ratio d) coordinates as (sorted ``<i4`` index, ``<f4`` value) pairs."""

    _fields = frozenset({"k", "index", "dtype", "value"})

    def __init__(self, ratio: float = 0.01) -> None:
        super().__init__()
        if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 < ratio <= 1:
            raise ValueError(f"{self.codec} parameter ratio must be in (0, 1], got {ratio!r}")
        self.ratio = float(ratio)

    @property
    def spec(self) -> str:
        return f"{self.codec}:ratio={self.ratio:g}"

    def k(self, d: int) -> int:
        """Coordinates kept out of d: ``ceil(ratio * d)`` (at least 1)."""
        return max(1, min(d, math.ceil(self.ratio * d - 1e-9)))

    @abstractmethod
    def _select(self, x: Tensor, k: int, generator: Randomness) -> Tensor:
        """Indices ``[*, k]`` of the coordinates to keep."""

    def _encode_fields(self, x: Tensor, generator: Randomness) -> dict[str, Tensor]:
        index = self._select(x, self.k(x.shape[-1]), generator).sort(dim=-1).values
        return {"index": index, "value": x.gather(-1, index).to(torch.float32)}

    def _decode_fields(self, fields: Mapping[str, Tensor], d: int) -> Tensor:
        value = fields["value"]
        out = value.new_zeros((*value.shape[:-1], d))
        return out.scatter_(-1, fields["index"].to(torch.int64), value)

    def _serialize(self, fields: Mapping[str, Tensor], d: int) -> Payload:
        return {
            "k": int(fields["index"].shape[-1]),
            "index": fields["index"].to("cpu", torch.int32).numpy().astype("<i4").tobytes(),
            "dtype": "<f4",
            "value": to_bytes(fields["value"], "<f4"),
        }

    def _parse(self, payload: Mapping[str, Any], d: int) -> dict[str, Tensor]:
        k = read_field(payload, "k", int)
        if not 0 <= k <= d:
            raise PayloadError(
                "parameter", f"payload field 'k' must be in [0, d={d}], got {k}", field="k"
            )
        wire = read_field(payload, "dtype", str)
        if wire != "<f4":
            raise PayloadError(
                "dtype",
                f"payload field 'dtype' must be '<f4' for codec {self.codec!r}, got {wire!r:.40}",
                field="dtype",
            )
        raw_index = read_field(payload, "index", bytes)
        if len(raw_index) != 4 * k:
            raise PayloadError(
                "length",
                f"payload field 'index' must hold k={k} values of <i4 = {4 * k} bytes, "
                f"got {len(raw_index)} bytes",
                field="index",
            )
        # int32 -> int64 for scatter (a conversion, so a copy in any case; it swaps bytes too)
        index = torch.from_numpy(np.frombuffer(raw_index, dtype="<i4").astype(np.int64))
        if k and (int(index.min()) < 0 or int(index.max()) >= d):
            raise PayloadError(
                "index", f"payload field 'index' holds indices outside [0, {d})", field="index"
            )
        if k > 1 and not bool((index[1:] > index[:-1]).all()):
            raise PayloadError(
                "index",
                "payload field 'index' must be strictly increasing (no duplicates)",
                field="index",
            )
        value = from_bytes(read_field(payload, "value", bytes), "<f4", k, "value")
        require_finite(value, "value")
        return {"index": index, "value": value}


class TopK(_Sparse):
    """Top-k sparsification: keep the k largest-magnitude coordinates (biased; Stich 2018)."""

    codec = "topk"

    def _select(self, x: Tensor, k: int, generator: Randomness) -> Tensor:
        return x.abs().topk(k, dim=-1, sorted=False).indices


class RandomK(_Sparse):
    """Random-k sparsification: k coordinates uniformly at random, unscaled (biased, δ = k/d)."""

    codec = "randk"

    def _select(self, x: Tensor, k: int, generator: Randomness) -> Tensor:
        keys = uniform(x, generator)
        return keys.topk(k, dim=-1, sorted=False).indices
