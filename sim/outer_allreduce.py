"""DiLoCo as its paper runs it: the exact mean of the pseudo-gradients by ring all-reduce.

The ``allreduce`` baseline with an ``outer_optimizer`` (and ``local_steps`` H) runs the
shared rule :class:`gossip.outer.DiLoCo` with an exact mean instead of a neighbour mix:
every live peer takes H inner steps, the pseudo-gradients ``phi_i - theta_i`` of the live
peers are averaged exactly (what an all-reduce gives every member), and each peer steps its
outer optimizer with that mean (Douillard et al. 2023). Time and bytes are those of a ring
all-reduce of the pseudo-gradient (``2(p-1)/p`` of its bytes sent per member); the update
is the rule's, so ``allreduce`` with ``outer_optimizer`` and ``diloco`` on the complete
graph with uniform weights give the same models and differ only in what the network costs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
from torch import Tensor

from gossip.outer import DiLoCo
from sim.algorithms import Context
from sim.gossip_runner import SynchronousGossip, keeping_rows
from sim.network import ring_allreduce_time
from topologies.schedules import Static


class OuterAllReduce(SynchronousGossip):
    """:class:`gossip.outer.DiLoCo` over an exact all-reduce mean of pseudo-gradients.

    Args:
        algorithm: the rule (its compressor must be ``none``: an all-reduce sums dense
            vectors).
        n: the number of peers.
    """

    def __init__(self, algorithm: DiLoCo, n: int, *, name: str = "allreduce") -> None:
        if algorithm.compressor.codec != "none":
            raise ValueError("compressor: an all-reduce averages dense pseudo-gradients")
        super().__init__(algorithm, Static(sp.eye(n, format="csr")), name=name)

    def _exchange(
        self,
        ctx: Context,
        table: Any,
        alive: Tensor,
        steps: np.ndarray,
        batch: tuple[Tensor, Tensor] | None = None,
        *,
        exchange: int = 0,
    ) -> tuple[np.ndarray, Tensor | None]:
        """The live peers' exact mean pseudo-gradient, then every live peer's outer step;
        a dead peer keeps its state (it takes part in no all-reduce)."""
        message = self.algorithm.message(self.state)
        members = alive.nonzero().squeeze(1)
        p = int(members.numel())
        sent_bytes = np.zeros(ctx.n)
        if p == 0:
            return sent_bytes, None
        mean = message[members].mean(dim=0)
        received = mean.expand(ctx.n, 1, -1)  # a view: no [n, d] copy
        weights = torch.ones((ctx.n, 1), dtype=message.dtype, device=message.device)
        # own weight 1 - 1 = 0: every live peer takes the mean itself; a dead one keeps its state
        with keeping_rows(self.state, ctx.n, (~alive).nonzero().squeeze(1)):
            self.algorithm.combine(self.state, message, received, weights)
        if p > 1:
            sent_bytes[members.cpu().numpy()] = 2 * (p - 1) / p * ctx.model_bytes
        return sent_bytes, None

    def _send_time(self, ctx: Context, table: Any, alive: Tensor) -> np.ndarray:
        """Every member waits for the ring all-reduce of the pseudo-gradient."""
        members = alive.nonzero().squeeze(1).cpu().numpy()
        return np.full(ctx.n, ring_allreduce_time(ctx.links, ctx.model_bytes, members))
