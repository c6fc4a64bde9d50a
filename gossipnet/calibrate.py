"""``gossipnet sim calibrate``: measure this machine for the simulator's time model.

    gossipnet sim calibrate [EXPERIMENT.toml] [--out calibration.toml] [--steps N]
                            [--repeats R] [--sizes 4kB,256kB,4MB]

It measures, on the machine at hand:

* ``step_time``: seconds per local step of the experiment's model on its batch size, taken as
  a real peer takes it (``peer.app.calibration.time_local_steps``: the peer's trainer, one
  torch thread), the median of ``--steps``;
* ``stack_latency`` and ``stack_bandwidth``: the real stack's time per message and throughput
  (aiohttp, msgpack, signed bodies, averaging), from exchanges between two real peers on
  127.0.0.1 at each ``--sizes`` model size, ``--repeats`` each, fitted by least squares
  (``peer.app.calibration.fit_stack``).

It prints them as a table and writes them as a ``[network]`` table (TOML) that an experiment
file takes as it is: paste it into the file's ``[network]``, or load the written file, itself a
valid experiment. Without EXPERIMENT the default experiment's workload is measured. The
simulator adds the stack terms in series with the wire's ``latency`` and ``bandwidth``
(``sim.network.Links``), which stay the regime you simulate (loopback, or 50 ms / 100 Mbit/s).

This lives in the front door because it needs both runners (``sim`` reads the file, a real
``peer`` is timed) and they never import each other; the peer's part is reached lazily, as the
dispatcher reaches every subcommand. A mistake is one line and exit code 2.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import os
import platform
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["main"]

DEFAULT_SIZES = "4kB,256kB,4MB"


def _parser(prog: str) -> argparse.ArgumentParser:
    from peer.app.usage import OneLineParser

    parser = OneLineParser(
        prog=prog,
        description=(
            "Measure this machine for the simulator's time model: a real peer's time per "
            "local step for the experiment's model and batch (step_time), and the real "
            "stack's time per message and throughput over loopback (stack_latency, "
            "stack_bandwidth); print them and write them as a [network] table."
        ),
    )
    parser.add_argument(
        "experiment", nargs="?", help="experiment TOML (default: the default experiment)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("calibration.toml"),
        help="where to write the [network] table (default calibration.toml)",
    )
    parser.add_argument(
        "--steps", type=int, default=20, help="timed local steps (default 20, after 2 untimed)"
    )
    parser.add_argument(
        "--repeats", type=int, default=5, help="timed exchanges per size (default 5, after 1)"
    )
    parser.add_argument(
        "--stack",
        choices=STACK_MEASURES,
        default="processes",
        help="where stack_latency is measured: processes = between two peer processes, as a "
        "swarm runs them (two short 2-peer launches, their processor time per message); "
        "one-process = between two peers on this process's event loop (quicker, about half "
        "a real swarm's cost: docs/prediction.md says why) (default processes)",
    )
    parser.add_argument(
        "--sizes",
        default=DEFAULT_SIZES,
        help=f"model sizes exchanged, bytes or kB/MB/GB, at least two (default {DEFAULT_SIZES})",
    )
    return parser


STACK_MEASURES = ("processes", "one-process")
"""``--stack``: where ``stack_latency`` is measured (:func:`calibrate`)."""


def _peer_part() -> Any:
    """``peer.app.calibration``, imported here only (the front door reaches peer lazily)."""
    return importlib.import_module("peer.app.calibration")


def _local_steps(config: Any, steps: int, measure: Any) -> tuple[list[float], int]:
    """The experiment's model and one peer's batches, built as the peer builds them: the
    timed steps, and the model's bytes (float32 parameters, as a message carries them)."""
    import torch

    from sim.build import load_workload_dataset
    from workloads import build_model, partition
    from workloads.batching import peer_batches
    from workloads.device import resolve_device

    w, o = config.workload, config.optimizer
    data = load_workload_dataset(w)
    shards = partition(w.partition, data.y_train, w.peers, seed=config.seed)
    model = build_model(w.model, data.input_shape, data.num_classes, seed=config.seed)
    batches = peer_batches(data, shards[0], batch_size=w.batch_size, seed=config.seed, peer=0)

    optimizer = o.torch_optimizer  # the experiment's optimizer, schedule and clipping

    model_bytes = 4 * sum(p.numel() for p in model.parameters())
    times: list[float] = measure(
        model,
        optimizer,
        torch.nn.functional.cross_entropy,
        batches,
        steps=steps,
        device=str(resolve_device(config.device)),
    )
    return times, model_bytes


