"""Robust aggregation rules and Byzantine attacks, in pure torch.

Every rule follows the vector convention ``own [*, d], neighbours [*, k, d],
weights [*, k], mask [*, k] -> [*, d]`` (weights are the off-diagonal mixing
weights W_ij; the self weight is 1 - sum). Build one by spec string::

    >>> import consensus, torch
    >>> rule = consensus.build("trimmed-mean:b=1")
    >>> neighbours = torch.tensor([[1.0, 2.0], [3.0, 4.0], [100.0, -100.0]])
    >>> rule(torch.zeros(2), neighbours, torch.full((3,), 0.25))
    tensor([2., 1.])

``consensus.weighted_mean`` / ``WeightedMean`` (spec ``mean``) is THE gossip
averaging that ``gossip``, ``sim`` and ``peer`` call; ``consensus.all_finite`` is
the cheap exact NaN/Inf check they share. ``consensus.byzantine_messages`` (all inboxes at
once, the simulator) and ``consensus.byzantine_message`` (one Byzantine node to one receiver,
a peer) inject an attack's messages by one rule. See ``docs/consensus.md``.
"""

from consensus._inputs import all_finite
from consensus.attacks import (
    ATTACKS,
    ALittleIsEnough,
    Attack,
    AttackBase,
    Dissensus,
    Garbage,
    GaussianNoise,
    InnerProductManipulation,
    Mimic,
    Scaling,
    SignFlip,
    alie_z,
    build_attack,
    describe_attacks,
)
from consensus.base import Aggregator, Rule
from consensus.build import AGGREGATORS, build, describe_aggregators
from consensus.clipping import CenteredClipping, ClippedGossip, GeometricMedian
from consensus.injection import byzantine_message, byzantine_messages
from consensus.krum import Bulyan, Krum, MultiKrum
from consensus.mean import WeightedMean, weighted_mean
from consensus.order_statistics import CoordinateWiseMedian, TrimmedMean
from consensus.registry import Entry, Parameter
from consensus.wrappers import Bucketing, NearestNeighbourMixing, Wrapper

__all__ = [
    "AGGREGATORS",
    "ATTACKS",
    "ALittleIsEnough",
    "Aggregator",
    "Attack",
    "AttackBase",
    "Bucketing",
    "Bulyan",
    "CenteredClipping",
    "ClippedGossip",
    "CoordinateWiseMedian",
    "Dissensus",
    "Entry",
    "Garbage",
    "GaussianNoise",
    "GeometricMedian",
    "InnerProductManipulation",
    "Krum",
    "Mimic",
    "MultiKrum",
    "NearestNeighbourMixing",
    "Parameter",
    "Rule",
    "Scaling",
    "SignFlip",
    "TrimmedMean",
    "WeightedMean",
    "Wrapper",
    "alie_z",
    "all_finite",
    "build",
    "build_attack",
    "byzantine_message",
    "byzantine_messages",
    "describe_aggregators",
    "describe_attacks",
    "weighted_mean",
]
