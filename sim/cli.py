"""``gossipnet sim``: run one experiment file, compare runs on it, or sweep a grid over it.

gossipnet sim run EXP.toml [--rounds N] [--seed S] [--jsonl F] [--csv F] [--plot F]
gossipnet sim compare EXP.toml [--algorithms dpsgd,allreduce | --over FIELD=V1,V2]
    (neither: the runs the file names in its [compare] table)
    [--csv F] [--plot F] [--jsonl F] [--jobs N | --ray ADDRESS]
gossipnet sim sweep EXP.toml --grid FIELD=V1,V2 [--grid ...] --out DIR
    [--set FIELD=V] [--rounds N] [--jobs N | --ray ADDRESS] [--skip-invalid] [--parquet]
gossipnet sim list

``compare`` is a sweep over one field without a results folder; ``sweep`` writes a tidy
table (CSV, Parquet), a figure and one file per finished run, and resumes. See
docs/sweeps.md.

Exit status: 0 done; 1 a run of a sweep or comparison failed (the others' results are
written); 2 bad input (one line on stderr); 3 a run diverged (its honest models stopped being
finite, :mod:`sim.divergence`): what it recorded until then is written, a sweep or comparison
runs the others.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from sim.build import build
from sim.config import ALGORITHMS, ConfigError, ExperimentConfig, load_experiment
from sim.divergence import EXIT_DIVERGED, Divergence
from sim.metrics import Record, plot, write_csv, write_jsonl, write_runs_jsonl
from sim.runner import run
from sim.sweep import (
    FIELD_ALIASES,
    GridAxis,
    SweepError,
    SweepOutcome,
    SweepPlan,
    execute,
    named_runs_axis,
    parse_axis,
    parse_setting,
    plan_sweep,
    result_table,
    write_outputs,
)
from sim.sweep_executors import (
    Executor,
    LocalExecutor,
    RayExecutor,
)
from sim.sweep_progress import SweepProgress
from sim.sweep_store import RunStore
from sim.sweep_table import MissingDependency, parquet_available
from sim.sweep_table import write_csv as write_table
from workloads.task import LANGUAGE_MODEL

_FIELDS_HELP = (
    "FIELD is a short name ("
    + ", ".join(FIELD_ALIASES)
    + ") or a dotted path into the file (optimizer.lr, algorithm.topology_params.degree)"
)


class _Parser(argparse.ArgumentParser):
    """Bad input is one line on stderr and exit code 2 (no usage block above it)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = _Parser(
        prog=prog,
        description="Vectorized simulation of n peers: gossip algorithms and baselines on one "
        "workload and one simulated network. `sweep` runs a grid over any field of the file "
        "(local processes or Ray, resumable; docs/sweeps.md). `gossipnet sim calibrate "
        "[EXP.toml]` measures this machine's step time and real stack for the [network] "
        "table (docs/calibration.md); `gossipnet sim predict EXP.toml` runs the file "
        "simulated and as real peers and compares the times (docs/prediction.md).",
    )
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_Parser
    )
    run_parser = commands.add_parser("run", help="run the experiment in a TOML file")
    compare = commands.add_parser(
        "compare",
        help="run the experiment under several values of one field (algorithms, aggregators, "
        "attacks, ...), or the runs its [compare] table names: one table, one figure",
    )
    sweep = commands.add_parser(
        "sweep",
        help="run a grid of values over fields of the experiment: tidy CSV/Parquet table, "
        "figure, progress, resumable; local processes or Ray",
        description="Run the experiment at every point of a grid. " + _FIELDS_HELP + ". "
        "Results go to DIR: results.csv, results.parquet (with pyarrow), accuracy.png and "
        "runs/KEY.json, one per finished run; rerunning the same command redoes nothing "
        "that finished. See docs/sweeps.md.",
    )
    for sub in (run_parser, compare, sweep):
        sub.add_argument(
            "experiment", type=Path, help="experiment TOML file (see docs/simulator.md)"
        )
        sub.add_argument("--rounds", type=int, help="override the file's rounds")
        sub.add_argument(
            "--device",
            help="override the file's device: auto (the GPU when there is one), cpu, cuda, "
            "cuda:INDEX (default: the file's, else cpu)",
        )
        sub.add_argument("--quiet", action="store_true", help="no progress")
    for sub in (run_parser, compare):
        sub.add_argument("--seed", type=int, help="override the file's seed")
        sub.add_argument("--jsonl", type=Path, help="write the records as JSON lines")
        sub.add_argument(
            "--plot", type=Path, help="draw accuracy vs time / bytes, consensus distance"
        )
        sub.add_argument("--csv", type=Path, help="write the records as CSV")
    chosen = compare.add_mutually_exclusive_group()
    chosen.add_argument(
        "--algorithms", help="comma-separated names; allowed: " + ", ".join(ALGORITHMS)
    )
    chosen.add_argument(
        "--over",
        metavar="FIELD=V1,V2",
        help="vary one field, e.g. aggregator=mean,trimmed-mean:b=4 or attack=sign-flip,alie; "
        + _FIELDS_HELP,
    )
    sweep.add_argument(
        "--grid",
        action="append",
        required=True,
        metavar="FIELD=V1,V2",
        help="one axis of the grid (repeat for more); values that read as TOML numbers or "
        "booleans are; a spec's own parameters may follow a comma (krum:f=1,m=2)",
    )
    sweep.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="one value for every run (repeatable), not a column of the table",
    )
    sweep.add_argument("--out", type=Path, required=True, help="results folder (resumable)")
    sweep.add_argument(
        "--skip-invalid",
        action="store_true",
        help="skip grid points the configuration refuses (listed) instead of stopping",
    )
    sweep.add_argument(
        "--parquet",
        action="store_true",
        help="require results.parquet (default: written when pyarrow is installed)",
    )
    for sub in (compare, sweep):
        where = sub.add_mutually_exclusive_group()
        where.add_argument(
            "--jobs", type=int, help="local worker processes (default: the number of CPUs)"
        )
        where.add_argument(
            "--ray",
            metavar="ADDRESS",
            help="run one Ray task per run: auto (the cluster `ray start` runs here), local "
            "(a fresh local instance) or a cluster address (needs gossipnet[ray])",
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


def _run_one(config: ExperimentConfig, quiet: bool, prog: str) -> list[Record]:
    """One run with a progress bar; a divergence is one line on stderr."""
    from rich.progress import Progress

    def diverged(divergence: Divergence) -> None:
        print(f"{prog}: {config.name}: {divergence.message()}", file=sys.stderr)

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
            on_diverge=diverged,
        )