PROCESS_STEPS = (100, 600)
"""The two lengths of the two-process measurement (:func:`stack_between_processes`)."""


def stack_between_processes(
    config: Any, step_time: float, stack_bandwidth: float | None, message: int
) -> dict[str, float]:
    """The stack's processor time per message between two real peer processes: two launches
    of a 2-peer D-PSGD ring (``gossipnet launch``, the experiment's data set, model and
    batch, no evaluation, no centralized run) of :data:`PROCESS_STEPS` steps; their
    processor time (``getrusage`` of the children: both peers and the launcher) over the
    extra steps, per peer and round, less the local step and the message's ``M /
    stack_bandwidth``. In a 2-peer ring each peer sends one message a round and receives
    one, so that is one message's processor time at both ends: ``stack_latency`` as the time
    model charges it per send. The launcher's polling is in it (a few percent)."""
    import resource
    import subprocess
    import sys
    import tempfile

    from sim.build import dataset_spec

    w = config.workload
    spec = dataset_spec(w)
    used = []
    for steps in PROCESS_STEPS:
        with tempfile.TemporaryDirectory(prefix="gossipnet-calibrate-") as folder:
            flags = ["--peers", "2", "--steps", str(steps), "--algorithm", "dpsgd"]
            flags += ["--topology", "ring", "--dataset", spec, "--model", w.model]
            flags += ["--batch-size", str(w.batch_size), "--seed", str(config.seed)]
            flags += ["--no-centralized", "--dir", folder]
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            done = subprocess.run(
                [sys.executable, "-m", "gossipnet", "launch", *flags],
                capture_output=True,
                text=True,
                env={**os.environ, "OMP_NUM_THREADS": "1"},
            )
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0:
            raise ValueError(
                f"the two-process calibration launch failed (exit {done.returncode}): "
                + (done.stderr.strip().splitlines() or ["no output"])[-1]
            )
        used.append((after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime))
    per_round = (used[1] - used[0]) / (PROCESS_STEPS[1] - PROCESS_STEPS[0]) / 2
    wire = 0.0 if stack_bandwidth is None else message / stack_bandwidth
    return {
        "per_peer_round": per_round,
        "message_bytes": float(message),
        "stack_latency": max(0.0, per_round - step_time - wire),
    }


def calibrate(
    experiment: str | None,
    *,
    steps: int,
    repeats: int,
    sizes: Sequence[int],
    processes: bool = True,
) -> dict[str, Any]:
    """The measurements: ``{"network": {...}, "steps": [...], "exchanges": [...], ...}``;
    ``processes`` (``--stack processes``, the default): ``stack_latency`` measured between two
    peer processes (:func:`stack_between_processes`) instead of from the one-process exchanges'
    fit."""
    from sim.config import ExperimentConfig, load_experiment

    config = ExperimentConfig() if experiment is None else load_experiment(experiment)
    peer = _peer_part()
    step_times, model_bytes = _local_steps(config, steps, peer.time_local_steps)
    exchanges = peer.time_exchanges(sizes, repeats=repeats)
    fit = peer.fit_stack(exchanges)
    network: dict[str, float] = {
        "step_time": statistics.median(step_times),
        "stack_latency": fit.stack_latency,
    }
    if fit.stack_bandwidth is not None:
        network["stack_bandwidth"] = fit.stack_bandwidth
    between = None
    if processes:
        between = stack_between_processes(
            config, network["step_time"], fit.stack_bandwidth, model_bytes
        )
        network["stack_latency"] = between["stack_latency"]
    return {
        "network": network,
        "processes": between,
        "one_process_latency": fit.stack_latency,
        "steps": step_times,
        "exchanges": exchanges,
        "residual": fit.residual,
        "model": config.workload.model,
        "batch_size": config.workload.batch_size,
    }


