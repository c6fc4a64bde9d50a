"""Per-group metrics: how each named group of peers is doing, and how far apart groups are.

For every group g of the experiment's ``[groups]`` with at least one honest member (Byzantine
members never count, as in every other metric), at each evaluation:

- ``group/g/accuracy``: test accuracy of the group's average model x̄_g = (1/|g|) Σ_{i∈g} x_i
  (honest members i);
- ``group/g/worst_peer_accuracy``: the lowest test accuracy of a member's own model (at most
  ``peer_limit`` members, a seeded subset, as for ``peer_accuracy_worst``);
- ``group/g/consensus_distance``: (1/|g|) Σ_{i∈g} ‖x_i − x̄_g‖², the agreement inside the group;
- ``group/g/accuracy_on/h``, when the partition gives label sets (``label-sets``): accuracy of
  x̄_g on the test samples whose class is in group h's classes (the union of its members'
  label sets), for every group h, g itself included. On a dumbbell whose cliques hold labels
  0-4 and 5-9, ``group/clique1/accuracy_on/clique2`` is what He, Karimireddy & Jaggi (2022),
  Fig. 4, plot: how much of the other clique's classes crossed the bridge;
- ``group/g/distance_to/h``: ‖x̄_g − x̄_h‖², the consensus distance between groups, for each
  later group h of the file (each pair once).

The keys are flat column names (``/`` separates group, metric and other group), so a record
stays one row per evaluation in JSON lines and CSV; :func:`sim.metrics.group_rows` splits them
into a long table. Every model is evaluated in one pass over the test set (class-wise correct
counts of all group averages and members at once). For a language model the accuracies are
next-token (next-byte) accuracies over every position.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from sim.batched import BatchedPeers
from sim.metrics import consensus_distance

__all__ = ["GroupMetrics", "class_correct"]


@torch.no_grad()
def class_correct(
    peers: BatchedPeers,
    x: Tensor,
    y: Tensor,
    models: Tensor,
    num_classes: int,
    *,
    batch_size: int = 4096,
) -> Tensor:
    """``[m, num_classes]`` float64: how many test samples of each class every model of
    ``models [m, d]`` gets right (one vmap over the models per chunk of ``batch_size``
    targets). A language model's targets ``y [N, L]`` count per position: how many next
    tokens of each value every model predicts right."""
    counts = torch.zeros(models.shape[0], num_classes, dtype=torch.float64, device=models.device)
    rows = max(batch_size // max(math.prod(y.shape[1:]), 1), 1)
    for start in range(0, x.shape[0], rows):
        xb, yb = x[start : start + rows], y[start : start + rows]
        right = (peers.logits(xb, models).argmax(dim=-1) == yb).double().flatten(1)  # [m, B]
        counts.index_add_(1, yb.flatten(), right)
    return counts


@dataclass(frozen=True)
class GroupMetrics:
    """What to measure per group: the groups (name -> peer ids), each group's class set
    (``None`` when the partition gives no label sets), the number of classes, and how many
    members' own models to evaluate at most per group."""

    groups: Mapping[str, tuple[int, ...]]
    classes: Mapping[str, tuple[int, ...]] | None = None
    num_classes: int = 10
    peer_limit: int = 64
    batch_size: int = 4096
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.num_classes, int) or self.num_classes < 1:
            raise ValueError(f"num_classes: must be an integer >= 1, got {self.num_classes!r}")
        if not isinstance(self.peer_limit, int) or self.peer_limit < 1:
            raise ValueError(f"peer_limit: must be an integer >= 1, got {self.peer_limit!r}")

    def _rows(self, models: Tensor, honest: Tensor) -> dict[str, Tensor]:
        """Each group's honest members as row indices of ``models``: the honest peers' rows
        in peer order, or row 0 for all when the algorithm keeps one model (a baseline)."""
        honest = honest.cpu()
        m = models.shape[0]
        if m == int(honest.sum()):
            row_of = torch.cumsum(honest.long(), dim=0) - 1
        elif m == 1:
            row_of = torch.zeros(honest.shape[0], dtype=torch.long, device="cpu")
        else:
            raise ValueError(
                f"models: expected one row per honest peer ({int(honest.sum())}) or one model, "
                f"got {m}"
            )
        rows = {}
        for name, members in self.groups.items():
            ids = torch.as_tensor(members, dtype=torch.long, device="cpu")
            ids = ids[honest[ids]]
            if ids.numel():
                rows[name] = row_of[ids].unique()
        return rows

    def measure(
        self, peers: BatchedPeers, x: Tensor, y: Tensor, models: Tensor, honest: Tensor
    ) -> dict[str, float]:
        """The ``group/...`` metrics of ``models [m, d]`` (the algorithm's models: one per
        honest peer, in peer order, or one shared model) on the test set ``(x, y)``;
        ``honest [n]`` bool says which peers are honest."""
        rows = self._rows(models, honest)
        if not rows:
            return {}
        names = list(rows)
        averages = torch.stack([models[rows[name].to(models.device)].mean(dim=0) for name in names])
        generator = torch.Generator().manual_seed(self.seed)
        picked = {}
        for name in names:
            members = rows[name]
            if members.numel() > self.peer_limit:
                order = torch.randperm(members.numel(), generator=generator, device="cpu")
                members = members[order[: self.peer_limit]].sort().values
            picked[name] = members
        own = torch.cat(list(picked.values())).unique()
        position = {int(row): k for k, row in enumerate(own.tolist())}
        evaluated = torch.cat([averages, models[own.to(models.device)]])
        correct = class_correct(
            peers, x, y, evaluated, self.num_classes, batch_size=self.batch_size
        ).cpu()
        per_class = torch.bincount(y.cpu().flatten(), minlength=self.num_classes).double()
        total = max(float(per_class.sum()), 1.0)
        accuracy = correct.sum(dim=1) / total
        out: dict[str, float] = {}
        for k, name in enumerate(names):
            mine = [len(names) + position[int(row)] for row in picked[name].tolist()]
            out[f"group/{name}/accuracy"] = float(accuracy[k])
            out[f"group/{name}/worst_peer_accuracy"] = float(accuracy[mine].min())
            out[f"group/{name}/consensus_distance"] = consensus_distance(
                models[rows[name].to(models.device)]
            )
            for other, classes in (self.classes or {}).items():
                index = torch.as_tensor(classes, dtype=torch.long, device="cpu")
                index = index[index < self.num_classes]
                count = float(per_class[index].sum())
                if count:
                    hits = float(correct[k, index].sum())
                    out[f"group/{name}/accuracy_on/{other}"] = hits / count
        averages64 = averages.double()
        for k, name in enumerate(names):
            for j in range(k + 1, len(names)):
                gap = float((averages64[k] - averages64[j]).square().sum())
                out[f"group/{name}/distance_to/{names[j]}"] = gap
        return out
