"""Input checking and the shared neighbourhood layout every rule works on.

Vector convention (see ``shared/ARCHITECTURE.md``): ``own [*, d]``,
``neighbours [*, k, d]``, ``weights [*, k]`` (off-diagonal mixing weights
W_ij), ``mask [*, k]`` (True = present) -> ``[*, d]``. The self weight is
implicit, w_ii = 1 - sum_j weights_j * mask_j.

Empty neighbourhoods (uniform for every rule): a node to which no neighbour is
declared present (``k = 0``: a peer alone, or every slot masked: a round in
which nothing arrived) has nothing to aggregate, so every rule returns its own
vector unchanged, whatever its bound, and its bound is not checked for it.

Non-finite policy (uniform for every rule): a present neighbour row holding a
NaN or an Inf anywhere is a Byzantine neighbour caught red-handed. It is
masked out before any rule runs, its weight folds into the self weight, and
rules with a Byzantine budget ``f`` (or ``b``) tolerate one fewer hidden
Byzantine neighbour for each row removed (``f_eff = max(f - removed, 0)``), so
a NaN can never make a rule fail its bound or leak into the result. The
node's own vector is trusted: a non-finite ``own`` raises ``ValueError``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

#: Slack allowed on sum_j W_ij <= 1 (float32 mixing rows rarely sum to exactly 1).
WEIGHT_SUM_TOLERANCE = 1e-5


@dataclass(frozen=True)
class Neighbourhood:
    """One call's inputs, flattened to a batch of ``B`` nodes and cleaned.

    ``neighbours`` rows that were non-finite are zeroed (other absent rows keep
    whatever content the caller padded with: rules must honour ``mask``).
    ``size`` is n per node (own + present finite neighbours), ``removed`` the
    number of present neighbours dropped for being non-finite, ``alone`` the
    nodes with no neighbour declared present at all (their result is their own
    vector), ``declared`` the smallest n among the other nodes as the caller
    declared it (before removal; 1 when every node is alone), which is what
    bound checks use.
    """

    own: Tensor  # [B, d]
    neighbours: Tensor  # [B, k, d]
    weights: Tensor  # [B, k], 0 where absent
    mask: Tensor  # [B, k] bool, present and finite
    self_weight: Tensor  # [B]
    removed: Tensor  # [B] int64
    alone: Tensor  # [B] bool, no neighbour declared present
    declared: int

    @property
    def batch(self) -> int:
        return int(self.own.shape[0])

    @property
    def k(self) -> int:
        return int(self.neighbours.shape[1])

    @property
    def dim(self) -> int:
        return int(self.own.shape[1])

    @property
    def size(self) -> Tensor:
        """n per node: the own vector plus its present, finite neighbours."""
        return self.mask.sum(-1) + 1

    def budget(self, f: int) -> Tensor:
        """Byzantine budget per node: min(max(f - removed, 0), present neighbours).

        Each caught (non-finite) row uses up one unit of f, and no more of the
        neighbours can be Byzantine than are present. The cap changes nothing
        where the rule's bound holds (it guarantees at least f present
        neighbours); it makes a node without neighbours keep its own vector.
        """
        return (f - self.removed).clamp_min(0).minimum(self.mask.sum(-1))

    def set_mask(self) -> Tensor:
        """[B, n] presence of the set {own} + neighbours (own at index 0, always present)."""
        ones = torch.ones(self.batch, 1, dtype=torch.bool, device=self.mask.device)
        return torch.cat([ones, self.mask], dim=1)

    def set_weights(self) -> Tensor:
        """[B, n] mixing weights of the set: (w_ii, W_ij...), zero where absent."""
        return torch.cat([self.self_weight[:, None], self.weights], dim=1)

    def stacked(self, fill: float) -> Tensor:
        """[B, n, d] the set {own} + neighbours, absent rows filled with ``fill``."""
        values = torch.cat([self.own[:, None, :], self.neighbours], dim=1)
        return fill_rows_(values, ~self.set_mask(), fill)

    def replace(
        self,
        *,
        own: Tensor | None = None,
        neighbours: Tensor | None = None,
        weights: Tensor | None = None,
        mask: Tensor | None = None,
        declared: int | None = None,
    ) -> Neighbourhood:
        """A neighbourhood with some fields swapped (wrappers feed their inner rule this)."""
        new_mask = self.mask if mask is None else mask
        new_weights = self.weights if weights is None else torch.where(new_mask, weights, 0.0)
        return Neighbourhood(
            own=self.own if own is None else own,
            neighbours=self.neighbours if neighbours is None else neighbours,
            weights=new_weights,
            mask=new_mask,
            self_weight=(1.0 - new_weights.sum(-1)).clamp_min(0.0),
            removed=self.removed,
            alone=self.alone,
            declared=self.declared if declared is None else declared,
        )


def fill_rows_(tensor: Tensor, rows: Tensor, value: float) -> Tensor:
    """Set the rows ``tensor[b, j, :]`` where ``rows[b, j]`` to ``value``, in place.

    Touches only those rows (a broadcast ``masked_fill_`` would pass over the
    whole [B, k, d] tensor), and nothing at all when no row is selected.
    """
    if bool(rows.any()):
        tensor[rows] = value
    return tensor


def _shape(shape: torch.Size | tuple[int, ...]) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def check_shapes(
    own: Tensor, neighbours: Tensor, weights: Tensor, mask: Tensor | None
) -> tuple[Tensor, Tensor | None]:
    """Validate the vector convention; return weights cast to own's dtype and the mask."""
    if not isinstance(own, Tensor) or not own.is_floating_point() or own.ndim < 1:
        got = (
            f"dtype {own.dtype}, shape {_shape(own.shape)}"
            if isinstance(own, Tensor)
            else type(own).__name__
        )
        raise ValueError(f"own must be a floating-point tensor of shape [*, d], got {got}")
    batch, d = own.shape[:-1], own.shape[-1]
    if (
        not isinstance(neighbours, Tensor)
        or neighbours.ndim != own.ndim + 1
        or neighbours.shape[:-2] != batch
        or neighbours.shape[-1] != d
    ):
        got = (
            _shape(neighbours.shape)
            if isinstance(neighbours, Tensor)
            else type(neighbours).__name__
        )
        want = _shape((*batch, -1, d)).replace("-1", "k")
        raise ValueError(
            f"neighbours must have shape [*, k, d] = {want} to match own {_shape(own.shape)}, got {got}"
        )
    if neighbours.dtype != own.dtype:
        raise ValueError(f"neighbours must have own's dtype {own.dtype}, got {neighbours.dtype}")
    k = neighbours.shape[-2]
    if not isinstance(weights, Tensor) or weights.shape != (*batch, k):
        got = _shape(weights.shape) if isinstance(weights, Tensor) else type(weights).__name__
        raise ValueError(f"weights must have shape [*, k] = {_shape((*batch, k))}, got {got}")
    if mask is not None and (
        not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.shape != (*batch, k)
    ):
        got = (
            f"{mask.dtype} {_shape(mask.shape)}"
            if isinstance(mask, Tensor)
            else type(mask).__name__
        )
        raise ValueError(
            f"mask must be a bool tensor of shape [*, k] = {_shape((*batch, k))}, got {got}"
        )
    present = weights if mask is None else torch.where(mask, weights, 0)
    if not bool(torch.isfinite(present).all()) or bool((present < 0).any()):
        raise ValueError("weights must be finite and >= 0 (off-diagonal mixing weights W_ij)")
    sums = present.to(torch.float64).sum(-1)
    if sums.numel() and float(sums.max()) > 1.0 + WEIGHT_SUM_TOLERANCE:
        worst = int(sums.flatten().argmax())
        raise ValueError(
            "weights of the present neighbours must sum to at most 1 (the self weight "
            f"1 - sum is implicit), got sum={float(sums.flatten()[worst]):.6g} at node {worst}"
        )
    return weights.to(dtype=own.dtype, device=own.device), mask