def calibration_toml(result: dict[str, Any], experiment: str | None) -> str:
    """The ``[network]`` table, and what was measured as comments (a valid experiment)."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"# gossipnet sim calibrate {experiment or '(default experiment)'}",
        f"# on {platform.node()} ({os.cpu_count()} CPUs, {platform.processor() or 'cpu'}), {now}",
        f"# model {result['model']}, batch {result['batch_size']}: "
        f"{len(result['steps'])} local steps, median {result['network']['step_time']:.6g} s",
    ]
    for timing in result["exchanges"]:
        lines.append(
            f"# exchange of {timing.body_bytes} bytes each way: median {timing.median:.6g} s "
            f"over {len(timing.seconds)}"
        )
    lines.append(
        f"# fit t(M) = 2 (stack_latency + M/stack_bandwidth), rms {result['residual']:.3g} s"
    )
    between = result.get("processes")
    if between:
        lines.append(
            f"# stack_latency between two peer processes: {between['per_peer_round']:.6g} s of "
            f"processor time per peer and round, less the step and {between['message_bytes']:.0f}"
            f" bytes at stack_bandwidth (one process's fit: {result['one_process_latency']:.6g} s)"
        )
    lines.append("[network]")
    lines += [f"{key} = {value!r}" for key, value in result["network"].items()]
    return "\n".join(lines) + "\n"


def _print_table(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    network = result["network"]
    table = Table(title="calibration of this machine (\\[network] keys)")
    for column in ("key", "value", "measured as"):
        table.add_column(column, justify="left" if column != "value" else "right")
    steps = result["steps"]
    table.add_row(
        "step_time",
        f"{network['step_time'] * 1e3:.4g} ms",
        f"median of {len(steps)} local steps of {result['model']}, batch "
        f"{result['batch_size']} (min {min(steps) * 1e3:.3g} ms, max {max(steps) * 1e3:.3g} ms)",
    )
    between = result.get("processes")
    table.add_row(
        "stack_latency",
        f"{network['stack_latency'] * 1e3:.4g} ms",
        "per message: half the fitted round trip of an empty exchange"
        if not between
        else f"per message, between two peer processes: {between['per_peer_round'] * 1e3:.3g} ms"
        " of processor time per peer and round, less the step and the bytes (one process's "
        f"fit: {result['one_process_latency'] * 1e3:.3g} ms)",
    )
    bandwidth = network.get("stack_bandwidth")
    table.add_row(
        "stack_bandwidth",
        "-" if bandwidth is None else f"{bandwidth / 1e6:.4g} MB/s",
        f"per message, fitted (rms error {result['residual'] * 1e3:.3g} ms)",
    )
    for timing in result["exchanges"]:
        table.add_row(
            "", f"{timing.median * 1e3:.4g} ms", f"exchange, {timing.body_bytes} bytes each way"
        )
    Console().print(table)


def main(argv: Sequence[str], prog: str = "gossipnet sim calibrate") -> int:
    parser = _parser(prog)
    args = parser.parse_args(list(argv))
    if args.steps < 1:
        parser.error(f"--steps: must be >= 1, got {args.steps}")
    if args.repeats < 1:
        parser.error(f"--repeats: must be >= 1, got {args.repeats}")
    try:
        sizes = _peer_part().model_sizes(args.sizes)
    except ValueError as error:
        parser.error(f"--sizes: {error}")
    if len(set(sizes)) < 2:
        parser.error(f"--sizes: needs at least two different sizes to fit, got {args.sizes!r}")
    if not args.out.parent.is_dir():
        parser.error(f"--out: folder {args.out.parent} does not exist")
    from sim.config import ConfigError

    try:
        result = calibrate(
            args.experiment,
            steps=args.steps,
            repeats=args.repeats,
            sizes=sizes,
            processes=args.stack == "processes",
        )
    except (ConfigError, ValueError) as error:
        parser.error(str(error))
    _print_table(result)
    args.out.write_text(calibration_toml(result, args.experiment), encoding="utf-8")
    print(f"wrote {args.out}")
    return 0
