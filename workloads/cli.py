"""``gossipnet workloads``: list the registered data sets, partitions and models, or inspect one setup.

    gossipnet workloads list
    gossipnet workloads inspect --dataset mnist1d:num_samples=2000 \\
        --partition dirichlet:alpha=0.1 --peers 16 --model mlp-100k --seed 0
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from workloads._registry import Entry
from workloads.datasets import DATASETS, DEFAULT_DATASET, load_dataset
from workloads.formats import DataFileError
from workloads.models import MODELS, build_model, parameter_count
from workloads.partition import PARTITIONS, label_histogram, partition
from workloads.task import (
    LANGUAGE_MODEL,
    REGRESSION,
    TASKS,
    ModelMismatchError,
    check_model_fits,
)


class _Parser(argparse.ArgumentParser):
    """Bad input is one line on stderr, ``PROG: error: FLAG: WHAT``, and exit code 2."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message.removeprefix('argument ')}", file=sys.stderr)
        sys.exit(2)


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = _Parser(
        prog=prog,
        description="Data sets, partitions across peers and models that gossipnet trains.",
    )
    commands = parser.add_subparsers(
        dest="action", required=True, metavar="ACTION", parser_class=_Parser
    )
    commands.add_parser("list", help="list data sets, partitions and models with their parameters")
    inspect = commands.add_parser(
        "inspect", help="load a data set, partition it and build a model; print a summary"
    )
    inspect.add_argument(
        "--dataset",
        default=DEFAULT_DATASET,
        help="data set spec (name:key=value,...), FILE.npz, or your MODULE:FACTORY",
    )
    inspect.add_argument(
        "--partition", default="iid", help="partition spec, e.g. dirichlet:alpha=0.1"
    )
    inspect.add_argument("--peers", type=int, default=8, help="number of peers (>= 1)")
    inspect.add_argument(
        "--model", default="mlp", help="model spec, e.g. mlp:hidden=64, or your MODULE:FACTORY"
    )
    inspect.add_argument("--seed", type=int, default=0, help="seed of the partition and the model")
    return parser


def _listing(title: str, registry: Mapping[str, Entry[Any]]) -> list[str]:
    lines = [f"{title}:"]
    for entry in registry.values():
        lines.append(f"  {entry.name:<10} {entry.doc}")
        for name, param in entry.params.items():
            default = "(required)" if repr(param.default) == "<required>" else repr(param.default)
            lines.append(f"      {name}={default}  {param.type.__name__}: {param.doc}")
    return lines


def _loss_name(task: str) -> str:
    return "the mean squared error" if task == REGRESSION else "cross entropy"


def _scored(data: Any) -> str:
    """The task's headline, and whether lower is better."""
    found = TASKS[data.task]
    better = "higher" if found.higher_is_better else "lower"
    return f"{found.title(data.num_classes)} ({better} is better)"


def main(argv: Sequence[str], prog: str = "gossipnet workloads") -> int:
    """Run the subcommand; returns the exit code (argparse exits 2 on bad input)."""
    parser = _parser(prog)
    args = parser.parse_args(list(argv))
    if args.action == "list":
        lines = _listing("datasets", DATASETS) + _listing("partitions", PARTITIONS)
        print("\n".join(lines + _listing("models", MODELS)))
        return 0
    if args.peers < 1:
        parser.error(f"--peers must be >= 1, got {args.peers}")
    try:
        data = load_dataset(args.dataset)
    except (ValueError, ImportError, DataFileError) as error:
        parser.error(f"--dataset: {error}")
    try:
        parts = partition(args.partition, data.y_train, args.peers, seed=args.seed)
    except ValueError as error:
        parser.error(f"--partition: {error}")
    try:
        model = build_model(args.model, data.input_shape, data.num_classes, seed=args.seed)
    except ValueError as error:
        parser.error(f"--model: {error}")
    try:
        check_model_fits(model, data)
    except ModelMismatchError as error:
        parser.error(f"--model {args.model} does not fit --dataset {args.dataset}: {error}")
    sizes = [len(p) for p in parts]
    if data.task == LANGUAGE_MODEL:  # next tokens are no class labels: count the tokens
        length = data.input_shape[0]
        spread = f"{length} tokens each, vocabulary {data.num_classes}"
    elif data.task == REGRESSION:  # no classes either: the targets per sample
        spread = f"regression, {data.num_classes} target value(s) per sample"
    else:
        classes = (label_histogram(data.y_train, parts, data.num_classes) > 0).sum(1).float()
        spread = f"classes per peer mean {float(classes.mean()):.2f} of {data.num_classes}"
    print(f"dataset    {data!r}")
    print(
        f"partition  {args.partition} over {args.peers} peers: samples per peer "
        f"min {min(sizes)} mean {sum(sizes) / len(sizes):.1f} max {max(sizes)}; {spread}"
    )
    print(f"model      {args.model}: {parameter_count(model):,} parameters")
    print(f"task       {data.task}: trained on {_loss_name(data.task)}, scored by {_scored(data)}")
    return 0
