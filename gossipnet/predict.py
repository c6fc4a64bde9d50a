"""``gossipnet sim predict``: the simulator's time prediction against a real swarm.

    gossipnet sim predict EXPERIMENT.toml [--target ACC | --target-loss LOSS]
                          [--plot predict.png] [--json predict.json] [--dir DIR]
                          [--calibrate]

Runs the experiment file twice on this machine: simulated (``sim.build``, ``sim.runner``: the
simulated clock of its time model) and as real peers over emulated links (``gossipnet launch
EXPERIMENT.toml``, :mod:`gossipnet.experiment_launch`, each peer evaluating every
``eval_every`` rounds on its own clock: ``peer --eval-every``). It prints, side by side,
predicted and measured

* **time per round**: the simulated time of the last evaluation over its round, against the
  measured time of the same step over the same rounds (the peers' clocks, evaluations left
  out, aligned as :func:`measured_curve` says);
* **time to target**: the first time the peers' mean test accuracy reaches ``--target`` (or
  the test loss falls to ``--target-loss``), linearly interpolated between evaluations, on
  each clock; by default the target is 90 % of the lower of the two runs' best accuracy,
  one both reach;

with the error of each, ``(predicted - measured) / measured``, then the time model's terms
(compute per local step; for synchronous rounds the round less its compute), and draws the
two curves (accuracy and loss against seconds) in one figure. Accuracy is the same quantity on both
sides (the mean over peers of each one's own model, the simulator's ``peer_accuracy_mean``);
loss is the simulator's average model's (``test_loss``) against the peers' mean: close when
the peers agree, and the reason ``--target`` is the default.

The prediction is only as good as the time model's constants: with ``step_time``,
``stack_latency`` and ``stack_bandwidth`` in the file's ``[network]`` (``gossipnet sim
calibrate``, docs/calibration.md) it is a prediction from measured constants; without them it
says so, as it is then of typed ones. ``--calibrate`` measures them first, on this machine,
and uses them. It lives in the front door because it drives both runners.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "CALIBRATED_KEYS",
    "Curve",
    "Prediction",
    "main",
    "measured_curve",
    "predict",
    "time_to",
]

CALIBRATED_KEYS = ("step_time", "stack_latency", "stack_bandwidth")
"""The ``[network]`` keys ``gossipnet sim calibrate`` measures."""
ASYNCHRONOUS = ("ad-psgd",)
"""The algorithms whose peers never wait for each other (``peer.node.config.ALGORITHMS``'s
async mode): their measured clock is each peer's own (:func:`measured_curve`)."""
DEFAULT_TARGET_SHARE = 0.9
"""Without ``--target``: this share of the lower of the two runs' best accuracy."""


@dataclass(frozen=True)
class Curve:
    """One run's evaluations: ``rounds[k]``, seconds ``time[k]`` since training began, the
    peers' mean test ``accuracy[k]`` and ``loss[k]``."""

    rounds: tuple[float, ...]
    time: tuple[float, ...]
    accuracy: tuple[float, ...]
    loss: tuple[float, ...]
    compute_per_step: float = math.nan
    """The peers' mean time per local step of their own compute (a straggler's included)."""
    compute_per_round: float = math.nan
    """The round's compute on the critical path: the slowest peer's H steps (synchronous);
    ``nan`` where rounds are not on one clock (AD-PSGD)."""

    def per_round(self) -> float:
        """Seconds per round, from the last evaluation."""
        return self.time[-1] / self.rounds[-1] if self.rounds and self.rounds[-1] else math.nan


