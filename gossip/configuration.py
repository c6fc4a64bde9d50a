"""One validation of a decentralized algorithm's configuration, for both runners.

The simulator's ``[algorithm]`` table and the peer's :class:`~peer.node.config.PeerConfig` both
hand the same few settings to :class:`GossipConfig` at construction, and build the rule with
:func:`build_algorithm`. So a configuration that cannot work is refused before anything
starts, with the same reason in either runner, and a setting that the chosen algorithm does
not read is an error instead of being silently dropped.

What each algorithm reads (``ALGORITHM_FIELDS``); every other field must be left unset
(``None``), and unset fields it reads take the defaults below:

==========  =================================================  ==============================
algorithm   reads                                              fixed
==========  =================================================  ==============================
dpsgd       order (combine-then-adapt), local_steps (1, >= 0),
            aggregator (mean), compressor (none, dense)
local-sgd   local_steps (4, >= 2), aggregator, compressor      order adapt-then-combine
push-sum    order (adapt-then-combine), local_steps (1),
            compressor (none, dense)
choco       local_steps (1), compressor (none, any codec),     order adapt-then-combine
            consensus_step (0.5, in (0, 1])
ad-psgd     aggregator (mean, must take 2 inputs),             order combine-then-adapt,
            compressor (none, dense)                           local_steps 1
==========  =================================================  ==============================

"Dense" codecs (``none``, ``fp16``, ``bf16``, ``qsgd``) send every coordinate. A sparsifier
(``topk``, ``randk``) applied to a model, as D-PSGD, local SGD, push-sum and AD-PSGD send it,
zeroes most coordinates of what the receiver mixes in; only CHOCO, which sends compressed
*differences* against public copies (Koloskova et al. 2019), makes one converge.

The topology's side, :meth:`GossipConfig.check_neighbourhood`, asks the robust rule whether it
can run on the smallest neighbourhood (own model plus in-neighbours) the topology gives; an
AD-PSGD exchange always has two inputs, which the constructor checks by itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import consensus
from gossip.algorithms import (
    ORDERS,
    Choco,
    DecentralizedSGD,
    GossipAlgorithm,
    PushSum,
)
from gossip.compression import build_compressor
from gossip.pairwise import PairwiseGossip

__all__ = [
    "ALGORITHM_FIELDS",
    "DENSE_COMPRESSORS",
    "GOSSIP_ALGORITHMS",
    "GOSSIP_SETTINGS",
    "ConfigurationError",
    "GossipConfig",
    "build_algorithm",
]

GOSSIP_ALGORITHMS: dict[str, str] = {
    "dpsgd": "D-PSGD, synchronous rounds (Lian et al., NeurIPS 2017)",
    "local-sgd": "decentralized local SGD: H local steps, then one average (Lin et al. 2020)",
    "push-sum": "stochastic gradient push on directed graphs (Assran et al., ICML 2019)",
    "choco": "CHOCO-SGD, compressed differences (Koloskova et al., ICML 2019)",
    "ad-psgd": "asynchronous pairwise gossip AD-PSGD (Lian et al., ICML 2018)",
}
"""The decentralized algorithms both runners drive, with a one-line description."""

ALGORITHM_FIELDS: dict[str, tuple[str, ...]] = {
    "dpsgd": ("order", "local_steps", "aggregator", "compressor"),
    "local-sgd": ("local_steps", "aggregator", "compressor"),
    "push-sum": ("order", "local_steps", "compressor"),
    "choco": ("local_steps", "compressor", "consensus_step"),
    "ad-psgd": ("aggregator", "compressor"),
}
"""The optional fields each algorithm reads; any other field given is an error."""

DENSE_COMPRESSORS = ("none", "fp16", "bf16", "qsgd")
"""Codecs that send every coordinate: the only ones an algorithm that sends its model takes."""

_FIXED: dict[str, dict[str, Any]] = {
    "local-sgd": {"order": "adapt-then-combine"},
    "choco": {"order": "adapt-then-combine"},
    "ad-psgd": {"order": "combine-then-adapt", "local_steps": 1},
}
_DEFAULTS: dict[str, Any] = {
    "order": "combine-then-adapt",
    "local_steps": 1,
    "aggregator": "mean",
    "compressor": "none",
    "consensus_step": 0.5,
}
_ALGORITHM_DEFAULTS: dict[str, dict[str, Any]] = {
    "local-sgd": {"local_steps": 4},
    "push-sum": {"order": "adapt-then-combine"},
}
_MINIMUM_LOCAL_STEPS = {"local-sgd": 2}
GOSSIP_SETTINGS = ("order", "local_steps", "aggregator", "compressor", "consensus_step")
"""Every setting :class:`GossipConfig` judges (each algorithm reads some of them)."""


class ConfigurationError(ValueError):
    """An algorithm setting that cannot work; ``field`` names the setting (``aggregator``...).

    ``str(error)`` is ``"FIELD: reason"``; a runner re-raises it under its own name for the
    field (``algorithm.aggregator`` in an experiment file, ``--aggregator`` on the CLI).
    """

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True)
class GossipConfig:
    """A decentralized algorithm and the settings it reads, validated at construction.

    Leave a field ``None`` for the algorithm's default; a field the algorithm does not read
    must stay ``None``. After construction every field the algorithm reads holds its
    resolved value (fixed ones included, e.g. ``order`` for ``local-sgd``), every other one
    is ``None``, so constructing again from the fields gives an equal config.

    >>> GossipConfig("local-sgd", local_steps=8).order
    'adapt-then-combine'
    >>> GossipConfig("push-sum", aggregator="krum:f=1")
    Traceback (most recent call last):
    ...
    gossip.configuration.ConfigurationError: aggregator: is not used by push-sum ...

    Args:
        algorithm: one of :data:`GOSSIP_ALGORITHMS`.
        order: ``combine-then-adapt`` or ``adapt-then-combine`` (``dpsgd``, ``push-sum``).
        local_steps: optimizer steps per exchange (``local-sgd`` >= 2, else >= 0).
        aggregator: a ``consensus.build`` spec (``dpsgd``, ``local-sgd``, ``ad-psgd``).
        compressor: a ``gossip.build_compressor`` spec; dense codecs only, except ``choco``.
        consensus_step: CHOCO's gamma in (0, 1].
    """

    algorithm: str = "dpsgd"
    order: str | None = None
    local_steps: int | None = None
    aggregator: str | None = None
    compressor: str | None = None
    consensus_step: float | None = None

    def __post_init__(self) -> None:
        name = self.algorithm
        if name not in GOSSIP_ALGORITHMS:
            raise ConfigurationError(
                "algorithm", f"must be one of {', '.join(GOSSIP_ALGORITHMS)}; got {name!r}"
            )
        reads = ALGORITHM_FIELDS[name]
        fixed = _FIXED.get(name, {})
        for key in GOSSIP_SETTINGS:
            value = getattr(self, key)
            if key in reads:
                if value is None:
                    value = _ALGORITHM_DEFAULTS.get(name, {}).get(key, _DEFAULTS[key])
                object.__setattr__(self, key, value)
            elif key in fixed:
                if value is not None and value != fixed[key]:
                    raise ConfigurationError(
                        key, f"{name} is always {key} = {fixed[key]!r}; got {value!r}"
                    )
                object.__setattr__(self, key, fixed[key])
            elif value is not None:
                raise ConfigurationError(
                    key,
                    f"is not used by {name} (it reads {', '.join(reads)}); remove it or pick "
                    f"an algorithm that reads it",
                )
        self._check_values()

    def _check_values(self) -> None:
        name = self.algorithm
        if self.order not in ORDERS:
            raise ConfigurationError(
                "order", f"must be one of {', '.join(ORDERS)}; got {self.order!r}"
            )
        steps = self.local_steps
        minimum = _MINIMUM_LOCAL_STEPS.get(name, 0)
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < minimum:
            hint = " (local-sgd with 1 step is dpsgd with adapt-then-combine)" if minimum else ""
            raise ConfigurationError(
                "local_steps", f"must be an integer >= {minimum} for {name}{hint}; got {steps!r}"
            )
        if self.aggregator is not None:
            try:
                rule = consensus.build(self.aggregator)
            except ValueError as error:
                raise ConfigurationError("aggregator", str(error)) from None
            if name == "ad-psgd":
                _check_size(rule, self.aggregator, 2, "an AD-PSGD exchange averages 2 models")

        if self.compressor is not None:
            try:
                build_compressor(self.compressor)
            except ValueError as error:
                raise ConfigurationError("compressor", str(error)) from None
            codec = self.compressor.strip().partition(":")[0]

            if name != "choco" and codec not in DENSE_COMPRESSORS:
                raise ConfigurationError(
                    "compressor",
                    f"{codec} drops most coordinates of the model {name} sends, which the "
                    f"receiver then mixes in as zeros; use {', '.join(DENSE_COMPRESSORS)}, or "
                    "choco, which sends compressed differences",
                )
        if name == "ad-psgd":
            pairwise = PairwiseGossip(
                consensus.build(self.aggregator or "mean"),
                build_compressor(self.compressor or "none"),
            )
            try:  # state per node that changing pairs cannot carry
                pairwise.check_batchable()
            except ValueError as error:
                field, _, reason = str(error).partition(": ")
                raise ConfigurationError(field, reason) from None
        if self.consensus_step is not None:
            gamma = self.consensus_step
            if (
                isinstance(gamma, bool)
                or not isinstance(gamma, int | float)
                or not math.isfinite(gamma)
                or not 0 < gamma <= 1
            ):
                raise ConfigurationError("consensus_step", f"must be in (0, 1]; got {gamma!r}")
            object.__setattr__(self, "consensus_step", float(gamma))

    @property
    def needs_topology(self) -> bool:
        """Whether the weights must come from a known graph: push-sum needs each column of
        P to sum to one, CHOCO a symmetric W over fixed neighbours whose copies it keeps."""
        return self.algorithm in ("push-sum", "choco")

    @property
    def pairwise(self) -> bool:
        """Whether the exchange is with one partner at a time (AD-PSGD)."""
        return self.algorithm == "ad-psgd"

    def given(self) -> dict[str, Any]:
        """The fields this algorithm reads, with their values (for records and status)."""
        return {key: getattr(self, key) for key in ALGORITHM_FIELDS[self.algorithm]}

    def check_neighbourhood(self, smallest: int, *, where: str = "the topology") -> None:
        """Refuse a robust rule that cannot run on the smallest neighbourhood ``where`` gives.

        Args:
            smallest: own model plus the fewest in-neighbours any node mixes in a round
                (``topologies.smallest_neighbourhood``); AD-PSGD always has 2.
            where: what gives that neighbourhood, for the message.
        Raises :class:`ConfigurationError` naming ``aggregator``.
        """
        if self.aggregator is None:
            return
        size = 2 if self.pairwise else smallest
        reason = (
            "an AD-PSGD exchange averages 2 models"
            if self.pairwise
            else f"{where} gives a node as few as {size - 1} neighbour(s), so {size} models"
        )
        _check_size(consensus.build(self.aggregator), self.aggregator, size, reason)


def _check_size(rule: Any, spec: str, size: int, reason: str) -> None:
    check = getattr(rule, "check_size", None)
    if check is None:
        return
    try:
        check(size)
    except ValueError as error:
        raise ConfigurationError("aggregator", f"{spec} cannot run: {error}; {reason}") from None


def build_algorithm(config: GossipConfig) -> GossipAlgorithm:
    """The ``gossip`` rule a :class:`GossipConfig` names, built the same way for both runners.

    ``ad-psgd`` is combine-then-adapt D-PSGD over matchings (one partner, weight 1/2, see
    :func:`gossip.pairwise.ad_psgd`); its runners drive the pairwise exchange.
    """
    compressor = build_compressor(config.compressor or "none")
    if config.algorithm == "push-sum":
        return PushSum(
            order=config.order,  # type: ignore[arg-type]
            local_steps=int(config.local_steps or 0),
            compressor=compressor,
        )
    if config.algorithm == "choco":
        return Choco(
            compressor,
            consensus_step=float(config.consensus_step or 0.5),
            local_steps=int(config.local_steps or 0),
        )
    algorithm = DecentralizedSGD(
        order=config.order,  # type: ignore[arg-type]
        local_steps=int(config.local_steps or 0),
        aggregator=consensus.build(config.aggregator or "mean"),
        compressor=compressor,
    )
    algorithm.name = config.algorithm
    return algorithm
