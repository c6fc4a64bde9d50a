"""DP-SGD in the simulator: every peer's private gradient at once, and the run's account.

:class:`SimPrivacy` is what an experiment's ``[privacy]`` table builds (:func:`sim.build.build`).
It draws every peer's batch of a step (:meth:`batch`: Poisson batches padded to the step's
largest with a mask, :class:`workloads.privacy.PoissonBatchSampler`, or the run's fixed-size
ones), and :class:`sim.batched.BatchedPeers` asks it for the gradients of that batch
(:meth:`gradients`): ``vmap`` over peers of ``vmap`` over samples of ``grad``, clipped and
summed by :func:`workloads.privacy.clipped_sum`, noised by
:func:`workloads.privacy.gaussian_noise` and :func:`workloads.privacy.privatize`, the same
functions a networked peer calls for itself (tested equal row by row).

The account (:class:`workloads.accountant.PrivacyLedger`) is kept for the peer with the largest
sampling rate ``q = B / N_i`` (the smallest shard), whose ε is the largest: every peer's ε is at
most the one reported. σ is the table's ``noise``, or the one that reaches ``epsilon`` in the
run's steps at that rate. :func:`sim.runner.run` records ε in every record (column ``epsilon``)
and ends the run before a round that would take it past ``epsilon`` (``privacy_stopped_at``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor, nn
from torch.func import vmap

from sim.pair_privacy import PairPrivacy
from workloads.accountant import PrivacyLedger, noise_multiplier_for
from workloads.batching import StackedBatchSampler
from workloads.privacy import (
    PoissonBatchSampler,
    PrivacyConfig,
    clipped_sum,
    gaussian_noise,
    per_sample_gradients,
    privatize,
    sample_rates,
)

_BLOCK_BYTES = 64 << 20
"""Per-sample gradients in flight per block of peers (about 64 MiB)."""


class SimPrivacy:
    """DP-SGD for the n peers of one simulated run.

    Args:
        config: the ``[privacy]`` table.
        partition: each peer's training indices.
        batch_size: B, the expected batch size (``q_i = B / N_i``).
        seed: the run's seed (batches and noise).
        rounds: the run's rounds.
        steps_per_round: the gradients a peer takes in a round; with ``rounds`` the run's steps
            (for a target ε: σ is picked for them).
    """

    def __init__(
        self,
        config: PrivacyConfig,
        partition: Sequence[Tensor],
        batch_size: int,
        *,
        seed: int,
        rounds: int,
        steps_per_round: int = 1,
    ) -> None:
        self.config = config
        self.seed = seed
        self.batch_size = batch_size
        self.steps_per_round = steps_per_round
        self.total_steps = steps = rounds * steps_per_round
        sizes = [len(part) for part in partition]
        self.sample_rate = float(sample_rates(sizes, batch_size).max())
        if config.noise is not None:
            self.noise_multiplier = config.noise
        else:
            assert config.epsilon is not None  # PrivacyConfig: one of the two
            self.noise_multiplier = noise_multiplier_for(
                config.epsilon, config.delta, self.sample_rate, steps, config.accountant
            )
        self.ledger = PrivacyLedger(
            self.noise_multiplier,
            self.sample_rate,
            config.delta,
            target=config.epsilon,
            kind=config.accountant,
        )
        self.poisson = (
            PoissonBatchSampler(partition, batch_size, seed=seed)
            if config.sampling == "poisson"
            else None
        )
        self.pair: PairPrivacy | None = None
        """``[privacy] pair``'s account, set by :func:`sim.build.build`."""
        self.step = -1
        """The step of the batch drawn last (its noise key)."""
        self.valid: Tensor | None = None
        """``[n, b]``: which slots of the last Poisson batch hold an example (None: fixed)."""

    def batch(
        self, sampler: StackedBatchSampler, step: int, x_train: Tensor, y_train: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Every peer's batch at ``step`` (``x [n, b, ...]``, ``y [n, b]``), remembered for
        :meth:`gradients`; counts the step in the account."""
        if self.poisson is None:
            index = sampler.indices(step)
            self.valid = None
        else:
            index, valid = self.poisson.indices(step)
            self.valid = valid.to(x_train.device)
        self.step = step
        self.ledger.record_step()
        index = index.to(x_train.device)
        return x_train[index], y_train[index]

    def steps_left(self) -> int | float:
        """Steps every peer may still take within the target ε (infinity without one)."""
        if self.ledger.target is None:
            return math.inf
        budget = self.ledger.budget_steps(max(self.total_steps, self.ledger.steps + 1))
        return budget - self.ledger.steps

    def gradients(
        self,
        template: nn.Module,
        names: Sequence[str],
        views: Mapping[str, Tensor],
        buffers: Mapping[str, Tensor],
        loss: Callable[[Tensor, Tensor], Tensor],
        x: Tensor,
        y: Tensor,
        out: Tensor,
    ) -> Tensor:
        """Every peer's DP-SGD gradient into ``out [n, d]``: the trainable parameters
        ``names`` first (as :func:`workloads.privacy.private_gradient` orders them), zero for
        the rest of the row (frozen parameters); returns each peer's mean loss over its batch
        ``[n]`` (NaN for an empty one).

        ``views`` are the peers' parameters ``{name: [n, ...]}``, all of them; the batch is
        the one :meth:`batch` drew last. Peers go a block at a time, each block one ``vmap``
        over peers of the per-sample ``vmap``."""
        n, width = x.shape[0], x.shape[1]
        valid = (
            torch.ones(n, width, dtype=torch.bool, device=x.device)
            if self.valid is None
            else self.valid
        )
        clip = float(self.config.clip)  # type: ignore[arg-type]

        trained = set(names)

        def one_peer(
            params: Mapping[str, Tensor], xs: Tensor, ys: Tensor, keep: Tensor
        ) -> tuple[Tensor, Tensor]:
            ordered = {name: params[name] for name in names}
            fixed = {**buffers, **{n: v for n, v in params.items() if n not in trained}}
            per_sample, losses = per_sample_gradients(template, ordered, fixed, loss, xs, ys)
            kept = keep.to(losses.dtype)
            mean = (losses * kept).sum() / kept.sum()
            return clipped_sum(per_sample, clip, keep), mean

        batched = vmap(one_peer, in_dims=(0, 0, 0, 0), randomness="different")
        per_peer_bytes = max(width, 1) * out.shape[1] * out.element_size() * 3
        block = max(1, _BLOCK_BYTES // per_peer_bytes)
        dim = sum(views[name][0].numel() for name in names)
        trainable = out[:, :dim]
        losses = torch.empty(n, dtype=out.dtype, device=out.device)
        for start in range(0, n, block):
            rows = slice(start, start + block)
            params = {name: view[rows] for name, view in views.items()}
            summed, loss_rows = batched(params, x[rows], y[rows], valid[rows])
            trainable[rows] = summed
            losses[rows] = loss_rows.detach()
        peers = torch.arange(n, dtype=torch.int64, device=out.device)
        noise = gaussian_noise(self.seed, peers, self.step, dim, dtype=out.dtype)
        trainable.copy_(
            privatize(
                trainable,
                noise,
                noise_multiplier=self.noise_multiplier,
                clip=clip,
                batch_size=self.batch_size,
            )
        )
        out[:, dim:] = 0.0
        return losses

    def epsilon(self) -> float:
        """ε after the steps taken so far (the largest of any peer)."""
        value = self.ledger.epsilon
        return value if math.isfinite(value) else math.inf
