"""The loss-threshold membership-inference attack on every simulated peer at once.

For each (honest) peer i the attacker holds the model i sends its neighbours (its row of the
``[n, d]`` parameters after the last round) and ``2m`` examples: ``m`` **members**, a seeded
subset of peer i's own training shard, and ``m`` **non-members**, a seeded subset of the test
set (examples from the same distribution that no peer trained on). Each example's score is
``−ℓ`` under peer i's model (its mean loss per target: per example of a classifier, per
position of a language model's context), and :mod:`workloads.membership` turns the scores into
the attack's ROC AUC and advantage, per peer.

All peers are scored in one ``vmap`` over their rows (of a ``vmap`` over their examples'
losses), a block of peers at a time so the outputs in flight stay near 64 MiB.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from workloads.membership import membership_advantage, roc_auc

_BLOCK_BYTES = 64 << 20


def _draw(sizes: Tensor, count: int, generator: torch.Generator) -> Tensor:
    """``[n, count]`` distinct positions ``< sizes[i]`` per row, uniformly (seeded)."""
    width = int(sizes.max())
    keys = torch.rand(sizes.shape[0], width, generator=generator, dtype=torch.float64)
    keys = keys.masked_fill(torch.arange(width)[None, :] >= sizes[:, None], 2.0)
    return keys.argsort(dim=1)[:, :count]


class MembershipAudit:
    """Who is a member for whom: ``members [n, m]`` (training-set indices from each peer's
    shard) and ``others [n, m]`` (test-set indices), drawn once from ``seed``.

    Args:
        partition: each peer's training indices.
        test_size: the test set's size (the non-members are drawn from it).
        members: m, the members (and non-members) per peer; None: as many as the smallest
            shard holds, at most the test set's size.
        seed: the draw's seed.

    A ``ValueError`` names ``members`` when m is more than the smallest shard or the test set.
    """

    def __init__(
        self, partition: Sequence[Tensor], test_size: int, members: int | None, seed: int
    ) -> None:
        sizes = torch.tensor([len(part) for part in partition], dtype=torch.int64)
        smallest = int(sizes.min())
        count = min(smallest, test_size) if members is None else members
        if count > smallest:
            peer = int(sizes.argmin())
            raise ValueError(
                f"members: {count} is more than the smallest shard holds ({smallest} examples, "
                f"peer {peer}); allowed: 1..{min(smallest, test_size)}"
            )
        if count > test_size:
            raise ValueError(
                f"members: {count} is more than the test set's {test_size} examples (the "
                f"non-members); allowed: 1..{min(smallest, test_size)}"
            )
        self.count = count
        generator = torch.Generator().manual_seed(seed)
        table = nn.utils.rnn.pad_sequence(list(partition), batch_first=True, padding_value=0)
        self.members = table.gather(1, _draw(sizes, count, generator))
        everyone = torch.full((len(partition),), test_size, dtype=torch.int64)
        self.others = _draw(everyone, count, generator)

    def scores(
        self,
        template: nn.Module,
        buffers: dict[str, Tensor],
        views: dict[str, Tensor],
        loss: Callable[[Tensor, Tensor], Tensor],
        x: Tensor,
        y: Tensor,
    ) -> Tensor:
        """``[k, e]``: ``−ℓ`` of each model ``views {name: [k, ...]}`` on its own examples
        ``x [k, e, ...]``, ``y [k, e, ...]``."""

        def one_example(params: dict[str, Tensor], xs: Tensor, ys: Tensor) -> Tensor:
            output = functional_call(template, (params, buffers), (xs.unsqueeze(0),))
            return loss(output, ys.unsqueeze(0))

        per_peer = vmap(vmap(one_example, in_dims=(None, 0, 0)), in_dims=(0, 0, 0))
        return -per_peer(views, x, y)

    @torch.no_grad()
    def measure(
        self,
        template: nn.Module,
        buffers: dict[str, Tensor],
        unflatten: Callable[[Tensor], dict[str, Tensor]],
        loss: Callable[[Tensor, Tensor], Tensor],
        models: Tensor,
        peers: Tensor,
        data: tuple[Tensor, Tensor, Tensor, Tensor],
        output_numel: int,
    ) -> tuple[Tensor, Tensor]:
        """Per-peer ``(auc [k], advantage [k])`` of models ``models [k, d]``, row r being
        peer ``peers[r]``'s; ``data`` is ``(x_train, y_train, x_test, y_test)``;
        ``output_numel``: the model's outputs per example (blocks the peers)."""
        x_train, y_train, x_test, y_test = data
        device = models.device
        members = self.members[peers.cpu()].to(device)
        others = self.others[peers.cpu()].to(device)
        per_peer = 2 * self.count * output_numel * models.element_size() * 3
        block = max(1, _BLOCK_BYTES // max(per_peer, 1))
        training = template.training
        template.eval()  # dropout off: the model as it is used
        aucs, advantages = [], []
        try:
            for start in range(0, models.shape[0], block):
                rows = slice(start, start + block)
                views = unflatten(models[rows])
                inside = self.scores(
                    template, buffers, views, loss, x_train[members[rows]], y_train[members[rows]]
                )
                outside = self.scores(
                    template, buffers, views, loss, x_test[others[rows]], y_test[others[rows]]
                )
                aucs.append(roc_auc(inside, outside))
                advantages.append(membership_advantage(inside, outside))
        finally:
            template.train(training)
        return torch.cat(aucs), torch.cat(advantages)
