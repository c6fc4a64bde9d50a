"""Tasks beyond classification from the command line, as real processes: a regression
``.npz`` and a next-token ``.npz`` through ``gossipnet launch`` to their final tables, and a
model that does not fit its data refused in one line before anything starts."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def launch(tmp_path: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GOSSIPNET_SECRET"}
    command = [sys.executable, "-m", "gossipnet", "launch", "--peers", "2", "--progress", "none",
               *args]  # fmt: skip
    return subprocess.run(
        command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=timeout
    )


def test_a_regression_npz_trains_through_launch_to_its_mean_squared_error(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 4)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0]) + 0.1 * rng.normal(size=200)).astype(np.float32)
    np.savez(tmp_path / "regression.npz", x=x, y=y)  # float y: the task is regression
    result = launch(tmp_path, "--dataset", "regression.npz", "--model", "logistic", "--steps",
                    "20", "--batch-size", "16", "--json", "--log-dir", "logs")  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    table, line = result.stdout.rsplit("\n", 2)[-3], result.stdout.splitlines()[-1]
    assert "test mean squared error after 20 steps of batch 16" in result.stdout
    assert "test MSE" in result.stdout and "%" not in result.stdout, table
    results = json.loads(line)
    assert (results["task"], results["num_classes"]) == ("regression", 1)
    zero = float(np.mean(y**2))  # the error of predicting 0: about 14
    for peer in results["peers"]:
        assert peer["test_accuracy"] is None and peer["test_mse"] == peer["test_loss"]
        assert peer["test_mse"] < zero / 4, peer  # it learned
    mean = sum(p["test_mse"] for p in results["peers"]) / 2
    assert results["mean_test_mse"] == pytest.approx(mean)
    assert results["centralized"]["test_mse"] < zero / 4
    with (tmp_path / "logs" / "peer-0" / "metrics.csv").open(newline="") as stream:
        last = list(csv.DictReader(stream))[-1]
    assert float(last["mse"]) == results["peers"][0]["test_mse"] and last["accuracy"] == ""


def test_a_next_token_npz_trains_through_launch_to_its_bits_per_token(tmp_path: Path) -> None:
    stream = np.arange(4001) * 3 % 11  # a vocabulary of 11 tokens, not bytes
    x, y = stream[:-1].reshape(500, 8), stream[1:].reshape(500, 8)
    np.savez(tmp_path / "tokens.npz", x=x, y=y)  # integer y of x's shape: next tokens
    result = launch(tmp_path, "--dataset", "tokens.npz", "--model",
                    "gpt:layers=1,width=16,heads=2", "--steps", "10", "--batch-size", "8",
                    "--json")  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "validation bits per token after 10 steps of batch 8" in result.stdout
    assert "val. bits/token" in result.stdout
    results = json.loads(result.stdout.splitlines()[-1])
    assert (results["task"], results["num_classes"]) == ("language-model", 11)
    for peer in [*results["peers"], results["centralized"]]:
        assert peer["test_bits_per_byte"] == pytest.approx(peer["test_loss"] / math.log(2))
        assert peer["test_bits_per_byte"] < math.log2(11)  # a uniform guess scores log2(11)
        assert 0 <= peer["test_accuracy"] <= 1  # next-token top-1


def test_a_model_that_does_not_fit_the_data_is_refused_in_one_line_within_10_s(
    tmp_path: Path,
) -> None:
    (tmp_path / "mymodel.py").write_text(
        "from torch import nn\n\n\n"
        "def Net(input_shape, num_classes):  # written for 3 features\n"
        "    return nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, num_classes))\n"
    )
    angle = np.linspace(0, 12, 300)
    labels = np.arange(300) % 2
    spirals = np.stack([angle * np.cos(angle + np.pi * labels), angle * np.sin(angle)], axis=1)
    np.savez(tmp_path / "spirals.npz", x=spirals.astype(np.float32), y=labels)
    start = time.monotonic()
    result = launch(tmp_path, "--model", "mymodel.py:Net", "--dataset", "spirals.npz", "--dir",
                    "run", "--steps", "1500", timeout=60)  # fmt: skip
    elapsed = time.monotonic() - start
    assert result.returncode == 2, result.stderr
    assert elapsed < 10, f"refused after {elapsed:.1f} s"
    assert result.stderr.splitlines() == [
        "gossipnet launch: error: --model mymodel.py:Net does not fit --dataset spirals.npz: the "
        "model fails on one batch of the data set's inputs x [4, 2] float32: RuntimeError: mat1 "
        "and mat2 shapes cannot be multiplied (4x2 and 3x16)"
    ]
    assert not (tmp_path / "run").exists()  # refused before the run directory was made


def test_a_peer_refuses_a_model_that_does_not_fit_before_it_listens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from peer.app.cli import main

    rng = np.random.default_rng(1)
    np.savez(tmp_path / "wide.npz", x=rng.normal(size=(40, 3)), y=rng.normal(size=(40, 2)))
    (tmp_path / "single.py").write_text(
        "from torch import nn\n\n\ndef Net():  # one output, whatever the data\n"
        "    return nn.Linear(3, 1)\n"
    )
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:  # two regression targets, one output
        main(["--id", "a", "--dataset", "wide.npz", "--model", "single.py:Net", "--port", "0",
              "--steps", "1"], "gossipnet peer")  # fmt: skip
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "gossipnet peer: error: --model single.py:Net does not fit --dataset wide.npz: the model's "
        "output for inputs x [4, 3] float32 is [4, 1], not 2 values per sample; the regression "
        "data set needs [4, 2] (regression targets y of 2 values per sample)"
    ]
