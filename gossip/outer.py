"""Low-communication training: an outer optimizer over gossip (DiLoCo, NoLoCo, SparseLoCo).

Each node keeps two copies of its model. The *fast weights* theta (the runner's model, which
the node's own torch optimizer steps H times between exchanges, AdamW being the usual inner
optimizer) and the *slow weights* phi, the last outer point. After H inner steps the node's
*pseudo-gradient* is ``Delta_i = phi_i - theta_i`` (the way its inner steps went, reversed).

:class:`DiLoCo` sends its fast weights, mixes what arrives with the topology's weights, and
steps an outer torch optimizer on phi, then restarts the inner steps from there::

    D_i      = phi_i - sum_j W_ij theta_j      (own term included; any consensus rule)
    phi_i   <- OuterOpt_i(phi_i, gradient = D_i)   (SGD, Nesterov 0.9, lr 0.7: DiLoCo)
    theta_i <- phi_i

``D_i = sum_j W_ij Delta_j + (phi_i - sum_j W_ij phi_j)``: the neighbours' mixed
pseudo-gradients plus a pull towards their mean slow weights. Where the slow weights agree
(the complete graph with uniform weights, where every node takes the same step) the pull is
zero and ``D_i`` is the exact mean pseudo-gradient, so this is DiLoCo (Douillard et al.
2023, "DiLoCo: Distributed Low-Communication Training of Language Models"); on a sparser
topology it is gossip-DiLoCo. The pull is what keeps gossip-DiLoCo's slow weights together:
mixing the pseudo-gradients alone leaves their disagreement uncontracted (outer Nesterov on
a ring then diverges). Outer SGD with lr 1 and no momentum gives ``phi_i <- sum_j W_ij
theta_j``: plain gossip averaging after H local steps (local SGD).

:class:`NoLoCo` (Kolehmainen et al. 2025, "NoLoCo: No-all-reduce Low Communication Training
Method for Large Models"; public code gensyn-ai/noloco) has no all-reduce: at every outer
step each node averages with one partner of a fresh random matching (the ``random-matching``
topology, drawn from the seed and the outer step, so nobody sends a message to agree on it).
A message carries ``[theta_i, phi_i]``; with ``Db_i = sum_j W_ij Delta_j`` and ``phib_i =
sum_j W_ij phi_j`` over the pair (own term included)::

    m_i     <- mu m_i - beta Db_i + gamma (phib_i - phi_i)
    phi_i   <- phi_i + m_i
    theta_i <- phi_i

(beta the outer learning rate, mu the outer momentum, gamma the consensus step; the
released configurations use beta = gamma = 0.7, mu = 0.5, H = 50). The signs are those of
the public code (``sparse_optimizer_c.py``: its ``mean_g`` is the mean of ``theta - phi``,
that is ``-Db``, and it adds ``outer_lr * (mean_g + mean - p_old)``). As torch SGD with
momentum mu and learning rate beta this is one step with the gradient ``Db_i + (gamma /
beta)(phi_i - phib_i)`` (torch's ``b <- mu b + g``, ``phi <- phi - beta b`` is the update
above with ``m = -beta b``), which is how :class:`NoLoCo` runs it. With gamma = beta the
gradient is DiLoCo's ``D_i``: :class:`DiLoCo` with ``sgd:lr=beta,momentum=mu`` on the
``random-matching`` topology is that NoLoCo at half the bytes (it sends theta alone).

:class:`SparseLoCo` (Sarfi et al. 2025, "Communication Efficient LLM Pre-training with
SparseLoCo") replaces the outer momentum by an error-feedback buffer e and sends a
compressed (chunked top-k, 2-bit) version of it::

    e_i     <- beta e_i + Delta_i
    s_i      = C(e_i)                  (what receivers decode: the runner's codec)
    e_i     <- e_i - s_i
    phi_i   <- phi_i - alpha sum_j W_ij s_j    (outer SGD, lr alpha, on the mixed s)
    theta_i <- phi_i

That is the paper's all-gather on the complete graph, where every node takes the same step
and the slow weights stay equal. On a sparser topology nothing pulls them together (a
sparse message cannot carry phi), so they drift apart slowly: run it on ``complete``.

All three follow the runner protocol of :mod:`gossip.algorithms` (``init``, ``model``,
``message``, ``combine``, ``late``) with an adapt-then-combine :class:`RoundPlan` of H local
steps, batched over a leading dimension of nodes: the outer optimizer is one torch
optimizer over the ``[*, d]`` slow weights, which for the element-wise optimizers (SGD,
momentum, Nesterov, Adam, AdamW) is exactly one optimizer per node. A message that misses
its outer step is stale when it arrives and is dropped (``late``); its weight went to the
node's own term that round, as for D-PSGD.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from consensus import Aggregator
from gossip.algorithms import RoundPlan, _aggregator, _check_model, _compressor, _named
from gossip.compression import Compressor
from topologies.spec_grammar import parse_spec, typed_value

__all__ = [
    "OUTER_OPTIMIZERS",
    "CheckpointedState",
    "DiLoCo",
    "NoLoCo",
    "OuterState",
    "SparseLoCo",
    "build_outer_optimizer",
    "check_outer_optimizer",
]


# ----------------------------------------------------------------------------- outer optimizers


def _sgd(params: list[Tensor], options: dict[str, Any]) -> torch.optim.Optimizer:
    return torch.optim.SGD(
        params,
        lr=options["lr"],
        momentum=options["momentum"],
        nesterov=options["nesterov"],
        weight_decay=options["weight_decay"],
    )


def _adam(kind: type[torch.optim.Adam]) -> Callable[..., torch.optim.Optimizer]:
    def build(params: list[Tensor], options: dict[str, Any]) -> torch.optim.Optimizer:
        return kind(
            params,
            lr=options["lr"],
            betas=(options["beta1"], options["beta2"]),
            eps=options["eps"],
            weight_decay=options["weight_decay"],
        )

    return build


_ADAM_PARAMETERS: dict[str, tuple[type, Any]] = {
    "lr": (float, 1e-3),
    "beta1": (float, 0.9),
    "beta2": (float, 0.999),
    "eps": (float, 1e-8),
    "weight_decay": (float, 0.0),
}

OUTER_OPTIMIZERS: dict[str, tuple[Callable[..., torch.optim.Optimizer], dict[str, Any]]] = {
    "sgd": (
        _sgd,
        {
            "lr": (float, 0.7),
            "momentum": (float, 0.0),
            "nesterov": (bool, False),
            "weight_decay": (float, 0.0),
        },
    ),
    "adam": (_adam(torch.optim.Adam), _ADAM_PARAMETERS),
    "adamw": (_adam(torch.optim.AdamW), {**_ADAM_PARAMETERS, "weight_decay": (float, 0.01)}),
}
"""The outer optimizers a spec may name, with their parameters ``(type, default)``. All are
element-wise, so one optimizer over the stacked ``[n, d]`` slow weights is n optimizers."""


def _convert(name: str, key: str, kind: type, text: str) -> Any:
    try:
        return typed_value(text, kind)
    except ValueError:
        what = "true or false" if kind is bool else f"a {kind.__name__}"
        raise ValueError(f"{name}: {key} must be {what}; got {text!r}") from None


def check_outer_optimizer(spec: str, *, heavy_ball: bool = False) -> tuple[str, dict[str, Any]]:
    """``(name, options)`` of an outer-optimizer spec such as ``"sgd:lr=0.7,momentum=0.9,
    nesterov=true"``, every option filled in; a ``ValueError`` naming the bad part otherwise.
    ``heavy_ball``: only SGD with plain momentum will do (NoLoCo's outer step).

    >>> check_outer_optimizer("sgd:lr=0.7,momentum=0.9,nesterov=true")[1]["nesterov"]
    True
    """
    if not isinstance(spec, str):
        raise ValueError(f"must be an optimizer spec string such as 'sgd:lr=0.7'; got {spec!r}")
    name, given = parse_spec(spec, "outer optimizer")
    if name not in OUTER_OPTIMIZERS:
        raise ValueError(f"{name!r} is not one of {', '.join(OUTER_OPTIMIZERS)}")
    _, parameters = OUTER_OPTIMIZERS[name]
    unknown = sorted(set(given) - set(parameters))
    if unknown:
        raise ValueError(f"{name} takes {', '.join(parameters)}; got unknown {', '.join(unknown)}")
    options = {
        key: _convert(name, key, kind, given[key]) if key in given else default
        for key, (kind, default) in parameters.items()
    }
    lr = options["lr"]
    if not (lr > 0 and lr < float("inf")):
        raise ValueError(f"{name}: lr must be a finite number > 0; got {lr!r}")
    if options["weight_decay"] < 0:
        raise ValueError(f"{name}: weight_decay must be >= 0; got {options['weight_decay']!r}")
    if heavy_ball and (name != "sgd" or options["nesterov"]):
        raise ValueError(
            "noloco's outer step is SGD with (heavy-ball) momentum, e.g. "
            f"'sgd:lr=0.7,momentum=0.5'; got {spec!r}"
        )
    if name == "sgd":
        if not 0 <= options["momentum"] < 1:
            raise ValueError(f"sgd: momentum must be in [0, 1); got {options['momentum']!r}")
        if options["nesterov"] and options["momentum"] == 0:
            raise ValueError("sgd: nesterov needs momentum > 0")
    else:
        for key in ("beta1", "beta2"):
            if not 0 <= options[key] < 1:
                raise ValueError(f"{name}: {key} must be in [0, 1); got {options[key]!r}")
        if not options["eps"] > 0:
            raise ValueError(f"{name}: eps must be > 0; got {options['eps']!r}")
    return name, options


def build_outer_optimizer(spec: str, slow: Tensor) -> torch.optim.Optimizer:
    """The torch optimizer a spec names, over the slow weights ``slow [*, d]`` (a leaf)."""
    name, options = check_outer_optimizer(spec)
    factory, _ = OUTER_OPTIMIZERS[name]
    return factory([slow], options)


# ----------------------------------------------------------------------------- state


@runtime_checkable
class CheckpointedState(Protocol):
    """A rule's state with more to keep than the model: a peer's checkpoint stores
    :meth:`tensors` beside the model and :meth:`load` restores them at resume."""

    def tensors(self) -> dict[str, Tensor]: ...

    def load(self, tensors: Mapping[str, Tensor]) -> None: ...


@dataclass
class OuterState:
    """State of an outer-optimizer rule, every tensor ``[*, d]`` (``*`` = the nodes).

    Attributes:
        x: the fast weights theta, the runner's model (shared, not copied).
        phi: the slow weights, the last outer point (a leaf the outer optimizer steps).
        message: the buffer :meth:`message` writes (SparseLoCo's ``beta e + Delta``,
            NoLoCo's ``[theta, phi]``; None for DiLoCo, which sends theta itself).
        error: SparseLoCo's error-feedback buffer e (None for the others).
        optimizer: the outer torch optimizer over ``phi``.
    """

    x: Tensor
    phi: Tensor
    message: Tensor | None
    error: Tensor | None
    optimizer: torch.optim.Optimizer

    def row_tensors(self) -> list[Tensor]:
        """Every per-node tensor of the state, the outer optimizer's included (momentum
        buffers, Adam's moments, once it has stepped): what a runner restores for a node
        that keeps its state for an exchange."""
        tensors = [self.x, self.phi]
        tensors += [t for t in (self.message, self.error) if t is not None]
        for value in self.optimizer.state.get(self.phi, {}).values():
            if isinstance(value, Tensor) and value.shape == self.phi.shape:
                tensors.append(value)
        return tensors

    def tensors(self) -> dict[str, Tensor]:
        """The state a checkpoint keeps (the model ``x`` is the caller's): ``phi``, ``error``
        and the outer optimizer's per-node tensors as ``outer.<key>``."""
        named = {"phi": self.phi.detach()}
        if self.error is not None:
            named["error"] = self.error
        for key, value in self.optimizer.state.get(self.phi, {}).items():
            if isinstance(value, Tensor):
                named[f"outer.{key}"] = value
        return named

    def load(self, tensors: Mapping[str, Tensor]) -> None:
        """Restore what :meth:`tensors` gave (shapes must match; ``ValueError`` otherwise)."""
        expected = {"phi"} | ({"error"} if self.error is not None else set())
        missing = expected - set(tensors)
        if missing:
            raise ValueError(f"outer state: missing {', '.join(sorted(missing))}")
        with torch.no_grad():
            for key in expected:
                target = self.phi if key == "phi" else self.error
                assert target is not None
                if tensors[key].shape != target.shape:
                    raise ValueError(
                        f"outer state: {key} has shape {tuple(tensors[key].shape)}, "
                        f"expected {tuple(target.shape)}"
                    )
                target.copy_(tensors[key])
            state: dict[str, Any] = {}
            for key, value in tensors.items():
                if key.startswith("outer."):
                    state[key.removeprefix("outer.")] = value.to(self.phi.device).clone()
            if state:
                self.optimizer.state[self.phi] = state


# ----------------------------------------------------------------------------- the rules


class DiLoCo:
    """DiLoCo over gossip: H inner steps, then an outer optimizer step on the slow weights
    with the neighbours' mixed pseudo-gradients (see the module docstring).

    Args:
        local_steps: H, inner optimizer steps per outer step (>= 1).
        outer_optimizer: an outer-optimizer spec (:data:`OUTER_OPTIMIZERS`); DiLoCo's is
            ``"sgd:lr=0.7,momentum=0.9,nesterov=true"``.
        aggregator: the rule that mixes the fast weights (default the weighted mean); a
            robust ``consensus`` rule makes it robust to Byzantine messages. The rules are
            translation-equivariant, so where the slow weights agree this is the same rule
            on the pseudo-gradients ``phi - theta_j``.
        compressor: the codec of the fast weights a node sends (a dense one: a dropped
            coordinate would be mixed in as zero).

    Requires of the topology: W row-stochastic (doubly stochastic for the exact mean).
    State per node: theta (the model), phi, the outer optimizer's state.
    """

    name = "diloco"
    message_is_model = False

    def __init__(
        self,
        *,
        local_steps: int,
        outer_optimizer: str = "sgd:lr=0.7,momentum=0.9,nesterov=true",
        aggregator: Aggregator | None = None,
        compressor: Compressor | None = None,
    ) -> None:
        if isinstance(local_steps, bool) or not isinstance(local_steps, int) or local_steps < 1:
            raise ValueError(f"local_steps must be an integer >= 1; got {local_steps!r}")
        self.plan = RoundPlan("adapt-then-combine", local_steps)
        check_outer_optimizer(outer_optimizer)
        self.outer_optimizer = outer_optimizer
        self.aggregator = _aggregator(aggregator)
        self.compressor = _compressor(compressor)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(local_steps={self.plan.local_steps}, outer_optimizer="
            f"{self.outer_optimizer!r}, aggregator={self.aggregator!r}, "
            f"compressor={self.compressor.spec!r})"
        )

    def _new_state(self, x: Tensor, message_width: int = 0) -> OuterState:
        _check_model(x)
        with torch.no_grad():
            phi = x.detach().clone()
        message = x.new_zeros((*x.shape[:-1], message_width)) if message_width else None
        return OuterState(x, phi, message, None, build_outer_optimizer(self.outer_optimizer, phi))

    def init(self, x: Tensor) -> OuterState:
        return self._new_state(x)

    def message_size(self, d: int) -> int:
        """A message is the fast weights: ``m = d``."""
        return d

    def model(self, state: OuterState) -> Tensor:
        return state.x

    def message(self, state: OuterState) -> Tensor:
        """The fast weights theta after the inner steps."""
        return state.x

    def _mixed(
        self, sent: Tensor, received: Tensor, weights: Tensor, mask: Tensor | None
    ) -> Tensor:
        return self.aggregator(sent, received.to(sent.dtype), weights.to(sent.dtype), mask)

    def _outer_step(self, state: OuterState, gradient: Tensor) -> None:
        """One outer optimizer step on phi with ``gradient``; then ``theta <- phi``."""
        state.phi.grad = gradient
        state.optimizer.step()
        state.phi.grad = None
        with torch.no_grad():
            state.x.copy_(state.phi)

    def combine(
        self,
        state: OuterState,
        sent: Tensor,
        received: Tensor,
        weights: Tensor,
        mask: Tensor | None = None,
        self_weight: Tensor | None = None,
    ) -> OuterState:
        """``phi <- OuterOpt(phi, phi - aggregator(theta, received))``, ``theta <- phi`` (the
        node's own exact theta, not ``sent``)."""
        with torch.no_grad():
            mixed = self._mixed(state.x.detach(), received, weights, mask)
            gradient = torch.sub(state.phi, mixed, out=mixed)
        self._outer_step(state, gradient)
        return state

    def late(self, state: OuterState, arrived: Tensor, missed: Tensor) -> OuterState:
        """A pseudo-gradient that missed its outer step is stale and dropped."""
        return state

    def reset(self) -> None:
        if hasattr(self.aggregator, "reset"):
            self.aggregator.reset()
        self.compressor.reset()


class SparseLoCo(DiLoCo):
    """SparseLoCo: DiLoCo whose outer momentum is replaced by error feedback, sending a
    compressed error buffer (see the module docstring).

    Args:
        local_steps: H.
        error_feedback: beta in [0, 1), the decay of the error buffer.
        outer_optimizer: the outer step on the mixed compressed buffers; the paper's is plain
            SGD (``"sgd:lr=1"``).
        aggregator, compressor: as :class:`DiLoCo`; the compressor is the point (chunked
            top-k with 2-bit values in the paper).
    """

    name = "sparseloco"

    def __init__(
        self,
        *,
        local_steps: int,
        error_feedback: float = 0.95,
        outer_optimizer: str = "sgd:lr=1",
        aggregator: Aggregator | None = None,
        compressor: Compressor | None = None,
    ) -> None:
        self.error_feedback = _named("error_feedback", error_feedback, open_high=True)
        super().__init__(
            local_steps=local_steps,
            outer_optimizer=outer_optimizer,
            aggregator=aggregator,
            compressor=compressor,
        )

    def __repr__(self) -> str:
        return super().__repr__()[:-1] + f", error_feedback={self.error_feedback:g})"

    def init(self, x: Tensor) -> OuterState:
        state = self._new_state(x, x.shape[-1])
        state.error = torch.zeros_like(state.phi)
        return state

    def message_size(self, d: int) -> int:
        """A message is the (compressed) error buffer: ``m = d``."""
        return d

    def message(self, state: OuterState) -> Tensor:
        """``beta e + (phi - theta)`` (e itself changes in :meth:`combine`)."""
        assert state.error is not None and state.message is not None
        with torch.no_grad():
            torch.sub(state.phi, state.x.detach(), out=state.message)
            state.message.add_(state.error, alpha=self.error_feedback)
        return state.message

    def combine(
        self,
        state: OuterState,
        sent: Tensor,
        received: Tensor,
        weights: Tensor,
        mask: Tensor | None = None,
        self_weight: Tensor | None = None,
    ) -> OuterState:
        """``e <- message - sent``; ``phi <- OuterOpt(phi, aggregator(sent, received))``, the
        node's own term as its receivers decode it (every node of the complete graph takes
        the same step)."""
        assert state.error is not None and state.message is not None
        with torch.no_grad():
            sent = sent.to(state.phi.dtype)
            torch.sub(state.message, sent, out=state.error)
            gradient = self._mixed(sent, received, weights, mask)
        self._outer_step(state, gradient)
        return state


class NoLoCo(DiLoCo):
    """NoLoCo: each node averages its pseudo-gradient and slow weights with its partner of
    the round's random matching, and steps outer SGD with momentum plus a pull towards the
    pair's mean slow weights (see the module docstring).

    Args:
        local_steps: H.
        outer_optimizer: SGD with momentum, no Nesterov (``"sgd:lr=0.7,momentum=0.5"``:
            beta = lr, mu = momentum).
        consensus_step: gamma in (0, 1], the pull towards the mean slow weights.
        aggregator, compressor: as :class:`DiLoCo`, over the ``[theta, phi]`` message.

    Run it on the ``random-matching`` topology for the paper's algorithm; any topology works.
    """

    name = "noloco"

    def __init__(
        self,
        *,
        local_steps: int,
        outer_optimizer: str = "sgd:lr=0.7,momentum=0.5",
        consensus_step: float = 0.7,
        aggregator: Aggregator | None = None,
        compressor: Compressor | None = None,
    ) -> None:
        try:
            _, options = check_outer_optimizer(outer_optimizer, heavy_ball=True)
        except ValueError as error:
            raise ValueError(f"outer_optimizer: {error}") from None
        self.consensus_step = _named("consensus_step", consensus_step, open_low=True)
        self._pull = self.consensus_step / options["lr"]
        super().__init__(
            local_steps=local_steps,
            outer_optimizer=outer_optimizer,
            aggregator=aggregator,
            compressor=compressor,
        )

    def __repr__(self) -> str:
        return super().__repr__()[:-1] + f", consensus_step={self.consensus_step:g})"

    def init(self, x: Tensor) -> OuterState:
        return self._new_state(x, 2 * x.shape[-1])

    def message_size(self, d: int) -> int:
        """A message is ``[theta, phi]``: ``m = 2 d``."""
        return 2 * d

    def message(self, state: OuterState) -> Tensor:
        """``[theta, phi]``."""
        d = state.phi.shape[-1]
        assert state.message is not None
        with torch.no_grad():
            state.message[..., :d].copy_(state.x.detach())
            state.message[..., d:].copy_(state.phi)
        return state.message

    def combine(
        self,
        state: OuterState,
        sent: Tensor,
        received: Tensor,
        weights: Tensor,
        mask: Tensor | None = None,
        self_weight: Tensor | None = None,
    ) -> OuterState:
        """``phi <- SGD(phi, Db + (gamma / beta)(phi - phib))`` with ``Db = phib - thetab``
        (the pair's means, own exact term included), ``theta <- phi``."""
        d = state.phi.shape[-1]
        assert state.message is not None
        with torch.no_grad():
            mixed = self._mixed(state.message, received, weights, mask)
            theta_mean, phi_mean = mixed[..., :d], mixed[..., d:]
            gradient = phi_mean - theta_mean
            gradient.add_(state.phi - phi_mean, alpha=self._pull)
        self._outer_step(state, gradient)
        return state
