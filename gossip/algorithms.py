"""Decentralized update rules, written once for both runners (simulator batched, peer unbatched).

The runner protocol
===================

Every algorithm is a small object with these methods over the vector convention
(``*`` = all n nodes in the simulator, nothing on a peer) and a :class:`RoundPlan`:

``state = algorithm.init(x)``
    ``x [*, d]`` is the starting model. D-PSGD and CHOCO keep ``x`` itself (no copy: a peer
    passes its :class:`~gossip.flat.FlatParameters` vector and the module sees every update).
``algorithm.model(state) -> [*, d]``
    The vector the local optimizer steps **in place** and the loss is evaluated at
    (``z = x / w`` for push-sum). A peer's flat buffer, a simulator's ``[n, d]`` parameter.
``algorithm.message(state) -> [*, m]``
    Called once per exchange, after that round's local steps: folds them into the
    algorithm's variables and returns the vector every out-neighbour receives (``m = d``,
    except push-sum: ``m = d + 1``, the weight rides as the last coordinate).
``algorithm.combine(state, sent, received, weights, mask=None, self_weight=None) -> state``
    ``sent [*, m]`` is this node's message as receivers decoded it; ``received [*, k, m]`` the
    decoded messages of its k in-neighbours, ``weights [*, k]`` their mixing weights W_ij,
    ``mask [*, k]`` False for padding and for messages that missed the deadline, and
    ``self_weight [*]`` W_ii (only push-sum reads it; row-stochastic rules use the implicit
    ``1 - sum_j W_ij mask_j``). Updates ``state`` in place and returns it.
``algorithm.late(state, arrived, missed) -> state``
    At the start of an exchange, the messages that missed earlier rounds:
    ``arrived = sum_j W_ij m_j``, ``missed = sum_j r_j W_ij m_j`` (r_j rounds late). D-PSGD
    drops them, push-sum adds the mass, CHOCO the increments (docs/algorithms.md).
``algorithm.message_size(d)``, ``algorithm.message_is_model``
    What a message holds (``m``), and whether it is the model itself.

Between ``message`` and ``combine`` the runner transports: with ``c = algorithm.compressor``,
the simulator calls ``c.compress(message, generator)`` (``.values`` is ``sent``; gather rows
with the neighbour table's ``index`` for ``received``), a peer encodes ``message`` once,
decodes its own payload as ``sent``, posts the payload and decodes each neighbour's. Both
runners charge or send exactly the envelope of ``gossip.compression.envelope``.

The plan says when gradients are taken, when the optimizer steps and when to exchange:
:meth:`RoundPlan.phases` lists, for one round, ``"gradient"`` (loss gradient at
``model(state)`` into the flat gradient buffer), ``"step"`` (``optimizer.step()`` on
``model(state)``) and ``"exchange"`` (message, transport, combine)::

    adapt-then-combine, H local steps:  gradient, step, ..., gradient, step, exchange
    combine-then-adapt, H local steps:  gradient, exchange, step, (gradient, step) * (H - 1)
    H = 0 (pure gossip/consensus):      exchange

With K gossip steps (``gossip_steps``, D-PSGD) each ``exchange`` above is K exchanges in a
row, each a full round of messages (``x <- W x`` K times): Muffliato's "noise once, then K
gossip steps" (Cyffers et al., NeurIPS 2022, Algorithm 3 with K plain gossip steps).

A runner iterates ``plan.phases()`` each round and does exactly that; it never branches on
the algorithm. The local optimizer is any torch optimizer: a peer gives it
``FlatParameters.parameter``; the simulator gives it one ``[n, d]`` parameter, which for
element-wise optimizers (SGD, momentum, Nesterov, Adam, AdamW) is exactly n per-node
optimizers.

Pairwise gossip and AD-PSGD exchange with one partner at a time: :mod:`gossip.pairwise`
holds the callee's answer and the caller's update, batched over disjoint pairs for the
simulator; as a neighbour table a matching is ``k = 1`` with weight ``1/2``, so
:class:`DecentralizedSGD` with such a table is pairwise averaging too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

import numpy as np
import torch
from torch import Tensor

from consensus import Aggregator, WeightedMean
from gossip.compression import Compressor, NoCompression

__all__ = [
    "ORDERS",
    "Aggregator",
    "Choco",
    "ChocoState",
    "DecentralizedSGD",
    "GossipAlgorithm",
    "GossipState",
    "NeighbourTableLike",
    "Order",
    "Phase",
    "PushSum",
    "PushSumState",
    "RoundPlan",
    "local_sgd",
    "neighbourhood_fits",
]

Order = Literal["combine-then-adapt", "adapt-then-combine"]
Phase = Literal["gradient", "step", "exchange"]
ORDERS: tuple[Order, ...] = ("combine-then-adapt", "adapt-then-combine")


@dataclass(frozen=True)
class RoundPlan:
    """When to take gradients, step the optimizer and exchange, within one round.

    Args:
        order: ``"adapt-then-combine"`` (ATC: local steps, then mix what they produced) or
            ``"combine-then-adapt"`` (CTA: gradient at the current model, mix, then apply that
            gradient to the mixed model, as in Lian et al. 2017, Algorithm 1).
        local_steps: optimizer steps per exchange, H >= 0 (H > 1 is local SGD; 0 = gossip
            only, no training).
        gossip_steps: exchanges in a row where the plan exchanges, K >= 1 (K > 1: several
            gossip steps after one local step, as in Muffliato).
    """

    order: Order = "adapt-then-combine"
    local_steps: int = 1
    gossip_steps: int = 1

    def __post_init__(self) -> None:
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {self.order!r}")
        steps = self.local_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise ValueError(f"local_steps must be an int >= 0, got {steps!r}")
        gossip = self.gossip_steps
        if isinstance(gossip, bool) or not isinstance(gossip, int) or gossip < 1:
            raise ValueError(f"gossip_steps must be an int >= 1, got {gossip!r}")

    def phases(self) -> tuple[Phase, ...]:
        """The round as a sequence of ``"gradient"``, ``"step"`` and ``"exchange"``."""
        local: tuple[Phase, ...] = ("gradient", "step")
        exchange: tuple[Phase, ...] = ("exchange",)
        exchanges = exchange * self.gossip_steps
        if self.local_steps == 0:
            return exchanges
        if self.order == "adapt-then-combine":
            return local * self.local_steps + exchanges
        return local[:1] + exchanges + local[1:] + local * (self.local_steps - 1)


StateT = TypeVar("StateT")


class GossipAlgorithm(Protocol[StateT]):
    """What the simulator and the peer drive (see module doc).

    Generic in the algorithm's state type; a bare ``GossipAlgorithm`` accepts any of them.
    """

    name: str
    plan: RoundPlan
    compressor: Compressor
    aggregator: Aggregator
    message_is_model: bool
    """Whether a message is the node's model itself (then any snapshot of the model is a
    valid message, e.g. a peer's answer before its first round); False for push-sum's
    ``[x, w]`` and CHOCO's increments, which the rule must account for."""

    def init(self, x: Tensor) -> StateT: ...
    def message_size(self, d: int) -> int: ...
    def model(self, state: StateT) -> Tensor: ...
    def message(self, state: StateT) -> Tensor: ...
    def combine(
        self,
        state: StateT,
        sent: Tensor,
        received: Tensor,
        weights: Tensor,
        mask: Tensor | None = None,
        self_weight: Tensor | None = None,
    ) -> StateT: ...
    def late(self, state: StateT, arrived: Tensor, missed: Tensor) -> StateT: ...


