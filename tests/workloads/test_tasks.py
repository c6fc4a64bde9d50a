"""The three tasks (``workloads.task``): a data set declares its own (an ``.npz`` by its
``task`` entry or by ``y``), the loss and the metrics follow, and one forward pass of one
batch says in one line what of a model does not fit the data."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from peer.app.report import print_results, title
from workloads import build_model, evaluate, load_dataset, partition, train_centralized
from workloads.formats import DataFileError
from workloads.task import (
    METRIC_NAMES,
    TASKS,
    ModelMismatchError,
    check_model_fits,
    mean_squared_error,
    metrics,
)


def regression_file(tmp_path: Path, **extra: np.ndarray | str) -> Path:
    """y = x w + noise over 4 features, 200 samples, no test split: a regression .npz."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 4)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0]) + 0.1 * rng.normal(size=200)).astype(np.float32)
    path = tmp_path / "regression.npz"
    np.savez(path, **{"x": x, "y": y, **extra})
    return path


def test_an_npz_declares_its_task_by_its_task_entry_or_by_y(tmp_path: Path) -> None:
    data = load_dataset(str(regression_file(tmp_path)))  # float y: a regression
    assert (data.task, data.num_classes, data.input_shape) == ("regression", 1, (4,))
    assert data.y_train.shape == (160, 1) and data.y_train.dtype == torch.float32
    labels = np.arange(50) % 3
    np.savez(tmp_path / "counts.npz", x=np.ones((50, 2)), y=labels, task="regression")
    declared = load_dataset(str(tmp_path / "counts.npz"))  # integer y, declared regression
    assert declared.task == "regression" and declared.y_train.dtype == torch.float32
    assert load_dataset(f"npz:path={tmp_path / 'counts.npz'}").task == "regression"
    spec = f"npz:path={tmp_path / 'counts.npz'},task=classification"  # the spec wins
    assert load_dataset(spec).task == "classification"
    wide = tmp_path / "wide.npz"  # [N, 3] targets: three outputs per sample
    np.savez(wide, x=np.ones((20, 2), np.float32), y=np.ones((20, 3), np.float32))
    assert load_dataset(str(wide)).num_classes == 3
    (tmp_path / "mydata.py").write_text(  # a factory's mapping declares its task the same way
        "import numpy as np\n\n\ndef load():\n"
        "    return {'x': np.ones((30, 2)), 'y': np.arange(30) % 4, 'task': 'regression'}\n"
    )
    made = load_dataset(f"{tmp_path / 'mydata.py'}:load")
    assert (made.task, made.num_classes, made.y_test.dtype) == ("regression", 1, torch.float32)


@pytest.mark.parametrize(
    ("extra", "spec", "message"),
    [
        ({"task": "vision"}, "", r"key 'task' is 'vision'; allowed: a string, one of "
         r"classification, language-model, regression"),
        ({}, ",num_classes=3", r"num_classes applies to classification and language-model data"),
        ({}, ",task=classification", r"key 'y' must be 1-D integer labels \[N\] for the "
         r"classification task, got dtype float32"),
        ({}, ",task=language-model", r"key 'y' must be integer next tokens \[N, L\]"),
        ({"y": np.full(200, np.nan, np.float32)}, "", r"key 'y' holds NaN or infinite targets"),
    ],
)  # fmt: skip
def test_a_task_that_does_not_fit_the_arrays_is_one_line_naming_the_key(
    tmp_path: Path, extra: dict[str, np.ndarray | str], spec: str, message: str
) -> None:
    path = regression_file(tmp_path, **extra)
    with pytest.raises(DataFileError, match=message):
        load_dataset(f"npz:path={path}{spec}")


def test_each_task_has_its_loss_metrics_and_direction() -> None:
    assert metrics("regression", loss=0.5) == {"mse": 0.5, "loss": 0.5}
    assert list(metrics("classification", accuracy=0.5, loss=1.0)) == ["accuracy", "loss"]
    with pytest.raises(ValueError, match="the classification task needs the accuracy"):
        metrics("classification", loss=1.0)
    regression, classification = TASKS["regression"], TASKS["classification"]
    assert regression.best([0.3, 0.1, 0.2]) == 0.1 and classification.best([0.3, 0.1]) == 0.3
    assert regression.better(0.1, 0.2) and not classification.better(0.1, 0.2)
    language = TASKS["language-model"]
    assert language.title(256) == "validation bits per byte"
    assert language.heading(50) == "val. bits/token" and language.title(50).endswith("token")
    assert set(METRIC_NAMES) == {"accuracy", "loss", "bits_per_byte", "mse"}


def test_the_mean_squared_error_reads_outputs_in_the_targets_shape_never_broadcast() -> None:
    targets = torch.tensor([[1.0], [2.0], [4.0]])
    squeezed = torch.tensor([1.0, 2.0, 3.0])  # [B] against [B, 1]: 0, 0, 1 -> mean 1/3
    assert float(mean_squared_error(squeezed, targets)) == pytest.approx(1 / 3)
    broadcast = float(((squeezed - targets) ** 2).mean())  # what [B] - [B, 1] would give
    assert broadcast == pytest.approx(21 / 9)
    with pytest.raises(ValueError, match=r"outputs \(3, 2\) do not hold one value per target"):
        mean_squared_error(torch.zeros(3, 2), targets)


