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

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from topologies.errors import MixingMatrixError, TopologyError

if TYPE_CHECKING:
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

# Each name is imported from its module on first use (PEP 562): the packages that only parse
# spec strings (topologies.spec_grammar, through consensus, gossip and workloads) or list the
# names do not pay for networkx and scipy, which every `gossipnet peer` process would otherwise
# import at start-up (about 0.3 s of processor time); building a graph imports them.
_LAZY: dict[str, str] = {
    "DENSE_LIMIT": "topologies.spectral",
    "NeighbourTable": "topologies.neighbours",
    "OnePeerExponential": "topologies.schedules",
    "RandomKOut": "topologies.schedules",
    "RandomMatching": "topologies.schedules",
    "SCHEDULES": "topologies.specs",
    "Schedule": "topologies.schedules",
    "ScheduleSpec": "topologies.specs",
    "Static": "topologies.schedules",
    "TOPOLOGIES": "topologies.registry",
    "TopologySpec": "topologies.registry",
    "WEIGHT_SCHEMES": "topologies.mixing",
    "build": "topologies.registry",
    "build_schedule": "topologies.specs",
    "canonical_name": "topologies.registry",
    "complete": "topologies.graphs",
    "contraction_factor": "topologies.spectral",
    "dumbbell": "topologies.graphs",
    "erdos_renyi": "topologies.graphs",
    "exponential": "topologies.graphs",
    "exponential_undirected": "topologies.graphs",
    "from_graph": "topologies.graphs",
    "hypercube": "topologies.graphs",
    "lazy": "topologies.mixing",
    "max_degree": "topologies.mixing",
    "metropolis_hastings": "topologies.mixing",
    "mixing_matrix": "topologies.mixing",
    "neighbour_table": "topologies.neighbours",
    "parse_spec": "topologies.specs",
    "random_regular": "topologies.graphs",
    "ring": "topologies.graphs",
    "rounds_to_consensus": "topologies.spectral",
    "small_world": "topologies.graphs",
    "smallest_neighbourhood": "topologies.neighbours",
    "spectral_gap": "topologies.spectral",
    "star": "topologies.graphs",
    "topology_names": "topologies.specs",
    "torus": "topologies.graphs",
    "uniform": "topologies.mixing",
    "validate_mixing": "topologies.mixing",
}

if not TYPE_CHECKING:  # (hidden from mypy, which then still refuses a misspelt name)

    def __getattr__(name: str) -> object:
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *_LAZY})


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
