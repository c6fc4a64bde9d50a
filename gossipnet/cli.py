"""The ``gossipnet`` command: a thin dispatcher over subcommands.

Each subcommand's code lives in the package it drives (``topologies.cli``,
``sim.cli``, ``peer.app.cli``, ``peer.app.export``) and exposes ``main(argv, prog) -> int``. The
dispatcher imports a subcommand's module only when that subcommand runs, so
``gossipnet --help`` answers instantly and an edge install that lacks the
simulator's extras still runs ``gossipnet peer``. A mistake on this level (an unknown
subcommand) is one line in the format every subcommand uses (:mod:`peer.app.usage`):
``gossipnet: error: COMMAND: invalid choice 'x'; allowed: demo, peer, ...``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from gossipnet import __version__

SubcommandMain = Callable[[Sequence[str], str], int]


@dataclass(frozen=True)
class Subcommand:
    """One ``gossipnet`` subcommand: its name, one-line summary and ``module:function``."""

    name: str
    summary: str
    target: str

    def load(self) -> SubcommandMain:
        module, _, function = self.target.partition(":")
        entry: SubcommandMain = getattr(importlib.import_module(module), function)
        return entry


SUBCOMMANDS: dict[str, Subcommand] = {
    s.name: s
    for s in [
        Subcommand(
            "demo",
            "a 4-peer swarm on MNIST-1D, under half a minute on 2 cores (launch, good defaults)",
            "peer.app.launch:demo_main",
        ),
        Subcommand(
            "peer",
            "run one networked peer: listen, join a swarm, train on a shard, gossip",
            "peer.app.cli:main",
        ),
        Subcommand(
            "launch",
            "run a local swarm of N peer processes (flags, or an experiment file): live "
            "table, accuracy vs centralized",
            "peer.app.launch:main",
        ),
        Subcommand(
            "export",
            "write a model you can take home from checkpoints (one peer's, or the swarm's average)",
            "peer.app.export:main",
        ),
        Subcommand(
            "status",
            "show a running peer's /v1/status (readable, or --json)",
            "peer.app.status:main",
        ),
        Subcommand(
            "sim",
            "simulate n peers: run an experiment TOML, compare or sweep any of its fields; "
            "calibrate its time model on this machine, check its prediction against real peers",
            "sim.cli:main",
        ),
        Subcommand(
            "topology",
            "build a topology, print its degree, diameter, spectral gap and rounds to consensus",
            "topologies.cli:main",
        ),
        Subcommand(
            "consensus",
            "list aggregation rules and attacks with their parameters, or check a spec string",
            "consensus.cli:main",
        ),
        Subcommand(
            "workloads",
            "list data sets, partitions and models, or inspect one setup (sizes, skew, parameters)",
            "workloads.cli:main",
        ),
    ]
}


SIM_FRONT_DOOR: dict[str, Subcommand] = {
    "calibrate": Subcommand(
        "calibrate",
        "measure this machine's step time and real stack for the simulator's [network]",
        "gossipnet.calibrate:main",
    ),
    "predict": Subcommand(
        "predict",
        "run an experiment file simulated and as real peers: predicted vs measured time",
        "gossipnet.predict:main",
    ),
}
"""``gossipnet sim`` subcommands that need a real peer as well as the simulator: they live
here (``sim`` and ``peer`` never import each other), dispatched before ``sim.cli``."""
EXPERIMENT_LAUNCH = Subcommand(
    "launch",
    "the real peers of an experiment file (gossipnet launch EXPERIMENT.toml)",
    "gossipnet.experiment_launch:main",
)
"""``gossipnet launch EXPERIMENT.toml``: launch with a file instead of flags, mapped here (the
simulator reads the file, the peers run it)."""


class _Parser(argparse.ArgumentParser):
    """Errors as one line, ``gossipnet: error: WHAT; allowed: ...``, exit code 2."""

    def error(self, message: str) -> NoReturn:
        from peer.app.usage import exit_with  # only on this error path: --help stays instant

        exit_with(self.prog, message)


def _parser() -> argparse.ArgumentParser:
    width = max(len(name) for name in SUBCOMMANDS)
    listing = "\n".join(f"  {s.name:<{width}}  {s.summary}" for s in SUBCOMMANDS.values())
    parser = _Parser(
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


OWN_PACKAGES = ("topologies", "workloads", "consensus", "gossip", "sim", "peer")
"""The top-level import packages this distribution installs next to ``gossipnet``."""


def foreign_packages(root: Path | None = None) -> list[str]:
    """Our package names that import from somewhere else than next to ``gossipnet``.

    PyPI has unrelated projects named ``gossip``, ``peer``, ``consensus``... and pip lets
    one overwrite or shadow another; each entry is ``"NAME (found at PATH)"``. Looks the
    packages up without importing them (``importlib.util.find_spec`` on the top level).
    """
    home = (root or Path(__file__).resolve().parent.parent).resolve()
    found = []
    for name in OWN_PACKAGES:
        spec = importlib.util.find_spec(name)
        origin = None if spec is None else spec.origin
        if origin is None or Path(origin).resolve().parent.parent != home:
            found.append(f"{name} (found at {origin or 'nowhere'})")
    return found


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``gossipnet`` command; returns the process exit code."""
    args = _parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    foreign = foreign_packages()
    if foreign:
        home = Path(__file__).resolve().parent.parent
        print(
            f"gossipnet: error: these packages are not gossipnet's (expected next to it in "
            f"{home}): {'; '.join(foreign)}; another project installed packages with the same "
            "names. Install gossipnet in a dedicated virtual environment",
            file=sys.stderr,
        )
        return 2
    command = SUBCOMMANDS[args.command]
    if command.name == "launch" and args.args[:1] and not args.args[0].startswith("-"):
        return EXPERIMENT_LAUNCH.load()(args.args, "gossipnet launch")
    if command.name == "sim" and args.args[:1] and args.args[0] in SIM_FRONT_DOOR:
        sub = SIM_FRONT_DOOR[args.args[0]]
        return sub.load()(args.args[1:], f"gossipnet sim {sub.name}")
    return command.load()(args.args, f"gossipnet {command.name}")


if __name__ == "__main__":
    sys.exit(main())