@dataclass
class Prediction:
    """Predicted and measured, side by side (:func:`predict`)."""

    name: str
    predicted: Curve
    measured: Curve
    target: float
    metric: str
    calibrated: list[str] = field(default_factory=list)

    @property
    def round_time(self) -> tuple[float, float]:
        return self.predicted.per_round(), self.measured.per_round()

    @property
    def time_to_target(self) -> tuple[float, float]:
        return (
            time_to(self.predicted, self.target, self.metric),
            time_to(self.measured, self.target, self.metric),
        )

    def rows(self) -> list[tuple[str, float, float, float]]:
        """``(what, predicted, measured, error)`` for time per round and time to target,
        then the time model's terms: compute per local step and, for synchronous rounds, the
        round less its compute (communication and waiting)."""
        target = (
            f"time to accuracy {self.target:.3g}"
            if self.metric == "accuracy"
            else f"time to loss {self.target:.3g}"
        )
        out = []
        for what, (p, m) in (
            ("time per round", self.round_time),
            (target, self.time_to_target),
        ):
            out.append((what, p, m, error(p, m)))
        pc, mc = self.predicted, self.measured
        out.append(("  compute per local step", pc.compute_per_step, mc.compute_per_step, 0.0))
        if math.isfinite(mc.compute_per_round):
            rest = (
                self.round_time[0] - pc.compute_per_round,
                self.round_time[1] - mc.compute_per_round,
            )
            out.append(("  round less its compute", *rest, 0.0))
        return [(what, p, m, error(p, m)) for what, p, m, _ in out]

    def summary(self) -> dict[str, Any]:
        """The numbers, for ``--json`` and a grid's table."""
        (per_p, per_m), (to_p, to_m) = self.round_time, self.time_to_target
        return {
            "name": self.name,
            "metric": self.metric,
            "target": self.target,
            "calibrated": self.calibrated,
            "round_time": {"predicted": per_p, "measured": per_m, "error": error(per_p, per_m)},
            "time_to_target": {"predicted": to_p, "measured": to_m, "error": error(to_p, to_m)},
            "terms": {
                what.strip(): {"predicted": p, "measured": m, "error": e}
                for what, p, m, e in self.rows()[2:]
            },
            "predicted": asdict(self.predicted),
            "measured": asdict(self.measured),
        }


def error(predicted: float, measured: float) -> float:
    """``(predicted - measured) / measured`` (nan when either is missing)."""
    if not (math.isfinite(predicted) and math.isfinite(measured)) or measured == 0:
        return math.nan
    return (predicted - measured) / measured


def time_to(curve: Curve, target: float, metric: str = "accuracy") -> float:
    """The first time ``curve`` reaches ``target`` (accuracy >= target, or loss <= target),
    linearly interpolated between the evaluation before and the one that reaches it; ``nan``
    if it never does."""
    values = curve.accuracy if metric == "accuracy" else tuple(-v for v in curve.loss)
    goal = target if metric == "accuracy" else -target
    for k, value in enumerate(values):
        if value >= goal:
            if k == 0:
                return curve.time[0]
            v0, t0, t1 = values[k - 1], curve.time[k - 1], curve.time[k]
            share = (goal - v0) / (value - v0) if value != v0 else 1.0
            return t0 + share * (t1 - t0)
    return math.nan


def measured_curve(
    directory: Path, steps_per_round: int, peers: Sequence[int], *, synchronous: bool = True
) -> Curve:
    """The real run's curve from the peers' ``peer-<i>.evals.jsonl`` in ``directory``
    (``launch --eval-every``): at each step that every peer in ``peers`` evaluated, the mean
    over them of the time and the test accuracy and loss.

    ``synchronous`` (rounds: a peer waits for its neighbours): the clocks are aligned on the
    last peer's start. Peer p began training at ``T_p`` (its lines' ``began``, a wall
    time) and reached step s at ``T_p + train_s``; the time of step s is the mean over peers
    of that, less ``max_p T_p`` (a peer that started early waited for the others in its first
    round, which is start-up, not the algorithm's time), and 0 at step 0. Asynchronous peers
    (AD-PSGD) wait for nobody: each is on its own clock, and the time of step s is the
    harmonic mean of their ``train_s``, ``s / mean_p(s / train_s_p)``: when the swarm has
    taken n·s steps in all at the peers' rates, which is the simulator's AD-PSGD round (the
    next n events in time order, whoever takes them: a straggler takes fewer)."""
    by_step: dict[int, dict[int, dict[str, Any]]] = {}
    began: dict[int, float] = {}
    for index in peers:
        path = directory / f"peer-{index}.evals.jsonl"
        if not path.is_file():
            raise RuntimeError(f"peer-{index} wrote no evaluations ({path})")
        for line in path.read_text().splitlines():
            if line.strip():
                entry = json.loads(line)
                began.setdefault(index, float(entry["began"]))  # its first start
                # the first time it reached a step (a crashed peer restarted from a checkpoint
                # evaluates a step again, on a new clock: its began + train_s is still wall)
                by_step.setdefault(int(entry["step"]), {}).setdefault(index, entry)
    steps = sorted(step for step, entries in by_step.items() if len(entries) == len(peers))
    if not steps:
        raise RuntimeError(f"no step that every peer evaluated in {directory}")
    origin = max(began.values())

    def wall(entry: dict[str, Any]) -> float:
        return float(entry["began"]) + float(entry["train_s"])

    def mean(values: Sequence[Any]) -> float:
        found = [float(v) for v in values if isinstance(v, int | float)]
        return sum(found) / len(found) if found else math.nan

    def harmonic(values: Sequence[float]) -> float:
        return 0.0 if min(values) <= 0 else len(values) / sum(1 / v for v in values)

    times = [
        max(0.0, mean([wall(e) - origin for e in by_step[step].values()]))
        if synchronous
        else harmonic([wall(e) - began[i] for i, e in by_step[step].items()])
        for step in steps
    ]
    times[0] = 0.0
    last = by_step[steps[-1]]
    compute = {
        i: float(e.get("compute_s") or 0.0) + float(e.get("slowdown_waited_s") or 0.0)
        for i, e in last.items()
    }
    has_compute = steps[-1] > 0 and all("compute_s" in e for e in last.values())
    per_step = mean([c / steps[-1] for c in compute.values()]) if has_compute else math.nan
    per_round = (
        max(compute.values()) / (steps[-1] / steps_per_round)
        if has_compute and synchronous
        else math.nan
    )
    return Curve(
        rounds=tuple(step / steps_per_round for step in steps),
        time=tuple(times),
        accuracy=tuple(mean([e.get("test_accuracy") for e in by_step[s].values()]) for s in steps),
        loss=tuple(mean([e.get("test_loss") for e in by_step[s].values()]) for s in steps),
        compute_per_step=per_step,
        compute_per_round=per_round,
    )


