"""Metrics: consensus distance, per-peer evaluation, JSON lines / CSV round trips, plots."""

from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

import torch

from sim import figures
from sim.metrics import (
    COLUMNS,
    Evaluation,
    Record,
    consensus_distance,
    plot,
    read_jsonl,
    write_csv,
    write_jsonl,
)

from .helpers import make_context


def record(round_: int, accuracy: float, loss: float = math.nan) -> Record:
    return Record(
        "dpsgd",
        round_,
        0.5 * round_,
        8 * round_,
        100.0 * round_,
        30.0 * round_,
        accuracy,
        1.0,
        accuracy,
        accuracy - 0.1,
        0.01,
        loss,
    )


def test_consensus_distance_is_the_mean_squared_distance_to_the_average() -> None:
    models = torch.tensor([[0.0, 0.0], [2.0, 0.0], [1.0, 3.0]])
    # average (1, 1); squared distances 2, 2, 4
    assert consensus_distance(models) == 8 / 3
    assert consensus_distance(models[:1]) == 0.0


def test_evaluation_of_the_average_model_and_of_every_peer() -> None:
    ctx, evaluation = make_context(4)
    models = ctx.peers.params + 0.05 * torch.randn(ctx.peers.params.shape)
    measured = evaluation.measure(ctx.peers, models)
    accuracy, _ = ctx.peers.evaluate(evaluation.x_test, evaluation.y_test, models)
    assert measured["peer_accuracy_worst"] == float(accuracy.min())
    assert abs(measured["peer_accuracy_mean"] - float(accuracy.mean())) < 1e-12
    average, loss = ctx.peers.evaluate(
        evaluation.x_test, evaluation.y_test, models.mean(0, keepdim=True)
    )
    assert measured["test_accuracy"] == float(average[0])
    assert measured["test_loss"] == float(loss[0])
    # a seeded subset of peers when there are more than peer_limit
    limited = Evaluation(evaluation.x_test, evaluation.y_test, peer_limit=2)
    subset = limited.measure(ctx.peers, models)
    assert subset["peer_accuracy_worst"] >= measured["peer_accuracy_worst"]
    assert subset == limited.measure(ctx.peers, models)


def test_jsonl_and_csv_round_trip(tmp_path: Path) -> None:
    records = [record(0, 0.1), record(10, 0.8, loss=0.7)]
    write_jsonl(records, tmp_path / "r.jsonl")
    back = read_jsonl(tmp_path / "r.jsonl")
    assert back[1] == records[1]
    assert math.isnan(back[0].train_loss)
    write_csv(records, tmp_path / "r.csv")
    with (tmp_path / "r.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert tuple(rows[0]) == COLUMNS
    assert float(rows[1]["test_accuracy"]) == 0.8


def test_plot_draws_a_figure(tmp_path: Path) -> None:
    runs = {"a": [record(0, 0.1), record(5, 0.5)], "b": [record(0, 0.1), record(5, 0.7)]}
    out = plot(runs, tmp_path / "fig.png", title="test")
    assert out.stat().st_size > 10_000
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the figures live in sim.figures (tests/sim/test_figures.py); sim.cli imports it from here
    assert plot is figures.plot


def test_importing_the_simulator_core_does_not_load_matplotlib() -> None:
    code = (
        "import sys, sim.batched, sim.optimizers, sim.mixing, sim.network, sim.algorithms, sim.gossip_runner, sim.runner, "
        "sim.metrics, sim.config, sim.cli; print('matplotlib' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
