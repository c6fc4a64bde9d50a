"""One validation of a decentralized algorithm's configuration, for both runners.

The simulator's ``[algorithm]`` table and the peer's :class:`~peer.node.config.PeerConfig` both
hand the same settings to :class:`GossipConfig` at construction, and build the rule with
:func:`build_algorithm`. So a configuration that cannot work is refused before anything
starts, with the same reason in either runner, and a setting that the chosen algorithm does
not read is an error instead of being silently dropped.

The settings, their defaults, allowed values and readers are declared once, in
:data:`gossip.settings.SETTINGS` (the table is in ``docs/settings.md``); this module adds the
rules that join a setting to the algorithm or to another setting.

"Dense" codecs (``none``, ``fp16``, ``bf16``, ``qsgd``) send every coordinate. A sparsifier
(``topk``, ``randk``) applied to a model, as D-PSGD, local SGD, push-sum and AD-PSGD send it,
zeroes most coordinates of what the receiver mixes in; only CHOCO, which sends compressed
*differences* against public copies (Koloskova et al. 2019), makes one converge.

The topology's side, :meth:`GossipConfig.check_neighbourhood`, asks the robust rule whether it
can run on the smallest neighbourhood (own model plus in-neighbours) the topology gives; an
AD-PSGD exchange always has two inputs, which the constructor checks by itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import consensus
from gossip.algorithms import (
    Choco,
    DecentralizedSGD,
    GossipAlgorithm,
    PushSum,
)
from gossip.compression import build_compressor
from gossip.outer import DiLoCo, NoLoCo, SparseLoCo
from gossip.pairwise import PairwiseGossip
from gossip.settings import (
    DENSE_COMPRESSORS,
    SETTING_NAMES,
    SETTINGS,
    ConfigurationError,
    setting_fields,
)
from topologies.specs import parse_spec

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
    "diloco": "H inner steps, then an outer optimizer step towards the neighbours' models "
    "(Douillard et al. 2023: DiLoCo on the complete graph, gossip-DiLoCo on a sparser one)",
    "noloco": "DiLoCo without all-reduce: one random partner per outer step "
    "(Kolehmainen et al. 2025)",
    "sparseloco": "DiLoCo with error feedback and sparse low-bit pseudo-gradients "
    "(Sarfi et al. 2025)",
}
"""The decentralized algorithms both runners drive, with a one-line description."""

for _item in SETTINGS:
    _unknown = set(_item.readers) | set(_item.fixed) | set(_item.defaults)
    if not _unknown <= set(GOSSIP_ALGORITHMS):
        raise TypeError(f"setting {_item.name} names unknown algorithms {_unknown}")

ALGORITHM_FIELDS: dict[str, tuple[str, ...]] = {
    name: tuple(item.name for item in SETTINGS if name in item.readers)
    for name in GOSSIP_ALGORITHMS
}
"""The settings each algorithm reads (from :data:`gossip.settings.SETTINGS`); any other
setting given is an error."""

GOSSIP_SETTINGS = SETTING_NAMES
"""Every setting :class:`GossipConfig` judges (each algorithm reads some of them)."""


@dataclass(frozen=True)
@setting_fields
class GossipConfig:
    """A decentralized algorithm and the settings it reads, validated at construction.

    Every setting of :data:`gossip.settings.SETTINGS` is a keyword field. Leave one ``None``
    for the algorithm's default; a setting the algorithm does not read must stay ``None``.
    After construction every setting the algorithm reads holds its resolved value (fixed ones
    included, e.g. ``order`` for ``local-sgd``), every other one is ``None``, so constructing
    again from the fields gives an equal config.

    >>> GossipConfig("local-sgd", local_steps=8).order
    'adapt-then-combine'
    >>> GossipConfig("push-sum", aggregator="krum:f=1")
    Traceback (most recent call last):
    ...
    gossip.settings.ConfigurationError: aggregator: is not used by push-sum ...

    Raises :class:`ConfigurationError` naming the setting (``algorithm`` for the name).
    """

    algorithm: str = "dpsgd"

    if TYPE_CHECKING:

        def __init__(self, algorithm: str = "dpsgd", **settings: Any) -> None: ...

        def __getattr__(self, name: str) -> Any: ...

    def __post_init__(self) -> None:
        name = self.algorithm
        if name not in GOSSIP_ALGORITHMS:
            raise ConfigurationError(
                "algorithm", f"must be one of {', '.join(GOSSIP_ALGORITHMS)}; got {name!r}"
            )
        reads = ALGORITHM_FIELDS[name]
        for item in SETTINGS:
            value = getattr(self, item.name)
            if name in item.readers:
                if value is None:
                    value = item.default_for(name)
                try:
                    value = item.check(value, name)
                except ValueError as error:
                    raise ConfigurationError(item.name, str(error)) from None
            elif name in item.fixed:
                if value is not None and value != item.fixed[name]:
                    raise ConfigurationError(
                        item.name,
                        f"{name} is always {item.name} = {item.fixed[name]!r}; got {value!r}",
                    )
                value = item.fixed[name]
            elif value is not None:
                raise ConfigurationError(
                    item.name,
                    f"is not used by {name} (it reads {', '.join(reads)}); remove it or pick "
                    f"an algorithm that reads it",
                )
            object.__setattr__(self, item.name, value)
        if name == "ad-psgd":
            self._check_pairwise()
        if self.secure_sum:
            self._check_secure_sum()

    def _check_secure_sum(self) -> None:
        """Secure sums (``gossip.secure_sum``) reveal only the weighted sum of the neighbours'
        models: a rule that needs the individual models, or a codec of its own, cannot run."""
        if type(consensus.build(self.aggregator)) is not consensus.WeightedMean:
            raise ConfigurationError(
                "secure_sum",
                f"cannot run with {{aggregator}} {self.aggregator!r}: a robust rule needs the "
                "individual models and a secure sum reveals only their weighted sum; use "
                "{aggregator} mean",
                mentions=("aggregator",),
            )
        if build_compressor(self.compressor).codec != "none":
            raise ConfigurationError(
                "secure_sum",
                f"cannot run with {{compressor}} {self.compressor!r}: a masked message is its own "
                "encoding (64-bit fixed point, twice a float32 message); use {compressor} none",
                mentions=("compressor",),
            )

    def _check_pairwise(self) -> None:
        """AD-PSGD's rule: an aggregator that runs on 2 models, no state per node."""
        _check_size(
            consensus.build(self.aggregator),
            self.aggregator,
            2,
            "an AD-PSGD exchange averages 2 models",
        )
        pairwise = PairwiseGossip(
            consensus.build(self.aggregator), build_compressor(self.compressor)
        )
        pairwise.check_batchable()  # state per node that changing pairs cannot carry

    @property
    def needs_topology(self) -> bool:
        """Whether the weights must come from a known graph: push-sum needs each column of
        P to sum to one, CHOCO a symmetric W over fixed neighbours whose copies it keeps,
        NoLoCo the round's matching (``random-matching``)."""
        return self.algorithm in ("push-sum", "choco", "noloco")

    def topology_caveat(self, topology: str | None) -> str | None:
        """A line an operator must read when this algorithm on ``topology`` will not do what
        its paper does (it still runs), else None. Both runners say it at start.

        SparseLoCo applies the mixed sparse pseudo-gradients to each node's slow weights and
        has no consensus term: only an exact mean (``complete``) keeps the nodes' slow
        weights equal (a sync peer without a topology mixes every member: that graph); on any
        other graph they drift apart.
        """
        if self.algorithm != "sparseloco" or topology is None:
            return None  # no topology: a sync peer mixes every member, the complete graph
        if parse_spec(topology)[0] == "complete":
            return None
        return (
            f"sparseloco on topology {topology!r}: its slow weights agree only under an exact mean "
            "(topology 'complete', as published); here nothing pulls them together and the "
            "nodes drift apart. To gossip, use noloco or diloco (compressor fp16, bf16 or "
            "qsgd), or choco with a sparse codec"
        )

    @property
    def pairwise(self) -> bool:
        """Whether the exchange is with one partner at a time (AD-PSGD)."""
        return self.algorithm == "ad-psgd"

    def given(self) -> dict[str, Any]:
        """The fields this algorithm reads, with their values (for records and status)."""
        return {key: getattr(self, key) for key in ALGORITHM_FIELDS[self.algorithm]}

    def check_neighbourhood(self, smallest: int, *, where: str = "the topology") -> None:
        """Refuse a robust rule that cannot run on the smallest neighbourhood ``where`` gives,
        and secure sums where a receiver would have fewer than 2 in-neighbours
        (:func:`gossip.secure_sum.check_neighbourhoods`).

        Args:
            smallest: own model plus the fewest in-neighbours any node mixes in a round
                (``topologies.smallest_neighbourhood``); AD-PSGD always has 2.
            where: what gives that neighbourhood, for the message.
        Raises :class:`ConfigurationError` naming ``secure_sum`` or ``aggregator``.
        """
        if self.secure_sum:
            from gossip.secure_sum import check_neighbourhoods

            try:
                check_neighbourhoods(smallest - 1, where=where)
            except ValueError as error:
                raise ConfigurationError("secure_sum", str(error)) from None
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
    if config.algorithm in ("diloco", "noloco", "sparseloco"):
        return _outer(config, compressor)
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
        gossip_steps=int(config.gossip_steps or 1),
        aggregator=consensus.build(config.aggregator or "mean"),
        compressor=compressor,
    )
    algorithm.name = config.algorithm
    return algorithm


def _outer(config: GossipConfig, compressor: Any) -> GossipAlgorithm:
    """The outer-optimizer family (``gossip.outer``) a validated config names."""
    common: dict[str, Any] = {
        "local_steps": int(config.local_steps),
        "outer_optimizer": config.outer_optimizer,
        "aggregator": consensus.build(config.aggregator),
        "compressor": compressor,
    }
    if config.algorithm == "noloco":
        return NoLoCo(consensus_step=float(config.consensus_step), **common)
    if config.algorithm == "sparseloco":
        return SparseLoCo(error_feedback=float(config.error_feedback), **common)
    return DiLoCo(**common)