def _check_model(x: Tensor) -> None:
    if not isinstance(x, Tensor) or not x.is_floating_point() or x.dim() < 1:
        raise ValueError(f"x must be a floating-point tensor of shape [*, d], got {x!r:.60}")


def fraction(value: Any, *, open_low: bool = False, open_high: bool = False) -> float:
    """``value`` as a float in [0, 1] with the ends ``open_low``/``open_high`` left out (a
    step size, a decay); else ``ValueError("must be in (0, 1]; got ...")``. The one range
    check of the settings (:mod:`gossip.settings`) and the rules that take them."""
    bracket = ("(" if open_low else "[") + "0, 1" + (")" if open_high else "]")
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
        or value > 1
        or (open_low and value == 0)
        or (open_high and value == 1)
    ):
        raise ValueError(f"must be in {bracket}; got {value!r}")
    return float(value)


def _named(name: str, value: Any, **ends: bool) -> float:
    """:func:`fraction` whose error names the argument (``consensus_step must be in ...``)."""
    try:
        return fraction(value, **ends)
    except ValueError as error:
        raise ValueError(f"{name} {error}") from None


def _compressor(compressor: Compressor | None) -> Compressor:
    if compressor is None:
        return NoCompression()
    if not isinstance(compressor, Compressor):
        raise ValueError(
            f"compressor must be a gossip.Compressor (see build_compressor), got {compressor!r}"
        )
    return compressor


