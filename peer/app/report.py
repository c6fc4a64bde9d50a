"""The end of a swarm run: every peer's test metric beside the centralized reference.

The metric is the data set's task's headline (:mod:`workloads.task`): test accuracy of a
classifier (the gap to the centralized run in points), validation bits per byte of a
language model (bits per token when its vocabulary is not the 256 bytes), the test mean
squared error of a regression (both lower is better; the gap in their unit). The ``--json``
line names the ``task`` and gives each peer's and the centralized reference's metrics as
``test_<name>`` (``test_accuracy``, ``test_loss``, ``test_bits_per_byte``, ``test_mse``) and
the honest peers' means as ``mean_test_<name>``.

:func:`collect_results` gathers what each peer wrote with ``gossipnet peer --eval-out`` and
the centralized run (:func:`workloads.train_centralized`) into one dictionary, the line
``--json`` prints; :func:`print_results` draws it as the final table. Both tell the truth
after Ctrl-C: the title says the steps the peers actually reached (``after 233-284 of
100000 steps, stopped early``), and a peer that failed always has a reason (its last
stderr line and exit code, or the signal that killed it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from peer.app.swarm import Swarm, read_text
from workloads.baseline import CentralizedResult
from workloads.task import CLASSIFICATION, METRIC_NAMES, TASKS, Task

_REPORTED = ("test_loss", *(f"test_{name}" for name in METRIC_NAMES if name != "loss"))
"""The test metrics a peer's ``--eval-out`` report may hold, under their keys."""


def collect_results(swarm: Swarm, centralized: CentralizedResult) -> dict[str, Any]:
    """The run's results, what ``--json`` prints: the ``task`` and the model's outputs per
    sample (``num_classes``: classes, vocabulary or regression targets); per peer its exit
    code, state and, from its ``--eval-out`` file, step, the task's test metrics
    (``test_<name>``), exchanges and its attack if it was Byzantine (else the step of its
    last status line); a failed peer's ``error`` (never empty); the centralized reference;
    the honest peers' mean of each metric (``mean_test_<name>``; ``mean_test_accuracy`` is
    null for a task without accuracy); the steps asked for and whether every peer reached
    them; the run directory."""
    steps = int(swarm.args.steps)
    peers = []
    task, num_classes = centralized.task, None
    for peer in swarm.peers:
        entry: dict[str, Any] = {
            "id": peer.peer_id,
            "client_only": peer.client_only,
            "exit_code": peer.process.returncode,
        }
        text = read_text(peer.eval_file)
        if text:
            report = json.loads(text)
            task = task or report.get("task")
            num_classes = num_classes or report.get("num_classes")
            entry["step"] = report["step"]
            entry.update({key: report[key] for key in _REPORTED if key in report})
            entry.setdefault("test_accuracy", None)
            for key in ("exchanges_ok", "exchanges_failed", "isolated", "byzantine"):
                entry[key] = report.get(key)
            if "epsilon" in report:  # DP-SGD (docs/privacy.md)
                entry["epsilon"] = report["epsilon"]
                entry["privacy_stopped"] = report["privacy_stopped"]
        else:
            last = peer.last_status_line() or peer.status
            if "step" in last:
                entry["step"] = int(last["step"])
        if "step" in entry:
            peer.status = {**peer.status, "step": entry["step"]}
        entry["state"] = peer.state(steps)
        if peer.failed():
            entry["error"] = peer.exit_reason()
        peers.append(entry)
    found = TASKS[task or CLASSIFICATION]
    reference: dict[str, Any] = {
        "test_accuracy": centralized.accuracy,
        "test_loss": centralized.loss,
        **{f"test_{name}": value for name, value in centralized.metrics.items()},
        "samples": centralized.samples,
        "error": centralized.error,
    }
    means: dict[str, Any] = {}
    for name in ("accuracy", *found.metric_names):
        if name == "loss":
            continue
        # Byzantine peers (launch --byzantine) are the attack, not the swarm: left out of the
        # mean; a peer without the metric (no accuracy of a regression) is left out, not 0
        values = [
            p[f"test_{name}"]
            for p in peers
            if p.get(f"test_{name}") is not None and not p.get("byzantine")
        ]
        means[f"mean_test_{name}"] = sum(values) / len(values) if values else None
    reached = [p["step"] for p in peers if p.get("step") is not None]
    return {
        "task": found.name,
        "num_classes": num_classes,
        "peers": peers,
        "centralized": reference,
        **means,
        "steps": steps,
        "all_reached_steps": bool(peers) and len(reached) == len(peers)
        and min(reached) >= steps,
        "directory": str(swarm.directory),
    }  # fmt: skip


def test_metrics(entry: dict[str, Any]) -> dict[str, float | None]:
    """A peer's (or the centralized reference's) test metrics of the results as a record's
    values (:class:`~peer.node.logbook.Logbook`): ``accuracy``, ``bits_per_byte``, ``mse``
    (None where the task has none: a blank cell) and ``test_loss``."""
    values: dict[str, float | None] = {
        name: entry.get(f"test_{name}") for name in METRIC_NAMES if name != "loss"
    }
    values["test_loss"] = entry.get("test_loss")
    return values


