"""How fast a mixing matrix drives nodes to agreement: spectral gap and rounds to consensus.

Disagreement x - mean(x) shrinks each round by at most rho = ||W - 11ᵀ/n||_2 (for symmetric
stochastic W this is the second largest eigenvalue modulus |λ2|), so after t rounds it is at
most rho^t of what it was (Boyd, Ghosh, Prabhakar & Shah, 2006, "Randomized gossip algorithms").
Small matrices use dense LAPACK for exactness; large ones use ARPACK (``eigsh`` / ``svds``) on
the deflated operator ``x -> W x - mean(x)``, never densifying W.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import LinearOperator, eigsh, svds

#: Up to this many nodes, ``method="auto"`` uses dense eigenvalues; above it, sparse solvers.
DENSE_LIMIT = 128

_METHODS = ("auto", "dense", "sparse")


def _is_symmetric(w: sp.csr_array, tol: float = 1e-12) -> bool:
    diff = sp.csr_array(w - w.T)
    return not diff.data.size or float(np.abs(diff.data).max()) <= tol


def contraction_factor(matrix: sp.sparray | np.ndarray, *, method: str = "auto") -> float:
    """rho = ||W - 11ᵀ/n||_2: the worst-case factor one round shrinks disagreement by.

    For symmetric W this is max |λ| over the eigenvalues of W - 11ᵀ/n, i.e. |λ2| when W is
    stochastic; otherwise the largest singular value. ``method``: ``"auto"`` (dense up to
    :data:`DENSE_LIMIT` nodes), ``"dense"`` or ``"sparse"``.
    """
    if method not in _METHODS:
        raise ValueError(f"method={method!r} is not one of: {', '.join(_METHODS)}")
    w = sp.csr_array(matrix, dtype=np.float64)
    n = w.shape[0]
    if w.shape != (n, n) or n < 1:
        raise ValueError(f"mixing matrix must be square and non-empty, got shape {w.shape}")
    symmetric = _is_symmetric(w)
    if method == "dense" or (method == "auto" and n <= DENSE_LIMIT) or n < 4:
        deflated = w.toarray() - 1.0 / n
        if symmetric:
            return float(np.abs(np.linalg.eigvalsh(deflated)).max())
        return float(np.linalg.norm(deflated, 2))
    transpose = sp.csr_array(w.T)
    operator = LinearOperator(
        (n, n),
        matvec=lambda x: w @ x - x.mean(axis=0),
        rmatvec=lambda x: transpose @ x - x.mean(axis=0),
        dtype=np.float64,
    )
    start = np.random.default_rng(0).standard_normal(n)
    start -= start.mean()
    if symmetric:
        values = eigsh(operator, k=1, which="LM", v0=start, return_eigenvectors=False)
        return float(np.abs(values).max())
    values = svds(operator, k=1, v0=start, return_singular_vectors=False)
    return float(values.max())


def spectral_gap(matrix: sp.sparray | np.ndarray, *, method: str = "auto") -> float:
    """Spectral gap 1 - ||W - 11ᵀ/n||_2, i.e. 1 - |λ2| for symmetric stochastic W.

    Larger is faster; 1 means one round is exact averaging. For the directed exponential graph
    with n a power of two it is 2 / (1 + log2 n) (Ying et al., 2021).
    """
    return 1.0 - contraction_factor(matrix, method=method)


def rounds_to_consensus(
    matrix: sp.sparray | np.ndarray, factor: float = 1e-3, *, method: str = "auto"
) -> int:
    """Rounds t after which disagreement has shrunk by ``factor`` in the worst case:
    the smallest t with rho^t <= factor, rho = ||W - 11ᵀ/n||_2, i.e. ceil(log factor / log rho).

    Raises ``ValueError`` when rho >= 1 (disconnected graph, or weights that are not doubly
    stochastic enough to contract in one round).
    """
    if not 0.0 < factor < 1.0:
        raise ValueError(f"factor={factor} must lie in (0, 1)")
    return rounds_from_contraction(contraction_factor(matrix, method=method), factor)


def rounds_from_contraction(rho: float, factor: float = 1e-3) -> int:
    """Smallest t with rho^t <= factor (see :func:`rounds_to_consensus`)."""
    if not 0.0 < factor < 1.0:
        raise ValueError(f"factor={factor} must lie in (0, 1)")
    if rho >= 1.0 - 1e-15:
        raise ValueError(
            f"the mixing matrix does not contract disagreement (||W - 11ᵀ/n||_2 = {rho:.6g} >= 1): "
            "the graph is disconnected or the weights are not doubly stochastic"
        )
    if rho <= 1e-12:
        return 1
    return max(1, math.ceil(math.log(factor) / math.log(rho) - 1e-9))
