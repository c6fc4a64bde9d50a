"""``PrivateTraining``: DP-SGD for one networked peer (``--dp-noise``, ``--dp-clip``,
``--dp-epsilon``; docs/privacy.md).

The trainer's gradient hook (:meth:`peer.node.trainer.Trainer.gradient`) calls
:meth:`PrivateTraining.gradient_into` instead of ``loss.backward()``: the shared mechanism
:func:`workloads.privacy.private_gradient` (per-sample gradients clipped to C, summed, noise
``N(0, σ²C²)``, divided by the expected batch size), keyed by this peer's shard index and
step, so the simulator's row of the same run draws the same noise. Every gradient is one
step in this peer's :class:`workloads.accountant.PrivacyLedger`; ε at δ is in ``/v1/status``
(``privacy``), ``/metrics`` (``gossipnet_privacy_epsilon``) and the status lines. Before a
round whose steps would take ε past the target, :class:`~peer.node.peer.Peer` stops training
with a warning naming ε and the budget (:meth:`PrivateTraining.exhausted`).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from workloads.accountant import PrivacyLedger
from workloads.privacy import PrivacyConfig, private_gradient

__all__ = ["PrivateTraining", "privacy_status"]

log = logging.getLogger(__name__)

_UNBOUNDED = 1 << 31
"""The furthest a budget is searched for a run without ``--steps``."""


class PrivateTraining:
    """One peer's DP-SGD: the mechanism's settings, its noise key and its account.

    Args:
        config: the privacy settings (``--dp-*``).
        noise_multiplier: σ (``config.noise``, or the one picked for the run's target ε).
        sample_rate: this peer's q = B / N (its shard of N examples, batch size B).
        batch_size: B, the expected batch size the clipped sum is divided by.
        seed: the noise's seed (the run's ``--seed``: same seed, same noise).
        peer: this peer's shard index (``--peer-index``), the noise's row.
        steps: steps already taken (a resumed peer's account starts there).
        max_steps: the run's steps (``--steps``; None: until stopped), the furthest the
            budget is searched (Opacus' PRV accountant slows down with the steps).
    """

    def __init__(
        self,
        config: PrivacyConfig,
        *,
        noise_multiplier: float,
        sample_rate: float,
        batch_size: int,
        seed: int,
        peer: int,
        steps: int = 0,
        max_steps: int | None = None,
    ) -> None:
        self.config = config
        self.noise_multiplier = noise_multiplier
        self.batch_size = batch_size
        self.seed = seed
        self.peer = peer
        self.ledger = PrivacyLedger(
            noise_multiplier,
            sample_rate,
            config.delta,
            target=config.epsilon,
            kind=config.accountant,
            steps=steps,
        )
        self.max_steps = max_steps
        self.stopped = False
        """Training stopped because one more round would pass the target ε."""

    def gradient_into(
        self,
        model: torch.nn.Module,
        loss_fn: Any,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        step: int,
        out: torch.Tensor,
    ) -> float:
        """The DP-SGD gradient of step ``step`` on ``(inputs, targets)`` written into ``out``
        (the flat gradient); counts the step; returns the batch's mean loss."""
        gradient, loss = private_gradient(
            model,
            loss_fn,
            inputs,
            targets,
            clip=float(self.config.clip),  # type: ignore[arg-type]
            noise_multiplier=self.noise_multiplier,
            batch_size=self.batch_size,
            seed=self.seed,
            peer=self.peer,
            step=step,
        )
        out.copy_(gradient)
        self.ledger.steps = max(self.ledger.steps, step)  # a resumed peer's earlier steps
        self.ledger.record_step()
        return loss

    def exhausted(self, steps: int, taken: int = 0) -> bool:
        """Whether ``steps`` more steps would take ε past the target, after ``taken`` steps
        (the trainer's count: a resumed peer's earlier steps count too); the first time it
        is, training stops: one warning line naming ε and the budget."""
        if self.stopped:
            return True
        ledger = self.ledger
        ledger.steps = max(ledger.steps, taken)
        wanted = ledger.steps + steps
        limit = max(_UNBOUNDED if self.max_steps is None else self.max_steps, wanted)
        if ledger.target is None or wanted <= ledger.budget_steps(limit):
            return False
        self.stopped = True
        log.warning(
            "privacy budget: stopped training at step %d: %d more step(s) would take epsilon "
            "from %.4g past the budget %g (delta %g, sigma %.4g, q %.4g)",
            ledger.steps,
            steps,
            ledger.epsilon,
            ledger.target,
            ledger.delta,
            ledger.noise_multiplier,
            ledger.sample_rate,
        )
        return True

    @property
    def epsilon(self) -> float:
        """ε at δ after the steps taken so far."""
        return self.ledger.epsilon

    def status(self) -> dict[str, Any]:
        """``/v1/status``' ``privacy``: ε, δ, σ, q, C, steps, the budget and whether training
        stopped for it."""
        return {
            **self.ledger.summary(),
            "clip": self.config.clip,
            "sampling": self.config.sampling,
            "accountant": self.config.accountant,
            "stopped": self.stopped,
        }


def privacy_status(privacy: PrivateTraining | None) -> dict[str, Any]:
    """``/v1/status``' ``privacy``: :meth:`PrivateTraining.status`, or None without DP-SGD."""
    return {"privacy": None if privacy is None else privacy.status()}