def _aggregator(aggregator: Aggregator | None) -> Aggregator:
    if aggregator is None:
        return WeightedMean()
    if not callable(aggregator):
        raise ValueError(f"aggregator must be a consensus rule, got {aggregator!r}")
    return aggregator


def neighbourhood_fits(aggregator: Aggregator, sizes: Tensor) -> Tensor:
    """``[*]`` bool: whether ``aggregator`` can mix a neighbourhood of ``sizes`` models (own
    model plus the neighbours whose message arrived).

    A node whose neighbourhood does not fit keeps its own state that exchange, in both
    runners: the simulator freezes its row, a peer skips mixing that round and says so.
    """
    check = getattr(aggregator, "check_size", None)
    ok = torch.ones_like(sizes, dtype=torch.bool)
    if check is None:
        return ok
    for size in sizes.unique().tolist():
        try:
            check(int(size))
        except ValueError:
            ok &= sizes != size
    return ok


# ----------------------------------------------------------------------------- D-PSGD


@dataclass
class GossipState:
    """D-PSGD / local SGD / pairwise state: the model ``x [*, d]`` (shared, not copied)."""

    x: Tensor


class DecentralizedSGD:
    """D-PSGD (Lian et al., NeurIPS 2017, "Can decentralized algorithms outperform centralized
    algorithms?"), in both orders, with local steps and a pluggable mixing rule.

    CTA: ``x_i <- sum_j W_ij x_j - eta g_i(x_i)`` (gradient at the pre-mixing model).
    ATC: ``x_i <- sum_j W_ij (x_j - eta g_j(x_j))``.
    With ``gossip_steps = K``, ``W`` is applied K times, one exchange each (``x <- W^K x``
    in place of ``W x``): Muffliato (Cyffers, Even, Bellet & Massoulié, NeurIPS 2022), whose
    pairwise privacy :mod:`workloads.network_privacy` accounts for.
    With ``local_steps = H > 1`` and ATC this is decentralized local SGD (Lin et al. 2020,
    "Don't use large mini-batches, use local SGD"; FedAvg's local steps without a server).

    Args:
        order: ``"combine-then-adapt"`` or ``"adapt-then-combine"``, see :class:`RoundPlan`.
        local_steps: optimizer steps per exchange.
        gossip_steps: K, exchanges in a row after the local steps (default 1).
        aggregator: the mixing rule ``(own, neighbours, weights, mask) -> [*, d]``; default
            ``consensus`` ``mean`` (plain gossip averaging). Any robust ``consensus`` rule
            (``trimmed-mean``, ``krum``, ``clipped-gossip``) makes this robust gossip.
        compressor: applied to the model each node sends; the node keeps its own exact
            model, so a lossy codec here is *naive* compressed gossip (use :class:`Choco`).

    Requires of the topology: W row-stochastic (symmetric doubly-stochastic for the exact
    average); time-varying tables allowed. State per node: x.
    """

    name = "dpsgd"
    message_is_model = True

    def __init__(
        self,
        *,
        order: Order = "combine-then-adapt",
        local_steps: int = 1,
        gossip_steps: int = 1,
        aggregator: Aggregator | None = None,
        compressor: Compressor | None = None,
    ) -> None:
        self.plan = RoundPlan(order, local_steps, gossip_steps)
        self.aggregator = _aggregator(aggregator)
        self.compressor = _compressor(compressor)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(order={self.plan.order!r}, local_steps="
            f"{self.plan.local_steps}, gossip_steps={self.plan.gossip_steps}, aggregator={self.aggregator!r}, "
            f"compressor={self.compressor.spec!r})"
        )

    def init(self, x: Tensor) -> GossipState:
        _check_model(x)
        return GossipState(x)

    def message_size(self, d: int) -> int:
        """A message is the model: ``m = d``."""
        return d

    def model(self, state: GossipState) -> Tensor:
        return state.x

    def message(self, state: GossipState) -> Tensor:
        return state.x

    def combine(
        self,
        state: GossipState,
        sent: Tensor,
        received: Tensor,
        weights: Tensor,
        mask: Tensor | None = None,
        self_weight: Tensor | None = None,
    ) -> GossipState:
        """``x_i <- aggregator(x_i, received, weights, mask)``; own exact model, not ``sent``."""
        with torch.no_grad():
            mixed = self.aggregator(state.x, received.to(state.x.dtype), weights, mask)
            state.x.copy_(mixed)
        return state

    def late(self, state: GossipState, arrived: Tensor, missed: Tensor) -> GossipState:
        """A model that missed its round is stale: its weight went to the self weight that
        round, and it is dropped when it arrives (``state`` unchanged)."""
        return state

    def reset(self) -> None:
        """Forget aggregator and error-feedback state."""
        if hasattr(self.aggregator, "reset"):
            self.aggregator.reset()
        self.compressor.reset()


