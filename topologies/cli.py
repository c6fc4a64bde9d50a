"""``gossipnet topology NAME --nodes N ...``: build a topology and print how well it mixes."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from topologies.errors import TopologyError
from topologies.mixing import WEIGHT_SCHEMES
from topologies.registry import TOPOLOGIES, build, canonical_name
from topologies.summary import TopologySummary, summarize

#: Builder parameter -> the flag that sets it.
FLAGS = {
    "n": "--nodes",
    "degree": "--degree",
    "p": "--p",
    "rows": "--rows",
    "cols": "--cols",
    "seed": "--seed",
    "weights": "--weights",
    "name": "NAME",
}

#: Topologies drawn with a seeded spring layout; the rest sit on a circle.
_SPRING = {"torus", "star", "random-regular", "erdos-renyi", "dumbbell"}


def _parser(prog: str) -> argparse.ArgumentParser:
    width = max(len(name) for name in TOPOLOGIES)
    listing = "\n".join(
        f"  {spec.name:<{width}}  {spec.summary}\n  {'':<{width}}  degree {spec.degree}"
        + (f"; parameters: {', '.join(FLAGS[p] for p in spec.params)}" if spec.params else "")
        for spec in TOPOLOGIES.values()
    )
    parser = argparse.ArgumentParser(
        prog=prog,
        description=(
            "Build a topology and print its nodes, edges, min/max degree, diameter, the spectral "
            "gap 1 - ||W - 11ᵀ/n||_2 of its mixing matrix W, and the rounds of gossip averaging "
            "needed to shrink disagreement by --factor."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"topologies:\n{listing}\n\nexample:\n  {prog} exponential --nodes 64",
    )
    parser.add_argument("name", metavar="NAME", help="topology, one of: " + ", ".join(TOPOLOGIES))
    parser.add_argument(
        "--nodes", type=int, required=True, metavar="N", help="number of nodes (>= 2)"
    )
    parser.add_argument(
        "--degree",
        type=int,
        metavar="D",
        help="degree for random-regular (default 4) and small-world (even, default 4)",
    )
    parser.add_argument(
        "--p",
        type=float,
        metavar="P",
        help="edge probability for erdos-renyi (default 2 ln(n)/n), rewiring probability for "
        "small-world (default 0.1)",
    )
    parser.add_argument("--rows", type=int, help="torus rows (must divide N)")
    parser.add_argument("--cols", type=int, help="torus columns (must divide N)")
    parser.add_argument(
        "--weights",
        choices=WEIGHT_SCHEMES,
        help="mixing weights for undirected topologies: metropolis (default; Metropolis-Hastings "
        "1/(1+max(d_i,d_j))), max-degree (1/(1+max degree)), lazy ((I+W_metropolis)/2), uniform "
        "(column-stochastic push weights 1/(1+d)). The directed exponential graph has fixed "
        "uniform weights 1/(1+ceil(log2 N)) and accepts only --weights uniform",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        metavar="S",
        help="seed for random topologies (random-regular, erdos-renyi, small-world); "
        "deterministic topologies do not use it (default 0)",
    )
    parser.add_argument(
        "--factor",
        type=float,
        default=1e-3,
        help="disagreement reduction for the rounds estimate, in (0, 1) (default 1e-3)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument(
        "--plot", metavar="FILE.png", help="also draw the graph to this PNG (written atomically)"
    )
    return parser


def _text(summary: TopologySummary) -> str:
    kind = "directed" if summary.directed else "undirected"
    degree = "out-degree" if summary.directed else "degree"
    rounds = (
        "n/a (||W - 11ᵀ/n||_2 >= 1)"
        if summary.rounds_to_consensus is None
        else str(summary.rounds_to_consensus)
    )
    rows = [
        ("topology", f"{summary.topology} ({kind})"),
        ("nodes", str(summary.nodes)),
        ("edges", str(summary.edges)),
        (f"min/max {degree}", f"{summary.min_degree} / {summary.max_degree}"),
        ("diameter", str(summary.diameter)),
        ("weights", summary.weights),
        ("spectral gap", f"{summary.spectral_gap:.4g}"),
        (f"rounds to {summary.factor:g}", rounds),
    ]
    width = max(len(key) for key, _ in rows)
    return "\n".join(f"{key:<{width}}  {value}" for key, value in rows)


def main(argv: Sequence[str], prog: str = "gossipnet topology") -> int:
    """Run ``gossipnet topology``; returns the exit code (argparse exits 2 on bad input)."""
    parser = _parser(prog)
    args = parser.parse_args(list(argv))
    try:
        name = canonical_name(args.name)
    except TopologyError as error:
        parser.error(f"argument NAME: {error.message}")
    spec = TOPOLOGIES[name]
    params: dict[str, object] = {}
    for key in ("degree", "p", "rows", "cols"):
        value = getattr(args, key)
        if value is None:
            continue
        if key not in spec.params:
            accepted = ", ".join(FLAGS[p] for p in spec.params if p != "seed") or "none"
            parser.error(f"argument {FLAGS[key]}: {name} does not take it (its flags: {accepted})")
        params[key] = value
    if "seed" in spec.params:
        params["seed"] = args.seed
    if spec.directed and args.weights not in (None, "uniform"):
        parser.error(
            f"argument --weights: the directed {name} graph has fixed uniform weights "
            "1/(1+ceil(log2 N)); --weights applies to undirected topologies "
            "(try exponential-undirected), or pass --weights uniform"
        )
    if not 0.0 < args.factor < 1.0:
        parser.error(f"argument --factor: {args.factor:g} must lie in (0, 1)")
    plot = Path(args.plot) if args.plot else None
    if plot is not None:
        if plot.suffix.lower() != ".png":
            parser.error(f"argument --plot: {args.plot!r} must end in .png")
        if not plot.parent.is_dir():
            parser.error(f"argument --plot: directory {str(plot.parent)!r} does not exist")
    try:
        graph = build(name, args.nodes, **params)
    except TopologyError as error:
        parser.error(f"argument {FLAGS.get(error.parameter, error.parameter)}: {error.message}")
    summary = summarize(graph, name=name, weights=args.weights, factor=args.factor)
    if plot is not None:
        from topologies.plot import draw

        draw(
            graph,
            plot,
            title=(
                f"{name}{' (directed, arrows not drawn)' if summary.directed else ''}, "
                f"n = {summary.nodes}, spectral gap {summary.spectral_gap:.4g}"
            ),
            layout="spring" if name in _SPRING else "circular",
            seed=args.seed,
        )
    if args.json:
        print(json.dumps(summary.as_dict(), indent=2))
    else:
        print(_text(summary))
    return 0
