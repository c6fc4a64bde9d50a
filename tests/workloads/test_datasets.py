"""Data sets: the Dataset contract, loading by spec, MNIST-1D generation and cache."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from workloads import DATASETS, Dataset, DatasetConfig, load_dataset


def small_dataset() -> Dataset:
    return load_dataset("synthetic:num_samples=120,num_features=5,num_classes=4,seed=3")


def test_synthetic_is_seeded_balanced_and_learnable_shapes() -> None:
    a = load_dataset("synthetic:num_samples=500,num_features=6,num_classes=5,seed=7")
    b = load_dataset("synthetic", num_samples=500, num_features=6, num_classes=5, seed=7)
    c = load_dataset("synthetic:num_samples=500,num_features=6,num_classes=5,seed=8")
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_test, b.y_test)
    assert not torch.equal(a.x_train, c.x_train)
    assert (a.num_train, a.num_test, a.input_shape, a.num_classes) == (400, 100, (6,), 5)
    labels = torch.cat([a.y_train, a.y_test])
    assert torch.bincount(labels).tolist() == [100] * 5
    # Class means are separated: the nearest-class-mean rule beats chance clearly.
    means = torch.stack([a.x_train[a.y_train == k].mean(0) for k in range(5)])
    predicted = torch.cdist(a.x_test, means).argmin(1)
    assert (predicted == a.y_test).float().mean() > 0.6


def test_dataset_to_device_keeps_everything() -> None:
    data = small_dataset()
    moved = data.to("cpu")
    assert torch.equal(moved.x_train, data.x_train) and moved.input_shape == data.input_shape
    assert moved.num_classes == data.num_classes and moved.name == data.name
    if torch.cuda.is_available():
        assert data.to("cuda").y_test.is_cuda


def test_dataset_validates_fields() -> None:
    good = small_dataset()
    with pytest.raises(
        ValueError, match=r"Dataset.x_train must be a float32 tensor, got torch.float64"
    ):
        Dataset("d", good.x_train.double(), good.y_train, good.x_test, good.y_test, 4, (5,))
    with pytest.raises(ValueError, match=r"Dataset.y_test must be a 1-D int64 tensor"):
        Dataset("d", good.x_train, good.y_train, good.x_test, good.y_test.int(), 4, (5,))
    with pytest.raises(
        ValueError, match=r"Dataset.x_test has sample shape \(6,\), expected input_shape \(5,\)"
    ):
        Dataset("d", good.x_train, good.y_train, torch.zeros(24, 6), good.y_test, 4, (5,))
    with pytest.raises(ValueError, match=r"Dataset.y_train labels must lie in 0..2, found 0..3"):
        Dataset("d", good.x_train, good.y_train, good.x_test, good.y_test, 3, (5,))
    with pytest.raises(ValueError, match=r"Dataset.y_train has 95 labels but x_train has 96"):
        Dataset("d", good.x_train, good.y_train[1:], good.x_test, good.y_test, 4, (5,))
    with pytest.raises(ValueError, match=r"Dataset.num_classes must be an int >= 2"):
        Dataset("d", good.x_train, good.y_train, good.x_test, good.y_test, 1, (5,))


def test_load_dataset_errors_list_choices_and_name_parameters() -> None:
    with pytest.raises(
        ValueError,
        match="unknown dataset 'imagenet'; allowed: cifar10, mnist, mnist1d, npz, synthetic",
    ):
        load_dataset("imagenet")
    with pytest.raises(
        ValueError, match=r"synthetic: unknown parameter\(s\) colour; allowed: num_samples"
    ):
        load_dataset("synthetic:colour=red")
    with pytest.raises(
        ValueError, match="synthetic: parameter 'num_samples' must be a int, got 'many'"
    ):
        load_dataset("synthetic:num_samples=many")
    with pytest.raises(
        ValueError, match="dataset spec 'synthetic:seed': parameter 'seed' is not KEY=VALUE"
    ):
        load_dataset("synthetic:seed")
    with pytest.raises(ValueError, match=r"dataset spec 'synthetic:seed=1,seed=2': .* twice"):
        load_dataset("synthetic:seed=1,seed=2")
    with pytest.raises(ValueError, match="synthetic: test_fraction must lie in"):
        load_dataset("synthetic:test_fraction=1.5")
    with pytest.raises(ValueError, match="mnist1d: num_samples must be >= 20"):
        load_dataset("mnist1d:num_samples=5")


def test_spec_values_are_converted_to_the_parameter_type() -> None:
    entry = DATASETS["mnist1d"]
    resolved = entry.resolve({"shuffle_seq": "yes", "train_split": "0.5", "cache_dir": "none"})
    assert resolved["shuffle_seq"] is True and resolved["train_split"] == 0.5
    assert resolved["cache_dir"] is None and resolved["num_samples"] == 5000
    assert entry.resolve({"train_split": 1})["train_split"] == 1.0  # int accepted for float
    with pytest.raises(ValueError, match="parameter 'shuffle_seq' must be a bool, got 'maybe'"):
        entry.resolve({"shuffle_seq": "maybe"})
    with pytest.raises(ValueError, match="synthetic: noise must be a finite number >= 0, got nan"):
        load_dataset("synthetic:noise=nan")
    assert DATASETS["npz"].describe().startswith("npz:path=<required>,num_classes=None")


def test_dataset_config_validates_and_matches_spec() -> None:
    config = DatasetConfig.from_spec("synthetic:num_samples=100,noise=0.5")
    assert config.params["num_samples"] == 100 and config.params["noise"] == 0.5
    assert config.params["seed"] == 0  # defaults filled in
    assert DatasetConfig("synthetic", {"num_samples": 100, "noise": 0.5}) == config
    a, b = load_dataset(config), load_dataset("synthetic:num_samples=100,noise=0.5")
    assert torch.equal(a.x_train, b.x_train)
    with pytest.raises(ValueError, match="unknown dataset"):
        DatasetConfig("nope")
    with pytest.raises(ValueError, match="parameter 'noise' must be a float"):
        DatasetConfig("synthetic", {"noise": "loud"})
    with pytest.raises(ValueError, match="parameter 'seed' must be a int, got True"):
        DatasetConfig("synthetic", {"seed": True})
    # Every registered name documents its parameters.
    for entry in DATASETS.values():
        assert entry.doc and all(p.doc for p in entry.params.values())


def numpy_keys() -> np.ndarray:
    """The key array of numpy's legacy global RNG state."""
    state = np.random.get_state(legacy=True)
    assert isinstance(state, tuple)
    return np.array(state[1])


