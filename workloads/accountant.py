"""Privacy accounting through Opacus (an optional extra: ``pip install 'gossipnet[privacy]'``).

:class:`PrivacyAccountant` composes subsampled Gaussian mechanisms, each a history entry
``(σ, q, steps)``, and answers ε at a δ: Opacus' RDP accountant (Mironov 2017; Mironov,
Talwar & Zhang 2019) or its PRV accountant (Gopi, Lee & Wutschitz 2021). DP-SGD records one
entry per step (:class:`PrivacyLedger` does, for one peer); any later mechanism that is a
(subsampled) Gaussian, such as the noise a noisy gossip step adds (``q = 1``), is one more
entry of the same history.

:class:`PrivacyLedger` is one peer's account of a run: its σ and q, the steps taken, ε after
them, and the budget: how many steps keep ε at or below the target. With the RDP accountant it
computes the per-step Rényi divergences once (Opacus' ``compute_rdp``, 20-300 ms) and ε after T
steps from T times them (``get_privacy_spent``, what ``RDPAccountant.get_epsilon`` does for a
history of one entry), so ε at any step count is cheap; with PRV each ε is Opacus' full answer.

Opacus is imported when an accountant is made, so a peer without DP never loads it.
"""

from __future__ import annotations

import importlib
import math
import warnings
from typing import Any

__all__ = [
    "OPACUS_MISSING",
    "PrivacyAccountant",
    "PrivacyLedger",
    "noise_multiplier_for",
]

OPACUS_MISSING = (
    "privacy accounting needs Opacus: pip install 'gossipnet[privacy]' (or pip install opacus)"
)
_STEP_CAP = 1 << 31
"""The most steps a budget is searched over (a run without a step count)."""


def _opacus(module: str) -> Any:
    try:
        return importlib.import_module(f"opacus.{module}")
    except ImportError as error:
        raise ImportError(OPACUS_MISSING) from error


class PrivacyAccountant:
    """A composition of subsampled Gaussian mechanisms and its ε at a given δ.

    Args:
        kind: ``"rdp"`` or ``"prv"`` (:data:`workloads.privacy.ACCOUNTANTS`).
    """

    def __init__(self, kind: str = "rdp") -> None:
        accountants = _opacus("accountants")
        if kind == "rdp":
            self._accountant = accountants.RDPAccountant()
        elif kind == "prv":
            self._accountant = accountants.PRVAccountant()
        else:
            raise ValueError(f"accountant: got {kind!r}; allowed: rdp, prv")
        self.kind = kind

    @property
    def history(self) -> list[tuple[float, float, int]]:
        """The mechanisms composed so far: ``(noise_multiplier, sample_rate, steps)``."""
        return list(self._accountant.history)

    def record(self, noise_multiplier: float, sample_rate: float, steps: int = 1) -> None:
        """Compose ``steps`` more runs of the Gaussian mechanism with noise multiplier σ on a
        Poisson subsample of rate q."""
        if steps < 0:
            raise ValueError(f"steps: must be >= 0, got {steps}")
        if steps == 0:
            return
        history = self._accountant.history
        if history and history[-1][:2] == (noise_multiplier, sample_rate):
            history[-1] = (noise_multiplier, sample_rate, history[-1][2] + steps)
        else:
            history.append((noise_multiplier, sample_rate, steps))

    def epsilon(self, delta: float) -> float:
        """ε of the composition at δ (0 before any mechanism)."""
        if not self._accountant.history:
            return 0.0
        with warnings.catch_warnings():
            # RDP: "optimal order is the largest alpha" (the bound is still valid)
            warnings.simplefilter("ignore", UserWarning)
            return float(self._accountant.get_epsilon(delta=delta))

    def epsilon_with(
        self, noise_multiplier: float, sample_rate: float, steps: int, delta: float
    ) -> float:
        """ε if ``steps`` more steps of (σ, q) were composed, without composing them."""
        saved = list(self._accountant.history)
        try:
            self.record(noise_multiplier, sample_rate, steps)
            return self.epsilon(delta)
        finally:
            self._accountant.history = saved


