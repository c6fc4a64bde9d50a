"""Topologies by name, for command lines and configs: ``build("random-regular", 64, degree=4)``."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from topologies import graphs
from topologies.errors import TopologyError

if TYPE_CHECKING:
    import networkx as nx


@dataclass(frozen=True)
class TopologySpec:
    """One named topology: its builder, parameters (name -> default) and when to use it."""

    name: str
    builder: Callable[..., nx.Graph]
    summary: str
    degree: str
    use_when: str
    directed: bool = False
    params: Mapping[str, object] = field(default_factory=dict)


def _spec(
    name: str,
    builder: Callable[..., nx.Graph],
    summary: str,
    degree: str,
    use_when: str,
    *,
    directed: bool = False,
) -> TopologySpec:
    signature = inspect.signature(builder)
    params = {p.name: p.default for p in signature.parameters.values() if p.name != "n"}
    return TopologySpec(name, builder, summary, degree, use_when, directed, params)


TOPOLOGIES: dict[str, TopologySpec] = {
    s.name: s
    for s in [
        _spec(
            "ring",
            graphs.ring,
            "cycle 0-1-...-(n-1)-0",
            "2",
            "cheapest sparse baseline; consensus slows as n² (gap ~ 1/n²), so keep n small",
        ),
        _spec(
            "torus",
            graphs.torus,
            "2-D torus rows x cols (near-square by default; --rows/--cols)",
            "4",
            "grid-like networks (racks, meshes); gap ~ 1/n, much better than a ring at equal cost",
        ),
        _spec(
            "complete",
            graphs.complete,
            "every pair connected",
            "n − 1",
            "small n only: one round is exact averaging, but each peer talks to everyone",
        ),
        _spec(
            "star",
            graphs.star,
            "hub 0 joined to every other node",
            "1 (leaves), n − 1 (hub)",
            "a parameter-server-like reference point; the hub is a bottleneck and a single point of failure",
        ),
        _spec(
            "hypercube",
            graphs.hypercube,
            "i ~ i XOR 2^k (n a power of two)",
            "log2 n",
            "n a power of two and log-degree is affordable; gap ~ 1/log n",
        ),
        _spec(
            "random-regular",
            graphs.random_regular,
            "uniformly random connected d-regular graph (--degree, --seed)",
            "d (--degree)",
            "an expander at constant degree: gap stays bounded away from 0 as n grows",
        ),
        _spec(
            "erdos-renyi",
            graphs.erdos_renyi,
            "G(n, p), redrawn until connected (--p, default 2 ln(n)/n; --seed)",
            "≈ p (n − 1)",
            "modelling unstructured peer-to-peer overlays; degrees vary, so Metropolis weights matter",
        ),
        _spec(
            "small-world",
            graphs.small_world,
            "Watts-Strogatz: ring lattice of even --degree, rewired with prob --p",
            "d on average (--degree)",
            "local links plus a few shortcuts: interpolates ring (p = 0) and random (p = 1)",
        ),
        _spec(
            "exponential",
            graphs.exponential,
            "directed: i sends to i + 2^k mod n, k < ceil(log2 n); uniform weights (Ying et al. 2021)",
            "⌈log2 n⌉ (out and in)",
            "the default for decentralized SGD and push-sum: log-degree, gap 2/(1+log2 n)",
            directed=True,
        ),
        _spec(
            "exponential-undirected",
            graphs.exponential_undirected,
            "undirected: i ~ i ± 2^k mod n, k < ceil(log2 n)",
            "≤ 2⌈log2 n⌉",
            "symmetric (Metropolis) weights at log-degree; no push-sum needed",
        ),
        _spec(
            "dumbbell",
            graphs.dumbbell,
            "two cliques joined by a single edge",
            "n/2 − 1 (n/2 at the bridge)",
            "a stress test: the bottleneck edge makes consensus slow despite high degree",
        ),
    ]
}


def canonical_name(name: str) -> str:
    """``random_regular`` and ``Random-Regular`` both mean ``random-regular``; unknown raises."""
    key = name.strip().lower().replace("_", "-")
    if key not in TOPOLOGIES:
        raise TopologyError(
            "name", f"unknown topology {name!r}; choose one of: {', '.join(TOPOLOGIES)}"
        )
    return key


def build(name: str, n: int, **params: object) -> nx.Graph:
    """Build the topology ``name`` on ``n`` nodes; ``params`` override its defaults.

    >>> build("random-regular", 16, degree=3, seed=1).number_of_nodes()
    16
    """
    spec = TOPOLOGIES[canonical_name(name)]
    for key in params:
        if key not in spec.params:
            allowed = ", ".join(spec.params) or "none"
            raise TopologyError(
                key, f"{spec.name} takes no parameter {key!r}; its parameters: {allowed}"
            )
    return spec.builder(n, **params)
