"""Your own model and data set code as ``MODULE:FACTORY``, and ``.npz`` files in every layout."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from workloads import (
    DataFileError,
    Dataset,
    UserCodeError,
    build_model,
    check_dataset_spec,
    check_model_spec,
    load_dataset,
)
from workloads.user_code import CodeSpec, parse_code_spec

USER_FILE = textwrap.dedent(
    """
    import numpy as np
    import torch
    from torch import nn

    import workloads


    class Net(nn.Module):
        def __init__(self, input_shape, num_classes, width=8):
            super().__init__()
            self.layers = nn.Sequential(
                nn.Flatten(), nn.Linear(int(np.prod(input_shape)), width), nn.ReLU(),
                nn.Linear(width, num_classes),
            )

        def forward(self, x):
            return self.layers(x)


    def fixed():
        return nn.Linear(5, 3)


    def not_a_module(input_shape, num_classes):
        return "a string"


    def raises(input_shape, num_classes):
        return 1 / 0


    def one_argument(width):
        return nn.Linear(width, 2)


    NUMBER = 3


    def arrays(samples=60):
        rng = np.random.default_rng(0)
        x = rng.standard_normal((samples, 4)).astype(np.float32)
        return {"x_train": x, "y_train": (x[:, 0] > 0).astype(np.int64),
                "x_test": torch.from_numpy(x[:10]), "y_test": (x[:10, 0] > 0).astype(np.int64)}


    def dataset():
        return workloads.load_dataset("synthetic:num_samples=100,num_features=4,num_classes=3")


    def bad_arrays():
        return {"x": np.zeros((4, 2))}


    def a_list():
        return [1, 2]
    """
)


@pytest.fixture
def user_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_code.py"
    path.write_text(USER_FILE)
    return path


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("mymodel.py:MyNet", CodeSpec("mymodel.py", "MyNet", is_file=True)),
        ("path/to/my-model.py:make", CodeSpec("path/to/my-model.py", "make", is_file=True)),
        ("C:\\models\\net.py:Net", CodeSpec("C:\\models\\net.py", "Net", is_file=True)),
        ("mypkg.models:make_net", CodeSpec("mypkg.models", "make_net", is_file=False)),
        ("mypkg.models:Builders.small", CodeSpec("mypkg.models", "Builders.small", False)),
        ("mlp:hidden=64", None),  # a registry spec: key=value after the colon
        ("mlp:hidden", None),  # a registered name before the colon stays a registry spec
        ("mlp", None),
        ("mnist1d:num_samples=4000,cache_dir=/tmp/x", None),
        ("my-model:Net", None),  # not a module name, not a .py path
        ("mymodel.py:", None),
        ("mymodel.py:1abc", None),
        ("", None),
    ],
)
def test_module_factory_and_registry_specs_are_told_apart(
    spec: str, expected: CodeSpec | None
) -> None:
    assert parse_code_spec(spec, registered={"mlp", "mnist1d"}) == expected


def test_a_model_from_a_file_is_built_with_the_shape_and_seeded(user_file: Path) -> None:
    first = build_model(f"{user_file}:Net", (2, 3), 4, seed=1, width=16)
    again = build_model(f"{user_file}:Net", (2, 3), 4, seed=1, width=16)
    assert first(torch.zeros(5, 2, 3)).shape == (5, 4)
    assert torch.equal(first.layers[1].weight, again.layers[1].weight)
    assert first.layers[1].weight.shape == (16, 6)
    assert isinstance(build_model(f"{user_file}:fixed", (5,), 3), nn.Linear)  # no shape taken


def test_a_model_from_a_dotted_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "models.py").write_text(USER_FILE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    check_model_spec("mypkg.models:Net")  # found from the current directory, as python -m
    assert isinstance(build_model("mypkg.models:Net", (4,), 2), nn.Module)
    sys.modules.pop("mypkg.models", None)
    sys.modules.pop("mypkg", None)


@pytest.mark.parametrize(
    ("attribute", "message"),
    [
        ("Nope", "my_code.py has no attribute 'Nope'; allowed: Net, a_list, arrays,"),
        (
            "NUMBER",
            "my_code.py:NUMBER is a value of type int, not callable; allowed: a class or function",
        ),
        (
            "one_argument",
            "one_argument cannot be called with (input_shape, num_classes) nor without them; "
            "allowed: a callable taking (input_shape, num_classes) or no arguments",
        ),
    ],
)
def test_a_model_spec_is_checked_before_anything_is_built(
    user_file: Path, attribute: str, message: str
) -> None:
    with pytest.raises(
        UserCodeError, match=message.replace("(", r"\(").replace(")", r"\)")
    ) as info:
        check_model_spec(f"{user_file}:{attribute}")
    assert info.value.role == "model"


def test_a_missing_file_and_a_module_that_does_not_import(tmp_path: Path) -> None:
    with pytest.raises(UserCodeError, match=r"file .*nope\.py does not exist"):
        check_model_spec(f"{tmp_path / 'nope.py'}:Net")
    broken = tmp_path / "broken.py"
    broken.write_text("import torch\n\nx = undefined_name\n")
    with pytest.raises(
        UserCodeError,
        match=r"importing .*broken\.py failed: NameError: name 'undefined_name' is not "
        r"defined \(line 3\)",
    ):
        check_model_spec(f"{broken}:Net")
    with pytest.raises(
        UserCodeError, match=r"no module named 'no_such_package_xyz.models' \(from "
    ):
        check_model_spec("no_such_package_xyz.models:Net")


def test_what_a_model_factory_returns_and_raises_is_named(user_file: Path) -> None:
    with pytest.raises(
        UserCodeError, match=r"not_a_module returned a value of type str; allowed: a torch\.nn"
    ):
        build_model(f"{user_file}:not_a_module", (4,), 2)
    line = USER_FILE.splitlines().index("    return 1 / 0") + 1  # where the user's code raised
    with pytest.raises(
        UserCodeError, match=r"calling .*my_code\.py:raises failed: ZeroDivisionError: division "
        rf"by zero \(line {line}\)",
    ):  # fmt: skip
        build_model(f"{user_file}:raises", (4,), 2)


def test_a_data_set_from_a_factory(user_file: Path) -> None:
    data = load_dataset(f"{user_file}:arrays", samples=40)
    assert (data.num_train, data.num_test, data.input_shape) == (40, 10, (4,))
    assert data.x_test.dtype == torch.float32 and data.num_classes == 2
    built = load_dataset(f"{user_file}:dataset")
    assert isinstance(built, Dataset) and built.num_classes == 3
    check_dataset_spec(f"{user_file}:arrays")
    with pytest.raises(UserCodeError, match=r"bad_arrays: missing key\(s\) y"):
        load_dataset(f"{user_file}:bad_arrays")
    with pytest.raises(UserCodeError, match=r"a_list returned a value of type list; allowed: a "):
        load_dataset(f"{user_file}:a_list")


def _npz(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)  # type: ignore[arg-type]
    return path


def test_an_npz_file_names_itself_in_every_layout(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((50, 3)), np.arange(50) % 5
    full = _npz(tmp_path / "full.npz", x_train=x[:40], y_train=y[:40], x_test=x[40:], y_test=y[40:])
    data = load_dataset(str(full))
    assert (data.num_train, data.num_test, data.num_classes) == (40, 10, 5)
    np.testing.assert_allclose(data.x_test.numpy(), x[40:].astype(np.float32))
    alone = _npz(tmp_path / "alone.npz", x=x, y=y)
    split = load_dataset(str(alone))  # 20 % held out by seed 0, the same for every peer
    assert (split.num_train, split.num_test) == (40, 10)
    assert torch.equal(split.x_test, load_dataset(str(alone)).x_test)
    other = load_dataset(f"npz:path={alone},test_fraction=0.5,seed=3")
    assert (other.num_train, other.num_test) == (25, 25)
    assert not torch.equal(other.x_test[:10], split.x_test)
    held = sorted(map(tuple, split.x_test.tolist()))
    trained = set(map(tuple, split.x_train.tolist()))
    assert not trained.intersection(held)  # disjoint splits
    check_dataset_spec(str(alone))


@pytest.mark.parametrize(
    ("arrays", "spec_suffix", "message"),
    [
        (
            {"x": np.zeros((4, 2)), "x_train": np.zeros((4, 2)), "y": np.zeros(4, np.int64)},
            "",
            "keys 'x' and 'x_train' both given; allowed: one of them",
        ),
        (
            {"x": np.zeros((4, 2)), "y": np.zeros(4, np.int64), "x_test": np.zeros((2, 2))},
            "",
            r"missing key\(s\) y_test \(found: x, y, x_test\); allowed: x, y, x_test, y_test;",
        ),
        (
            {
                "x": np.zeros((4, 2)),
                "y": np.zeros(4, np.int64),
                "x_test": np.zeros((2, 2)),
                "y_test": np.zeros(2, np.int64),
            },
            ",test_fraction=0.3",
            "test_fraction applies only to arrays without x_test, y_test",
        ),
        ({"x": np.zeros((1, 2)), "y": np.zeros(1, np.int64)}, "", "cannot be split"),
    ],
)
def test_npz_layout_errors_name_the_keys(
    tmp_path: Path, arrays: dict[str, np.ndarray], spec_suffix: str, message: str
) -> None:
    path = _npz(tmp_path / "data.npz", **arrays)
    with pytest.raises(DataFileError, match=message):
        load_dataset(f"npz:path={path}{spec_suffix}")


def test_a_missing_npz_is_found_without_loading(tmp_path: Path) -> None:
    with pytest.raises(DataFileError, match=r"no such file; allowed: an existing \.npz file"):
        check_dataset_spec(str(tmp_path / "missing.npz"))
    with pytest.raises(ValueError, match=r"unknown dataset 'nosuch'; allowed: cifar10"):
        check_dataset_spec("nosuch")