def test_evaluate_scores_a_regression_by_its_mean_squared_error(tmp_path: Path) -> None:
    data = load_dataset(str(regression_file(tmp_path)))
    model = build_model("logistic", data.input_shape, data.num_classes, seed=0)
    scores = evaluate(model, data.x_test, data.y_test, data.task, batch_size=7)
    with torch.no_grad():
        expected = float(((model(data.x_test) - data.y_test) ** 2).mean())
    assert scores == {"mse": pytest.approx(expected), "loss": pytest.approx(expected)}


def test_the_centralized_reference_trains_a_regression_on_its_loss(tmp_path: Path) -> None:
    data = load_dataset(str(regression_file(tmp_path)))
    model = build_model("logistic", data.input_shape, 1, seed=0)
    before = evaluate(model, data.x_test, data.y_test, data.task)["mse"]
    result = train_centralized(model, data, steps=60, batch_size=32, lr=0.05)
    assert result.task == "regression" and result.accuracy is None
    assert result.metrics["mse"] == result.loss < before / 20  # y's variance is about 14


def test_label_partitions_refuse_regression_targets(tmp_path: Path) -> None:
    data = load_dataset(str(regression_file(tmp_path)))
    assert sorted(torch.cat(partition("iid", data.y_train, 4)).tolist()) == list(range(160))
    with pytest.raises(ValueError, match="dirichlet: splits by class label, but these targets "
                       "are a regression's values; allowed: iid"):  # fmt: skip
        partition("dirichlet:alpha=0.5", data.y_train, 4)


class Normed(nn.Module):
    """A classifier with BatchNorm: the check must leave its running statistics alone."""

    def __init__(self, features: int, outputs: int) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(features)
        self.linear = nn.Linear(features, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.norm(x))


def test_one_forward_pass_says_what_does_not_fit(tmp_path: Path) -> None:
    classes = load_dataset("synthetic:num_samples=100,num_features=5,num_classes=3")
    fitting = Normed(5, 3)
    fitting.train()
    check_model_fits(fitting, classes)  # fits: nothing raised, nothing changed
    assert fitting.training and int(fitting.norm.num_batches_tracked) == 0
    assert torch.equal(fitting.norm.running_mean, torch.zeros(5))
    check_model_fits(Normed(5, 4), classes)  # more logits than classes is allowed
    cases = [
        (nn.Linear(3, 3), classes, r"the model fails on one batch of the data set's inputs x "
         r"\[4, 5\] float32: RuntimeError: mat1 and mat2 shapes cannot be multiplied"),
        (nn.Linear(5, 2), classes, r"output for inputs x \[4, 5\] float32 is 2 logits per "
         r"sample, fewer than the classes; the classification data set needs logits \[4, 3\]"),
        (nn.Sequential(nn.Linear(5, 3), nn.Softmax(dim=0), nn.Flatten(0)), classes,
         r"is \[12\], not one row per sample of the 4"),
    ]  # fmt: skip
    regression = load_dataset(str(regression_file(tmp_path)))
    cases.append(
        (nn.Linear(4, 2), regression, r"is \[4, 2\], not 1 value per sample; the regression "
         r"data set needs \[4, 1\] \(regression targets y of 1 value per sample\)"),
    )  # fmt: skip
    tokens = load_dataset("text:context=8,max_bytes=4000")
    small = nn.Sequential(nn.Embedding(256, 8), nn.Linear(8, 100))  # 100 logits per position
    cases += [
        (small, tokens, r"is a vocabulary of 100, smaller than the data's; the language-model "
         r"data set needs logits \[4, 8, 256\]"),
        (nn.Linear(8, 256), tokens, r"RuntimeError: .*\(language-model data are integer tokens "
         r"\[B, L\]: the model must embed them, as gpt does\)"),
    ]  # fmt: skip
    for model, data, message in cases:
        with pytest.raises(ModelMismatchError, match=message) as raised:
            check_model_fits(model, data)
        assert "\n" not in str(raised.value)


def test_launchs_table_shows_a_regressions_mean_squared_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    peer = {"id": "peer-0", "step": 20, "test_accuracy": None, "test_loss": 0.5, "test_mse": 0.5,
            "exchanges_ok": 4, "exchanges_failed": 0}  # fmt: skip
    results = {
        "task": "regression",
        "num_classes": 1,
        "peers": [peer],
        "centralized": {"test_mse": 0.25, "test_loss": 0.25, "samples": 640, "error": None},
        "steps": 20,
    }
    args = argparse.Namespace(steps=20, batch_size=16, peers=2)
    assert title(results, args) == "test mean squared error after 20 steps of batch 16"
    print_results(results, args)
    out = capsys.readouterr().out
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in out.splitlines() if "│" in line]
    assert ["peer-0", "20", "0.5", "+0.25", "4", "0"] in cells
    assert "test MSE" in out and "%" not in out and math.isfinite(peer["test_mse"])


def test_workloads_inspect_names_the_task_and_refuses_a_model_that_does_not_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from workloads.cli import main

    path = regression_file(tmp_path)
    assert main(["inspect", "--dataset", str(path), "--model", "logistic", "--peers", "2"]) == 0
    out = capsys.readouterr().out
    assert "task       regression: trained on the mean squared error, scored by test mean " \
        "squared error (lower is better)" in out  # fmt: skip
    with pytest.raises(SystemExit) as exited:  # a token model on float features
        main(["inspect", "--dataset", str(path), "--model", "gpt:layers=1,width=8,heads=2"])
    assert exited.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(
        f"gossipnet workloads: error: --model gpt:layers=1,width=8,heads=2 does not fit "
        f"--dataset {path}: the model fails on one batch of the data set's inputs x [4, 4] "
        "float32: "
    )
