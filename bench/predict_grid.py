"""The prediction grid of issue 32: does the simulator predict a real swarm's time?

Every cell is one experiment file run twice on this machine by ``gossipnet sim predict``
(simulated, and as real peers over emulated links): the base file
(``examples/experiments/predict-base.toml``, 8 peers, MLP on MNIST-1D) under each algorithm
(D-PSGD, AD-PSGD, DiLoCo with H = 10 and the same number of local steps) and each regime
(loopback; emulated 50 ms / 100 Mbit/s links; loopback with peer 0 a straggler at 3x). The
machine is measured first (``gossipnet sim calibrate``: step_time, stack_latency,
stack_bandwidth, written into every cell's [network]), so the prediction is of measured
constants. It prints every cell (predicted and measured time per round and time to the
target accuracy, the error of each), the mean absolute percentage error (MAPE) over the
grid, and writes the cells' files, the numbers (grid.json, grid.md) and one figure of every
cell's two curves (grid.png) into --out::

    .venv/bin/python bench/predict_grid.py                     # the grid: 9 cells, ~15 min
    .venv/bin/python bench/predict_grid.py --cells dpsgd:loopback --peers 3 --rounds 20

Run it on an otherwise idle machine with at least as many cores as peers: the real peers'
times are the measurement. The table goes to docs/prediction.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shutil
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

from gossipnet.predict import (
    Curve,
    Prediction,
    error,
    predict,
    simulated_curve,
    time_to,
    usable_cores,
)
from sim.config import load_experiment

BASE = Path(__file__).resolve().parents[1] / "examples" / "experiments" / "predict-base.toml"
DILOCO_H = 10
ALGORITHMS: dict[str, dict[str, Any]] = {
    "dpsgd": {"name": "dpsgd", "topology": "ring"},
    "ad-psgd": {"name": "ad-psgd", "topology": "ring"},
    "diloco": {"name": "diloco", "topology": "ring", "local_steps": DILOCO_H},
}
"""The algorithms of the grid: synchronous gossip, asynchronous gossip, low communication."""
REGIMES: dict[str, dict[str, Any]] = {
    "loopback": {},
    "50ms-100Mbit": {"latency": 0.05, "bandwidth": 1.25e7},
    "straggler-3x": {"stragglers": {"0": 3.0}},
}
"""The network regimes of the grid, as [network] keys."""


def cell_table(
    base: dict[str, Any], algorithm: str, regime: str, calibration: dict[str, float]
) -> dict[str, Any]:
    """The experiment tables of one cell: the base with the algorithm, the regime's and the
    calibration's [network] keys; DiLoCo's rounds are H local steps each, so it gets the
    same local steps (and evaluations at the same steps) in fewer rounds."""
    data = json.loads(json.dumps(base))  # a deep copy of plain tables
    data["name"] = f"predict-{algorithm}-{regime}"
    data["algorithm"] = dict(ALGORITHMS[algorithm])
    data["network"] = {**data.get("network", {}), **calibration, **REGIMES[regime]}
    steps = int(data["algorithm"].get("local_steps", 1))
    data["rounds"] = max(1, int(data.get("rounds", 100)) // steps)
    data["eval_every"] = max(1, int(data.get("eval_every", 10)) // steps)
    return data


def write_toml(data: dict[str, Any], path: Path) -> None:
    """The few shapes an experiment file needs: top-level values, then one table each."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, dict):
            return "{" + ", ".join(f"{json.dumps(k)} = {value(x)}" for k, x in v.items()) + "}"
        if isinstance(v, list | tuple):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return repr(v)

    lines = [f"{k} = {value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for section, table in data.items():
        if isinstance(table, dict):
            lines += ["", f"[{section}]", *(f"{k} = {value(v)}" for k, v in table.items())]
    path.write_text("\n".join(lines) + "\n")


def mape(values: list[float]) -> float:
    finite = [abs(v) for v in values if math.isfinite(v)]
    return 100 * sum(finite) / len(finite) if finite else math.nan


def _ms(value: float, digits: int = 1) -> str:
    return "-" if not math.isfinite(value) else f"{value * 1e3:.{digits}f}"


def _s(value: float) -> str:
    return "not reached" if not math.isfinite(value) else f"{value:.2f}"


def _pct(value: float) -> str:
    return "-" if not math.isfinite(value) else f"{100 * value:+.0f} %"


def table(results: dict[str, Prediction], own: dict[str, Curve]) -> str:
    """Every cell and the MAPE, as a markdown table; ``own``: each cell's prediction without
    the host term (every peer its own machine), whose errors are the last two columns."""
    lines = [
        "| cell | target acc. | round ms pred. | round ms meas. | error | to target s pred. "
        "| to target s meas. | error | compute ms/step pred. / meas. | round less compute ms "
        "pred. / meas. | without host_cores: round error | to target error |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    round_errors, target_errors, own_round, own_target = [], [], [], []
    for name, result in results.items():
        alone = own.get(name)
        if alone is not None:
            own_round.append(error(alone.per_round(), result.round_time[1]))
            own_target.append(
                error(time_to(alone, result.target, result.metric), result.time_to_target[1])
            )
        own_cells = (
            f"{_pct(own_round[-1])} | {_pct(own_target[-1])}" if alone is not None else "- | -"
        )
        (rp, rm), (tp, tm) = result.round_time, result.time_to_target
        round_errors.append(error(rp, rm))
        target_errors.append(error(tp, tm))
        terms = {what.strip(): (p, m) for what, p, m, _ in result.rows()[2:]}
        compute = terms.get("compute per local step", (math.nan, math.nan))
        rest = terms.get("round less its compute", (math.nan, math.nan))
        lines.append(
            f"| {name} | {result.target:.3f} | {_ms(rp)} | {_ms(rm)} | {_pct(error(rp, rm))} "
            f"| {_s(tp)} | {_s(tm)} | {_pct(error(tp, tm))} "
            f"| {_ms(compute[0], 2)} / {_ms(compute[1], 2)} | {_ms(rest[0])} / {_ms(rest[1])} "
            f"| {own_cells} |"
        )
    own_mape = f"{mape(own_round):.0f} % | {mape(own_target):.0f} %" if own_round else "- | -"
    lines.append(
        f"| **MAPE** over {len(results)} cells | | | | {mape(round_errors):.0f} % | | | "
        f"{mape(target_errors):.0f} % | | | {own_mape} |"
    )
    return "\n".join(lines)


def figure(results: dict[str, Prediction], path: Path) -> None:
    """One panel per cell (algorithms in rows, regimes in columns): test accuracy against
    seconds, predicted and measured, the target dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [a for a in ALGORITHMS if any(k.startswith(a + ":") for k in results)]
    columns = [r for r in REGIMES if any(k.endswith(":" + r) for k in results)]
    fig, axes = plt.subplots(
        len(rows),
        len(columns),
        figsize=(4 * len(columns), 3 * len(rows)),
        squeeze=False,
        constrained_layout=True,
    )
    for i, algorithm in enumerate(rows):
        for j, regime in enumerate(columns):
            axis = axes[i][j]
            result = results.get(f"{algorithm}:{regime}")
            if result is None:
                axis.set_axis_off()
                continue
            curves: tuple[Curve, Curve] = (result.predicted, result.measured)
            for curve, style, label in zip(
                curves, ("o-", "s--"), ("predicted", "measured"), strict=True
            ):
                axis.plot(curve.time, curve.accuracy, style, ms=3, label=label)
            axis.axhline(result.target, color="grey", lw=0.8, ls=":")
            (tp, tm) = result.time_to_target
            axis.set_title(f"{algorithm}, {regime}: to target {_pct(error(tp, tm))}", fontsize=9)
            axis.set_xlabel("seconds")
            axis.set_ylabel("test accuracy (peers' mean)")
            axis.grid(alpha=0.3)
    shown = [axis for row in axes for axis in row if axis.lines]
    shown[0].legend(loc="lower right", fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench/predict_grid.py", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--base", type=Path, default=BASE, help="the base experiment file")
    parser.add_argument("--out", type=Path, default=Path("predict-grid"), help="output folder")
    parser.add_argument(
        "--cells",
        help="ALGORITHM:REGIME,... (default: all of "
        + ", ".join(ALGORITHMS)
        + " x "
        + ", ".join(REGIMES)
        + ")",
    )
    parser.add_argument("--peers", type=int, help="override workload.peers (a quick check)")
    parser.add_argument("--rounds", type=int, help="override the base's rounds (a quick check)")
    parser.add_argument("--target", type=float, help="one target accuracy for every cell")
    parser.add_argument(
        "--no-calibrate", action="store_true", help="predict with the base file's constants"
    )
    parser.add_argument(
        "--one-process",
        action="store_true",
        help="calibrate stack_latency between two peers in one process (default: between "
        "two peer processes, gossipnet sim calibrate, --stack processes)",
    )
    parser.add_argument(
        "--host-cores",
        default="auto",
        help="[network] host_cores of every cell: auto (this machine's usable cores: the "
        "swarm runs here), none, or a number (default auto)",
    )
    args = parser.parse_args(argv)
    cells = (
        [tuple(c.split(":", 1)) for c in args.cells.split(",")]
        if args.cells
        else [(a, r) for a in ALGORITHMS for r in REGIMES]
    )
    for algorithm, regime in cells:
        if algorithm not in ALGORITHMS or regime not in REGIMES:
            parser.error(f"--cells: unknown cell {algorithm}:{regime}")
    base = tomllib.loads(args.base.read_text())
    if args.peers is not None:
        base.setdefault("workload", {})["peers"] = args.peers
    if args.rounds is not None:
        base["rounds"] = args.rounds
        base["eval_every"] = max(1, min(int(base.get("eval_every", 10)), args.rounds // 4))
    args.out.mkdir(parents=True, exist_ok=True)
    calibration: dict[str, float] = {}
    if not args.no_calibrate:
        from gossipnet.calibrate import DEFAULT_SIZES, calibrate
        from peer.app.calibration import model_sizes

        measured = calibrate(
            str(args.base),
            steps=20,
            repeats=5,
            sizes=model_sizes(DEFAULT_SIZES),
            processes=not args.one_process,
        )
        calibration = dict(measured["network"])
        print("calibrated: " + ", ".join(f"{k} = {v:.4g}" for k, v in calibration.items()))
    cores = usable_cores() if args.host_cores == "auto" else args.host_cores
    if cores != "none":
        calibration["host_cores"] = int(cores)
    own: dict[str, Curve] = {}
    results: dict[str, Prediction] = {}
    for algorithm, regime in cells:
        name = f"{algorithm}:{regime}"
        file = args.out / f"{algorithm}-{regime}.toml"
        write_toml(cell_table(base, algorithm, regime, calibration), file)
        run_dir = args.out / f"{algorithm}-{regime}.run"
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir()
        print(f"== {name}: {file}", flush=True)
        results[name] = predict(str(file), target=args.target, directory=run_dir)
        if "host_cores" in calibration:  # the same file, every peer on its own machine
            config = load_experiment(str(file))
            alone = replace(config, network=replace(config.network, host_cores=None))
            own[name] = simulated_curve(alone)
        (tp, tm) = results[name].time_to_target
        print(f"   to target: predicted {_s(tp)} s, measured {_s(tm)} s ({_pct(error(tp, tm))})")
    text = table(results, own)
    stamp = f"{datetime.date.today()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}"
    print(f"\n# bench/predict_grid.py, {stamp}\n{text}")
    (args.out / "grid.md").write_text(f"<!-- bench/predict_grid.py, {stamp} -->\n{text}\n")
    (args.out / "grid.json").write_text(
        json.dumps({k: v.summary() for k, v in results.items()}, indent=1)
    )
    figure(results, args.out / "grid.png")
    print(f"wrote {args.out}/grid.md, grid.json, grid.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
