"""DP-SGD for one peer, written once for both runners (Abadi et al. 2016, "Deep Learning with
Differential Privacy", CCS).

One private step of peer i at step t, on the batch ``S`` that Poisson sampling drew (each of
the peer's ``N_i`` examples in with probability ``q_i = B / N_i``)::

    g_i = ( Σ_{s ∈ S} clip_C(∇ℓ(x; s)) + σ C z ) / B,   clip_C(g) = g · min(1, C / ‖g‖₂),
    z ~ N(0, I_d)

``‖g‖₂`` is over all parameters together, ``B`` the expected batch size ``q_i N_i`` (so the
sum is divided by a constant, not by ``|S|``, which would leak it), ``σ`` the noise multiplier
and ``C`` the clipping norm. Per-sample gradients come from ``torch.func`` (``vmap`` over the
samples of ``grad`` of ``functional_call``); the simulator maps that over its peers with one
more ``vmap``. Frozen parameters (``requires_grad=False``) are neither clipped over nor noised.

Sampling (``PrivacyConfig.sampling``):

- ``"poisson"`` (default): what the accountants analyse. Example ``j`` of peer ``i`` is in
  the batch of step ``t`` when a counter-based uniform ``u(seed, i, t, j) < q_i``, so the
  simulator draws every peer's batch in one vectorized call (padded to the step's largest
  batch, with a mask: :class:`PoissonBatchSampler`), and a networked peer draws the same
  examples (:func:`poisson_batches`).
- ``"fixed"``: the run's ordinary batches of exactly ``B`` (``workloads.batching``, with
  replacement by default). The accountants' Poisson analysis does not strictly apply to them;
  the ε reported is that analysis at ``q = B / N_i`` all the same (docs/privacy.md says so).

The noise ``z`` of peer i at step t is counter-based too (:func:`gaussian_noise`: SplitMix64 of
(seed, i, t, coordinate), Box-Muller), so the simulator draws all n peers' noise in one call and
a peer with the same seed draws its own row of it: same seed, same noise. It is reproducible
by design, so it is only as secret as its seed (docs/privacy.md).

The ε these steps spend is counted by :mod:`workloads.accountant`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap

from workloads.batching import splitmix64
from workloads.datasets import Dataset

__all__ = [
    "ACCOUNTANTS",
    "DEFAULT_DELTA",
    "SAMPLINGS",
    "PoissonBatchSampler",
    "PrivacyConfig",
    "clipped_sum",
    "gaussian_noise",
    "poisson_batches",
    "poisson_mask",
    "private_gradient",
    "privatize",
    "sample_rates",
]

SAMPLINGS = ("poisson", "fixed")
"""``PrivacyConfig.sampling``: Poisson sampling (what the accountants assume) or the run's
fixed-size batches (the Poisson analysis then does not strictly apply)."""
ACCOUNTANTS = ("rdp", "prv")
"""``PrivacyConfig.accountant``: Opacus' Rényi DP accountant (Mironov 2017; the subsampled
Gaussian of Mironov, Talwar & Zhang 2019) or its PRV accountant (Gopi, Lee & Wutschitz 2021)."""
DEFAULT_DELTA = 1e-5
"""δ when none is given."""
PRIVACY_FIELDS = ("noise", "clip", "epsilon", "delta", "sampling", "accountant")
"""The settings of DP-SGD: the simulator's ``[privacy]`` keys, the peer's ``--dp-*`` flags."""


def _positive(name: str, value: object, *, below: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name}: must be a finite number, got {value!r}")
    if not 0 < value < below:
        bound = "" if below == math.inf else f" and < {below:g}"
        raise ValueError(f"{name}: must be > 0{bound}, got {value!r}")
    return float(value)


def _pair(value: object) -> tuple[int, int]:
    nodes = tuple(value) if isinstance(value, list | tuple) else ()
    if len(nodes) != 2 or not all(
        isinstance(node, int) and not isinstance(node, bool) and node >= 0 for node in nodes
    ):
        raise ValueError(f"pair: must be two node indices [u, v], got {value!r}")
    if nodes[0] == nodes[1]:
        raise ValueError(f"pair: u and v must be two different nodes, got {list(nodes)}")
    return (int(nodes[0]), int(nodes[1]))


@dataclass(frozen=True)
class PrivacyConfig:
    """The settings of DP-SGD for every peer of a run, checked at construction.

    A ``ValueError`` names the field (``noise: ...``); the simulator names it
    ``privacy.noise``, the peer ``--dp-noise``.

    Attributes:
        noise: σ, the noise multiplier (noise ``N(0, σ²C²)`` on the summed clipped
            gradients). None: picked from ``epsilon`` for the run's steps and sampling rate
            (Opacus' ``get_noise_multiplier``).
        clip: C, the L2 norm every per-sample gradient is clipped to (over all parameters).
        epsilon: the target ε: with ``noise`` a budget (training stops before the step that
            would pass it); without, it also picks σ. None: no budget (ε is still reported).
        delta: δ of the (ε, δ) guarantee (default 1e-5; keep it below 1 / N).
        sampling: ``"poisson"`` or ``"fixed"`` (:data:`SAMPLINGS`).
        accountant: ``"rdp"`` or ``"prv"`` (:data:`ACCOUNTANTS`).
        pair: ``(u, v)``, two different nodes: the simulator also reports ε of u's data
            against v's view (:mod:`workloads.network_privacy`; docs/privacy.md, "Noisy
            gossip"). Not a peer setting.
    """

    noise: float | None = None
    clip: float | None = None
    epsilon: float | None = None
    delta: float = DEFAULT_DELTA
    sampling: str = "poisson"
    accountant: str = "rdp"
    pair: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.clip is None:
            raise ValueError("clip: is required (the L2 norm per-sample gradients are clipped to)")
        object.__setattr__(self, "clip", _positive("clip", self.clip))
        if self.noise is None and self.epsilon is None:
            raise ValueError("noise: give the noise multiplier, or a target epsilon that picks it")
        if self.noise is not None:
            object.__setattr__(self, "noise", _positive("noise", self.noise))
        if self.epsilon is not None:
            object.__setattr__(self, "epsilon", _positive("epsilon", self.epsilon))
        object.__setattr__(self, "delta", _positive("delta", self.delta, below=1.0))
        if self.sampling not in SAMPLINGS:
            raise ValueError(f"sampling: got {self.sampling!r}; allowed: {', '.join(SAMPLINGS)}")
        if self.accountant not in ACCOUNTANTS:
            raise ValueError(
                f"accountant: got {self.accountant!r}; allowed: {', '.join(ACCOUNTANTS)}"
            )
        if self.pair is not None:
            object.__setattr__(self, "pair", _pair(self.pair))

    @classmethod
    def from_table(cls, table: Mapping[str, object]) -> PrivacyConfig:
        """From a table of the :data:`PRIVACY_FIELDS` (an unknown key is a ``ValueError``
        naming it and the allowed keys)."""
        unknown = sorted(set(table) - set(PRIVACY_FIELDS))
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown key; allowed: {', '.join(PRIVACY_FIELDS)}")
        return cls(**table)  # type: ignore[arg-type]


def sample_rates(sizes: Sequence[int] | Tensor, batch_size: int) -> Tensor:
    """``q_i = min(1, B / N_i)`` per peer (float64), the sampling rate each accounts with."""
    sizes = torch.as_tensor(sizes, dtype=torch.float64)
    return (batch_size / sizes).clamp(max=1.0)


# --------------------------------------------------------------------- counter-based draws

_POISSON_SALT = 0x0D5A_11CE
_NOISE_SALT = 0x6A05_5EED
_SCALE_53 = 2.0**-53


def _mix(seed: int, salt: int) -> Tensor:
    value = torch.tensor([(seed ^ salt) & ((1 << 63) - 1)], dtype=torch.int64)
    return splitmix64(splitmix64(value))


def _step_keys(seed: int, salt: int, peers: Tensor, step: int) -> Tensor:
    """``[m]`` keys of (seed, peer, step): SplitMix64 chained, one per peer."""
    base = _mix(seed, salt).to(peers.device)
    return splitmix64(splitmix64(base ^ peers.to(torch.int64)) ^ step)


def _uniform53(bits: Tensor) -> Tensor:
    """Uniform in [0, 1) from the top 53 bits of int64 hashes (float64)."""
    return ((bits >> 11) & ((1 << 53) - 1)).to(torch.float64) * _SCALE_53


def poisson_mask(seed: int, peers: Tensor, step: int, sizes: Tensor, rates: Tensor) -> Tensor:
    """``[m, max(sizes)]`` bool: whether example j of peer ``peers[r]`` is in its batch at
    ``step`` (``u(seed, peer, step, j) < q``, and ``j < sizes[r]``). One vectorized draw."""
    width = int(sizes.max()) if sizes.numel() else 0
    keys = _step_keys(seed, _POISSON_SALT, peers, step)
    slots = torch.arange(width, dtype=torch.int64, device=peers.device)
    uniform = _uniform53(splitmix64(keys[:, None] + slots))
    return (uniform < rates.to(peers.device)[:, None]) & (slots < sizes.to(peers.device)[:, None])


def gaussian_noise(
    seed: int,
    peers: Tensor,
    step: int,
    dim: int,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> Tensor:
    """``[m, dim]`` standard normal noise of peers ``peers [m]`` at ``step``: Box-Muller on two
    counter-based uniforms per coordinate (SplitMix64 of (seed, peer, step, coordinate)),
    computed in float64. Row r depends only on (seed, peers[r], step): a peer draws its own
    row alone, the simulator all rows at once."""
    device = peers.device if device is None else torch.device(device)
    keys = _step_keys(seed, _NOISE_SALT, peers.to(device), step)
    index = torch.arange(dim, dtype=torch.int64, device=device) * 2
    first = 1.0 - _uniform53(splitmix64(keys[:, None] + index))  # (0, 1]: log is finite
    second = _uniform53(splitmix64(keys[:, None] + index + 1))
    normal = torch.sqrt(-2.0 * torch.log(first)) * torch.cos((2.0 * math.pi) * second)
    return normal.to(dtype)


# --------------------------------------------------------------------- sampling


class PoissonBatchSampler:
    """Every peer's Poisson batch at once: ``indices(step) -> (index [n, b], valid [n, b])``.

    Row i holds the training-set indices of the examples of ``partition[i]`` that
    :func:`poisson_mask` put in its batch at ``step``, padded to ``b`` (the step's largest
    batch, at least 1) with a valid index and ``valid`` false. The networked peer draws the
    same examples with :func:`poisson_batches`.
    """

    def __init__(self, partition: Sequence[Tensor], batch_size: int, seed: int = 0) -> None:
        parts = list(partition)
        if not parts or any(len(p) == 0 for p in parts):
            raise ValueError("partition: every peer needs at least one sample")
        self.seed = seed
        self.batch_size = batch_size
        self.sizes = torch.tensor([len(p) for p in parts], dtype=torch.int64)
        self.rates = sample_rates(self.sizes, batch_size)
        self.table = nn.utils.rnn.pad_sequence(parts, batch_first=True, padding_value=0)
        self._peers = torch.arange(len(parts), dtype=torch.int64)

    def indices(self, step: int) -> tuple[Tensor, Tensor]:
        mask = poisson_mask(self.seed, self._peers, step, self.sizes, self.rates)
        counts = mask.sum(dim=1)
        width = max(int(counts.max()), 1)
        # the chosen positions first, in order (a stable sort of "not chosen")
        order = torch.sort((~mask).to(torch.int8), dim=1, stable=True).indices[:, :width]
        valid = torch.arange(width)[None, :] < counts[:, None]
        return self.table.gather(1, order), valid


def poisson_batches(
    dataset: Dataset,
    indices: Tensor,
    batch_size: int,
    *,
    seed: int = 0,
    peer: int = 0,
    start_step: int = 0,
) -> Iterator[tuple[Tensor, Tensor]]:
    """Endless Poisson batches ``(x [b_t, ...], y [b_t])`` of one peer, from ``start_step``:
    the examples of row ``peer`` of :class:`PoissonBatchSampler` (``b_t`` varies; it may be
    0). ``indices`` are the peer's training indices."""
    sizes = torch.tensor([len(indices)], dtype=torch.int64)
    rates = sample_rates(sizes, batch_size)
    peers = torch.tensor([peer], dtype=torch.int64)
    step = start_step
    while True:
        chosen = indices[poisson_mask(seed, peers, step, sizes, rates)[0]]
        chosen = chosen.to(dataset.x_train.device)
        yield dataset.x_train[chosen], dataset.y_train[chosen]
        step += 1


# --------------------------------------------------------------------- the mechanism

LossFunction = Callable[[Tensor, Tensor], Tensor]


def per_sample_gradients(
    module: nn.Module,
    params: Mapping[str, Tensor],
    buffers: Mapping[str, Tensor],
    loss_fn: LossFunction,
    x: Tensor,
    y: Tensor,
) -> tuple[Tensor, Tensor]:
    """``([B, d], [B])``: each sample's gradient of ``loss_fn(module(x_s), y_s)`` with respect
    to ``params`` (flattened in ``params``' order) and its loss; ``vmap`` over the samples of
    ``grad`` of ``functional_call``. Batchable itself (the simulator vmaps it over peers)."""

    def one(views: Mapping[str, Tensor], xs: Tensor, ys: Tensor) -> Tensor:
        output = functional_call(module, (dict(views), dict(buffers)), (xs.unsqueeze(0),))
        return loss_fn(output, ys.unsqueeze(0))

    grads, losses = vmap(grad_and_value(one), in_dims=(None, 0, 0), randomness="different")(
        params, x, y
    )
    samples = x.shape[0]
    flat = torch.cat([grads[name].reshape(samples, -1) for name in params], dim=1)
    return flat, losses


def clipped_sum(per_sample: Tensor, clip: float, valid: Tensor | None = None) -> Tensor:
    """``Σ_s valid_s · g_s · min(1, C / ‖g_s‖₂)`` over the samples: ``per_sample [..., B, d]``
    (``valid [..., B]``, default all) -> ``[..., d]``."""
    norms = torch.linalg.vector_norm(per_sample, dim=-1)
    factor = (clip / (norms + 1e-6)).clamp(max=1.0)
    if valid is not None:
        factor = factor * valid.to(factor.dtype)
    return torch.einsum("...b,...bd->...d", factor, per_sample)


def privatize(
    summed: Tensor, noise: Tensor, *, noise_multiplier: float, clip: float, batch_size: float
) -> Tensor:
    """``(summed + σ C z) / B``: the DP-SGD gradient from the clipped sum and standard normal
    ``noise`` of its shape."""
    return (summed + (noise_multiplier * clip) * noise) / batch_size


def private_gradient(
    module: nn.Module,
    loss_fn: LossFunction,
    x: Tensor,
    y: Tensor,
    *,
    clip: float,
    noise_multiplier: float,
    batch_size: float,
    seed: int,
    peer: int,
    step: int,
) -> tuple[Tensor, float]:
    """One peer's DP-SGD gradient ``[d]`` (trainable parameters in ``module``'s order) on its
    batch ``(x [b, ...], y [b])`` at ``step``, and the batch's mean loss (NaN when empty).

    The simulator computes the same thing for all its peers at once (tested equal)."""
    params = {n: p.detach() for n, p in module.named_parameters() if p.requires_grad}
    dim = sum(p.numel() for p in params.values())
    first = next(iter(params.values()))
    if x.shape[0] == 0:
        summed = torch.zeros(dim, dtype=first.dtype, device=first.device)
        loss = math.nan
    else:
        buffers = {n: b.detach() for n, b in module.named_buffers()}
        per_sample, losses = per_sample_gradients(module, params, buffers, loss_fn, x, y)
        summed = clipped_sum(per_sample, clip)
        loss = float(losses.mean())
    peers = torch.tensor([peer], dtype=torch.int64, device=first.device)
    noise = gaussian_noise(seed, peers, step, dim, dtype=first.dtype)[0]
    gradient = privatize(
        summed, noise, noise_multiplier=noise_multiplier, clip=clip, batch_size=batch_size
    )
    return gradient, loss
