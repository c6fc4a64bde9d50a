"""Privacy audits of a simulated run: the ``[audit]`` table, and the attacks it runs on the
models a run ends with (docs/privacy.md, "Audits").

- ``membership = true``: the loss-threshold membership-inference attack (Yeom et al. 2018)
  on every honest peer's final model, members from its own shard, non-members from the test
  set (:mod:`sim.audit_membership`, :mod:`workloads.membership`).
- ``reconstruction = true``: the exact input reconstruction from the one-step delta of a batch
  of one through a dense first layer with a bias, with DP-SGD's clipping and noise when the
  run has ``[privacy]`` (:mod:`sim.audit_reconstruction`, :mod:`workloads.reconstruction`).

The attacker's view: the model each peer sends its neighbours, i.e. the peer's row of the
``[n, d]`` parameters after the last round (a baseline that keeps one model: that model, for
every peer). :func:`sim.runner.run` measures the audit after the last round and puts the
results in the last record (:data:`sim.metrics.AUDIT_COLUMNS`: the mean over the honest peers
and the worst peer's value); :meth:`SimAudit.measure` gives the per-peer values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from sim.audit_membership import MembershipAudit
from sim.audit_reconstruction import ReconstructionAudit
from workloads.reconstruction import dense_input_layer

if TYPE_CHECKING:
    from sim.algorithms import Algorithm, Context

__all__ = ["AUDIT_FIELDS", "AuditConfig", "AuditResult", "SimAudit"]


@dataclass(frozen=True)
class AuditConfig:
    """The ``[audit]`` table, checked at construction (a ``ValueError`` names the key).

    Attributes:
        membership: run the membership-inference attack on every honest peer.
        members: m, members and non-members per peer (with ``membership``); default: as
            many as the smallest shard holds, at most the test set's size.
        reconstruction: run the batch-of-one reconstruction on every honest peer (the
            model's first layer must be dense with a bias: ``mlp``, ``logistic``).
    """

    membership: bool = False
    members: int | None = None
    reconstruction: bool = False

    def __post_init__(self) -> None:
        for key in ("membership", "reconstruction"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"{key}: must be true or false, got {getattr(self, key)!r}")
        if self.members is not None:
            if (
                isinstance(self.members, bool)
                or not isinstance(self.members, int)
                or self.members < 1
            ):
                raise ValueError(f"members: must be an integer >= 1, got {self.members!r}")
            if not self.membership:
                raise ValueError("members: is read by membership = true; add it or remove members")
        if not (self.membership or self.reconstruction):
            raise ValueError(
                "membership: the table runs no attack; set membership = true and/or "
                "reconstruction = true, or remove [audit]"
            )

    @classmethod
    def from_table(cls, table: Mapping[str, object]) -> AuditConfig:
        """From the ``[audit]`` table (an unknown key is a ``ValueError`` naming it)."""
        unknown = sorted(set(table) - set(AUDIT_FIELDS))
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown key; allowed: {', '.join(AUDIT_FIELDS)}")
        return cls(**table)  # type: ignore[arg-type]


AUDIT_FIELDS = tuple(f.name for f in fields(AuditConfig))
"""The ``[audit]`` keys."""


@dataclass(frozen=True)
class AuditResult:
    """Per honest peer (``peers [k]``, their ids): the attack's AUC and advantage, and the
    reconstruction's cosine; None for an attack that did not run."""

    peers: Tensor
    membership_auc: Tensor | None = None
    membership_advantage: Tensor | None = None
    reconstruction_cosine: Tensor | None = None

    def columns(self) -> dict[str, float]:
        """The record's columns: each measure's mean over the peers and its worst peer
        (``_max``: the attack's best)."""
        out: dict[str, float] = {}
        for name in ("membership_auc", "membership_advantage", "reconstruction_cosine"):
            values = getattr(self, name)
            if values is not None:
                out[name] = float(values.mean())
                out[f"{name}_max"] = float(values.max())
        return out


class SimAudit:
    """What ``[audit]`` builds for one run (:func:`sim.build.build`).

    Args:
        config: the ``[audit]`` table.
        partition: each peer's training indices.
        x_test, y_test: the test set (the membership attack's non-members).
        input_shape: one example's shape (the reconstruction's first layer takes it whole).
        template: the model (its first layer is checked when ``reconstruction``).
        seed: the run's seed (which examples; DP noise).

    A ``ValueError`` names the ``[audit]`` key that cannot run on this workload.
    """

    def __init__(
        self,
        config: AuditConfig,
        partition: Sequence[Tensor],
        x_test: Tensor,
        y_test: Tensor,
        *,
        input_shape: Sequence[int],
        template: torch.nn.Module,
        seed: int,
    ) -> None:
        self.config = config
        self.x_test = x_test
        self.y_test = y_test
        self.membership = (
            MembershipAudit(partition, x_test.shape[0], config.members, seed)
            if config.membership
            else None
        )
        self.reconstruction: ReconstructionAudit | None = None
        if config.reconstruction:
            try:
                layer = dense_input_layer(template, input_shape)
            except ValueError as error:
                raise ValueError(f"reconstruction: {error}") from None
            if not all(template.get_parameter(name).requires_grad for name in layer):
                raise ValueError(f"reconstruction: the first layer {layer[0]!r} is frozen")
            self.reconstruction = ReconstructionAudit(partition, layer, seed)

    def measure(self, algorithm: Algorithm, ctx: Context) -> AuditResult:
        """Both attacks on the honest peers' models as the run leaves them."""
        peers = ctx.peers
        models = algorithm.models(ctx).detach()
        ids = torch.nonzero(ctx.honest.cpu()).flatten()
        if models.shape[0] == 1 and ids.numel() > 1:  # a baseline's one model, every peer's
            models = models.expand(ids.numel(), -1)
        results: dict[str, Any] = {"peers": ids}
        if self.membership is not None:
            output = peers.logits(self.x_test[:1], models[:1])
            auc, advantage = self.membership.measure(
                peers.template,
                peers.buffers,
                peers.layout.unflatten,
                peers.loss,
                models,
                ids,
                (ctx.x_train, ctx.y_train, self.x_test, self.y_test),
                output_numel=output[0].numel(),
            )
            results["membership_auc"] = auc
            results["membership_advantage"] = advantage
        if self.reconstruction is not None:
            privacy = None
            if ctx.privacy is not None:
                clip = ctx.privacy.config.clip
                assert clip is not None
                privacy = (ctx.privacy.noise_multiplier, clip, ctx.privacy.ledger.steps)
            results["reconstruction_cosine"] = self.reconstruction.measure(
                peers.template,
                peers.buffers,
                peers.layout,
                models,
                peers.loss,
                ids,
                ctx.x_train,
                ctx.y_train,
                lr=ctx.optimizer.lr,
                privacy=privacy,
            )
        return AuditResult(**results)
