"""SparseLoCo's codec: chunked top-k with b-bit values decoded through per-bin centroids.

Payload: ``{"codec": "chunked-topk", "chunk", "k", "bits", "group", "index", "centroid",
"level"}``, see :class:`ChunkedTopK`. Sarfi, Thérien, Lidin & Belilovsky 2025, "Communication Efficient
LLM Pre-training with SparseLoCo" (arXiv 2508.15706): each chunk of a pseudo-gradient keeps
its k largest magnitudes, each kept value travels as a 2-bit bin of a statistical quantizer,
and the receiver reads each bin as the mean of the values that fell in it. Unsent
coordinates decode as zeros, so, like ``topk``, it suits messages that are deltas.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from gossip.compression import slabs as layout
from gossip.compression.base import Compressor, Payload, Randomness
from gossip.compression.bitpack import pack_uints, packed_bytes, unpack_uints
from gossip.compression.errors import PayloadError
from gossip.compression.selection import exact_largest
from gossip.compression.slabs import slabs
from gossip.compression.wire_dtypes import from_bytes, read_field, require_finite, view_bytes

__all__ = ["ChunkedTopK"]

MAX_CHUNK = 1 << 30
"""The largest chunk (an index then takes 30 bits); a payload claiming more is refused."""


class ChunkedTopK(Compressor):
    """Chunked top-k with ``bits``-bit values read through per-bin centroids (SparseLoCo).

    **Which coordinates.** The vector is cut into chunks of ``chunk`` consecutive coordinates
    (the last one shorter when ``chunk`` does not divide d); each chunk keeps its
    ``k_c = min(k, len(chunk))`` largest magnitudes, ties to the lower index, a NaN ranking
    above every number (the definition of ``topk``, :mod:`gossip.compression.selection`,
    applied to each chunk). A row sends ``m = floor(d/chunk) k + min(k, d mod chunk)``
    values, chunk by chunk, each chunk's in increasing index order.

    **Which value** (SparseLoCo's statistical quantizer, one per group of ``group``
    consecutive chunks, the short last chunk counting as one): over the n kept values v of a
    group, with ``mu = mean(v)``, ``sigma = sqrt(sum (v - mu)^2 / (n - 1))`` (0 when
    n = 1), ``L = 2^bits`` bins of width ``s = sigmas * sigma / L`` (``s = 1`` when that is
    0) and ``q = clamp(round_half_even((v - mu) / s + L/2), 0, L - 1)``; bin b decodes to
    its centroid ``c_b = mean{v : q(v) = b}`` (0 for an empty bin), the group's own. So
    ``C(x)_i = c_{q(x_i)}`` for a kept i and 0 otherwise. Sums run in float64, in order, and
    the centroids are sent as float32; nothing is random, so there is no generator to seed. A
    group whose kept values hold NaN or infinity has every level 0 and every centroid NaN: a
    receiver refuses the payload, and the batched path decodes the group's kept coordinates
    to NaN. A centroid is its bin's least-squares constant, so ``|x - C(x)| <= |x|``.

    One centroid table per chunk by default (``group=1``): ``4 L`` bytes a chunk, 14 % of a
    payload of ``64 (12 + 2) / 8 + 16 = 128`` bytes per chunk at ``chunk=4096, k=64,
    bits=2``. One table for the whole message (``group`` at least the number of chunks)
    saves them but spans layers of different scales: on a vector of eight layers whose
    scales span 10^3, the kept values' relative error was 0.34 against 0.10 per chunk
    (docs/algorithms.md). SparseLoCo keeps one table per tensor it sends; a flat vector has
    no tensors, and a chunk of 4096 lies in one tensor but for a few.

    Args:
        chunk: coordinates per chunk, in [1, 2^30].
        k: coordinates kept per chunk, in [1, chunk].
        bits: bits per kept value, 2, 4 or 8 (``L = 4, 16, 256`` bins).
        sigmas: the bins' total width in standard deviations of the kept values (> 0; the
            sender's choice, not on the wire).
        group: consecutive chunks that share one centroid table, in [1, 2^30].

    Wire fields: ``chunk``, ``k``, ``bits``, ``group`` (ints); ``index`` (the m in-chunk
    positions, ``w = max(1, ceil(log2 chunk))`` bits each, packed end to end little-end
    first: ``ceil(m w / 8)`` bytes, :mod:`gossip.compression.bitpack`); ``centroid``
    (``T L`` ``<f4``, finite, table by table, ``T = ceil(ceil(d / chunk) / group)``);
    ``level`` (the m bins, ``bits`` each, packed the same way: ``ceil(m bits / 8)`` bytes). A receiver refuses a position outside its chunk, and a
    chunk's positions not strictly increasing (so none repeats).

    Encoding walks the vector a cache-sized slab of chunks at a time
    (:mod:`gossip.compression.slabs`): magnitudes into a reused workspace, numpy's
    introselect for each chunk's k-th largest, one comparison to collect the chunk's
    positions (the exact tie-breaking selection runs only for a slab where a tie or a NaN
    makes that ambiguous), then a gather of the kept values. Decoding scatters the m values
    into zeros. Neither loops over chunks or coordinates in Python.
    """

    codec = "chunked-topk"
    _fields = frozenset({"chunk", "k", "bits", "group", "index", "centroid", "level"})
    BITS = (2, 4, 8)

    def __init__(
        self, chunk: int = 4096, k: int = 64, bits: int = 2, sigmas: float = 6.0, group: int = 1
    ) -> None:
        super().__init__()
        if isinstance(chunk, bool) or not isinstance(chunk, int) or not 1 <= chunk <= MAX_CHUNK:
            raise ValueError(
                f"chunked-topk parameter chunk must be an int in [1, {MAX_CHUNK}], got {chunk!r}"
            )
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= chunk:
            raise ValueError(
                f"chunked-topk parameter k must be an int in [1, chunk={chunk}], got {k!r}"
            )
        if isinstance(bits, bool) or bits not in self.BITS:
            raise ValueError(
                f"chunked-topk parameter bits must be one of {self.BITS}, got {bits!r}"
            )
        if (
            isinstance(sigmas, bool)
            or not isinstance(sigmas, int | float)
            or not math.isfinite(sigmas)
            or sigmas <= 0
        ):
            raise ValueError(f"chunked-topk parameter sigmas must be a number > 0, got {sigmas!r}")
        if isinstance(group, bool) or not isinstance(group, int) or not 1 <= group <= MAX_CHUNK:
            raise ValueError(
                f"chunked-topk parameter group must be an int in [1, {MAX_CHUNK}], got {group!r}"
            )
        self.chunk = chunk
        self.k = k
        self.bits = bits
        self.sigmas = float(sigmas)
        self.group = group
        self.bins = 1 << bits
        self.index_bits = max(1, (chunk - 1).bit_length())

    @property
    def spec(self) -> str:
        return (
            f"chunked-topk:chunk={self.chunk},k={self.k},bits={self.bits},"
            f"sigmas={self.sigmas:g},group={self.group}"
        )

    # -- sizes -----------------------------------------------------------------------
    def _layout(self, d: int) -> tuple[int, int, int]:
        """``(full chunks, length of the last short chunk or 0, its k)`` for length d."""
        full, tail = divmod(d, self.chunk)
        return full, tail, min(self.k, tail)

    def tables(self, d: int) -> int:
        """Centroid tables of a length-d vector: ``ceil(ceil(d / chunk) / group)``."""
        return math.ceil(math.ceil(d / self.chunk) / self.group)

    def kept(self, d: int) -> int:
        """Values a length-d vector sends: ``floor(d/chunk) k + min(k, d mod chunk)``."""
        full, _, tail_k = self._layout(d)
        return full * self.k + tail_k

    # -- encode --------------------------------------------------------------------
    def _encode_fields(self, x: Tensor, generator: Randomness) -> dict[str, Tensor]:
        d = x.shape[-1]
        batch = x.shape[:-1]
        rows = x.detach().reshape(-1, d)
        index, value = self._select(rows)
        level, centroid = self._quantize(value, self.tables(d))
        m = index.shape[1]
        return {
            "index": index.reshape(*batch, m).to(x.device),
            "level": level.reshape(*batch, m).to(x.device),
            "centroid": centroid.reshape(*batch, centroid.shape[-1]).to(x.device),
        }

    def _score_dtype(self, x: Tensor) -> torch.dtype:
        """Magnitudes in float64 for a float64 ``x``, else float32 (exact for 16-bit ones)."""
        return torch.float64 if x.dtype == torch.float64 else torch.float32

    def _select(self, rows: Tensor) -> tuple[Tensor, Tensor]:
        """In-chunk positions ``int64 [n, m]`` and kept values ``[n, m]`` (the score dtype,
        on the CPU) of every row of ``rows [n, d]``, chunk by chunk."""
        n, d = rows.shape
        full, _, tail_k = self._layout(d)
        dtype = self._score_dtype(rows)
        k = self.k
        index = torch.empty((n, full, k), dtype=torch.int64)
        value = torch.empty((n, full, k), dtype=dtype)
        if full:
            chunks = rows[:, : full * self.chunk].unflatten(-1, (full, self.chunk))
            if rows.device.type == "cpu":
                self._select_full_cpu(chunks, index, value)
            else:  # an accelerator: every chunk at once, then the (small) result to the CPU
                scores = chunks.abs().to(dtype).nan_to_num_(nan=math.inf, posinf=math.inf)
                best = exact_largest(scores.reshape(n * full, self.chunk), k).view(n, full, k)
                index.copy_(best)
                value.copy_(chunks.gather(-1, best).to(dtype))
        parts_index = [index.view(n, full * k)]
        parts_value = [value.view(n, full * k)]
        if tail_k:
            source = rows[:, full * self.chunk :]
            scores = source.abs().to(dtype).nan_to_num_(nan=math.inf, posinf=math.inf)
            best = exact_largest(scores, tail_k)
            parts_index.append(best.cpu())
            parts_value.append(source.gather(-1, best).to("cpu", dtype))
        if len(parts_index) == 1:
            return parts_index[0], parts_value[0]
        return torch.cat(parts_index, dim=1), torch.cat(parts_value, dim=1)

    def _select_full_cpu(self, chunks: Tensor, index: Tensor, value: Tensor) -> None:
        """Fill ``index``/``value [n, full, k]`` from ``chunks [n, full, chunk]`` (CPU), a
        cache-sized slab of chunks at a time."""
        n, full, size = chunks.shape
        k = self.k
        per_slab = max(1, layout.SLAB // size)
        plan = list(slabs(n, full, size=per_slab))
        workspace = torch.empty(
            max(s.shape[0] * s.shape[1] for s in plan) * size, dtype=value.dtype
        )
        for slab in plan:
            r, c = slab.shape
            source = chunks[slab.row : slab.row_end, slab.col : slab.col_end]
            scores = workspace[: r * c * size].view(r, c, size)
            if source.dtype == scores.dtype:
                torch.abs(source, out=scores)
            else:  # a 16-bit x: widened first (exactly)
                scores.copy_(source).abs_()
            best = self._largest(scores.view(r * c, size), k).view(r, c, k)
            index[slab.row : slab.row_end, slab.col : slab.col_end] = best
            value[slab.row : slab.row_end, slab.col : slab.col_end] = source.gather(-1, best)

    @staticmethod
    def _largest(scores: Tensor, k: int) -> Tensor:
        """:func:`~gossip.compression.selection.exact_largest` of ``scores [g, size]``
        (magnitudes, CPU), the fast way when no tie or NaN makes it ambiguous: each row's
        k-th largest by introselect, then the positions that reach it. When every row has
        exactly k of them they are the answer (no tie at the k-th largest, no NaN, which
        compares false); else the exact selection runs on the slab (NaN as +inf)."""
        g, size = scores.shape
        if k >= size:
            return torch.arange(size).repeat(g, 1)
        magnitudes = scores.numpy()
        kth = np.partition(magnitudes, size - k, axis=-1)[:, size - k, None]
        hits = np.flatnonzero(magnitudes >= kth)
        if hits.shape[0] == g * k and bool((np.bincount(hits // size, minlength=g) == k).all()):
            return torch.from_numpy((hits % size).reshape(g, k))
        scores.nan_to_num_(nan=math.inf, posinf=math.inf)
        return exact_largest(scores, k)

    def _quantize(self, value: Tensor, tables: int) -> tuple[Tensor, Tensor]:
        """Levels ``uint8 [n, m]`` and centroids ``float32 [n, tables * L]`` of the kept values
        ``[n, m]`` (CPU): the class's quantizer in float64 numpy, every group of every row at
        once (a group's sums accumulate its values in order, as :func:`numpy.bincount` does,
        so a row's numbers do not depend on the rows beside it)."""
        v = value.numpy().astype(np.float64)
        n, m = v.shape
        bins = self.bins
        size = n * tables
        group = np.arange(m, dtype=np.int64) // (self.k * self.group)  # chunk j // k, / group
        key = (group + (np.arange(n, dtype=np.int64) * tables)[:, None]).reshape(-1)
        flat = v.reshape(-1)
        counts = np.bincount(key, minlength=size)  # >= 1: every chunk keeps a value
        bad = np.bincount(key, weights=~np.isfinite(flat), minlength=size) > 0
        with np.errstate(invalid="ignore", over="ignore"):  # a non-finite group: below
            mu = np.bincount(key, weights=flat, minlength=size) / counts
            centred = flat - mu[key]
            square = np.bincount(key, weights=centred * centred, minlength=size)
            sigma = np.sqrt(square / np.maximum(counts - 1, 1))
            step = self.sigmas * sigma / bins
            step[~np.isfinite(step) | (step == 0)] = 1.0
            t = centred / step[key] + bins // 2
            np.rint(t, out=t)
            np.clip(t, 0, bins - 1, out=t)
        t[bad[key]] = 0
        level = t.astype(np.uint8)
        slot = key * bins + level
        members = np.bincount(slot, minlength=size * bins)
        with np.errstate(invalid="ignore", over="ignore"):
            sums = np.bincount(slot, weights=flat, minlength=size * bins)
            centroid = np.where(members > 0, sums / np.maximum(members, 1), 0.0)
        centroid = centroid.reshape(size, bins)
        centroid[bad] = math.nan
        return (
            torch.from_numpy(level.reshape(n, m)),
            torch.from_numpy(centroid.reshape(n, tables * bins).astype(np.float32)),
        )

    def _empty_fields(self, d: int, dtype: torch.dtype) -> dict[str, Tensor]:
        m = self.kept(d)
        return {
            "index": torch.zeros(m, dtype=torch.int64),
            "level": torch.zeros(m, dtype=torch.uint8),
            "centroid": torch.empty(self.tables(d) * self.bins),
        }

    # -- decode --------------------------------------------------------------------
    def _decode_fields(self, fields: Mapping[str, Tensor], d: int) -> Tensor:
        index, level, centroid = fields["index"], fields["level"], fields["centroid"]
        batch = index.shape[:-1]
        m = index.shape[-1]
        n = math.prod(batch)
        full, _, _ = self._layout(d)
        device = centroid.device
        position = index.reshape(n, m).to(device, torch.int64, copy=True)
        if full:  # in-chunk positions -> positions in the vector
            starts = torch.arange(0, full * self.chunk, self.chunk, device=device)
            position[:, : full * self.k].view(n, full, self.k).add_(starts[:, None])
        position[:, full * self.k :] += full * self.chunk
        group = torch.arange(m, device=device) // (self.k * self.group)
        slot = level.reshape(n, m).to(device, torch.int64).add_(group * self.bins)
        values = centroid.reshape(n, -1).to(torch.float32).gather(1, slot)
        out = torch.zeros((n, d), dtype=torch.float32, device=device)
        out.scatter_(1, position, values)
        return out.reshape(*batch, d)

    # -- wire ----------------------------------------------------------------------
    def _serialize(self, fields: Mapping[str, Tensor], d: int) -> Payload:
        index = fields["index"].to("cpu").reshape(1, -1).numpy()
        level = fields["level"].to("cpu").reshape(1, -1).numpy()
        centroid = fields["centroid"].to("cpu", torch.float32).contiguous().numpy()
        return {
            "chunk": self.chunk,
            "k": self.k,
            "bits": self.bits,
            "group": self.group,
            "index": pack_uints(index, self.index_bits).data.cast("B"),
            "centroid": centroid.astype("<f4", copy=False).tobytes(),
            "level": pack_uints(level, self.bits).data.cast("B"),
        }

    def _parse(self, payload: Mapping[str, Any], d: int) -> dict[str, Tensor]:
        chunk = read_field(payload, "chunk", int)
        k = read_field(payload, "k", int)
        bits = read_field(payload, "bits", int)
        group = read_field(payload, "group", int)
        got = {"chunk": chunk, "k": k, "bits": bits, "group": group}
        mine = {"chunk": self.chunk, "k": self.k, "bits": self.bits, "group": self.group}
        for name in got:
            if got[name] != mine[name]:
                raise PayloadError(
                    "parameter",
                    f"payload fields {_listed(got)} do not match this codec's {_listed(mine)}",
                    field=name,
                )
        count = self.tables(d) * self.bins
        centroid = from_bytes(read_field(payload, "centroid", bytes), "<f4", count, "centroid")
        require_finite(centroid, "centroid")
        m = self.kept(d)
        index = self._read_packed(payload, "index", m, self.index_bits)
        level = self._read_packed(payload, "level", m, self.bits)
        full, tail, tail_k = self._layout(d)
        in_chunks = index[:, : full * self.k].reshape(full, self.k)
        last = index[:, full * self.k :].reshape(1, tail_k)
        for part, limit in ((in_chunks, self.chunk), (last, tail)):
            if part.size and int(part.max()) >= limit:
                raise PayloadError(
                    "index",
                    f"payload field 'index' holds a position outside its chunk [0, {limit})",
                    field="index",
                )
            if part.shape[1] > 1 and not bool((part[:, 1:] > part[:, :-1]).all()):
                raise PayloadError(
                    "index",
                    "payload field 'index' must be strictly increasing within each chunk "
                    "(no repeats)",
                    field="index",
                )
        return {
            "index": torch.from_numpy(index[0]),
            "level": torch.from_numpy(level[0]),
            "centroid": centroid,
        }

    @staticmethod
    def _read_packed(payload: Mapping[str, Any], name: str, count: int, width: int) -> np.ndarray:
        """``count`` values of ``width`` bits from byte field ``name`` (length checked)."""
        raw = read_field(payload, name, bytes)
        expected = packed_bytes(count, width)
        if len(raw) != expected:
            raise PayloadError(
                "length",
                f"payload field {name!r} must hold {count} values of {width} bits = "
                f"{expected} bytes, got {len(raw)} bytes",
                field=name,
            )
        packed = view_bytes(raw, np.dtype(np.uint8)).numpy().reshape(1, expected)
        return unpack_uints(packed, width, count)


def _listed(values: Mapping[str, int]) -> str:
    return ", ".join(f"{name}={value}" for name, value in values.items())