def local_sgd(local_steps: int, **kwargs: object) -> DecentralizedSGD:
    """Decentralized local SGD: H optimizer steps, then one gossip average (ATC)."""
    return DecentralizedSGD(order="adapt-then-combine", local_steps=local_steps, **kwargs)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- push-sum


@dataclass
class PushSumState:
    """Push-sum state: numerator ``x [*, d]``, weight ``weight [*, 1]``, model ``z = x / w``."""

    x: Tensor
    weight: Tensor
    z: Tensor


class PushSum:
    """Push-sum gossip (Kempe, Dobra & Gehrke, FOCS 2003) and Stochastic Gradient Push
    (Assran et al., ICML 2019) for directed or asymmetric links.

    ``x_i <- sum_j P_ij x_j``, ``w_i <- sum_j P_ij w_j`` (own term included), model
    ``z_i = x_i / w_i``; SGP applies the local step to the numerator,
    ``x_i <- x_i - eta g_i(z_i)``.

    P must be column-stochastic (every sender splits all its mass: sum_i P_ij = 1); time
    varying allowed. Pass the explicit ``self_weight`` P_ii to :meth:`combine` whenever rows
    do not sum to one. State per node: x, w, z. Messages are ``[x, w]`` (``m = d + 1``).

    Local steps: the optimizer steps ``z`` in place; :meth:`message` folds that into the
    numerator as ``x <- x + (z - x / w)``, which is exactly SGP's ``x - eta g(z)``.
    """

    name = "push-sum"
    message_is_model = False

    def __init__(
        self,
        *,
        order: Order = "adapt-then-combine",
        local_steps: int = 1,
        compressor: Compressor | None = None,
    ) -> None:
        self.plan = RoundPlan(order, local_steps)
        self.compressor = _compressor(compressor)
        self.aggregator: Aggregator = WeightedMean()

    def __repr__(self) -> str:
        return (
            f"PushSum(order={self.plan.order!r}, local_steps={self.plan.local_steps}, "
            f"compressor={self.compressor.spec!r})"
        )

    def init(self, x: Tensor) -> PushSumState:
        _check_model(x)
        with torch.no_grad():
            return PushSumState(x.detach().clone(), x.new_ones((*x.shape[:-1], 1)), x)

    def message_size(self, d: int) -> int:
        """A message is ``[x, w]``: ``m = d + 1``."""
        return d + 1

    def model(self, state: PushSumState) -> Tensor:
        return state.z

    def message(self, state: PushSumState) -> Tensor:
        with torch.no_grad():
            state.x.add_(state.z - state.x / state.weight)
            return torch.cat([state.x, state.weight], dim=-1)

    def combine(
        self,
        state: PushSumState,
        sent: Tensor,
        received: Tensor,
        weights: Tensor,
        mask: Tensor | None = None,
        self_weight: Tensor | None = None,
    ) -> PushSumState:
        """``(x, w)_i <- P_ii (x, w)_i + sum_j P_ij (x, w)_j``; then ``z_i <- x_i / w_i``.

        A received message whose weight ``w_j`` is not a positive number is left out (as if
        it had not arrived): no honest node sends one, and mixing it could make ``w_i <= 0``.
        """
        own = torch.cat([state.x, state.weight], dim=-1)
        with torch.no_grad():
            received = received.to(own.dtype)
            weights = weights.to(own.dtype)
            positive = received[..., -1] > 0  # False for NaN too
            mask = positive if mask is None else torch.as_tensor(mask, device=own.device) & positive
            if self_weight is None:
                mixed = self.aggregator(own, received, weights, mask)
            else:
                # sum_j P_ij v_j = r_i * mean_i(v) with the row total r_i = P_ii + sum_j P_ij:
                # the weighted mean with weights P_ij / r_i has implicit self weight P_ii / r_i.
                present = weights if mask is None else torch.where(mask, weights, 0.0)
                total = torch.as_tensor(self_weight, dtype=own.dtype, device=own.device)
                total = total + present.sum(-1)
                if not bool((total > 0).all()):
                    raise ValueError("push-sum needs self_weight + sum of weights > 0 per node")
                mixed = self.aggregator(own, received, weights / total.unsqueeze(-1), mask)
                mixed.mul_(total.unsqueeze(-1))
            d = state.x.shape[-1]
            state.x.copy_(mixed[..., :d])
            state.weight.copy_(mixed[..., d:])
            if not bool((state.weight > 0).all()):
                raise ValueError(
                    "push-sum weight became <= 0: the mixing matrix must be column-stochastic "
                    "with nonnegative entries"
                )
            torch.div(state.x, state.weight, out=state.z)
        return state

    def late(self, state: PushSumState, arrived: Tensor, missed: Tensor) -> PushSumState:
        """Mass that missed its round is added when it arrives: ``(x, w)_i += sum_j P_ij
        (x, w)_j`` over the late messages (``arrived``, already weighted), so the total mass
        is conserved; ``z = x / w`` stays a weighted average of the models."""
        with torch.no_grad():
            d = state.x.shape[-1]
            arrived = arrived.to(state.x.dtype)
            # mass is never negative: a node whose late sum would not keep w > 0 (only a
            # hostile sender makes one) skips it
            ok = (arrived[..., d:] >= 0) & torch.isfinite(arrived).all(-1, keepdim=True)
            arrived = torch.where(ok, arrived, 0.0)
            state.x.add_(arrived[..., :d])
            state.weight.add_(arrived[..., d:])
            torch.div(state.x, state.weight, out=state.z)
        return state

    def reset(self) -> None:
        self.compressor.reset()


