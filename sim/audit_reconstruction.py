"""The batch-of-one reconstruction attack on every simulated peer at once.

Each (honest) peer i takes one more SGD step from the model it holds after the last round, on
a batch of one: an example drawn (seeded) from its own shard. Its neighbour receives the delta
``Δ_i = −η g_i`` and recovers the input from the dense first layer
(:func:`workloads.reconstruction.reconstruct_input`); the audit reports the cosine similarity
of the recovered input with the true one, per peer, up to its sign (``|cos|``: an input
recovered up to its sign is recovered; the noise can flip the bias delta's sign).

Without ``[privacy]`` ``g_i`` is the example's gradient, and the recovery is exact (cosine 1 up
to float rounding). With ``[privacy]`` it is DP-SGD's gradient of that batch of one, the same
mechanism as training (:mod:`workloads.privacy`): the per-sample gradient clipped to C, plus
``σ C z``, divided by the batch size 1. The noise ``z`` is the run's counter-based noise for
step T (the run's steps so far: the step after the last), so the same seed gives the same
audit. One ``vmap`` over the peers of the per-sample ``vmap`` computes every gradient.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn
from torch.func import vmap

from gossip.flat import ParameterLayout
from workloads.privacy import clipped_sum, gaussian_noise, per_sample_gradients, privatize
from workloads.reconstruction import cosine_similarity, reconstruct_input

Loss = Callable[[Tensor, Tensor], Tensor]


class ReconstructionAudit:
    """The example each peer steps on (``examples [n]``, training-set indices drawn once from
    ``seed``) and the first layer's names (``layer``: weight, bias).

    Args:
        partition: each peer's training indices.
        layer: ``(weight, bias)`` names of the dense first layer
            (:func:`workloads.reconstruction.dense_input_layer`).
        seed: the draw's seed (also the noise's key under DP-SGD, as in training).
    """

    def __init__(self, partition: Sequence[Tensor], layer: tuple[str, str], seed: int) -> None:
        generator = torch.Generator().manual_seed(seed ^ 0x5EC0)
        sizes = torch.tensor([len(part) for part in partition], dtype=torch.float64)
        pick = (torch.rand(len(partition), generator=generator, dtype=torch.float64) * sizes).long()
        self.examples = torch.stack(
            [part[index] for part, index in zip(partition, pick.tolist(), strict=True)]
        )
        self.layer = layer
        self.seed = seed

    def measure(
        self,
        template: nn.Module,
        buffers: dict[str, Tensor],
        layout: ParameterLayout,
        models: Tensor,
        loss: Loss,
        peers: Tensor,
        x_train: Tensor,
        y_train: Tensor,
        *,
        lr: float,
        privacy: tuple[float, float, int] | None,
    ) -> Tensor:
        """Per-peer ``|cos|`` ``[k]`` of the input recovered from each model's one-step delta.

        ``models [k, d]`` (in ``layout``), row r being peer ``peers[r]``'s; ``privacy``:
        ``(σ, C, step)`` for DP-SGD's step, or None for plain SGD (``Δ = −η g``: no momentum
        history, no weight decay)."""
        views = layout.unflatten(models)
        trainable = [e.name for e in layout.entries if e.kind == "parameter"]
        frozen = [e.name for e in layout.entries if e.kind != "parameter"]
        index = self.examples[peers.cpu()].to(x_train.device)
        x = x_train[index].unsqueeze(1)  # [k, 1, ...]: a batch of one per peer
        y = y_train[index].unsqueeze(1)

        def one_peer(params: dict[str, Tensor], xs: Tensor, ys: Tensor) -> Tensor:
            ordered = {name: params[name] for name in trainable}
            fixed = {**buffers, **{name: params[name] for name in frozen}}
            per_sample, _ = per_sample_gradients(template, ordered, fixed, loss, xs, ys)
            if privacy is None:
                return per_sample.sum(dim=0)
            return clipped_sum(per_sample, privacy[1])

        training = template.training
        template.eval()
        try:
            gradient = vmap(one_peer, in_dims=(0, 0, 0))(views, x, y).detach()
        finally:
            template.train(training)
        if privacy is not None:
            sigma, clip, step = privacy
            noise = gaussian_noise(
                self.seed, peers.to(gradient.device), step, gradient.shape[1], dtype=gradient.dtype
            )
            gradient = privatize(gradient, noise, noise_multiplier=sigma, clip=clip, batch_size=1)
        delta = -lr * gradient  # the trainable parameters lead the layout, in its order
        entries = {e.name: e for e in layout.entries}
        weight, bias = (entries[name] for name in self.layer)
        weight_delta = delta[:, weight.offset : weight.offset + weight.numel]
        bias_delta = delta[:, bias.offset : bias.offset + bias.numel]
        recovered = reconstruct_input(weight_delta.unflatten(1, weight.shape), bias_delta)
        return cosine_similarity(recovered, x.flatten(2)[:, 0]).abs()