def sum_is_finite(values: Tensor) -> bool:
    """A cheap pre-check: True proves ``values`` hold no NaN and no Inf.

    One sum over ``values`` (no bool temporary of their size): a NaN or an Inf
    anywhere makes it non-finite. The converse can fail (finite values whose
    sum overflows), so ``False`` only means "check exactly". 16-bit floats are
    summed in float32, whose range their sums cannot realistically overflow.
    """
    if values.dtype in (torch.float16, torch.bfloat16):
        return bool(values.sum(dtype=torch.float32).isfinite())
    return bool(values.sum().isfinite())


def all_finite(values: Tensor) -> bool:
    """Exactly whether ``values`` hold no NaN and no Inf, usually in one cheap pass.

    :func:`sum_is_finite` first; only when that sum is not finite, the exact
    elementwise ``torch.isfinite`` (a bool temporary of the input's size).
    """
    return sum_is_finite(values) or bool(torch.isfinite(values).all())


def row_is_finite(rows: Tensor) -> Tensor:
    """[..., k] whether each row of ``rows [..., k, d]`` is free of NaN and Inf.

    A NaN or an Inf makes the row's sum non-finite, so a sum (a fast reduction
    with no [k, d] temporary) clears almost every row; only rows whose sum is
    not finite (non-finite entries, or finite ones that overflow) get the
    exact elementwise check.
    """
    finite = torch.isfinite(rows.sum(-1))
    if bool(finite.all()):
        return finite
    suspects = ~finite
    finite[suspects] = torch.isfinite(rows[suspects]).all(-1)
    return finite