def simulated_curve(config: Any) -> Curve:
    """The simulator's curve of ``config``: each evaluation's round, simulated time, the
    honest peers' mean test accuracy and the average model's test loss."""
    from gossipnet.experiment_launch import steps_per_round
    from sim.build import build
    from sim.runner import run

    algorithm, ctx, evaluation = build(config)
    records = run(algorithm, ctx, evaluation, rounds=config.rounds, eval_every=config.eval_every)
    from sim.build import host_share

    net, n = config.network, config.workload.peers
    factors = [float(net.stragglers.get(i, 1.0)) for i in range(n)]
    step_time = net.step_time * host_share(n, net.host_cores)
    per_step = step_time * sum(factors) / n
    synchronous = config.algorithm.name not in ASYNCHRONOUS
    return Curve(
        rounds=tuple(float(r.round) for r in records),
        time=tuple(float(r.time) for r in records),
        accuracy=tuple(float(r.peer_accuracy_mean) for r in records),
        loss=tuple(float(r.test_loss) for r in records),
        compute_per_step=per_step,
        compute_per_round=(
            step_time * max(factors) * steps_per_round(config) if synchronous else math.nan
        ),
    )


def predict(
    file: str,
    *,
    target: float | None = None,
    metric: str = "accuracy",
    directory: Path,
    calibration: dict[str, Any] | None = None,
    launch_flags: Sequence[str] = (),
) -> Prediction:
    """Simulate ``file`` and run it as real peers (their files in ``directory``); the two
    curves and the target. ``calibration``: ``[network]`` values that replace the file's."""
    import dataclasses

    from gossipnet.experiment_launch import launch_plan, steps_per_round
    from sim.build import byzantine_mask
    from sim.config import load_experiment, load_experiment_data

    config = load_experiment(file)
    given = set(load_experiment_data(file).get("network", {}))
    if calibration:
        config = dataclasses.replace(
            config, network=dataclasses.replace(config.network, **calibration)
        )
        given |= set(calibration)
    plan = launch_plan(config)  # refuses what real peers cannot run, before anything runs
    predicted = simulated_curve(config)
    launch = importlib.import_module("peer.app.launch")  # as the dispatcher reaches peer
    flags = [*plan.flags, "--dir", str(directory), "--no-centralized", *launch_flags]
    code = launch.main(flags, "gossipnet sim predict", origins=plan.origins)
    if code != 0:
        raise RuntimeError(f"the real swarm failed (exit code {code}); its files: {directory}")
    honest = [i for i, bad in enumerate(byzantine_mask(config)) if not bad]
    measured = measured_curve(
        directory,
        steps_per_round(config),
        honest,
        synchronous=config.algorithm.name not in ASYNCHRONOUS,
    )
    if target is None:
        if metric != "accuracy":
            raise ValueError("--target-loss: needs a value")
        reached = min(max(predicted.accuracy), max(measured.accuracy))
        target = round(DEFAULT_TARGET_SHARE * reached, 4)
    return Prediction(
        name=config.name,
        predicted=predicted,
        measured=measured,
        target=target,
        metric=metric,
        calibrated=[key for key in CALIBRATED_KEYS if key in given],
    )


