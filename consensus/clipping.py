"""Norm-based rules: geometric median (smoothed Weiszfeld), centered clipping, ClippedGossip."""

from __future__ import annotations

import torch
from torch import Tensor

from consensus._inputs import Neighbourhood, combine, squared_distances_to
from consensus.base import Rule, check_float, check_int
from consensus.order_statistics import CoordinateWiseMedian


def clip_scale(norms: Tensor, tau: Tensor | float) -> Tensor:
    """min(1, tau / ||z||), so that clip(z, tau) = z * clip_scale(||z||, tau) (1 where z = 0)."""
    return torch.where(norms > tau, tau / norms.clamp_min(torch.finfo(norms.dtype).tiny), 1.0)


class GeometricMedian(Rule):
    """Geometric median by smoothed Weiszfeld, spec name ``geometric-median:nu=NU,T=T``.

    v <- sum_c beta_c x_c / sum_c beta_c with beta_c = w_c / max(nu, ||v - x_c||),
    T times, over the set {x_i} + neighbours with mixing weights w (w_ii for
    the own vector). Pillutla, Kakade & Harchaoui, "Robust aggregation for
    federated learning" (RFA, IEEE TSP 2022). Unlike RFA, which starts at the
    weighted mean, v starts at the weighted coordinate-wise median (robust, and
    in d > 1 generically no input itself, where a smoothed Weiszfeld step
    would stall), so a huge outlier cannot drag the start away and few
    iterations suffice. Robust while the Byzantine weight is below 1/2.
    """

    name = "geometric-median"

    def __init__(self, nu: float = 1e-6, T: int = 5) -> None:
        self.nu = check_float(self.name, "nu", nu, 0.0, strict=True)
        self.T = check_int(self.name, "T", T, 1)
        super().__init__()

    def _aggregate(self, hood: Neighbourhood) -> Tensor:
        estimate = CoordinateWiseMedian()._aggregate(hood)
        tiny = torch.finfo(estimate.dtype).tiny
        for _ in range(self.T):
            distance = squared_distances_to(hood, estimate).sqrt_().clamp_min_(self.nu)
            own_distance = torch.linalg.vector_norm(hood.own - estimate, dim=-1).clamp_min(self.nu)
            beta = hood.weights / distance
            own_beta = hood.self_weight / own_distance
            total = (beta.sum(-1) + own_beta).clamp_min(tiny)
            estimate = combine(hood, own_beta / total, beta / total[:, None])
        return estimate


class CenteredClipping(Rule):
    """Centered clipping, spec name ``centered-clipping:tau=TAU,L=L``.

    v <- v + sum_c w_c clip(x_c - v, tau), L times, with clip(z, tau) =
    z min(1, tau/||z||), over the set {x_i} + neighbours with mixing weights
    w; v starts from the previous call's result (the centre, kept in this
    object per node of the batch; the own vector on the first call).
    Karimireddy, He & Jaggi, "Learning from history for Byzantine robust
    optimization" (ICML 2021). ``reset()`` forgets the centre.
    """

    name = "centered-clipping"

    def __init__(self, tau: float = 1.0, L: int = 1) -> None:
        self.tau = check_float(self.name, "tau", tau, 0.0)
        self.L = check_int(self.name, "L", L, 1)
        self.centre: Tensor | None = None
        super().__init__()

    @property
    def stateful(self) -> bool:
        return True

    def reset(self) -> None:
        self.centre = None

    def _start(self, hood: Neighbourhood) -> Tensor:
        """The centre this call starts from: the previous result, or ``own`` on the first call."""
        centre = self.centre
        if centre is None:
            return hood.own
        if centre.shape != hood.own.shape or centre.dtype != hood.own.dtype:
            raise ValueError(
                f"centered-clipping keeps a centre of shape {list(centre.shape)} from the previous "
                f"call but got {hood.batch} nodes of dimension {hood.dim}; call reset() when the "
                "batch or the dimension changes"
            )
        return centre

    def _kept_own(self, hood: Neighbourhood) -> None:
        """A node alone returned its own vector, so that is its next centre."""
        centre = self._start(hood)
        self.centre = torch.where(hood.alone[:, None], hood.own, centre).detach().clone()

    def _aggregate(self, hood: Neighbourhood) -> Tensor:
        centre = self._start(hood)
        for _ in range(self.L):
            # v + sum_c a_c (x_c - v) with a_c = w_c min(1, tau / ||x_c - v||)
            scale = clip_scale(squared_distances_to(hood, centre).sqrt_(), self.tau)
            own_norm = torch.linalg.vector_norm(hood.own - centre, dim=-1)
            own_coefficient = hood.self_weight * clip_scale(own_norm, self.tau)
            coefficients = hood.weights * scale
            moved = combine(hood, own_coefficient, coefficients)
            stay = 1.0 - own_coefficient - coefficients.sum(-1)
            centre = moved.addcmul_(centre, stay[:, None])
        self.centre = centre.detach().clone()
        return centre