def _task(results: dict[str, Any]) -> Task:
    """The run's task (a classifier's for results without one)."""
    return TASKS[results.get("task") or CLASSIFICATION]


def _show(task: Task, value: float) -> str:
    """A headline value as the table shows it: accuracy in percent, bits per byte to
    three decimals, a mean squared error to four significant digits."""
    if task.headline == "accuracy":
        return f"{100 * value:.1f}%"
    return f"{value:.3f}" if task.headline == "bits_per_byte" else f"{value:.4g}"


def _gap(task: Task, value: float, reference: float) -> str:
    """``value - reference`` in the headline's unit (accuracy in points)."""
    if task.headline == "accuracy":
        return f"{100 * (value - reference):+.1f} pts"
    return (
        f"{value - reference:+.3f}"
        if task.headline == "bits_per_byte"
        else (f"{value - reference:+.3g}")
    )


def title(results: dict[str, Any], args: argparse.Namespace) -> str:
    """The final table's title: the task's headline metric (:meth:`workloads.task.Task.
    title`), the steps the peers reached (all of ``--steps``, or a range of fewer after
    Ctrl-C; peers down at the end, ``launch --crashes``, counted apart), and the batch size."""
    steps = int(results.get("steps", args.steps))
    up = [p for p in results["peers"] if not p.get("down")]  # launch --crashes: down ones apart
    down = len(results["peers"]) - len(up)
    reached = [p["step"] for p in up if p.get("step") is not None]
    batch = f"of batch {args.batch_size}" + (f" ({down} down)" if down else "")
    if not reached:
        return f"no peer reported a step (of {steps} steps {batch})"
    low, high = min(reached), max(reached)
    metric = _task(results).title(results.get("num_classes"))
    if low >= steps and len(reached) == len(up):
        return f"{metric} after {steps} steps {batch}"
    span = str(low) if low == high else f"{low}-{high}"
    return f"{metric} after {span} of {steps} steps {batch} (stopped early)"


def _count(value: object) -> str:
    """A count for the results table; ``-`` if the peer did not report it."""
    return "-" if value is None else str(value)


def _epsilon(entry: dict[str, Any]) -> str:
    """A peer's ε cell: the value, and ``(budget)`` when training stopped for it."""
    epsilon = entry.get("epsilon")
    text = "inf" if epsilon is None else f"{epsilon:.3g}"
    return text + (" (budget)" if entry.get("privacy_stopped") else "")


def print_results(results: dict[str, Any], args: argparse.Namespace) -> None:
    """The final table: per peer its step, the task's headline test metric, its gap to the
    centralized run, exchanges.

    The exchange columns are the peer's successful and failed exchanges over the run; a
    peer that ended isolated (training alone, :mod:`peer.node.health`) is marked ``ISOLATED``.
    """
    from rich.console import Console
    from rich.table import Table

    task = _task(results)
    key = f"test_{task.headline}"
    reference = results["centralized"].get(key)
    table = Table(title=title(results, args))
    metric = task.heading(results.get("num_classes"))
    private = any("epsilon" in entry for entry in results["peers"])
    columns = ("", "step", metric, "vs centralized", "exchanges ok", "failed")
    for column in columns + (("epsilon",) if private else ()):
        table.add_column(column, justify="left" if not column else "right")
    add_row = table.add_row
    if private:  # every row gets the epsilon cell (the peer's, "-" for the others)

        def add_row(*cells: Any, epsilon: str = "-", **style: Any) -> None:
            table.add_row(*cells, epsilon, **style)

    for entry in results["peers"]:
        value = entry.get(key)
        if value is None and entry.get("test_loss") is not None:  # evaluated, no headline
            add_row(
                entry["id"],
                str(entry["step"]),
                f"loss {entry['test_loss']:.4g}",
                "-",
                _count(entry.get("exchanges_ok")),
                _count(entry.get("exchanges_failed")),
            )
            continue
        if value is None:
            why = entry.get("error") or f"no result ({entry.get('state', 'unknown')})"
            step = "-" if entry.get("step") is None else str(entry["step"])
            add_row(entry["id"], step, why, "-", "-", "-")
            continue
        isolated = bool(entry.get("isolated"))
        byzantine = f" (byzantine: {entry['byzantine']})" if entry.get("byzantine") else ""
        cells: dict[str, Any] = {} if not private else {"epsilon": _epsilon(entry)}
        add_row(
            entry["id"] + byzantine + (" ISOLATED" if isolated else ""),
            str(entry["step"]),
            _show(task, value),
            "-" if reference is None else _gap(task, value, reference),
            _count(entry.get("exchanges_ok")),
            _count(entry.get("exchanges_failed")),
            style="bold red" if isolated else None,
            **cells,
        )
    if reference is not None:
        samples = results["centralized"]["samples"]
        add_row(
            "centralized",
            str(args.steps),
            _show(task, reference),
            f"batch {args.peers * args.batch_size}, {samples} samples",
            "-",
            "-",
        )
    elif results["centralized"]["error"]:
        add_row("centralized", "-", results["centralized"]["error"], "-", "-", "-")
    Console(width=max(100, os.get_terminal_size(sys.stdout.fileno()).columns)
            if sys.stdout.isatty() else 100).print(table)  # fmt: skip