def plot(prediction: Prediction, path: Path) -> None:
    """Accuracy and loss against seconds, predicted (simulated clock) and measured (the real
    peers' mean), with the target and its two times marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    p, m = prediction.predicted, prediction.measured
    for axis, key, label in ((left, "accuracy", "test accuracy"), (right, "loss", "test loss")):
        axis.plot(p.time, getattr(p, key), "o-", label="predicted (simulator)", color="C0")
        axis.plot(m.time, getattr(m, key), "s--", label="measured (real peers)", color="C1")
        axis.set_xlabel("seconds since training began")
        axis.set_ylabel(label + (" (peers' mean)" if key == "accuracy" else ""))
        axis.grid(alpha=0.3)
    target_axis = left if prediction.metric == "accuracy" else right
    target_axis.axhline(prediction.target, color="grey", lw=0.8, ls=":")
    for when, colour in zip(prediction.time_to_target, ("C0", "C1"), strict=True):
        if math.isfinite(when):
            target_axis.axvline(when, color=colour, lw=0.8, ls=":")
    (per_p, per_m), (to_p, to_m) = prediction.round_time, prediction.time_to_target
    left.legend(loc="lower right")
    calibrated = ", ".join(prediction.calibrated) or "none (typed constants)"
    figure.suptitle(
        f"{prediction.name}: time per round {per_p * 1e3:.3g} ms predicted, "
        f"{per_m * 1e3:.3g} ms measured ({_percent(error(per_p, per_m))}); to target "
        f"{_seconds(to_p)} vs {_seconds(to_m)} ({_percent(error(to_p, to_m))})\n"
        f"calibrated: {calibrated}",
        fontsize=9,
    )
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _percent(value: float) -> str:
    return "-" if not math.isfinite(value) else f"{100 * value:+.1f} %"


def _milliseconds(value: float) -> str:
    return "-" if not math.isfinite(value) else f"{value * 1e3:.3g} ms"


def _seconds(value: float) -> str:
    return "not reached" if not math.isfinite(value) else f"{value:.3g} s"


def print_table(prediction: Prediction) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{prediction.name}: predicted (simulator) and measured (real peers)")
    for column in ("", "predicted", "measured", "error"):
        table.add_column(column, justify="left" if not column else "right")
    for what, p, m, e in prediction.rows():
        shown = _seconds if what.startswith("time") else _milliseconds
        table.add_row(what, shown(p), shown(m), _percent(e))
    Console().print(table)


def _parser(prog: str) -> argparse.ArgumentParser:
    from peer.app.usage import OneLineParser

    parser = OneLineParser(
        prog=prog,
        description=(
            "Run an experiment file simulated and as real peers on this machine (gossipnet "
            "launch EXPERIMENT.toml), and print the predicted and measured time per round and "
            "time to a target accuracy or loss side by side, with the error of each; draw "
            "both curves."
        ),
        epilog="Guide: docs/prediction.md.",
    )
    parser.add_argument("experiment", help="experiment TOML")
    goal = parser.add_mutually_exclusive_group()
    goal.add_argument(
        "--target",
        type=float,
        help="target test accuracy, in (0, 1] (default: 90 %% of the lower of the two runs' "
        "best, one both reach)",
    )
    goal.add_argument("--target-loss", type=float, help="target test loss, > 0 (default: none)")
    parser.add_argument(
        "--plot", type=Path, default=Path("predict.png"), help="the figure (default %(default)s)"
    )
    parser.add_argument("--json", type=Path, help="write the numbers as JSON (default: none)")
    parser.add_argument(
        "--dir",
        help="keep the real run's files here (default: a temporary folder, removed after)",
    )
    parser.add_argument(
        "--host-cores",
        default="auto",
        help="the cores the real peers share, for the time model's [network] host_cores "
        "(docs/time-model.md): auto (the file's host_cores, else this machine's usable cores: "
        "the swarm runs here), none (each peer its own machine), or a number (default auto)",
    )
    parser.add_argument(
        "--calibrate",
        action="store_true",
        help="first measure step_time, stack_latency and stack_bandwidth on this machine "
        "(gossipnet sim calibrate --stack processes: the stack between two peer processes, as the "
        "swarm runs) and predict with them (default: the file's [network])",
    )
    return parser


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, else the machine's count)."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _host_cores(text: str, file_value: int | None, parser: argparse.ArgumentParser) -> int | None:
    """``--host-cores``: the cores the real peers share (None: each its own machine)."""
    if text == "auto":
        return file_value if file_value is not None else usable_cores()
    if text == "none":
        return None
    try:
        cores = int(text)
    except ValueError:
        cores = 0
    if cores < 1:
        parser.error(f"--host-cores: must be auto, none or an integer >= 1, got {text!r}")
    return cores


def main(argv: Sequence[str], prog: str = "gossipnet sim predict") -> int:
    parser = _parser(prog)
    args = parser.parse_args(list(argv))
    if args.target is not None and not 0 < args.target <= 1:
        parser.error(f"--target: must be an accuracy in (0, 1], got {args.target:g}")
    if args.target_loss is not None and not args.target_loss > 0:
        parser.error(f"--target-loss: must be > 0, got {args.target_loss:g}")
    for flag, path in (("--plot", args.plot), ("--json", args.json)):
        if path is not None and not path.parent.is_dir():
            parser.error(f"{flag}: folder {path.parent} does not exist")
    from gossipnet.experiment_launch import NotOnPeers
    from sim.config import ConfigError, load_experiment, load_experiment_data

    try:
        from gossipnet.experiment_launch import launch_plan

        experiment = load_experiment(args.experiment)
        launch_plan(experiment)  # refused before anything runs
        given = set(load_experiment_data(args.experiment).get("network", {}))
    except (ConfigError, NotOnPeers) as error:
        parser.error(f"{args.experiment}: {error}")
    host_cores = _host_cores(args.host_cores, experiment.network.host_cores, parser)
    calibration: dict[str, Any] | None = None
    if args.calibrate:
        from gossipnet.calibrate import DEFAULT_SIZES, calibrate

        sizes = importlib.import_module("peer.app.calibration").model_sizes(DEFAULT_SIZES)
        measured = calibrate(args.experiment, steps=20, repeats=5, sizes=sizes, processes=True)
        calibration = dict(measured["network"])
        print(
            "calibrated on this machine: "
            + ", ".join(f"{key} = {value:.4g}" for key, value in calibration.items())
        )
    elif not set(CALIBRATED_KEYS) & given:
        print(
            f"note: {args.experiment} has no calibration in [network] ({', '.join(CALIBRATED_KEYS)}): "
            "the prediction is of the typed constants; measure them with gossipnet sim "
            "calibrate (or --calibrate)"
        )
    calibration = {**(calibration or {}), "host_cores": host_cores}
    peers = experiment.workload.peers
    if host_cores is not None and peers > host_cores:
        print(
            f"the {peers} peers share {host_cores} cores: the time model's CPU terms (step_time, "
            f"stack_latency, stack_bandwidth) take {peers / host_cores:.3g}x as long ([network] "
            "host_cores; --host-cores none: each peer its own machine)"
        )
    keep = args.dir is not None
    directory = Path(args.dir) if keep else Path(tempfile.mkdtemp(prefix="gossipnet-predict-"))
    directory.mkdir(parents=True, exist_ok=True)
    metric = "loss" if args.target_loss is not None else "accuracy"
    try:
        prediction = predict(
            args.experiment,
            target=args.target_loss if metric == "loss" else args.target,
            metric=metric,
            directory=directory,
            calibration=calibration,
        )
    except RuntimeError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 1
    if not keep:
        shutil.rmtree(directory, ignore_errors=True)
    print_table(prediction)
    plot(prediction, args.plot)
    print(f"wrote {args.plot}")
    if args.json is not None:
        args.json.write_text(json.dumps(prediction.summary(), indent=1))
        print(f"wrote {args.json}")
    return 0