def prepare(own: Tensor, neighbours: Tensor, weights: Tensor, mask: Tensor | None) -> Neighbourhood:
    """Check the inputs, flatten the batch and mask out non-finite neighbour rows.

    The batch is flattened to an explicit size (not ``-1``), so ``k = 0``
    neighbours (a node alone) and ``d = 0`` reshape like any other size.
    """
    weights, mask = check_shapes(own, neighbours, weights, mask)
    d, k, batch = own.shape[-1], neighbours.shape[-2], math.prod(own.shape[:-1])
    own2 = own.reshape(batch, d)
    nb = neighbours.reshape(batch, k, d)
    present = (
        torch.ones(batch, k, dtype=torch.bool, device=own.device)
        if mask is None
        else mask.reshape(batch, k)
    )
    if not bool(torch.isfinite(own2.sum(-1)).all()) and not bool(torch.isfinite(own2).all()):
        raise ValueError(
            "own contains NaN or Inf: the node's own vector is trusted and must be finite"
        )
    finite = row_is_finite(nb)
    counts = present.sum(-1)
    alone = counts == 0
    declared = int(counts[~alone].min()) + 1 if bool((~alone).any()) else 1
    removed = (present & ~finite).sum(-1)
    if not bool(finite.all()):
        nb = torch.where(finite[:, :, None], nb, nb.new_zeros(()))
    keep = present & finite
    w = torch.where(keep, weights.reshape(batch, k), 0.0)
    return Neighbourhood(
        own=own2,
        neighbours=nb,
        weights=w,
        mask=keep,
        self_weight=(1.0 - w.sum(-1)).clamp_min(0.0),
        removed=removed,
        alone=alone,
        declared=declared,
    )


#: Largest temporary (in elements; 16 MiB of float32) a rule allocates while it measures
#: distances, so a simulator batch of thousands of nodes never holds a second copy of all
#: neighbours' vectors (and blocks this size were faster than one big block in
#: bench/consensus_rules.py: one node with k = 16, d = 10^6 takes 4 blocks).
CHUNK_ELEMENTS = 1 << 22


