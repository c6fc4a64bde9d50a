"""Pre-aggregation wrappers that sit in front of any rule: bucketing and nearest-neighbour mixing.

Spec syntax: ``WRAPPER[:params]+...+RULE[:params]``, e.g. ``bucketing:s=2+median``
or ``nnm+krum:f=1`` (a wrapper that needs ``f`` and is not given one takes the
inner rule's). Wrappers apply left to right: ``nnm+bucketing:s=2+krum:f=1``
mixes first, then buckets, then runs Krum.
"""

from __future__ import annotations

import torch
from torch import Tensor

from consensus._inputs import Neighbourhood, pairwise_squared_distances
from consensus.base import Rule, bound_error, check_int


class Wrapper(Rule):
    """A rule that transforms the neighbourhood and hands it to ``inner``."""

    def __init__(self, inner: Rule, n: int | None = None) -> None:
        if not isinstance(inner, Rule):
            raise ValueError(f"{self.name}: inner must be a consensus rule, got {inner!r}")
        self.inner = inner
        super().__init__(n)

    @property
    def stateful(self) -> bool:
        return self.inner.stateful

    def reset(self) -> None:
        self.inner.reset()

    def _kept_own(self, hood: Neighbourhood) -> None:
        """The inner rule keeps the state, so it records which nodes kept their own vector."""
        self.inner._kept_own(hood)


class Bucketing(Wrapper):
    """Bucketing, spec name ``bucketing:s=S,seed=SEED+RULE``.

    Shuffle the present neighbours, split them into ceil(k/s) buckets of s,
    and hand the rule the bucket means y_b = sum_{j in b} W_ij x_j / sum_{j in b} W_ij
    (uniform if the bucket has no weight) with bucket weights
    sum_{j in b} W_ij; the own vector stays the trusted own vector, so mixing
    weights are preserved. Karimireddy, He & Jaggi, "Byzantine-robust learning
    on heterogeneous datasets via bucketing" (ICLR 2022). Each call draws a
    fresh permutation per node from a generator seeded with ``seed``;
    ``reset()`` rewinds it. The inner rule's f counts Byzantine buckets.
    """

    name = "bucketing"

    def __init__(self, inner: Rule, s: int = 2, seed: int = 0, n: int | None = None) -> None:
        self.s = check_int(self.name, "s", s, 1)
        self.seed = check_int(self.name, "seed", seed, 0)
        self._generator = torch.Generator().manual_seed(self.seed)
        super().__init__(inner, n)

    @property
    def stateful(self) -> bool:
        return True  # each call advances the shuffling generator

    def reset(self) -> None:
        self._generator.manual_seed(self.seed)
        super().reset()

    def _buckets(self, n: int) -> int:
        return 1 + -(-(n - 1) // self.s)

    def check_size(self, n: int) -> None:
        self.inner.check_size(self._buckets(n))

    def _aggregate(self, hood: Neighbourhood) -> Tensor:
        b, k, d, s = hood.batch, hood.k, hood.dim, self.s
        keys = torch.rand(b, k, generator=self._generator, device=self._generator.device)
        keys = keys.to(hood.mask.device)
        order = keys.masked_fill(~hood.mask, 2.0).argsort(-1)  # present first, shuffled
        groups = -(-k // s)
        pad = groups * s - k
        members = torch.nn.functional.pad(
            hood.neighbours.gather(1, order[:, :, None].expand(-1, -1, d)), (0, 0, 0, pad)
        ).view(b, groups, s, d)
        weights = torch.nn.functional.pad(hood.weights.gather(1, order), (0, pad)).view(
            b, groups, s
        )
        present = torch.nn.functional.pad(hood.mask.gather(1, order), (0, pad)).view(b, groups, s)
        bucket_weight = weights.sum(-1)
        count = present.sum(-1, keepdim=True).clamp_min(1)
        coef = torch.where(
            (bucket_weight > 0)[:, :, None],
            weights / bucket_weight.clamp_min(torch.finfo(weights.dtype).tiny)[:, :, None],
            present.to(weights.dtype) / count,
        )
        means = torch.matmul(coef[:, :, None, :], members).squeeze(2)  # [B, groups, d]
        inner = hood.replace(
            neighbours=means,
            weights=bucket_weight,
            mask=present.any(-1),
            declared=self._buckets(hood.declared),
        )
        return self.inner._aggregate(inner)


class NearestNeighbourMixing(Wrapper):
    """Nearest-neighbour mixing (NNM), spec name ``nnm:f=F+RULE``.

    Replace every member c of the set {x_i} + neighbours by the mean of its
    n - f nearest members (itself included), y_c = (1/(n-f)) sum_{j in N_c} x_j,
    then run the rule on the mixed vectors with the original mixing weights.
    Allouah et al., "Fixing by mixing: a recipe for optimal Byzantine ML under
    heterogeneity" (AISTATS 2023). Needs n > 2f. Distances come from one Gram
    matrix product and the mixing is one batched matrix product.
    """

    name = "nnm"

    def __init__(self, inner: Rule, f: int = 1, n: int | None = None) -> None:
        self.f = check_int(self.name, "f", f, 0)
        super().__init__(inner, n)

    def check_size(self, n: int) -> None:
        if n <= 2 * self.f:
            raise bound_error(self.name, "n > 2f", n=n, f=self.f)
        self.inner.check_size(n)

    def _aggregate(self, hood: Neighbourhood) -> Tensor:
        distances = pairwise_squared_distances(hood)
        rank = distances.argsort(dim=-1, stable=True).argsort(-1)
        count = hood.size - hood.budget(self.f)
        present = hood.set_mask()
        nearest = (rank < count.view(-1, 1, 1)) & present[:, :, None] & present[:, None, :]
        nearest = nearest.to(hood.own.dtype) / count.view(-1, 1, 1)
        # absent members get and give nothing: a 0 coefficient drops their padded rows
        mixed = torch.bmm(nearest[:, :, 1:], hood.neighbours)  # [B, n, d]
        mixed.addcmul_(nearest[:, :, :1], hood.own[:, None, :])
        inner = hood.replace(own=mixed[:, 0], neighbours=mixed[:, 1:])
        return self.inner._aggregate(inner)
