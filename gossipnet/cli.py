"""The ``gossipnet`` command: a thin dispatcher over subcommands.

Each subcommand's code lives in the package it drives (``topologies.cli``,
``sim.cli``, ``peer.cli``) and exposes ``main(argv, prog) -> int``. The
dispatcher imports a subcommand's module only when that subcommand runs, so
``gossipnet --help`` answers instantly and an edge install that lacks the
simulator's extras still runs ``gossipnet peer``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gossipnet import __version__

SubcommandMain = Callable[[Sequence[str], str], int]


@dataclass(frozen=True)
class Subcommand:
    name: str
    summary: str
    load: Callable[[], SubcommandMain]


def _topology() -> SubcommandMain:
    from topologies.cli import main

    return main


SUBCOMMANDS: dict[str, Subcommand] = {
    s.name: s
    for s in [
        Subcommand(
            "topology",
            "build a topology, print its degree, diameter, spectral gap and rounds to consensus",
            _topology,
        ),
        Subcommand(
            "sim",
            "simulate n peers: run an experiment TOML, or compare algorithms on it",
            lambda: __import__("sim.cli", fromlist=["main"]).main,
        ),
        Subcommand(
            "workloads",
            "list data sets, partitions and models, or inspect one setup (sizes, skew, parameters)",
            lambda: __import__("workloads.cli", fromlist=["main"]).main,
        ),
        Subcommand(
            "consensus",
            "list aggregation rules and attacks with their parameters, or check a spec string",
            lambda: __import__("consensus.cli", fromlist=["main"]).main,
        ),
        Subcommand(
            "peer",
            "run one networked peer: listen, join a swarm, train on a shard, gossip",
            lambda: __import__("peer.cli", fromlist=["main"]).main,
        ),
        Subcommand(
            "launch",
            "run a local swarm of N peer processes: live table, accuracy vs centralized",
            lambda: __import__("peer.launch", fromlist=["main"]).main,
        ),
        Subcommand(
            "demo",
            "a 4-peer swarm on MNIST-1D in about a minute (launch with good defaults)",
            lambda: __import__("peer.launch", fromlist=["demo_main"]).demo_main,
        ),
        Subcommand(
            "status",
            "show a running peer's /v1/status (readable, or --json)",
            lambda: __import__("peer.status", fromlist=["main"]).main,
        ),
    ]
}


def _parser() -> argparse.ArgumentParser:
    width = max(len(name) for name in SUBCOMMANDS)
    listing = "\n".join(f"  {s.name:<{width}}  {s.summary}" for s in SUBCOMMANDS.values())
    parser = argparse.ArgumentParser(
        prog="gossipnet",
        description=(
            "Decentralized gossip training of PyTorch models: peers exchange model deltas "
            "with their neighbours, with no central server."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"subcommands:\n{listing}\n\nRun 'gossipnet COMMAND --help' for a command's options.",
        usage="gossipnet [-h] [--version] COMMAND [ARGS ...]",
    )
    parser.add_argument("--version", action="version", version=f"gossipnet {__version__}")
    parser.add_argument(
        "command",
        metavar="COMMAND",
        choices=list(SUBCOMMANDS),
        help="one of: " + ", ".join(SUBCOMMANDS),
    )
    parser.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``gossipnet`` command; returns the process exit code."""
    args = _parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    command = SUBCOMMANDS[args.command]
    return command.load()(args.args, f"gossipnet {command.name}")


if __name__ == "__main__":
    sys.exit(main())