def column_blocks(rows: int, d: int) -> Iterator[slice]:
    """Slices of the d columns so that ``rows`` rows of one slice hold ~``CHUNK_ELEMENTS``."""
    width = max(1, CHUNK_ELEMENTS // max(rows, 1))
    for start in range(0, d, width):
        yield slice(start, min(start + width, d))


def squared_distances_to(hood: Neighbourhood, centre: Tensor) -> Tensor:
    """[B, k] ||x_j - c_b||^2 for every neighbour slot (0 where absent), block by block."""
    out = torch.zeros(hood.batch, hood.k, dtype=hood.own.dtype, device=hood.own.device)
    for cols in column_blocks(hood.batch * hood.k, hood.dim):
        diff = hood.neighbours[:, :, cols] - centre[:, None, cols]
        out += diff.square_().sum(-1)
    return out.masked_fill_(~hood.mask, 0.0)


def pairwise_squared_distances(hood: Neighbourhood) -> Tensor:
    """[B, n, n] squared distances within {own} + neighbours, from a Gram matrix product.

    Vectors are centred at ``own`` first (distances are translation invariant),
    which keeps float32 cancellation small when all vectors share a large
    offset; the centring runs over column blocks, one ``bmm`` each, so there is
    no second copy of the neighbours. Absent members get +inf rows and
    columns; the diagonal is 0.
    """
    b, k = hood.batch, hood.k
    gram = torch.zeros(b, k, k, dtype=torch.float64, device=hood.own.device)
    for cols in column_blocks(b * k, hood.dim):
        block = fill_rows_(hood.neighbours[:, :, cols] - hood.own[:, None, cols], ~hood.mask, 0.0)
        gram += torch.bmm(block, block.transpose(1, 2)).to(torch.float64)
    sq = gram.diagonal(dim1=1, dim2=2)  # ||x_j - own||^2
    between = (sq[:, :, None] + sq[:, None, :] - 2.0 * gram).clamp_min(0.0)
    dist = torch.zeros(b, k + 1, k + 1, dtype=torch.float64, device=gram.device)
    dist[:, 1:, 1:] = between
    dist[:, 0, 1:] = sq
    dist[:, 1:, 0] = sq
    idx = torch.arange(k + 1, device=gram.device)
    dist[:, idx, idx] = 0.0
    present = hood.set_mask()
    absent = ~(present[:, :, None] & present[:, None, :])
    dist = (dist + dist.transpose(1, 2)) / 2  # exactly symmetric, so ties are exact
    return dist.masked_fill_(absent, float("inf"))


def combine(hood: Neighbourhood, own_coefficient: Tensor, coefficients: Tensor) -> Tensor:
    """[B, d] a_0 x_i + sum_j a_j x_j: one fused multiply-add and one batched matrix product.

    ``coefficients [B, k]`` must be 0 on absent slots (whose content, finite
    after :func:`prepare`, then drops out).
    """
    out = torch.bmm(coefficients[:, None, :], hood.neighbours).squeeze(1)
    return out.addcmul_(hood.own, own_coefficient[:, None])


def renormalised_average(hood: Neighbourhood, chosen: Tensor) -> Tensor:
    """sum_c a_c x_c with a_c = w_c [c chosen] / sum(w [chosen]) over the set {own} + neighbours.

    ``chosen`` is [B, n]. When the chosen members carry no mixing weight at
    all, they are averaged uniformly.
    """
    w = hood.set_weights() * chosen
    total = w.sum(-1, keepdim=True)
    uniform = chosen.to(w.dtype) / chosen.sum(-1, keepdim=True).clamp_min(1)
    coef = torch.where(total > 0, w / total.clamp_min(torch.finfo(w.dtype).tiny), uniform)
    return combine(hood, coef[:, 0], coef[:, 1:])