def _table(runs: dict[str, list[Record]], first: str = "algorithm") -> None:
    from rich.console import Console
    from rich.table import Table

    # a run that diverged shows its last evaluation before that, and the round it diverged at
    diverged = any(records[-1].diverged_at is not None for records in runs.values())
    table = Table(title="final evaluation (honest peers)")
    language = any(records[-1].task == LANGUAGE_MODEL for records in runs.values())
    private = any(records[-1].epsilon is not None for records in runs.values())  # DP-SGD
    pair = any(records[-1].epsilon_pair is not None for records in runs.values())
    headline = "val. bits/byte" if language else "accuracy"
    for column in (
        first,
        "rounds",
        "sim time (s)",
        "bytes total",
        "bytes busiest",
        headline,
        "worst peer",
        "consensus dist.",
        *(("diverged at",) if diverged else ()),
        *(("epsilon",) if private else ()),
        *(("epsilon pair", "paper's sum") if pair else ()),  # [privacy] pair = [u, v]
    ):
        table.add_column(column, justify="left" if column == first else "right", no_wrap=True)
    for name, records in runs.items():
        last = records[-1]
        cells = [
            name,
            str(last.round),
            f"{last.time:.4g}",
            f"{last.bytes_total:.4g}",
            f"{last.bytes_busiest:.4g}",
            f"{last.headline:.4f}",
            f"{last.worst_peer:.4f}",
            f"{last.consensus_distance:.3g}",
        ]
        if diverged:
            cells.append("" if last.diverged_at is None else f"round {last.diverged_at}")
        if private:
            budget = " (budget)" if last.privacy_stopped_at is not None else ""
            cells.append("" if last.epsilon is None else f"{last.epsilon:.3g}{budget}")
        if pair:
            for value in (last.epsilon_pair, last.epsilon_pair_muffliato):
                cells.append("" if value is None else f"{value:.3g}")
        table.add_row(*cells)
    console = Console()
    wide = (135 if diverged else 120) + (20 if private else 0) + (30 if pair else 0)
    console.width = max(console.width, wide, wide - 20 + max(len(name) for name in runs))
    console.print(table)


