"""Pairwise network privacy of noisy gossip: how much node v learns of node u's data.

The run (Muffliato-SGD: Cyffers, Even, Bellet & Massoulié, "Muffliato: Peer-to-Peer Privacy
Amplification for Decentralized Optimization and Averaging", NeurIPS 2022): every node adds
its private noisy step once (DP-SGD, noise ``σC`` on a sum of gradients clipped to ``C``),
then all nodes mix ``K`` times, ``x <- W x`` (``gossip_steps``), for ``R`` rounds. Node v is
honest but curious: its **view** is every message it receives, i.e. ``x_w`` of each of its
in-neighbours ``w`` (``W[v, w] > 0``, ``w != v``) at each of the ``R K`` gossip steps; it
also knows its own data and noise. Pairwise network DP (the paper's Definition 2) bounds
what that view reveals about one record of u's data, as a Rényi DP curve of order α.

Everything below is in units of the noise: one local step of u changes u's noisy step by a
vector of norm at most ``C`` (the clipped gradient of one record, the sensitivity the
mechanism of :mod:`workloads.privacy` gives) against noise ``N(0, σ²C²)``, so only σ and a
graph coefficient ``S`` remain: the view is a Gaussian mechanism with RDP
``ε(α) = α S / (2σ²)``.

Two coefficients are computed, both pure numpy over the mixing matrix ``W`` (row ``v``
holds the weights v mixes with):

* :func:`muffliato_coefficient`, the paper's accounting: each message ``x_w`` at gossip
  step ``s`` after u's noisy step is treated as a Gaussian mechanism of its own, with
  sensitivity ``(W^s)_{wu}`` and noise ``σ ‖(W^s)_{w,:}‖``, and all are composed
  (the sum of Theorem 1 of the NeurIPS paper, for gossip averaging,
  ``Σ_s Σ_{w ∈ N(v)} (W^s)²_{wu} / ‖(W^s)_{w,:}‖²``, summed over the R noisy steps, each
  counted in every message after it as the corrected analysis of Muffliato-GD in the
  paper's arXiv version does). It ignores that the messages share their noise: v can
  combine them, cancel most of the noise, and learn more than the sum says. On a ring of
  8 with one noisy step and K = 3, the node at distance 2 gets ``S = 0.54`` from the sum,
  while its view determines u's noisy value exactly (``S = 1``, local DP, no amplification;
  :func:`view_coefficient`; tests/workloads/test_muffliato.py). So this sum is reported
  for comparison with the paper, and is **not** a guarantee.
* :func:`view_coefficient`, the exact Gaussian-mechanism analysis of v's whole view, as
  Koskela & Kulkarni (2025, "Differential Privacy Analysis of Decentralized Gossip Averaging
  under Varying Threat Models") frame it: the view is ``Y = M z`` with ``z`` every node's
  noisy step of every local step, a linear map ``M`` fixed by ``W``, ``K``, ``R`` and the
  optimizer's momentum. With v's own columns removed (it knows them) as ``M'``, the noise of
  Y has covariance ``σ² M' M'ᵀ`` and one record of u shifts the mean by ``Σ_t M e_t d_t``,
  ``‖d_t‖ ≤ 1`` chosen adaptively per step t, so the Rényi divergence of order α is
  ``α/(2σ²) Σ_{t,t'} d_tᵀ d_t' G_{tt'}`` with ``G_{tt'} = e_tᵀ P e_t'`` and ``P`` the
  projection onto the row space of ``M'``; this is bounded by ``S = Σ_{t,t'} |G_{tt'}|``
  (attained when every entry is >= 0 and the record pushes the same way each step), and
  by ``S <= R H`` (the composition of u's ``R H`` noisy steps, which v's view is a
  post-processing of). This is what ``epsilon_pair`` reports.

Neither uses Poisson subsampling (both assume the record is in every batch, a valid bound);
the local ε of :mod:`workloads.accountant` does, so a run reports ``min(local ε, pair ε)``:
both guarantees hold for v. RDP is converted to (ε, δ) by :func:`rdp_to_epsilon`, the
conversion Opacus' RDP accountant uses (Balle et al. 2020, "Hypothesis Testing
Interpretations and Renyi Differential Privacy", Theorem 21), over :data:`ORDERS`.

What the linear model assumes: the update is linear in the noisy steps (SGD, with momentum
or Nesterov momentum, a constant learning rate, no weight decay), the adapt-then-combine
order (combine-then-adapt sends a subset of the same messages, so the bound holds for it
too), and every message arrives (W as given). Like the paper's analysis of Muffliato-GD and
the linear-systems analyses after it, it treats the noise-free part of every other node's
step as known to v (fixed inputs of the linear map): exact for gossip averaging of fixed
values; for training, where the other nodes' gradients depend on noise v has not seen, it
is the model's account, not a theorem about every nonlinear loss. The local ε needs no such
assumption.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "MAX_VIEW_SIZE",
    "ORDERS",
    "muffliato_coefficient",
    "pair_epsilon",
    "rdp_to_epsilon",
    "received_from",
    "view_coefficient",
]

ORDERS: tuple[float, ...] = (
    *(1 + x / 10.0 for x in range(1, 100)),
    *(float(a) for a in range(12, 64)),
    128.0,
    256.0,
    512.0,
)
"""The Rényi orders α the conversion minimizes over (Opacus' default grid)."""

MAX_VIEW_SIZE = 4_000_000
"""The largest view matrix (messages times noisy inputs) :func:`view_coefficient` forms."""


def _check(weights: np.ndarray, u: int, v: int, rounds: int, gossip_steps: int) -> np.ndarray:
    matrix = np.asarray(weights, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise ValueError(f"weights: must be a square matrix, got shape {matrix.shape}")
    n = matrix.shape[0]
    for name, node in (("u", u), ("v", v)):
        if isinstance(node, bool) or not isinstance(node, int | np.integer) or not 0 <= node < n:
            raise ValueError(f"{name}: must be a node in 0..{n - 1}, got {node!r}")
    if u == v:
        raise ValueError(f"u, v: must be two different nodes, got {u} twice")
    for name, value in (("rounds", rounds), ("gossip_steps", gossip_steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
    return matrix


def received_from(weights: np.ndarray, v: int) -> np.ndarray:
    """The nodes whose messages v receives: ``w != v`` with ``W[v, w] > 0``."""
    row = np.asarray(weights)[v]
    senders = np.flatnonzero(row > 0)
    return senders[senders != v]


def muffliato_coefficient(
    weights: np.ndarray, u: int, v: int, *, rounds: int, gossip_steps: int
) -> float:
    """The paper's sum (module doc): ``S = Σ_{s=0}^{RK-1} (R - ⌊s/K⌋) Σ_{w ∈ N(v)}
    (W^s)²_{wu} / ‖(W^s)_{w,:}‖²``, where ``R - ⌊s/K⌋`` counts the noisy steps that lie
    ``s`` gossip steps before a message v receives. RDP ``α S / (2σ²)``; not a guarantee."""
    matrix = _check(weights, u, v, rounds, gossip_steps)
    senders = received_from(matrix, v)
    rows = np.eye(matrix.shape[0])[senders]  # rows w of W^s, s = 0
    total = 0.0
    for lag in range(rounds * gossip_steps):
        norms = np.einsum("ij,ij->i", rows, rows)
        total += (rounds - lag // gossip_steps) * float(np.sum(rows[:, u] ** 2 / norms))
        rows = rows @ matrix
    return total


def _view(
    matrix: np.ndarray,
    v: int,
    rounds: int,
    gossip_steps: int,
    local_steps: int,
    momentum: float,
    nesterov: bool,
) -> np.ndarray:
    """``M``: v's received messages (rows) as linear functions of every node's noisy step
    of every local step (columns ``(t * H + h) * n + node``)."""
    n = matrix.shape[0]
    senders = received_from(matrix, v)
    inputs = rounds * local_steps * n
    state = np.zeros((n, inputs))  # x, as a function of the noisy steps
    buffer = np.zeros((n, inputs))  # the momentum buffer
    rows = []
    for t in range(rounds):
        for h in range(local_steps):
            fresh = np.zeros((n, inputs))
            start = (t * local_steps + h) * n
            fresh[:, start : start + n] = np.eye(n)
            buffer = momentum * buffer + fresh
            state = state - (fresh + momentum * buffer if nesterov else buffer)
        for _ in range(gossip_steps):
            rows.append(state[senders])
            state = matrix @ state
    return np.concatenate(rows)


def view_coefficient(
    weights: np.ndarray,
    u: int,
    v: int,
    *,
    rounds: int,
    gossip_steps: int,
    local_steps: int = 1,
    momentum: float = 0.0,
    nesterov: bool = False,
) -> float:
    """The exact analysis of v's view (module doc): ``S = min(R H, Σ_{t,t'} |G_{tt'}|)``,
    ``G`` the projection onto the row space of v's view map without v's own inputs,
    restricted to u's ``R H`` inputs. RDP ``α S / (2σ²)``.

    Args:
        weights: W ``[n, n]``, row ``i`` the weights node i mixes with.
        u, v: the node whose data is protected, and the curious node.
        rounds: R, noisy rounds.
        gossip_steps: K, gossip steps after each round's local steps.
        local_steps: H, noisy optimizer steps per round.
        momentum, nesterov: SGD's heavy-ball momentum μ (``b <- μ b + z; x <- x - b``) and
            Nesterov's variant (``x <- x - (z + μ b)``).
    """
    matrix = _check(weights, u, v, rounds, gossip_steps)
    if isinstance(local_steps, bool) or not isinstance(local_steps, int) or local_steps < 1:
        raise ValueError(f"local_steps: must be an integer >= 1, got {local_steps!r}")
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"momentum: must be in [0, 1), got {momentum!r}")
    n = matrix.shape[0]
    inputs = rounds * local_steps * n
    messages = rounds * gossip_steps * len(received_from(matrix, v))
    if messages * inputs > MAX_VIEW_SIZE:
        raise ValueError(
            f"the view of node {v} has {messages} messages of {inputs} noisy inputs; at most "
            f"{MAX_VIEW_SIZE} entries (fewer rounds, gossip steps or nodes)"
        )
    if messages == 0:
        return 0.0
    view = _view(matrix, v, rounds, gossip_steps, local_steps, momentum, nesterov)
    steps = np.arange(rounds * local_steps) * n
    known = steps + v  # v's own noisy steps: it knows them
    unknown = np.setdiff1d(np.arange(inputs), known)
    reduced = view[:, unknown]
    # orthonormal basis of the row space of M' (right singular vectors of nonzero values)
    _, values, basis = np.linalg.svd(reduced, full_matrices=False)
    tolerance = values.max(initial=0.0) * max(reduced.shape) * np.finfo(np.float64).eps
    basis = basis[values > tolerance]
    columns = np.searchsorted(unknown, steps + u)  # u's inputs among the unknown ones
    projected = basis[:, columns]  # [rank, R H]
    gram = projected.T @ projected
    return float(min(rounds * local_steps, np.abs(gram).sum()))


def rdp_to_epsilon(
    rdp: np.ndarray | float, delta: float, orders: tuple[float, ...] = ORDERS
) -> float:
    """ε at δ from RDP ``rdp[i]`` at order ``orders[i]``: ``min_α rdp(α) + log((α-1)/α)
    - (log δ + log α) / (α - 1)`` (Balle et al. 2020, Theorem 21; what Opacus' RDP
    accountant uses), at least 0."""
    alphas = np.asarray(orders, dtype=np.float64)
    curve = np.broadcast_to(np.asarray(rdp, dtype=np.float64), alphas.shape)
    eps = curve + np.log1p(-1 / alphas) - (math.log(delta) + np.log(alphas)) / (alphas - 1)
    return float(max(0.0, np.nanmin(eps)))


def pair_epsilon(coefficient: float, noise: float, delta: float) -> float:
    """ε at δ of a Gaussian mechanism with RDP ``α S / (2σ²)`` (``S = coefficient``,
    ``σ = noise``): :func:`rdp_to_epsilon` of that curve; 0 when ``S = 0``."""
    if coefficient <= 0:
        return 0.0
    alphas = np.asarray(ORDERS)
    return rdp_to_epsilon(alphas * coefficient / (2 * noise**2), delta)
