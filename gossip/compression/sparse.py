"""Sparsifiers: send k = ceil(ratio d) coordinates as (index, value) pairs (biased).

Payload: ``{"codec": "topk" | "randk", "k", "index", "dtype", "value"}`` with ``index`` k
strictly increasing ``<i4`` and ``value`` k ``<f4``. Unsent coordinates decode as zeros, so
a sparsifier suits messages that are deltas (CHOCO, Koloskova et al. 2019), not models.

Which coordinates: the k largest scores of each row (top-k: ``|x_i|``; rand-k: a U[0, 1)
key per coordinate), ties to the lower index (:mod:`gossip.compression.selection`). Short
rows (the simulator's) are selected a group of rows at a time; a long row slab by slab
through a threshold, with no temporary of its size (:data:`LONG_ROW`).
"""

from __future__ import annotations

import math
import sys
from abc import abstractmethod
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from gossip.compression import slabs as layout
from gossip.compression.base import Compressor, Payload, Randomness, uniform
from gossip.compression.errors import PayloadError
from gossip.compression.selection import (
    exact_largest,
    largest_above,
    largest_in_row,
    margin_count,
)
from gossip.compression.slabs import (
    Slab,
    check_generators,
    chunked,
    draw_uniform,
    row_generator,
    slabs,
)
from gossip.compression.wire_dtypes import from_bytes, read_field, require_finite, to_bytes

__all__ = ["LONG_ROW", "RandomK", "TopK"]