def _audit_lines(runs: dict[str, list[Record]]) -> None:
    """One line per audited run (``[audit]``): the attacks' results, mean over the honest
    peers and the worst peer."""
    for name, records in runs.items():
        last = records[-1]
        parts = []
        if last.membership_auc is not None:
            parts.append(
                f"membership AUC {last.membership_auc:.3f} (worst peer "
                f"{last.membership_auc_max:.3f}), advantage {last.membership_advantage:.3f} "
                f"(worst peer {last.membership_advantage_max:.3f})"
            )
        if last.reconstruction_cosine is not None:
            parts.append(
                f"reconstruction cosine {last.reconstruction_cosine:.3f} (worst peer "
                f"{last.reconstruction_cosine_max:.3f})"
            )
        if parts:
            print(f"audit: {name}: " + "; ".join(parts))


def _executor(args: argparse.Namespace) -> Executor:
    if args.ray is not None:
        executor = RayExecutor(args.ray)
        executor.connect()  # an unreachable cluster is refused before anything is drawn
        return executor
    return LocalExecutor(args.jobs)


def _settings(args: argparse.Namespace) -> list[tuple[tuple[str, ...], Any]]:
    """The one-value overrides: ``--set`` (sweep), then ``--rounds``/``--seed``/``--device``."""
    settings = [parse_setting(text) for text in getattr(args, "set", [])]
    for flag in ("rounds", "seed", "device"):
        value = getattr(args, flag, None)
        if value is not None:
            settings.append(((flag,), value))
    return settings


def _compare_axis(args: argparse.Namespace) -> GridAxis:
    if args.over is not None:
        return parse_axis(args.over, flag="--over")
    if args.algorithms is None:  # the runs the file names in its [compare] table
        return named_runs_axis(args.experiment)
    names = [n.strip() for n in args.algorithms.split(",") if n.strip()]
    unknown = [n for n in names if n not in ALGORITHMS]
    if not names or unknown:
        raise SweepError(
            "--algorithms",
            f"unknown {', '.join(unknown) or '(empty)'}; allowed: {', '.join(ALGORITHMS)}",
        )
    return parse_axis("algorithm=" + ",".join(names), flag="--algorithms")


def _compare_flag(args: argparse.Namespace) -> str:
    """The flag of ``sim compare`` that chose its runs (errors name it, never sweep's)."""
    if args.over is not None:
        return "--over"
    return "--algorithms" if args.algorithms is not None else "compare"


def _plan(args: argparse.Namespace, axes: Sequence[GridAxis]) -> SweepPlan:
    """The runs, checked; an error names this command's own flags (``compare`` has no
    ``--grid`` and no ``--skip-invalid``)."""
    compare = args.command == "compare"
    return plan_sweep(
        args.experiment,
        axes,
        settings=_settings(args),
        skip_invalid=getattr(args, "skip_invalid", False),
        check_device=args.ray is None,
        flag=_compare_flag(args) if compare else "--grid",
        skip_flag=None if compare else "--skip-invalid",
    )


def _report_invalid(plan: SweepPlan, label: str) -> None:
    for point in plan.invalid:
        print(f"{label}: skipping invalid point {point.label()}: {point.reason}", file=sys.stderr)