class ClippedGossip(Rule):
    """ClippedGossip / self-centred clipping, spec name ``clipped-gossip:tau=TAU|auto,f=F``.

    x_i <- sum_j W_ij (x_i + clip(x_j - x_i, tau_i)) = x_i + sum_{j != i} W_ij clip(x_j - x_i, tau_i).
    He, Karimireddy & Jaggi, "Byzantine-robust decentralized learning via
    ClippedGossip" (2022). With a fixed ``tau`` every node uses it; with
    ``tau=auto`` node i picks tau_i from its own neighbourhood: the distance
    ||x_j - x_i|| of its (f+1)-th farthest present neighbour, so that the f
    farthest (the possible Byzantine ones) are clipped to the radius of an
    honest one (tau_i = 0, i.e. keep x_i, if it has at most f neighbours).
    The radius used in the last call is kept in ``self.radius [*]``.
    tau -> inf gives plain gossip averaging; tau = 0 returns x_i.
    """

    name = "clipped-gossip"

    def __init__(self, tau: float | str = "auto", f: int = 1) -> None:
        if tau != "auto":
            tau = check_float(self.name, "tau", tau, 0.0)
        self.tau: float | str = tau
        self.f = check_int(self.name, "f", f, 0)
        self.radius: Tensor | None = None
        super().__init__()

    def reset(self) -> None:
        self.radius = None

    def _kept_own(self, hood: Neighbourhood) -> None:
        """A node alone kept x_i: its radius is 0, as ``tau=auto`` gives a node with <= f neighbours."""
        if self.radius is None or self.radius.shape != hood.alone.shape:
            self.radius = torch.zeros(hood.batch, dtype=hood.own.dtype, device=hood.own.device)
        self.radius = self.radius.masked_fill(hood.alone, 0.0)

    def _aggregate(self, hood: Neighbourhood) -> Tensor:
        norms = squared_distances_to(hood, hood.own).sqrt_()  # [B, k], 0 where absent
        if self.tau == "auto":
            descending = norms.masked_fill(~hood.mask, -1.0).sort(dim=-1, descending=True).values
            padded = torch.nn.functional.pad(descending, (0, 1), value=0.0)
            position = hood.budget(self.f).clamp_max(hood.k).view(-1, 1)
            tau = padded.gather(-1, position).clamp_min(0.0)  # [B, 1]
        else:
            tau = torch.full(
                (hood.batch, 1), float(self.tau), dtype=norms.dtype, device=norms.device
            )
        self.radius = tau.squeeze(-1).detach().clone()
        coefficients = hood.weights * clip_scale(norms, tau)
        # x_i + sum_j a_j (x_j - x_i) = (1 - sum_j a_j) x_i + sum_j a_j x_j
        return combine(hood, 1.0 - coefficients.sum(-1), coefficients)