LONG_ROW = 1 << 14
"""Rows from this length on (keeping at most an eighth) select through a threshold, each on
its own; shorter rows are selected a group of rows at a time (per-row steps would cost more
than the selection)."""


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

    # -- which coordinates: the k largest scores, ties to the lower index -----------------
    @abstractmethod
    def _scores(self, rows: Tensor, slab: Slab, out: Tensor, generator: Randomness) -> Tensor:
        """Write the scores of ``rows``' slab into ``out`` (contiguous, the slab's shape, no
        NaN) and return it; slabs come in order, so randomized scores are drawn in order."""

    @abstractmethod
    def _whole_scores(self, x: Tensor, generator: Randomness) -> Tensor:
        """The scores of all of ``x [*, d]`` at once, as ``[n, d]`` (off the CPU)."""

    @abstractmethod
    def _threshold(self, row: Tensor, k: int, dtype: torch.dtype) -> float | None:
        """A score that at least k of ``row``'s scores reach with high probability, or None."""

    def _snapshot(self, generator: Randomness, row: int, rows: int) -> Randomness:
        """What a second pass over row ``row`` must draw from to see the same scores (only
        randomized scores need one)."""
        return generator

    def _score_dtype(self, x: Tensor) -> torch.dtype:
        """The scores' dtype on the CPU paths: float64 for a float64 ``x``, else float32
        (exact for 16-bit magnitudes, and numpy has no bfloat16)."""
        return torch.float64 if x.dtype == torch.float64 else torch.float32

    def _select(self, x: Tensor, k: int, generator: Randomness) -> Tensor:
        """Indices ``[n, k]``, increasing, of the k largest scores of each row of ``x``
        flattened to ``[n, d]`` (:mod:`gossip.compression.selection`)."""
        d = x.shape[-1]
        rows = x.reshape(-1, d)
        n = rows.shape[0]
        if not chunked(rows, generator):  # an accelerator: one batched selection
            return exact_largest(self._whole_scores(x, generator), k)
        dtype = self._score_dtype(x)
        sparse_long_rows = d >= LONG_ROW and 8 * k <= d
        if d <= layout.SLAB and not sparse_long_rows:  # short rows: batched, a group at a time
            plan = list(slabs(n, d))
            size = max((s.shape[0] * d for s in plan), default=0)
            workspace = torch.empty(size, dtype=dtype, device="cpu")
            parts = [
                exact_largest(
                    self._scores(rows, s, workspace[: s.shape[0] * d].view(s.shape), generator),
                    k,
                )
                for s in plan
            ]
            return (
                torch.cat(parts) if parts else torch.empty((0, k), dtype=torch.int64, device="cpu")
            )
        chosen = [
            self._select_row(rows, row, k, generator, dtype, sparse_long_rows) for row in range(n)
        ]
        return (
            torch.stack(chosen) if chosen else torch.empty((0, k), dtype=torch.int64, device="cpu")
        )

    def _select_row(
        self,
        rows: Tensor,
        row: int,
        k: int,
        generator: Randomness,
        dtype: torch.dtype,
        candidates: bool,
    ) -> Tensor:
        """One long row. With ``candidates``, slab by slab: the scores that reach a threshold,
        then the k largest of them, and a second, full pass in the rare case fewer than k
        reach it; else the row's scores at once."""
        d = rows.shape[1]
        threshold = self._threshold(rows[row], k, dtype) if candidates else None
        replay = self._snapshot(generator, row, rows.shape[0]) if threshold is not None else None

        def fill(draws: Randomness) -> Callable[[Tensor, int, int], Tensor]:
            def write(out: Tensor, start: int, stop: int) -> Tensor:
                slab = Slab(row, row + 1, start, stop)
                return self._scores(rows, slab, out.view(1, -1), draws)[0]

            return write

        if threshold is not None:
            found = largest_above(fill(generator), d, k, threshold, dtype=dtype)
            if found is not None:
                return found
            generator = replay
        return largest_in_row(fill(generator), d, k, dtype=dtype)

    def _encode_fields(self, x: Tensor, generator: Randomness) -> dict[str, Tensor]:
        check_generators(generator, x)
        d = x.shape[-1]
        k = self.k(d)
        index = self._select(x, k, generator)
        value = x.reshape(-1, d).gather(-1, index).to(torch.float32)
        batch = x.shape[:-1]
        return {"index": index.reshape(*batch, k), "value": value.reshape(*batch, k)}

    def _empty_fields(self, d: int, dtype: torch.dtype) -> dict[str, Tensor]:
        k = self.k(d)
        return {
            "index": torch.zeros(k, dtype=torch.int64, device="cpu"),
            "value": torch.empty(k, device="cpu"),
        }

    def _decode_fields(self, fields: Mapping[str, Tensor], d: int) -> Tensor:
        value = fields["value"]
        out = value.new_zeros((*value.shape[:-1], d))
        return out.scatter_(-1, fields["index"].to(torch.int64), value)

    def _serialize(self, fields: Mapping[str, Tensor], d: int) -> Payload:
        return {
            "k": int(fields["index"].shape[-1]),
            "index": _int32_bytes(fields["index"]),
            "dtype": "<f4",
            "value": to_bytes(fields["value"], "<f4"),
        }

    def _parse(self, payload: Mapping[str, Any], d: int) -> dict[str, Tensor]:
        k = read_field(payload, "k", int)
        if not 0 <= k <= d:
            # more entries than the model has is a size mismatch with this model (422);
            # a negative count is a malformed field (400)
            raise PayloadError(
                "length" if k > d else "parameter",
                f"payload field 'k' must be in [0, d={d}], got {k}",
                field="k",
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
        require_finite(value, "value", coordinate_of=lambda i: int(index[i]))
        return {"index": index, "value": value}


class TopK(_Sparse):
    """Top-k sparsification: keep the k largest-magnitude coordinates (biased; Stich 2018).

    Ties in magnitude go to the lower index and a NaN ranks above every number
    (:mod:`gossip.compression.selection`); magnitudes are compared exactly (16-bit ones
    widened to float32). A long row's threshold comes from an evenly spaced sample.
    """

    codec = "topk"
    SAMPLE = 1 << 14
    """Coordinates sampled (evenly spaced) to estimate a long row's threshold."""

    def _scores(self, rows: Tensor, slab: Slab, out: Tensor, generator: Randomness) -> Tensor:
        source = rows[slab.row : slab.row_end, slab.col : slab.col_end]
        if source.dtype == out.dtype:
            torch.abs(source, out=out)
        else:  # a 16-bit x: widened first (exactly)
            out.copy_(source).abs_()
        return out.nan_to_num_(nan=math.inf, posinf=math.inf)

    def _whole_scores(self, x: Tensor, generator: Randomness) -> Tensor:
        d = x.shape[-1]
        return x.reshape(-1, d).abs().nan_to_num_(nan=math.inf, posinf=math.inf)

    def _threshold(self, row: Tensor, k: int, dtype: torch.dtype) -> float | None:
        """The magnitude that ``margin_count`` of an evenly spaced sample reach: about
        ``k (1 + small)`` of the row reach it unless the row is periodic with the sample's
        stride (then the full pass runs, with the same answer)."""
        d = row.shape[0]
        sample = row[:: max(1, d // self.SAMPLE)].to(dtype, copy=True).abs_()
        magnitudes = sample.nan_to_num_(nan=math.inf, posinf=math.inf).numpy()
        count = magnitudes.shape[0]
        want = math.ceil(margin_count(count * k / d))
        if want >= count:
            return None
        return float(np.partition(magnitudes, count - want)[count - want])


class RandomK(_Sparse):
    """Random-k sparsification: k coordinates uniformly at random, unscaled (biased, δ = k/d).

    Each coordinate draws a U[0, 1) key (d draws from the generator, the same numbers on
    both paths) and the k largest keys are kept, ties to the lower index.
    """

    codec = "randk"

    def _scores(self, rows: Tensor, slab: Slab, out: Tensor, generator: Randomness) -> Tensor:
        return draw_uniform(out, generator, slab, rows.shape[0])

    def _whole_scores(self, x: Tensor, generator: Randomness) -> Tensor:
        return uniform(x, generator).reshape(-1, x.shape[-1])

    def _score_dtype(self, x: Tensor) -> torch.dtype:
        return torch.float32

    def _threshold(self, row: Tensor, k: int, dtype: torch.dtype) -> float | None:
        """``1 - p`` with ``d p = margin_count(k)``: a Binomial(d, p) count of keys reach it,
        fewer than k with negligible probability."""
        share = margin_count(k) / row.shape[0]
        return None if share >= 1 else 1.0 - share

    def _snapshot(self, generator: Randomness, row: int, rows: int) -> Randomness:
        """A copy of the row's generator as it is now: a second pass draws the same keys."""
        source = row_generator(generator, row, rows) or torch.default_generator
        copy = torch.Generator(device=source.device)
        copy.set_state(source.get_state())
        return copy


def _int32_bytes(index: Tensor) -> bytes | memoryview:
    """Indices as ``<i4`` bytes: a view of the one int32 copy on a little-endian host."""
    array = index.to("cpu", torch.int32).reshape(-1).numpy()
    if sys.byteorder != "little":
        return array.astype("<i4").tobytes()
    return array.data.cast("B")
