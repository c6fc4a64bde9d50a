"""``gossipnet sim calibrate``: a real peer's step and a real exchange timed on this machine,
written as a [network] table that an experiment takes."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from gossipnet.cli import main
from peer.app.calibration import ExchangeTiming, fit_stack
from sim.config import experiment_from_dict, load_experiment, load_experiment_data

TINY = """
seed = 0
[workload]
dataset = "synthetic:num_samples=200,test_fraction=0.2,seed=0"
model = "logistic"
peers = 4
batch_size = 8
[network]
latency = 0.05
bandwidth = 1.25e7
"""


def test_calibrate_writes_a_network_table_the_experiment_takes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    experiment = tmp_path / "tiny.toml"
    experiment.write_text(TINY)
    out = tmp_path / "calibration.toml"
    argv = ["sim", "calibrate", str(experiment), "--out", str(out), "--steps", "3"]
    assert main([*argv, "--repeats", "2", "--sizes", "4kB,400kB", "--stack", "one-process"]) == 0
    printed = capsys.readouterr().out
    assert "step_time" in printed and "stack_bandwidth" in printed and f"wrote {out}" in printed
    written = tomllib.loads(out.read_text())["network"]
    assert set(written) <= {"step_time", "stack_latency", "stack_bandwidth"}
    assert written["step_time"] > 0 and written["stack_latency"] >= 0
    assert "exchange of 4096 bytes each way" in out.read_text()  # the raw medians, as comments
    load_experiment(out)  # a valid experiment file by itself
    data = load_experiment_data(experiment)
    data["network"].update(written)  # pasted into the experiment's [network]
    network = experiment_from_dict(data).network
    assert network.step_time == written["step_time"]
    assert network.stack_latency == written["stack_latency"]
    assert network.latency == 0.05  # the regime simulated stays the file's


def test_the_fit_recovers_the_stacks_latency_and_throughput() -> None:
    sigma, throughput = 4e-4, 5e8
    timings = [
        ExchangeTiming(size, (2 * (sigma + size / throughput),) * 3)
        for size in (4096, 10**6, 10**7)
    ]
    fit = fit_stack(timings)
    assert fit.stack_latency == pytest.approx(sigma)
    assert fit.stack_bandwidth == pytest.approx(throughput)
    assert fit.residual < 1e-9
    flat = fit_stack([ExchangeTiming(4096, (0.002,)), ExchangeTiming(10**6, (0.001,))])
    assert flat.stack_bandwidth is None  # times that do not grow with size: no throughput term


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (["--sizes", "4kB"], "--sizes: needs at least two different sizes to fit"),
        (["--sizes", "4kB,lots"], "--sizes: got 'lots'; allowed: comma-separated sizes"),
        (["--steps", "0"], "--steps: must be >= 1, got 0"),
        (["--stack", "loop"], "--stack: invalid choice 'loop'; allowed: processes, one-process"),
    ],
)
def test_a_bad_flag_is_one_line_and_exit_2(
    flags: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["sim", "calibrate", *flags])
    assert exited.value.code == 2
    assert capsys.readouterr().err.startswith(f"gossipnet sim calibrate: error: {line}")


@pytest.mark.slow
def test_calibrate_processes_measures_the_stack_between_two_peer_processes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The default (--stack processes): two real 2-peer launches; the stack's processor time
    per message between processes replaces the one-process fit (whose value stays in the
    comments)."""
    experiment = tmp_path / "tiny.toml"
    experiment.write_text(TINY)
    out = tmp_path / "calibration.toml"
    argv = ["sim", "calibrate", str(experiment), "--out", str(out), "--steps", "3"]
    assert main([*argv, "--repeats", "2", "--sizes", "4kB,400kB"]) == 0
    assert "between two peer processes" in capsys.readouterr().out
    text = out.read_text()
    written = tomllib.loads(text)["network"]
    assert written["stack_latency"] > 0
    line = next(line for line in text.splitlines() if "between two peer processes" in line)
    per_round = float(line.split(": ")[1].split(" s ")[0])  # processor time per peer and round
    assert per_round > written["step_time"] + written["stack_latency"] * 0.99
    assert "one process's fit" in line