# ----------------------------------------------------------------------------- CHOCO


@dataclass
class ChocoState:
    """CHOCO state: model ``x``, public copy ``public`` (x̂_i) and ``public_mix``
    (``sum_j W_ij x̂_j``, own term included), all ``[*, d]``."""

    x: Tensor
    public: Tensor
    public_mix: Tensor


class Choco:
    """CHOCO-Gossip and CHOCO-SGD (Koloskova, Stich & Jaggi, ICML 2019, "Decentralized
    stochastic optimization and gossip algorithms with compressed communication").

    ``q_i = Q(x_i - x̂_i)``; ``x̂_j <- x̂_j + q_j`` for j = i and all neighbours;
    ``x_i <- x_i + gamma sum_j W_ij (x̂_j - x̂_i)``. Each node keeps ``sum_j W_ij x̂_j`` rather
    than every neighbour's x̂_j (memory 3d, the paper's memory-efficient form).

    Args:
        compressor: Q, any codec (biased ones included; CHOCO compensates by itself).
        consensus_step: gamma in (0, 1]; smaller for more aggressive compression.
        order, local_steps: CHOCO-SGD is ATC with one local step; ``local_steps=0`` is
            CHOCO-Gossip (average consensus).

    Requires W symmetric doubly-stochastic (average preserved). Late delivery: the public
    copies are sums of increments, so an increment ``q_j`` is never dropped. One that
    misses its round (``mask`` False where W_ij > 0) is left out of that round's
    ``sum_j W_ij x̂_j`` (no folding into the self weight, which would corrupt it) and is
    applied by :meth:`late` when it arrives, r rounds later: ``sum_j W_ij x̂_j += W_ij q_j``
    and ``x += gamma r W_ij q_j``, the consensus steps it missed. Once every increment has
    arrived, the copies and the average are exactly those of on-time delivery; a message
    that never arrives (a crashed sender) leaves the receiver's copy behind for good.
    Time-varying W is not covered by the paper's analysis.
    """

    name = "choco"
    message_is_model = False

    def __init__(
        self,
        compressor: Compressor,
        *,
        consensus_step: float,
        order: Order = "adapt-then-combine",
        local_steps: int = 1,
    ) -> None:
        self.consensus_step = _named("consensus_step", consensus_step, open_low=True)
        self.plan = RoundPlan(order, local_steps)
        self.compressor = _compressor(compressor)
        self.aggregator: Aggregator = WeightedMean()

    def __repr__(self) -> str:
        return (
            f"Choco({self.compressor.spec!r}, consensus_step={self.consensus_step:g}, "
            f"order={self.plan.order!r}, local_steps={self.plan.local_steps})"
        )

    def init(self, x: Tensor) -> ChocoState:
        _check_model(x)
        return ChocoState(x, torch.zeros_like(x), torch.zeros_like(x))

    def message_size(self, d: int) -> int:
        """A message is the compressed difference ``q = Q(x - x̂)``: ``m = d``."""
        return d

    def model(self, state: ChocoState) -> Tensor:
        return state.x

    def message(self, state: ChocoState) -> Tensor:
        return state.x.detach() - state.public

    def combine(
        self,
        state: ChocoState,
        sent: Tensor,
        received: Tensor,
        weights: Tensor,
        mask: Tensor | None = None,
        self_weight: Tensor | None = None,
    ) -> ChocoState:
        """``x̂ += q``, ``sum_j W_ij x̂_j += sum_j W_ij q_j``, ``x += gamma (sum_j W_ij x̂_j - x̂)``.

        A masked neighbour's increment is left out, its weight NOT folded into the self
        weight (``W_ii`` stays ``1 - sum_j W_ij``); it comes later through :meth:`late`.
        """
        with torch.no_grad():
            sent = sent.to(state.x.dtype)
            received = received.to(sent.dtype)
            weights = torch.as_tensor(weights, dtype=sent.dtype, device=sent.device)
            increment = self.aggregator(sent, received, weights, mask)
            if mask is not None:
                # the weighted mean folded the missing W_ij into the self weight: take it back
                lost = torch.where(torch.as_tensor(mask, device=sent.device), 0.0, weights)
                increment.sub_(sent * lost.sum(-1, keepdim=True))
            state.public.add_(sent)
            state.public_mix.add_(increment)
            state.x.add_(state.public_mix - state.public, alpha=self.consensus_step)
        return state

    def late(self, state: ChocoState, arrived: Tensor, missed: Tensor) -> ChocoState:
        """Increments that missed their round: ``arrived = sum_j W_ij q_j`` over them,
        ``missed = sum_j r_j W_ij q_j`` (r_j: rounds late). See :class:`Choco`."""
        with torch.no_grad():
            state.public_mix.add_(arrived.to(state.x.dtype))
            state.x.add_(missed.to(state.x.dtype), alpha=self.consensus_step)
        return state

    def reset(self) -> None:
        self.compressor.reset()


# ----------------------------------------------------------------------------- driver


class NeighbourTableLike(Protocol):
    """``topologies.NeighbourTable`` (numpy arrays) or the same fields as tensors."""

    @property
    def index(self) -> np.ndarray | Tensor: ...
    @property
    def weight(self) -> np.ndarray | Tensor: ...
    @property
    def mask(self) -> np.ndarray | Tensor: ...
    @property
    def self_weight(self) -> np.ndarray | Tensor: ...
