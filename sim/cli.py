"""``gossipnet sim``: run one experiment file, or compare several algorithms on it.

gossipnet sim run EXP.toml [--rounds N] [--seed S] [--jsonl F] [--csv F] [--plot F]
gossipnet sim compare EXP.toml --algorithms dpsgd,allreduce,fedavg [--plot F] [--jsonl F]
gossipnet sim list
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sim.build import build
from sim.config import ALGORITHMS, ConfigError, ExperimentConfig, load_experiment
from sim.metrics import Record, plot, write_csv, write_jsonl
from sim.runner import run


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Vectorized simulation of n peers: gossip algorithms and baselines on one "
        "workload and one simulated network.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run_parser = commands.add_parser("run", help="run the experiment in a TOML file")
    compare = commands.add_parser(
        "compare", help="run several algorithms on one experiment: one table, one figure"
    )
    for sub in (run_parser, compare):
        sub.add_argument(
            "experiment", type=Path, help="experiment TOML file (see docs/simulator.md)"
        )
        sub.add_argument("--rounds", type=int, help="override the file's rounds")
        sub.add_argument("--seed", type=int, help="override the file's seed")
        sub.add_argument(
            "--device",
            help="override the file's device: auto (the GPU when there is one), cpu, cuda, "
            "cuda:INDEX (default: the file's, else cpu)",
        )
        sub.add_argument("--jsonl", type=Path, help="write the records as JSON lines")
        sub.add_argument(
            "--plot", type=Path, help="draw accuracy vs time / bytes, consensus distance"
        )
        sub.add_argument("--quiet", action="store_true", help="no progress bar")
    run_parser.add_argument("--csv", type=Path, help="write the records as CSV")
    compare.add_argument(
        "--algorithms",
        required=True,
        help="comma-separated names; choices: " + ", ".join(ALGORITHMS),
    )
    commands.add_parser("list", help="list the algorithms")
    return parser


def _override(config: ExperimentConfig, args: argparse.Namespace) -> ExperimentConfig:
    changes: dict[str, Any] = {}
    if args.rounds is not None:
        changes["rounds"] = args.rounds
    if args.seed is not None:
        changes["seed"] = args.seed
    if args.device is not None:
        changes["device"] = args.device
    return dataclasses.replace(config, **changes) if changes else config


def _run_one(config: ExperimentConfig, quiet: bool) -> list[Record]:
    from rich.progress import Progress

    algorithm, ctx, evaluation = build(config)
    with Progress(transient=True, disable=quiet) as progress:
        task = progress.add_task(algorithm.name, total=config.rounds)
        return run(
            algorithm,
            ctx,
            evaluation,
            rounds=config.rounds,
            eval_every=config.eval_every,
            on_round=lambda _: progress.advance(task),
        )


def _table(runs: dict[str, list[Record]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="final evaluation (honest peers)")
    for column in (
        "algorithm",
        "rounds",
        "sim time (s)",
        "bytes total",
        "bytes busiest",
        "accuracy",
        "worst peer",
        "consensus dist.",
    ):
        table.add_column(column, justify="left" if column == "algorithm" else "right", no_wrap=True)
    for name, records in runs.items():
        last = records[-1]
        table.add_row(
            name,
            str(last.round),
            f"{last.time:.4g}",
            f"{last.bytes_total:.4g}",
            f"{last.bytes_busiest:.4g}",
            f"{last.test_accuracy:.4f}",
            f"{last.peer_accuracy_worst:.4f}",
            f"{last.consensus_distance:.3g}",
        )
    console = Console()
    console.width = max(console.width, 120)
    console.print(table)


def main(argv: Sequence[str], prog: str = "gossipnet sim") -> int:
    parser = _parser(prog)
    args = parser.parse_args(list(argv))
    if args.command == "list":
        for name, summary in ALGORITHMS.items():
            print(f"{name:<24} {summary}")
        return 0
    try:
        config = _override(load_experiment(args.experiment), args)
        if args.command == "run":
            runs = {config.algorithm.name: _run_one(config, args.quiet)}
        else:
            names = [n.strip() for n in args.algorithms.split(",") if n.strip()]
            unknown = [n for n in names if n not in ALGORITHMS]
            if not names or unknown:
                parser.error(
                    f"--algorithms: unknown {', '.join(unknown) or '(empty)'}; "
                    f"choose from {', '.join(ALGORITHMS)}"
                )
            runs = {name: _run_one(config.with_algorithm(name), args.quiet) for name in names}
    except (ConfigError, ValueError) as error:  # bad input found while building or running
        parser.error(str(error))
    _table(runs)
    output = config.output
    jsonl = args.jsonl or (Path(output.jsonl) if output.jsonl else None)
    csv = getattr(args, "csv", None) or (Path(output.csv) if output.csv else None)
    figure = args.plot or (Path(output.plot) if output.plot else None)
    every = [record for records in runs.values() for record in records]
    if jsonl:
        write_jsonl(every, jsonl)
    if csv:
        write_csv(every, csv)
    if figure:
        plot(runs, figure, title=config.name)
    return 0
