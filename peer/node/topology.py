"""Neighbours from a ``topologies`` graph over a known peer list (``--topology --peers-file --rank``).

A swarm that knows its members up front lists them in a peer file, one
``HOST:PORT`` per line; rank r is line r (0-based). The topology decides, for
round t, the mixing row of this peer's rank:

    x_r <- W_rr x_r + sum_j W_rj x_j      (row r of W_t, ``topologies.neighbour_table``)

with W from ``topologies.mixing_matrix`` (Metropolis-Hastings by default for an
undirected graph, Xiao & Boyd 2004; uniform 1/(1 + ceil(log2 n)) for the directed
exponential graph, Assran et al. 2019) or from a time-varying
``topologies.Schedule`` (``one-peer-exponential``, Ying et al. 2021;
``random-matching``; ``random-k-out``), built from the spec by
``topologies.build_schedule`` exactly as the simulator builds it. A round trip is
bidirectional, so a peer exchanges with the union of the nodes it receives from and
the nodes that receive from it (its *partners*), and mixes only what row r says it
receives.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import topologies
from peer.node.membership import check_address

topology_names = topologies.topology_names
"""Every name ``--topology`` accepts (re-exported: the spec grammar lives in ``topologies``)."""


def read_peer_list(path: str | Path) -> tuple[str, ...]:
    """The ``HOST:PORT`` lines of a peer file (blank lines and ``#`` comments skipped).

    Raises ``ValueError`` naming the file and line of a malformed or repeated address.
    """
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise ValueError(f"--peers-file: cannot read {path}: {error.strerror or error}") from None
    addresses: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            check_address(line, field=f"--peers-file: {path} line {number}")
        except ValueError as error:
            raise ValueError(f"{error} (each line must be HOST:PORT)") from None
        if line in addresses:
            raise ValueError(f"--peers-file: {path} line {number}: {line} is listed twice")
        addresses.append(line)
    if len(addresses) < 2:
        raise ValueError(
            f"--peers-file: {path} must list at least 2 HOST:PORT lines, got {len(addresses)}"
        )
    return tuple(addresses)


class TopologyNeighbours:
    """Row ``rank`` of a topology's mixing matrices over ``addresses``, round by round.

    Args:
        spec: a topology name with parameters (``ring``, ``exponential``,
            ``random-regular:degree=4,seed=0``) or a schedule (``one-peer-exponential``,
            ``random-matching``, ``random-k-out:k=2``).
        addresses: the swarm's ``HOST:PORT`` list; node i is ``addresses[i]``.
        rank: this peer's node.
        weights: a ``topologies.mixing_matrix`` scheme (``metropolis``, ``max-degree``,
            ``lazy``, ``uniform``); ``None`` = its default for the graph.
        seed: seeds random graphs and schedules that take no explicit ``seed``.
    """

    def __init__(
        self,
        spec: str,
        addresses: Sequence[str],
        rank: int,
        *,
        weights: str | None = None,
        seed: int = 0,
    ) -> None:
        n = len(addresses)
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < n:
            raise ValueError(f"rank must be an integer in [0, {n}) for {n} peers, got {rank!r}")
        self.addresses = tuple(addresses)
        self.rank = rank
        self.name = topologies.parse_spec(spec)[0]
        self.schedule: topologies.Schedule = topologies.build_schedule(
            spec, n, weights=weights, seed=seed
        )
        self._round: int | None = None
        self._weights: dict[str, float] = {}
        self._self_weight = 1.0
        self._partners: frozenset[str] = frozenset()

    @property
    def static(self) -> bool:
        return isinstance(self.schedule, topologies.Static)

    def _at(self, t: int) -> None:
        if self._round == t or (self.static and self._round is not None):
            return
        table = self.schedule.neighbour_table(t)
        row = self.rank
        incoming = {
            self.addresses[int(j)]: float(w)
            for j, w, present in zip(table.index[row], table.weight[row], table.mask[row])
            if present
        }
        outgoing = {
            self.addresses[i]
            for i in range(table.n)
            if (table.index[i][table.mask[i]] == row).any()
        }
        self._round, self._weights = t, incoming
        self._self_weight = float(table.self_weight[row])
        self._partners = frozenset(incoming) | frozenset(outgoing)

    def weights(self, t: int) -> dict[str, float]:
        """``{address of j: W_rank,j}`` for every node this rank receives from in round t."""
        self._at(t)
        return dict(self._weights)

    def self_weight(self, t: int) -> float:
        """``W_rank,rank`` of round t (push-sum needs it explicitly: columns sum to one)."""
        self._at(t)
        return self._self_weight

    def partners(self, t: int) -> frozenset[str]:
        """Addresses this rank exchanges with in round t (it receives from or sends to them)."""
        self._at(t)
        return self._partners
