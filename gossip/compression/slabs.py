"""Cache-sized slabs of a ``[rows, d]`` tensor, and uniform noise drawn slab by slab in stream order.

The codecs' kernels (qsgd's quantization and packing, the sparsifiers' selection) walk their
input one slab at a time over a small reused workspace instead of making whole-vector
temporaries: at 100M parameters a temporary is 400 MB, and a freshly allocated one costs as
much as a copy (its pages are faulted in), so every temporary of the definition would
otherwise cost about one ``clone()``. A slab is either a group of whole rows (when ``d`` is
at most :data:`SLAB` coordinates: the simulator's many small rows stay batched) or one
aligned piece of one row (a large model's vector).

**Noise in stream order.** A seeded CPU ``torch.Generator`` is one stream: ``torch.rand(d)``
drawn in consecutive pieces gives the same numbers as drawn at once, and ``torch.rand([n,
d])`` the same as ``n`` rows drawn one after the other (``tests/gossip/
test_compression_kernels.py`` pins both). Slabs visit rows in order and each row's columns
in order, so :func:`draw_uniform` over the slabs gives exactly the draws of
``uniform(x, generator)`` over the whole tensor: the codecs' definitions, and the numbers
the simulator's batched path and a peer's wire path draw for the same node, do not change.
Where that cannot be promised (a tensor or generator on an accelerator) :func:`chunked` says
so and a codec runs its kernel over the whole tensor as one slab.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from gossip.compression.base import Randomness

__all__ = [
    "SLAB",
    "Slab",
    "check_generators",
    "chunked",
    "draw_uniform",
    "lcm",
    "row_generator",
    "slabs",
]

SLAB = 1 << 20
"""Coordinates per slab (1M: a 4 MiB float32 workspace, which stays in the last-level cache).
Measured on a 2-core machine at 10M coordinates: 2^16 spent more in per-slab Python steps
than it saved in cache misses; 2^18 to 2^20 were the fastest. Read at call time, so a test
may shrink it to cross slab edges on small inputs."""


class Slab(NamedTuple):
    """Rows ``[row, row_end)`` and columns ``[col, col_end)`` of a ``[rows, d]`` tensor."""

    row: int
    row_end: int
    col: int
    col_end: int

    @property
    def shape(self) -> tuple[int, int]:
        """``(rows, columns)`` of the slab."""
        return self.row_end - self.row, self.col_end - self.col


def slabs(rows: int, d: int, *, align: int = 1, size: int | None = None) -> Iterator[Slab]:
    """Cover a ``[rows, d]`` tensor, rows in order and each row's columns in order.

    With ``d <= size``: groups of ``max(1, size // d)`` whole rows. Otherwise each row in
    pieces of ``size`` rounded down to a multiple of ``align`` (at least ``align``), so every
    piece but a row's last starts and ends on a multiple of ``align`` (a qsgd block, a byte
    of packed levels). A slab never holds more than ``max(size, align)`` coordinates.
    ``size`` defaults to :data:`SLAB` (read at call time).
    """
    size = SLAB if size is None else size
    if rows < 0 or d < 1 or align < 1 or size < 1:
        raise ValueError(
            f"slabs need rows >= 0, d >= 1, align >= 1, size >= 1; got {rows}, {d}, {align}, {size}"
        )
    if d <= size:
        group = max(1, size // d)
        for row in range(0, rows, group):
            yield Slab(row, min(row + group, rows), 0, d)
        return
    step = max(align, size // align * align)
    for row in range(rows):
        for col in range(0, d, step):
            yield Slab(row, row + 1, col, min(col + step, d))


def lcm(a: int, b: int) -> int:
    """Least common multiple (an alignment that respects two others)."""
    return a * b // math.gcd(a, b)


def check_generators(generator: Randomness, x: Tensor) -> None:
    """A per-row sequence of generators needs ``x [n, ..., d]`` with ``n`` generators."""
    if generator is None or isinstance(generator, torch.Generator):
        return
    count = len(generator)
    if x.dim() < 2 or count != x.shape[0]:
        rows = x.shape[0] if x.dim() >= 2 else 0
        raise ValueError(
            f"generator: one per row needs x of shape [n, ..., d] and n generators; "
            f"x has shape {tuple(x.shape)} ({rows} rows), got {count} generators"
        )


def chunked(x: Tensor, generator: Randomness) -> bool:
    """Whether ``x``'s slabs may be processed (and their noise drawn) one at a time: ``x`` on
    the CPU and every generator a CPU one (None is torch's default CPU generator)."""
    if x.device.type != "cpu":
        return False
    if generator is None:
        return True
    if isinstance(generator, torch.Generator):
        return generator.device.type == "cpu"
    return all(g.device.type == "cpu" for g in generator)


def row_generator(generator: Randomness, row: int, rows: int) -> torch.Generator | None:
    """The generator that flat row ``row`` of ``rows`` draws from: the one generator, or
    ``generator[i]`` for the rows of ``x[i]`` (``rows // len(generator)`` flat rows each)."""
    if generator is None or isinstance(generator, torch.Generator):
        return generator
    return generator[row // (rows // len(generator))]


def draw_uniform(out: Tensor, generator: Randomness, slab: Slab, rows: int) -> Tensor:
    """Fill ``out`` (contiguous, the slab's shape) with U[0, 1) float32 draws, in stream order:
    one call for a single generator, one per row for per-row generators."""
    if generator is None or isinstance(generator, torch.Generator):
        return torch.rand(out.shape, generator=generator, out=out, device=out.device)
    gens: Sequence[torch.Generator] = generator
    for i in range(out.shape[0]):
        torch.rand(
            out.shape[1:],
            generator=row_generator(gens, slab.row + i, rows),
            out=out[i],
            device=out.device,
        )
    return out