def noise_multiplier_for(
    epsilon: float, delta: float, sample_rate: float, steps: int, kind: str = "rdp"
) -> float:
    """The smallest σ (within Opacus' tolerance of 0.01 in ε) whose ``steps`` steps at
    sampling rate q reach at most ε at δ (Opacus' ``get_noise_multiplier``)."""
    if steps < 1:
        raise ValueError(f"steps: a target epsilon needs the run's step count (>= 1), got {steps}")
    utils = _opacus("accountants.utils")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return float(
            utils.get_noise_multiplier(
                target_epsilon=epsilon,
                target_delta=delta,
                sample_rate=sample_rate,
                steps=steps,
                accountant=kind,
            )
        )


class PrivacyLedger:
    """One peer's privacy account of a run: σ, q and δ fixed, steps counted.

    Args:
        noise_multiplier, sample_rate, delta: the run's σ, this peer's q and δ.
        target: the budget ε (None: none).
        kind: the accountant (``"rdp"`` or ``"prv"``).
        steps: steps already taken (a resumed peer).
    """

    def __init__(
        self,
        noise_multiplier: float,
        sample_rate: float,
        delta: float,
        *,
        target: float | None = None,
        kind: str = "rdp",
        steps: int = 0,
    ) -> None:
        self.noise_multiplier = float(noise_multiplier)
        self.sample_rate = float(sample_rate)
        self.delta = float(delta)
        self.target = target
        self.accountant = PrivacyAccountant(kind)
        self.steps = steps
        self._epsilons: dict[int, float] = {0: 0.0}
        self._budget: int | None = None
        self._rdp_one: Any = None
        if kind == "rdp":
            analysis = _opacus("accountants.analysis.rdp")
            orders = _opacus("accountants.rdp").RDPAccountant.DEFAULT_ALPHAS
            self._rdp_one = analysis.compute_rdp(
                q=self.sample_rate, noise_multiplier=self.noise_multiplier, steps=1, orders=orders
            )
            self._orders = orders
            self._spent = analysis.get_privacy_spent

    def epsilon_at(self, steps: int) -> float:
        """ε after ``steps`` steps of this account (cached)."""
        if steps not in self._epsilons:
            if self._rdp_one is not None:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)
                    epsilon, _ = self._spent(
                        orders=self._orders, rdp=self._rdp_one * steps, delta=self.delta
                    )
                self._epsilons[steps] = float(epsilon)
            else:
                self._epsilons[steps] = self.accountant.epsilon_with(
                    self.noise_multiplier, self.sample_rate, steps, self.delta
                )
        return self._epsilons[steps]

    @property
    def epsilon(self) -> float:
        """ε after the steps taken so far."""
        return self.epsilon_at(self.steps)

    def budget_steps(self, limit: int = _STEP_CAP) -> int:
        """The most steps (at most ``limit``) whose ε stays within the target (``limit``
        without a target). ε grows with the steps: an exponential search from the steps
        taken, then bisection, so ε is only evaluated up to about twice the budget (Opacus'
        PRV accountant slows down with the steps; the RDP ledger does not)."""
        if self.target is None:
            return limit
        if self._budget is not None and self._budget < limit:
            return self._budget
        low, high = 0, limit + 1  # ε(low) <= target < ε(high), ε(limit + 1) taken as too much
        probe = max(self.steps, 1)
        while probe <= limit:
            if self.epsilon_at(probe) <= self.target:
                low, probe = probe, probe * 2
            else:
                high = probe
                break
        else:
            if self.epsilon_at(limit) <= self.target:
                return limit
            high = limit
        while high - low > 1:
            middle = (low + high) // 2
            if self.epsilon_at(middle) <= self.target:
                low = middle
            else:
                high = middle
        self._budget = low
        return low

    def allows_step(self) -> bool:
        """Whether one more step keeps ε within the target."""
        return self.steps + 1 <= self.budget_steps(max(self.steps + 1, _STEP_CAP))

    def record_step(self) -> None:
        """Count one step taken."""
        self.steps += 1

    def summary(self) -> dict[str, Any]:
        """What a status report shows: ε, δ, σ, q, steps and the budget."""
        epsilon = self.epsilon
        return {
            "epsilon": epsilon if math.isfinite(epsilon) else None,
            "delta": self.delta,
            "noise_multiplier": self.noise_multiplier,
            "sample_rate": self.sample_rate,
            "steps": self.steps,
            "target_epsilon": self.target,
        }
