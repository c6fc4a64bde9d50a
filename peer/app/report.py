"""The end of a swarm run: every peer's test accuracy beside the centralized reference.

A language model's run (``--dataset text``) shows validation bits per byte instead (lower is
better; the gap to the centralized run in bits per byte), and its ``--json`` line adds
``test_bits_per_byte`` to each peer and to the centralized reference, and
``mean_test_bits_per_byte``.

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


def collect_results(swarm: Swarm, centralized: CentralizedResult) -> dict[str, Any]:
    """The run's results, what ``--json`` prints: per peer its exit code, state and, from
    its ``--eval-out`` file, step, test accuracy and loss, exchanges and its attack if it was
    Byzantine (else the step of its last status line); a failed peer's ``error`` (never
    empty); the centralized reference; the honest peers' mean test accuracy; the steps asked
    for and whether every peer reached them; the run directory."""
    steps = int(swarm.args.steps)
    peers = []
    for peer in swarm.peers:
        entry: dict[str, Any] = {
            "id": peer.peer_id,
            "client_only": peer.client_only,
            "exit_code": peer.process.returncode,
        }
        text = read_text(peer.eval_file)
        if text:
            report = json.loads(text)
            entry.update(step=report["step"], test_accuracy=report["test_accuracy"])
            entry["test_loss"] = report["test_loss"]
            if "test_bits_per_byte" in report:  # a language model's
                entry["test_bits_per_byte"] = report["test_bits_per_byte"]
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
    # Byzantine peers (launch --byzantine) are the attack, not the swarm: left out of the mean
    accuracies = [
        p["test_accuracy"]
        for p in peers
        if p.get("test_accuracy") is not None and not p.get("byzantine")
    ]  # a regression model has no accuracy (None): it is left out, not counted as 0
    reached = [p["step"] for p in peers if p.get("step") is not None]
    reference: dict[str, Any] = {
        "test_accuracy": centralized.accuracy,
        "test_loss": centralized.loss,
        "samples": centralized.samples,
        "error": centralized.error,
    }
    language: dict[str, Any] = {}
    bits = [
        p["test_bits_per_byte"]
        for p in peers
        if p.get("test_bits_per_byte") is not None and not p.get("byzantine")
    ]
    if bits or centralized.bits_per_byte is not None:  # a language model's run
        reference["test_bits_per_byte"] = centralized.bits_per_byte
        language["mean_test_bits_per_byte"] = sum(bits) / len(bits) if bits else None
    return {
        "peers": peers,
        "centralized": reference,
        "mean_test_accuracy": sum(accuracies) / len(accuracies) if accuracies else None,
        **language,
        "steps": steps,
        "all_reached_steps": bool(peers) and len(reached) == len(peers)
        and min(reached) >= steps,
        "directory": str(swarm.directory),
    }  # fmt: skip


def title(results: dict[str, Any], args: argparse.Namespace) -> str:
    """The final table's title: the steps the peers reached (all of ``--steps``, or a range
    of fewer after Ctrl-C), and the batch size."""
    steps = int(results.get("steps", args.steps))
    reached = [p["step"] for p in results["peers"] if p.get("step") is not None]
    batch = f"of batch {args.batch_size}"
    if not reached:
        return f"no peer reported a step (of {steps} steps {batch})"
    low, high = min(reached), max(reached)
    metric = "validation bits per byte" if _language(results) else "test accuracy"
    if low >= steps and len(reached) == len(results["peers"]):
        return f"{metric} after {steps} steps {batch}"
    span = str(low) if low == high else f"{low}-{high}"
    return f"{metric} after {span} of {steps} steps {batch} (stopped early)"


def _language(results: dict[str, Any]) -> bool:
    """Whether the run trained a language model: its headline is bits per byte (lower is
    better), not accuracy (:mod:`workloads.task`)."""
    return "mean_test_bits_per_byte" in results


def _count(value: object) -> str:
    """A count for the results table; ``-`` if the peer did not report it."""
    return "-" if value is None else str(value)


def _epsilon(entry: dict[str, Any]) -> str:
    """A peer's ε cell: the value, and ``(budget)`` when training stopped for it."""
    epsilon = entry.get("epsilon")
    text = "inf" if epsilon is None else f"{epsilon:.3g}"
    return text + (" (budget)" if entry.get("privacy_stopped") else "")


def print_results(results: dict[str, Any], args: argparse.Namespace) -> None:
    """The final table: per peer its step, test accuracy, gap to the centralized run, exchanges.

    The exchange columns are the peer's successful and failed exchanges over the run; a
    peer that ended isolated (training alone, :mod:`peer.node.health`) is marked ``ISOLATED``.
    """
    from rich.console import Console
    from rich.table import Table

    language = _language(results)
    key = "test_bits_per_byte" if language else "test_accuracy"
    reference = results["centralized"][key]
    table = Table(title=title(results, args))
    metric = "val. bits/byte" if language else "test accuracy"
    private = any("epsilon" in entry for entry in results["peers"])
    columns = ("", "step", metric, "vs centralized", "exchanges ok", "failed")
    for column in columns + (("epsilon",) if private else ()):
        table.add_column(column, justify="left" if not column else "right")
    add_row = table.add_row
    if private:  # every row gets the epsilon cell (the peer's, "-" for the others)

        def add_row(*cells: Any, epsilon: str = "-", **style: Any) -> None:
            table.add_row(*cells, epsilon, **style)

    for entry in results["peers"]:
        accuracy = entry.get(key)
        if accuracy is None and "test_loss" in entry:  # evaluated, but not a classifier
            loss = entry["test_loss"]
            add_row(
                entry["id"],
                str(entry["step"]),
                "-" if loss is None else f"loss {loss:.4g}",
                "-",
                _count(entry.get("exchanges_ok")),
                _count(entry.get("exchanges_failed")),
            )
            continue
        if accuracy is None:
            why = entry.get("error") or f"no result ({entry.get('state', 'unknown')})"
            step = "-" if entry.get("step") is None else str(entry["step"])
            add_row(entry["id"], step, why, "-", "-", "-")
            continue
        if reference is None:
            diff = "-"
        elif language:
            diff = f"{accuracy - reference:+.3f}"
        else:
            diff = f"{100 * (accuracy - reference):+.1f} pts"
        isolated = bool(entry.get("isolated"))
        byzantine = f" (byzantine: {entry['byzantine']})" if entry.get("byzantine") else ""
        cells: dict[str, Any] = {} if not private else {"epsilon": _epsilon(entry)}
        add_row(
            entry["id"] + byzantine + (" ISOLATED" if isolated else ""),
            str(entry["step"]),
            f"{accuracy:.3f}" if language else f"{100 * accuracy:.1f}%",
            diff,
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
            f"{reference:.3f}" if language else f"{100 * reference:.1f}%",
            f"batch {args.peers * args.batch_size}, {samples} samples",
            "-",
            "-",
        )
    elif results["centralized"]["error"]:
        add_row("centralized", "-", results["centralized"]["error"], "-", "-", "-")
    Console(width=max(100, os.get_terminal_size(sys.stdout.fileno()).columns)
            if sys.stdout.isatty() else 100).print(table)  # fmt: skip
