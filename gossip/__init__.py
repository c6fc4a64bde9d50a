"""Per-node decentralized update rules and compressors, shared by the simulator and the peer.

Every rule is written once over the vector convention (``own [*, d]``, ``received [*, k, m]``,
``weights [*, k]``, ``mask [*, k]``): the simulator calls it with ``*`` = all n nodes, a peer
with no batch. The runner protocol (init / model / message / combine plus a
:class:`RoundPlan` of gradient, step and exchange phases) is documented in
:mod:`gossip.algorithms` and ``docs/algorithms.md``.

>>> import torch, gossip
>>> algorithm = gossip.Choco(gossip.build_compressor("topk:ratio=0.1"), consensus_step=0.2)
>>> algorithm.plan.phases()
('gradient', 'step', 'exchange')
"""

from gossip.algorithms import (
    ORDERS,
    Aggregator,
    Choco,
    ChocoState,
    DecentralizedSGD,
    GossipAlgorithm,
    GossipState,
    NeighbourTableLike,
    Order,
    Phase,
    PushSum,
    PushSumState,
    RoundPlan,
    local_sgd,
)
from gossip.compression import (
    COMPRESSORS,
    PAYLOAD_ERROR_KINDS,
    BFloat16,
    Compressed,
    Compressor,
    CompressorInfo,
    ErrorFeedback,
    Float16,
    NoCompression,
    Payload,
    PayloadError,
    PayloadErrorKind,
    RandomK,
    StochasticQuantization,
    TopK,
    build_compressor,
    decode,
)
from gossip.configuration import (
    ALGORITHM_FIELDS,
    DENSE_COMPRESSORS,
    GOSSIP_ALGORITHMS,
    ConfigurationError,
    GossipConfig,
    build_algorithm,
)
from gossip.flat import FlatParameters, LayoutEntry, ParameterLayout
from gossip.pairwise import PairwiseGossip, ad_psgd, average_pair

__all__ = [
    "ALGORITHM_FIELDS",
    "COMPRESSORS",
    "DENSE_COMPRESSORS",
    "GOSSIP_ALGORITHMS",
    "ORDERS",
    "PAYLOAD_ERROR_KINDS",
    "Aggregator",
    "BFloat16",
    "Choco",
    "ChocoState",
    "Compressed",
    "Compressor",
    "CompressorInfo",
    "ConfigurationError",
    "DecentralizedSGD",
    "ErrorFeedback",
    "FlatParameters",
    "Float16",
    "GossipAlgorithm",
    "GossipConfig",
    "GossipState",
    "LayoutEntry",
    "NeighbourTableLike",
    "NoCompression",
    "Order",
    "PairwiseGossip",
    "ParameterLayout",
    "Payload",
    "PayloadError",
    "PayloadErrorKind",
    "Phase",
    "PushSum",
    "PushSumState",
    "RandomK",
    "RoundPlan",
    "StochasticQuantization",
    "TopK",
    "ad_psgd",
    "average_pair",
    "build_algorithm",
    "build_compressor",
    "decode",
    "local_sgd",
]
