"""``[privacy] pair = [u, v]``: ε of node u's data against node v's view, in a run's records.

:class:`PairPrivacy` holds what :mod:`workloads.network_privacy` needs of the run (the static
mixing matrix W, the gossip steps K, the local steps H, SGD's momentum, σ and δ) and gives,
after r rounds, the two columns of a record (docs/privacy.md, "Noisy gossip (Muffliato)"):

* ``epsilon_pair``: ``min(local ε, ε of v's exact view)`` (:func:`view_coefficient`), the
  account of u's data against v (under the linear model :mod:`workloads.network_privacy`
  states);
* ``epsilon_pair_muffliato``: ``min(local ε, ε of the paper's sum)``
  (:func:`muffliato_coefficient`), for comparison with Cyffers et al. (2022); it ignores
  that the messages share their noise, and can be below what v's view really allows.
"""

from __future__ import annotations

import numpy as np

from workloads.network_privacy import muffliato_coefficient, pair_epsilon, view_coefficient

__all__ = ["PairPrivacy"]


class PairPrivacy:
    """The pairwise account of one run (module doc); ``weights`` is W ``[n, n]``."""

    def __init__(
        self,
        weights: np.ndarray,
        pair: tuple[int, int],
        *,
        gossip_steps: int,
        local_steps: int,
        momentum: float,
        nesterov: bool,
        noise: float,
        delta: float,
    ) -> None:
        self.weights = np.asarray(weights, dtype=np.float64)
        self.u, self.v = pair
        self.gossip_steps = gossip_steps
        self.local_steps = local_steps
        self.momentum = momentum
        self.nesterov = nesterov
        self.noise = noise
        self.delta = delta
        self._cache: dict[int, tuple[float, float]] = {}

    def epsilons(self, rounds: int, local: float) -> tuple[float, float]:
        """``(epsilon_pair, epsilon_pair_muffliato)`` after ``rounds`` rounds, each at most
        the ``local`` ε (0 before the first round)."""
        if rounds < 1:
            return (0.0, 0.0)
        if rounds not in self._cache:
            view = view_coefficient(
                self.weights,
                self.u,
                self.v,
                rounds=rounds,
                gossip_steps=self.gossip_steps,
                local_steps=self.local_steps,
                momentum=self.momentum,
                nesterov=self.nesterov,
            )
            paper = (
                muffliato_coefficient(
                    self.weights, self.u, self.v, rounds=rounds, gossip_steps=self.gossip_steps
                )
                * self.local_steps
            )  # H noisy steps before each round's messages, as one each
            self._cache[rounds] = (
                pair_epsilon(view, self.noise, self.delta),
                pair_epsilon(paper, self.noise, self.delta),
            )
        view_eps, paper_eps = self._cache[rounds]
        return (min(local, view_eps), min(local, paper_eps))