def _compare(args: argparse.Namespace) -> int:
    axis = _compare_axis(args)
    plan = _plan(args, [axis])
    executor = _executor(args)
    progress = SweepProgress(quiet=args.quiet, label="compare")
    try:
        outcome = execute(plan, executor, progress=progress)
    except KeyboardInterrupt:
        print("compare: interrupted", file=sys.stderr)
        return 130
    runs = outcome.runs()
    if runs:
        _table(runs, first=axis.name)
        _audit_lines(runs)
    output = plan.points[0].config.output if plan.points else None
    jsonl = args.jsonl or (Path(output.jsonl) if output and output.jsonl else None)
    csv = args.csv or (Path(output.csv) if output and output.csv else None)
    figure = args.plot or (Path(output.plot) if output and output.plot else None)
    if jsonl:
        write_runs_jsonl(runs, jsonl)
    if csv:
        write_table(*result_table(outcome), csv)
    if figure and runs:
        plot(runs, figure, title=plan.describe())
    return _failures(outcome, "compare")


def _failures(outcome: SweepOutcome, label: str) -> int:
    """The exit status: 1 when a run failed, else 3 when one diverged, else 0."""
    if outcome.failed:
        print(
            f"{label}: {len(outcome.failed)} run{'s' if len(outcome.failed) != 1 else ''} "
            "failed (see above); the others' results are written",
            file=sys.stderr,
        )
        return 1
    if outcome.diverged:
        count = len(outcome.diverged)
        print(
            f"{label}: {count} run{'s' if count != 1 else ''} diverged (see above; their "
            "records stop there, column diverged_at); the others ran to the end",
            file=sys.stderr,
        )
        return EXIT_DIVERGED
    return 0


def _sweep(args: argparse.Namespace) -> int:
    axes = [parse_axis(text) for text in args.grid]
    if args.parquet and not parquet_available():
        raise SweepError(
            "--parquet", "pyarrow is not installed; pip install pyarrow, or leave out --parquet"
        )
    plan = _plan(args, axes)
    _report_invalid(plan, "sweep")
    executor = _executor(args)
    store = RunStore(args.out)
    progress = SweepProgress(quiet=args.quiet)
    try:
        outcome = execute(plan, executor, store=store, progress=progress)
    except KeyboardInterrupt:
        print(
            f"sweep: interrupted; finished runs are kept in {store.folder}, rerun the same "
            "command to resume",
            file=sys.stderr,
        )
        return 130
    runs = outcome.runs()
    if runs:
        _table(runs, first=", ".join(axis.name for axis in axes))
    written = write_outputs(outcome, args.out, parquet=True if args.parquet else None)
    if "parquet" not in written:
        print("sweep: pyarrow is not installed, so no results.parquet", file=sys.stderr)
    for path in written.values():
        print(f"wrote {path}")
    return _failures(outcome, "sweep")


def main(argv: Sequence[str], prog: str = "gossipnet sim") -> int:
    parser = _parser(prog)
    args = parser.parse_args(list(argv))
    if args.command == "list":
        for name, summary in ALGORITHMS.items():
            print(f"{name:<24} {summary}")
        return 0
    try:
        if args.command == "compare":
            return _compare(args)
        if args.command == "sweep":
            return _sweep(args)
        config = _override(load_experiment(args.experiment), args)
        runs = {config.algorithm.name: _run_one(config, args.quiet, prog)}
    except (ConfigError, ValueError, MissingDependency) as error:
        # bad input found while parsing, planning, building or running
        parser.error(str(error))
    _table(runs)
    _audit_lines(runs)
    output = config.output
    jsonl = args.jsonl or (Path(output.jsonl) if output.jsonl else None)
    csv = args.csv or (Path(output.csv) if output.csv else None)
    figure = args.plot or (Path(output.plot) if output.plot else None)
    every = [record for records in runs.values() for record in records]
    if jsonl:
        write_jsonl(every, jsonl)
    if csv:
        write_csv(every, csv)
    if figure:
        plot(runs, figure, title=config.name)
    return EXIT_DIVERGED if every and every[-1].diverged_at is not None else 0
