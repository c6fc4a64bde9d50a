"""``gossipnet sim predict``: one experiment file simulated and run as real peers, the times
side by side. The real run here is the suite's one launch of an experiment file: two peers,
four rounds, loopback; it checks that the file's real peers end where its simulated ones do
(same seed, partition, model, batches, algorithm: the same final accuracy) and that the
table, the JSON and the figure say the same numbers. Timings are not asserted: the machine
running the suite is shared (the grid that checks them: bench/predict_grid.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from gossipnet.cli import main
from gossipnet.predict import Curve, measured_curve, time_to

TINY = """
name = "tiny"
seed = 2
rounds = 4
eval_every = 2
[workload]
dataset = "synthetic:num_samples=300"
model = "logistic"
peers = 2
batch_size = 16
[optimizer]
lr = 0.3
[algorithm]
name = "dpsgd"
[network]
step_time = 0.002
stack_latency = 0.003
"""


def test_time_to_target_interpolates_between_evaluations() -> None:
    curve = Curve(
        rounds=(0, 2, 4), time=(0.0, 1.0, 3.0), accuracy=(0.1, 0.5, 0.9), loss=(2.0, 1.0, 0.5)
    )
    assert time_to(curve, 0.7) == pytest.approx(2.0)  # halfway from 0.5 at 1 s to 0.9 at 3 s
    assert time_to(curve, 0.1) == 0.0
    assert math.isnan(time_to(curve, 0.95))
    assert time_to(curve, 0.75, "loss") == pytest.approx(2.0)
    assert curve.per_round() == pytest.approx(0.75)


def test_the_measured_clock_starts_when_the_last_synchronous_peer_starts(tmp_path: Path) -> None:
    lines = {  # peer 1 started 0.5 s after peer 0 and caught up within the first round
        0: [(0, 100.1, 0.0, 0.1), (2, 100.1, 0.9, 0.1)],
        1: [(0, 100.6, 0.0, 0.1), (2, 100.6, 0.5, 0.1)],
    }
    for peer, entries in lines.items():
        (tmp_path / f"peer-{peer}.evals.jsonl").write_text(
            "".join(
                json.dumps(
                    {
                        "step": s,
                        "began": t,
                        "train_s": train,
                        "eval_s": spent,
                        "test_accuracy": 0.5 + s / 10,
                        "test_loss": 1.0,
                    }
                )
                + "\n"
                for s, t, train, spent in entries
            )
        )
    curve = measured_curve(tmp_path, 1, [0, 1])
    assert curve.rounds == (0, 2) and curve.time[0] == 0.0
    # began at 100.1 and 100.6 (after the step-0 evaluation); step 2 at 101.0 and 101.1
    assert curve.time[1] == pytest.approx(((101.0 - 100.6) + (101.1 - 100.6)) / 2)
    assert curve.accuracy == (0.5, 0.7)
    own = measured_curve(tmp_path, 1, [0, 1], synchronous=False)  # AD-PSGD: own clocks
    assert own.time[1] == pytest.approx(2 / (1 / 0.9 + 1 / 0.5))  # the swarm's step rate


@pytest.mark.slow
def test_predict_runs_the_file_both_ways_and_reports_each_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    experiment = tmp_path / "tiny.toml"
    experiment.write_text(TINY)
    figure, numbers = tmp_path / "predict.png", tmp_path / "predict.json"
    argv = ["sim", "predict", str(experiment), "--plot", str(figure), "--json", str(numbers)]
    assert main([*argv, "--target", "0.3", "--dir", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "time per round" in out and "time to accuracy 0.3" in out and "note:" not in out
    summary = json.loads(numbers.read_text())
    assert summary["calibrated"] == ["step_time", "stack_latency"]
    predicted, measured = summary["predicted"], summary["measured"]
    assert predicted["rounds"] == measured["rounds"] == [0, 2, 4]
    # one file, two runners: the real peers end with the simulated peers' accuracy
    assert measured["accuracy"][-1] == pytest.approx(predicted["accuracy"][-1], abs=1e-6)
    assert measured["accuracy"][-1] > measured["accuracy"][0]
    per_round = summary["round_time"]
    assert per_round["predicted"] == pytest.approx(predicted["time"][-1] / 4)
    assert per_round["measured"] > 0
    assert per_round["error"] == pytest.approx(
        (per_round["predicted"] - per_round["measured"]) / per_round["measured"]
    )
    assert figure.stat().st_size > 10_000
    terms = summary["terms"]  # the time model's terms, each side
    assert terms["compute per local step"]["predicted"] == pytest.approx(0.002)
    assert terms["compute per local step"]["measured"] > 0
    assert "round less its compute" in terms and "compute per local step" in out


def test_every_cell_of_the_grid_is_an_experiment_its_peers_can_run(tmp_path: Path) -> None:
    """``bench/predict_grid.py``'s cells: valid files, launchable as written (no key only the
    simulator runs), with the same local steps and evaluation steps under every algorithm."""
    import importlib.util
    import tomllib

    from gossipnet.experiment_launch import launch_plan
    from sim.config import load_experiment

    spec = importlib.util.spec_from_file_location(
        "predict_grid", Path(__file__).resolve().parents[1] / "bench" / "predict_grid.py"
    )
    assert spec is not None and spec.loader is not None
    grid = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(grid)
    base = tomllib.loads(grid.BASE.read_text())
    calibration = {"step_time": 5e-4, "stack_latency": 3e-3, "stack_bandwidth": 5e8}
    seen = set()
    for algorithm in grid.ALGORITHMS:
        for regime in grid.REGIMES:
            file = tmp_path / f"{algorithm}-{regime}.toml"
            grid.write_toml(grid.cell_table(base, algorithm, regime, calibration), file)
            config = load_experiment(file)
            assert config.workload.peers >= 8 and config.network.step_time == 5e-4
            flags = launch_plan(config).flags
            steps = flags[flags.index("--steps") + 1], flags[flags.index("--eval-every") + 1]
            seen.add(steps)
            assert ("--latency" in flags) == (regime == "50ms-100Mbit")
            assert ("--stragglers" in flags) == (regime == "straggler-3x")
    assert seen == {("200", "20")}  # DiLoCo: 20 rounds of H = 10, the same 200 local steps


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--eval-every", "5"], "--eval-every: goes with --eval-log FILE"),
        (["--eval-log", "x.jsonl"], "--eval-every: goes with --eval-log FILE"),
        (["--eval-every", "-1", "--eval-log", "x.jsonl"], "--eval-every: must be >= 0"),
    ],
)
def test_a_peers_timed_evaluations_need_both_flags(flags: list[str], message: str) -> None:
    from peer.app.cli import parse_peer_args
    from peer.app.usage import UsageError

    with pytest.raises(UsageError, match=message):
        parse_peer_args(["--id", "a", *flags], raise_errors=True)
