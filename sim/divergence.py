"""A run whose model stops being finite: how the simulator notices it and what it says.

A learning rate that is too large, or an attack that pushes a robust rule's output away
geometrically (He, Karimireddy & Jaggi 2022, the dissensus attack on a node without an honest
majority), makes some honest peer's parameters overflow to Inf, then NaN. Nothing after that
is a measurement, so :func:`sim.runner.run` checks the honest models after every round and
ends the run at the first round that leaves one of them non-finite: it keeps the records
evaluated before, marks each of them with ``diverged_at = r`` (:class:`sim.metrics.Record`),
and reports a :class:`Divergence` (``diverged at round 38: 1 of 5 honest peers have a
non-finite model (peer 0)``). The check is one sum per model row each round (a row whose sum
is finite holds no NaN and no Inf); only a row whose sum is not finite is checked value by
value, since a sum of large finite values can overflow too.

Exit status of the command line (documented in docs/simulator.md): ``gossipnet sim run``
writes what it recorded and exits with :data:`EXIT_DIVERGED`; ``sim sweep`` and ``sim
compare`` finish the other runs and exit with it when a run diverged and none failed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

#: Exit status of ``gossipnet sim`` when a run diverged (1: a run failed, 2: bad input).
EXIT_DIVERGED = 3

#: Peer ids named in a divergence message before it abbreviates.
_SHOWN = 8


@dataclass(frozen=True)
class Divergence:
    """Round ``round`` left the models of ``peers`` (ids of honest peers, ascending)
    non-finite, out of ``models`` evaluated models (the honest peers, or a baseline's one
    model, whose id is 0)."""

    round: int
    peers: tuple[int, ...]
    models: int

    def message(self) -> str:
        """``diverged at round 38: 1 of 5 honest peers have a non-finite model (peer 0)``."""
        shown = ", ".join(str(peer) for peer in self.peers[:_SHOWN])
        more = f", ... ({len(self.peers) - _SHOWN} more)" if len(self.peers) > _SHOWN else ""
        ids = f"peer{'s' if len(self.peers) != 1 else ''} {shown}{more}"
        if self.models == 1:
            return f"diverged at round {self.round}: the model is non-finite"
        return (
            f"diverged at round {self.round}: {len(self.peers)} of {self.models} honest peers "
            f"have a non-finite model ({ids})"
        )


def nonfinite_rows(models: Tensor) -> Tensor:
    """Indices of the rows of ``models [m, d]`` that hold a NaN or an Inf, ascending.

    One sum per row first: a finite sum proves its row finite. Rows whose sum is not finite
    (a NaN or an Inf, or finite values whose sum overflows) are then checked value by value.
    """
    if models.dim() != 2:
        raise ValueError(f"models: must be a [m, d] tensor, got shape {tuple(models.shape)}")
    with torch.no_grad():
        suspects = (~torch.isfinite(models.sum(dim=1))).nonzero().squeeze(1)
        if suspects.numel() == 0:
            return suspects
        bad = ~torch.isfinite(models[suspects]).all(dim=1)
        return suspects[bad]


def find_divergence(round_: int, models: Tensor, honest: Tensor) -> Divergence | None:
    """The :class:`Divergence` at ``round_`` if an honest model in ``models`` is non-finite,
    else None.

    ``models`` is every peer's model (``[n, d]``, one row per peer: Byzantine rows are not
    looked at), the honest peers' models (``[m, d]``, in peer order), or a baseline's single
    model (``[1, d]``); ``honest [n]`` (bool) maps rows to peer ids.
    """
    rows = nonfinite_rows(models)
    if rows.numel() == 0:
        return None
    honest = honest.to(rows.device)
    if models.shape[0] == honest.numel() and models.shape[0] > 1:
        rows = rows[honest[rows]]  # every peer's row: keep the honest ones
        count = int(honest.sum())
    else:
        ids = honest.nonzero().squeeze(1)
        count = int(models.shape[0])
        if count == ids.numel():
            rows = ids[rows]
    if rows.numel() == 0:
        return None
    return Divergence(round_, tuple(int(peer) for peer in rows.tolist()), count)
