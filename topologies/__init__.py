"""Graphs that decide who gossips with whom, their mixing weights, and how fast they agree.

>>> import topologies
>>> graph = topologies.build("exponential", 64)
>>> W = topologies.mixing_matrix(graph)          # uniform 1/7 weights, doubly stochastic
>>> round(topologies.spectral_gap(W), 4)
0.2857
>>> table = topologies.neighbour_table(W)        # padded [n, k] arrays for the runners
>>> schedule = topologies.build_schedule("random-regular:degree=4", 64, seed=1)  # from a spec

See ``docs/topologies.md`` for every topology, its spectral gap, and when to use it.
"""

from topologies.errors import MixingMatrixError, TopologyError
from topologies.graphs import (
    complete,
    dumbbell,
    erdos_renyi,
    exponential,
    exponential_undirected,
    from_graph,
    hypercube,
    random_regular,
    ring,
    small_world,
    star,
    torus,
)
from topologies.mixing import (
    WEIGHT_SCHEMES,
    lazy,
    max_degree,
    metropolis_hastings,
    mixing_matrix,
    uniform,
    validate_mixing,
)
from topologies.neighbours import NeighbourTable, neighbour_table, smallest_neighbourhood
from topologies.registry import TOPOLOGIES, TopologySpec, build, canonical_name
from topologies.schedules import (
    OnePeerExponential,
    RandomKOut,
    RandomMatching,
    Schedule,
    Static,
)
from topologies.specs import (
    SCHEDULES,
    ScheduleSpec,
    build_schedule,
    parse_spec,
    topology_names,
)
from topologies.spectral import (
    DENSE_LIMIT,
    contraction_factor,
    rounds_to_consensus,
    spectral_gap,
)

__all__ = [
    "DENSE_LIMIT",
    "SCHEDULES",
    "TOPOLOGIES",
    "WEIGHT_SCHEMES",
    "MixingMatrixError",
    "NeighbourTable",
    "OnePeerExponential",
    "RandomKOut",
    "RandomMatching",
    "Schedule",
    "ScheduleSpec",
    "Static",
    "TopologyError",
    "TopologySpec",
    "build",
    "build_schedule",
    "canonical_name",
    "complete",
    "contraction_factor",
    "dumbbell",
    "erdos_renyi",
    "exponential",
    "exponential_undirected",
    "from_graph",
    "hypercube",
    "lazy",
    "max_degree",
    "metropolis_hastings",
    "mixing_matrix",
    "neighbour_table",
    "parse_spec",
    "random_regular",
    "ring",
    "rounds_to_consensus",
    "small_world",
    "smallest_neighbourhood",
    "spectral_gap",
    "star",
    "topology_names",
    "torus",
    "uniform",
    "validate_mixing",
]