def test_mnist1d_is_reproducible_and_leaves_global_rng_alone() -> None:
    np.random.seed(123)
    random.seed(123)
    before_numpy, before_python = numpy_keys(), random.getstate()
    a = load_dataset("mnist1d:num_samples=200,seed=5")
    assert np.array_equal(numpy_keys(), before_numpy)
    assert random.getstate() == before_python
    b = load_dataset("mnist1d:num_samples=200,seed=5")
    c = load_dataset("mnist1d:num_samples=200,seed=6")
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_train, b.y_train)
    assert not torch.equal(a.x_train, c.x_train)
    assert (a.num_train, a.num_test, a.input_shape, a.num_classes) == (160, 40, (40,), 10)
    assert torch.bincount(torch.cat([a.y_train, a.y_test])).tolist() == [20] * 10
    assert abs(float(torch.cat([a.x_train, a.x_test]).std()) - 1.0) < 1e-3  # standardised


def test_mnist1d_cache_round_trip_and_repair(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = load_dataset(f"mnist1d:num_samples=100,seed=1,cache_dir={cache}")
    files = list(cache.iterdir())
    assert len(files) == 1 and files[0].suffix == ".npz"  # no temporary file left behind
    with np.load(files[0], allow_pickle=False) as stored:
        np.testing.assert_array_equal(stored["x"], first.x_train.numpy())
    # A cached read returns the same data; a different seed is a different entry.
    again = load_dataset(f"mnist1d:num_samples=100,seed=1,cache_dir={cache}")
    assert torch.equal(again.x_train, first.x_train) and torch.equal(again.y_test, first.y_test)
    load_dataset(f"mnist1d:num_samples=100,seed=2,cache_dir={cache}")
    assert len(list(cache.iterdir())) == 2
    # The cache is really read: a planted entry comes back (same key, edited content).
    with np.load(files[0], allow_pickle=False) as stored:
        planted = {k: stored[k] for k in stored.files}
    planted["x"] = planted["x"] + 1
    np.savez(files[0], **planted)
    edited = load_dataset(f"mnist1d:num_samples=100,seed=1,cache_dir={cache}")
    assert torch.allclose(edited.x_train, first.x_train + 1)
    # A damaged entry is regenerated and replaced.
    files[0].write_bytes(b"damaged")
    repaired = load_dataset(f"mnist1d:num_samples=100,seed=1,cache_dir={cache}")
    assert torch.equal(repaired.x_train, first.x_train)


def test_mnist1d_cache_hit_does_not_import_matplotlib(tmp_path: Path) -> None:
    load_dataset(f"mnist1d:num_samples=100,seed=3,cache_dir={tmp_path}")
    code = (
        "import sys; from workloads import load_dataset; "
        f"d = load_dataset('mnist1d:num_samples=100,seed=3,cache_dir={tmp_path}'); "
        "print(d.num_train, 'matplotlib' in sys.modules, 'mnist1d' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["80", "False", "False"]


def test_mnist1d_without_the_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mnist1d", None)
    monkeypatch.setitem(sys.modules, "mnist1d.data", None)
    with pytest.raises(ImportError, match=r"pip install gossipnet\[sim\]"):
        load_dataset("mnist1d:num_samples=100")
