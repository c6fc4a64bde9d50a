"""Every input path in an experiment file is relative to the file's folder (sim.paths)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sim.build import build
from sim.config import ConfigError, experiment_from_dict, load_experiment
from sim.paths import resolve_dataset_spec, resolve_experiment_paths, resolve_model_spec
from sim.runner import run

MODEL_CODE = """
from torch import nn


def make(input_shape, num_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[-1], num_classes))
"""

EXPERIMENT = """
name = "paths"
rounds = 2
eval_every = 2

[graph]
file = "graphs/ring.edges"

[workload]
dataset = "data/arrays.npz"
model = "code/net.py:make"
peers = 4
batch_size = 4

[optimizer]
lr = 0.1

[output]
csv = "out.csv"
"""


def _experiment_folder(root: Path) -> Path:
    """An experiment file with its graph, model code and data in sub-folders of ``root``."""
    for sub in ("graphs", "code", "data"):
        (root / sub).mkdir(parents=True)
    (root / "graphs" / "ring.edges").write_text("0 1\n1 2\n2 3\n3 0\n", encoding="utf-8")
    (root / "code" / "net.py").write_text(MODEL_CODE, encoding="utf-8")
    rng = np.random.default_rng(0)
    np.savez(
        root / "data" / "arrays.npz",
        x=rng.normal(size=(64, 6)).astype(np.float32),
        y=rng.integers(0, 3, size=64),
        x_test=rng.normal(size=(16, 6)).astype(np.float32),
        y_test=rng.integers(0, 3, size=16),
    )
    path = root / "experiment.toml"
    path.write_text(EXPERIMENT, encoding="utf-8")
    return path


def test_a_file_runs_from_any_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _experiment_folder(tmp_path / "experiment")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config = load_experiment(Path("..") / "experiment" / "experiment.toml")
    folder = (Path("..") / "experiment").resolve()
    assert Path(config.graph.file).resolve() == folder / "graphs" / "ring.edges"  # type: ignore[union-attr]
    model_file, _, factory = config.workload.model.rpartition(":")
    assert Path(model_file).resolve() == folder / "code" / "net.py" and factory == "make"
    assert Path(config.workload.dataset).resolve() == folder / "data" / "arrays.npz"
    assert config.output.csv == "out.csv"  # outputs stay relative to the working directory
    algorithm, ctx, evaluation = build(config)
    records = run(algorithm, ctx, evaluation, rounds=2, eval_every=2)
    assert [r.round for r in records] == [0, 2]
    del path


def test_relative_paths_without_the_folder_are_refused_with_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read from the working directory instead of the file's folder, the same tables find
    nothing, and the error names the field (so the resolution above is what made it work)."""
    _experiment_folder(tmp_path / "experiment")
    monkeypatch.chdir(tmp_path)
    data = {"graph": {"file": "graphs/ring.edges"}, "workload": {"peers": 4}}
    with pytest.raises(ConfigError, match=r"^graph\.file: "):
        experiment_from_dict(data)
    config = experiment_from_dict(data, base_dir=tmp_path / "experiment")
    assert config.graph is not None


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("net.py:make", "/exp/net.py:make"),
        ("models/net.py:Builders.small", "/exp/models/net.py:Builders.small"),
        ("/abs/net.py:make", "/abs/net.py:make"),
        ("mlp:hidden=8", "mlp:hidden=8"),
        ("mlp", "mlp"),
        ("mypkg.models:make_net", "mypkg.models:make_net"),  # a module on the import path
    ],
)
def test_model_specs(spec: str, expected: str) -> None:
    assert resolve_model_spec(spec, Path("/exp")) == expected


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("data.npz", "/exp/data.npz"),
        ("npz:path=data.npz,seed=3", "npz:path=/exp/data.npz,seed=3"),
        ("mnist:path=mnist", "mnist:path=/exp/mnist"),
        ("cifar10:path=/data/cifar", "cifar10:path=/data/cifar"),
        ("mnist1d:num_samples=1000,cache_dir=cache", "mnist1d:num_samples=1000,cache_dir=/exp/cache"),
        ("mnist1d:num_samples=1000", "mnist1d:num_samples=1000"),
        ("mnist1d", "mnist1d"),
        ("load.py:make", "/exp/load.py:make"),
        ("mypkg.data:load", "mypkg.data:load"),
        ("npz:path", "npz:path"),  # malformed: left for the data set's own check
    ],
)  # fmt: skip
def test_dataset_specs(spec: str, expected: str) -> None:
    assert resolve_dataset_spec(spec, Path("/exp")) == expected


def test_home_is_expanded_and_other_tables_are_untouched() -> None:
    data = {
        "workload": {"dataset": "~/data.npz", "cache_dir": "cache", "model": 3},
        "graph": {"edges": [[0, 1]]},
        "output": {"csv": "run.csv"},
    }
    resolved = resolve_experiment_paths(data, "/exp")
    assert resolved["workload"] == {
        "dataset": str(Path("~/data.npz").expanduser()),
        "cache_dir": "/exp/cache",
        "model": 3,  # not a string: the validation reports it
    }
    assert resolved["graph"] == data["graph"] and resolved["output"] == data["output"]
    assert data["workload"]["cache_dir"] == "cache"  # the caller's tables are not changed
