"""Data sets that need no download at run time, behind one small frozen :class:`Dataset`.

Built in (``DATASETS``; spec syntax ``name:key=value,...``):

- ``mnist1d`` (default): MNIST-1D (Greydanus 2020, https://arxiv.org/abs/2011.14439),
  generated locally with the ``mnist1d`` package's ``make_dataset``; 40 features,
  10 classes. Optional on-disk ``.npz`` cache keyed by the generation arguments.
- ``synthetic``: a seeded Gaussian-mixture classification set.
- ``npz``: the user's own arrays from an ``.npz`` (``x, y, x_test, y_test``, or the
  training keys spelled ``x_train, y_train``, or ``x, y`` alone with a seeded held-out
  split), for any task (``y``'s dtype and shape say which, or a ``task`` entry);
  ``FILE.npz`` alone is short for ``npz:path=FILE.npz``.
- ``mnist``: MNIST (or Fashion-MNIST) IDX files from a local folder, gzipped or not.
- ``cifar10``: CIFAR-10 from a local folder, binary or python version.

Your own loader: ``MODULE:FACTORY`` (``mydata.py:load``, ``mypkg.data:load``; see
:mod:`workloads.user_code`) calls ``FACTORY(**params)``, which returns a :class:`Dataset`
or a mapping of arrays under the ``.npz`` keys.

Example::

    >>> from workloads import load_dataset
    >>> data = load_dataset("synthetic:num_samples=500,num_features=8,num_classes=3,seed=1")
    >>> data.x_train.shape, data.num_classes, data.input_shape
    (torch.Size([400, 8]), 3, (8,))
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import math
import os
import random
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workloads._registry import REQUIRED, Entry, Param, lookup, parse_spec
from workloads.formats import TASK_KEY as _TASK_KEY
from workloads.formats import (
    DataFileError,
    check_arrays,
    cifar10_batch_files,
    read_cifar10_binary_batch,
    read_cifar10_python_batch,
    read_idx,
    read_npz_arrays,
)
from workloads.task import CLASSIFICATION, LANGUAGE_MODEL, REGRESSION, TASKS
from workloads.user_code import CodeSpec, UserCodeError, call_factory, load_factory, parse_code_spec

__all__ = [
    "DATASETS",
    "DEFAULT_DATASET",
    "Dataset",
    "DatasetConfig",
    "check_dataset_spec",
    "cifar10",
    "load_dataset",
    "mnist",
    "mnist1d",
    "npz",
    "synthetic",
]

DEFAULT_DATASET = "mnist1d"


@dataclass(frozen=True, eq=False)
class Dataset:
    """A data set held in memory as tensors, for one :data:`~workloads.task.TASKS` task.

    ``task="classification"`` (the default): ``x_*`` float32 ``[N, *input_shape]``, ``y_*``
    int64 ``[N]`` with labels in ``0 .. num_classes - 1``.

    ``task="language-model"``: ``x_*`` int64 token contexts ``[N, L]`` (``input_shape ==
    (L,)``), ``y_*`` int64 ``[N, L]`` the next tokens, every token in ``0 .. num_classes -
    1``: for a language model ``num_classes`` is the vocabulary size (256 for bytes).

    ``task="regression"``: ``x_*`` float32 ``[N, *input_shape]``, ``y_*`` finite float32
    ``[N, K, ...]`` (at least 2-D: one target is ``[N, 1]``); ``num_classes`` is then the
    number of values a model outputs per sample, ``K·...`` (>= 1).

    Construction validates all of it and raises ``ValueError`` naming the field.
    """

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    input_shape: tuple[int, ...]
    task: str = CLASSIFICATION

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"Dataset.task: got {self.task!r}; allowed: {', '.join(TASKS)}")
        least = 1 if self.task == REGRESSION else 2
        if not isinstance(self.num_classes, int) or self.num_classes < least:
            raise ValueError(
                f"Dataset.num_classes must be an int >= {least}, got {self.num_classes!r}"
            )
        object.__setattr__(self, "input_shape", tuple(int(s) for s in self.input_shape))
        language = self.task == LANGUAGE_MODEL
        for split in ("train", "test"):
            x: torch.Tensor = getattr(self, f"x_{split}")
            y: torch.Tensor = getattr(self, f"y_{split}")
            if language:
                _check_tokens(split, x, y, self.num_classes)
            elif not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
                raise ValueError(f"Dataset.x_{split} must be a float32 tensor, got {_describe(x)}")
            elif self.task == REGRESSION:
                _check_regression_targets(split, y, self.num_classes)
            elif not isinstance(y, torch.Tensor) or y.dtype != torch.int64 or y.ndim != 1:
                raise ValueError(
                    f"Dataset.y_{split} must be a 1-D int64 tensor, got {_describe(y)}"
                )
            if tuple(x.shape[1:]) != self.input_shape:
                raise ValueError(
                    f"Dataset.x_{split} has sample shape {tuple(x.shape[1:])}, expected "
                    f"input_shape {self.input_shape}"
                )
            if len(x) != len(y):
                raise ValueError(
                    f"Dataset.y_{split} has {len(y)} labels but x_{split} has {len(x)} samples"
                )
            if self.task == REGRESSION:
                continue
            if len(y) and (int(y.min()) < 0 or int(y.max()) >= self.num_classes):
                raise ValueError(
                    f"Dataset.y_{split} labels must lie in 0..{self.num_classes - 1}, found "
                    f"{int(y.min())}..{int(y.max())}"
                )
        if len(self.y_train) == 0:
            raise ValueError("Dataset.x_train is empty")

    @property
    def num_train(self) -> int:
        return len(self.y_train)

    @property
    def num_test(self) -> int:
        return len(self.y_test)

    def to(self, device: torch.device | str) -> Dataset:
        """The same data set with its tensors on ``device`` (e.g. ``"cuda"``)."""
        return replace(
            self,
            x_train=self.x_train.to(device),
            y_train=self.y_train.to(device),
            x_test=self.x_test.to(device),
            y_test=self.y_test.to(device),
        )

    def __repr__(self) -> str:
        task = "" if self.task == CLASSIFICATION else f", task={self.task!r}"
        return (
            f"Dataset(name={self.name!r}, train={self.num_train}, test={self.num_test}, "
            f"input_shape={self.input_shape}, num_classes={self.num_classes}{task})"
        )


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{value.dtype} tensor of shape {tuple(value.shape)}"
    return type(value).__name__


def _check_tokens(split: str, x: Any, y: Any, vocabulary: int) -> None:
    """A language model's split: int64 contexts ``x [N, L]`` and next tokens ``y [N, L]``."""
    for key, value in ((f"x_{split}", x), (f"y_{split}", y)):
        if not isinstance(value, torch.Tensor) or value.dtype != torch.int64 or value.ndim != 2:
            raise ValueError(
                f"Dataset.{key} of a language model must be a 2-D int64 tensor [N, L] of "
                f"tokens, got {_describe(value)}"
            )
    if x.shape != y.shape:
        raise ValueError(
            f"Dataset.y_{split} (next tokens) has shape {tuple(y.shape)}, x_{split} has "
            f"{tuple(x.shape)}; they must be equal"
        )
    if x.numel() and (int(x.min()) < 0 or int(x.max()) >= vocabulary):
        raise ValueError(
            f"Dataset.x_{split} tokens must lie in 0..{vocabulary - 1} (num_classes is the "
            f"vocabulary size), found {int(x.min())}..{int(x.max())}"
        )


def _check_regression_targets(split: str, y: Any, outputs: int) -> None:
    """A regression split's targets: finite float32 ``[N, ...]``, at least 2-D, with
    ``outputs`` values per sample."""
    if not isinstance(y, torch.Tensor) or y.dtype != torch.float32 or y.ndim < 2:
        raise ValueError(
            f"Dataset.y_{split} of a regression must be a float32 tensor [N, K, ...] (one "
            f"target: [N, 1]), got {_describe(y)}"
        )
    if math.prod(y.shape[1:]) != outputs:
        raise ValueError(
            f"Dataset.y_{split} has {math.prod(y.shape[1:])} values per sample, but "
            f"num_classes (the model's outputs per sample) is {outputs}"
        )
    if y.numel() and not bool(torch.isfinite(y).all()):
        raise ValueError(f"Dataset.y_{split} holds NaN or infinite regression targets")


def _from_numpy(
    name: str,
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    num_classes: int,
) -> Dataset:
    return Dataset(
        name=name,
        x_train=torch.from_numpy(np.ascontiguousarray(x_train, dtype=np.float32)),
        y_train=torch.from_numpy(np.ascontiguousarray(y_train, dtype=np.int64)),
        x_test=torch.from_numpy(np.ascontiguousarray(x_test, dtype=np.float32)),
        y_test=torch.from_numpy(np.ascontiguousarray(y_test, dtype=np.int64)),
        num_classes=num_classes,
        input_shape=tuple(x_train.shape[1:]),
    )


def _targets_from_numpy(
    name: str, x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray
) -> Dataset:
    """A regression's :class:`Dataset`: float32 inputs and targets, 1-D ``y`` as ``[N, 1]``."""

    def floats(array: np.ndarray, targets: bool) -> torch.Tensor:
        array = array[:, None] if targets and array.ndim == 1 else array
        return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))

    y = floats(y_train, True)
    return Dataset(
        name=name,
        x_train=floats(x_train, False),
        y_train=y,
        x_test=floats(x_test, False),
        y_test=floats(y_test, True),
        num_classes=math.prod(y.shape[1:]),
        input_shape=tuple(x_train.shape[1:]),
        task=REGRESSION,
    )


def _tokens_from_numpy(
    name: str,
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    vocabulary: int,
) -> Dataset:
    """A language model's :class:`Dataset` from integer contexts and next tokens ``[N, L]``."""

    def tokens(array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(array, dtype=np.int64))

    return Dataset(
        name=name,
        x_train=tokens(x_train),
        y_train=tokens(y_train),
        x_test=tokens(x_test),
        y_test=tokens(y_test),
        num_classes=vocabulary,
        input_shape=tuple(x_train.shape[1:]),
        task=LANGUAGE_MODEL,
    )


# --------------------------------------------------------------------------- MNIST-1D


_MNIST1D_MISSING = (
    "the mnist1d data set needs the 'mnist1d' package and matplotlib: pip install gossipnet[sim]"
)


def _mnist1d_cache_path(cache_dir: str, args: Mapping[str, Any], version: str) -> Path:
    key = json.dumps({**args, "mnist1d_version": version}, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:20]
    return Path(cache_dir) / f"mnist1d-{digest}.npz"


def _atomic_savez(path: Path, **arrays: np.ndarray) -> None:
    """Write an .npz so that readers see the old file or the complete new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as stream:
            np.savez(stream, **arrays)  # type: ignore[arg-type]
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def mnist1d(
    num_samples: int = 5000,
    seed: int = 42,
    train_split: float = 0.8,
    shuffle_seq: bool = False,
    cache_dir: str | None = None,
) -> Dataset:
    """MNIST-1D (Greydanus 2020), generated locally: 10 classes of 1-D signals of length 40.

    ``num_samples`` is rounded down to a multiple of 10 (equal counts per class);
    the first ``train_split`` of the shuffled samples train, the rest test. The
    generator seeds numpy's and Python's global RNGs; they are restored
    afterwards, so loading does not disturb the caller's random state. With
    ``cache_dir`` the arrays are kept in ``mnist1d-<hash of args>.npz`` there
    (written atomically, read back with ``allow_pickle=False``); a cache hit
    does not import mnist1d (nor the matplotlib it pulls in).
    """
    if num_samples < 20:
        raise ValueError(f"mnist1d: num_samples must be >= 20, got {num_samples}")
    if not 0.0 < train_split < 1.0:
        raise ValueError(f"mnist1d: train_split must lie in (0, 1), got {train_split}")
    try:  # the installed version keys the cache; reading it needs no import of mnist1d
        version = importlib.metadata.version("mnist1d")
    except importlib.metadata.PackageNotFoundError:
        raise ImportError(_MNIST1D_MISSING) from None
    args_dict = {
        "num_samples": int(num_samples),
        "seed": int(seed),
        "train_split": float(train_split),
        "shuffle_seq": bool(shuffle_seq),
    }
    cache = None
    if cache_dir is not None:
        cache = _mnist1d_cache_path(cache_dir, args_dict, version)
        if cache.is_file():
            try:
                arrays = read_npz_arrays(cache)
            except DataFileError:
                arrays = None  # a damaged cache entry is regenerated and replaced
            if arrays is not None:
                return _from_numpy(
                    "mnist1d", arrays["x"], arrays["y"], arrays["x_test"], arrays["y_test"], 10
                )
    try:
        from mnist1d.data import get_dataset_args, make_dataset
    except ImportError as error:  # mnist1d (and the matplotlib it imports) are the [sim] extra
        raise ImportError(f"{_MNIST1D_MISSING} ({error})") from error
    args = get_dataset_args()
    for key, value in args_dict.items():
        setattr(args, key, value)
    python_state, numpy_state = random.getstate(), np.random.get_state()
    try:
        generated = make_dataset(args)
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)
    arrays = {
        "x": np.asarray(generated["x"], dtype=np.float32),
        "y": np.asarray(generated["y"], dtype=np.int64),
        "x_test": np.asarray(generated["x_test"], dtype=np.float32),
        "y_test": np.asarray(generated["y_test"], dtype=np.int64),
    }
    if cache is not None:
        _atomic_savez(cache, **arrays)
    return _from_numpy("mnist1d", arrays["x"], arrays["y"], arrays["x_test"], arrays["y_test"], 10)


# --------------------------------------------------------------------------- synthetic


def synthetic(
    num_samples: int = 2000,
    num_features: int = 20,
    num_classes: int = 10,
    noise: float = 1.0,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> Dataset:
    """A seeded Gaussian mixture: class ``c`` has mean ``mu_c ~ N(0, I)``, x = mu_y + noise * N(0, I).

    Labels are balanced (``c = i mod num_classes``, then shuffled); the last
    ``test_fraction`` of the samples form the test split. Same seed, same tensors.
    """
    if num_classes < 2:
        raise ValueError(f"synthetic: num_classes must be >= 2, got {num_classes}")
    if num_features < 1:
        raise ValueError(f"synthetic: num_features must be >= 1, got {num_features}")
    if not 0 <= noise < float("inf"):
        raise ValueError(f"synthetic: noise must be a finite number >= 0, got {noise}")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"synthetic: test_fraction must lie in (0, 1), got {test_fraction}")
    num_test = round(num_samples * test_fraction)
    if num_samples - num_test < num_classes or num_test < 1:
        raise ValueError(
            f"synthetic: num_samples={num_samples} too small for {num_classes} classes and "
            f"test_fraction={test_fraction}"
        )
    generator = torch.Generator().manual_seed(seed)
    means = torch.randn(num_classes, num_features, generator=generator)
    labels = (torch.arange(num_samples) % num_classes)[
        torch.randperm(num_samples, generator=generator)
    ]
    x = means[labels] + noise * torch.randn(num_samples, num_features, generator=generator)
    split = num_samples - num_test
    return Dataset(
        name="synthetic",
        x_train=x[:split].contiguous(),
        y_train=labels[:split].contiguous(),
        x_test=x[split:].contiguous(),
        y_test=labels[split:].contiguous(),
        num_classes=num_classes,
        input_shape=(num_features,),
    )


# --------------------------------------------------------------------------- user files


def npz(
    path: str,
    num_classes: int | None = None,
    test_fraction: float | None = None,
    seed: int = 0,
    task: str | None = None,
) -> Dataset:
    """The user's arrays from an ``.npz`` (no pickle), for any task.

    Keys (:data:`~workloads.formats.LAYOUTS`): ``x, y, x_test, y_test``; or ``x_train,
    y_train, x_test, y_test``; or ``x, y`` (``x_train, y_train``) alone, in which case a
    seeded random ``test_fraction`` (default 0.2) of the samples is held out for testing,
    the same for every peer that loads the file with the same ``seed`` (default 0,
    independent of a run's seed so that every peer of a swarm holds out the same samples).

    The task (:data:`~workloads.task.TASKS`) is ``task`` when given, else the file's
    optional ``task`` entry (a string), else what ``y`` says
    (:func:`~workloads.formats.infer_task`): ``x`` numeric ``[N, ...]`` (cast to float32)
    and ``y`` integer ``[N]`` is a classifier's data; ``x`` integer ``[N, L]`` and ``y``
    integer ``[N, L]`` (the next token of each position) a language model's, ``num_classes``
    then the vocabulary size; ``y`` float ``[N, ...]`` a regression's (``[N]`` is read as
    ``[N, 1]``; integer targets too when the task is declared). ``num_classes`` (not for a
    regression, whose outputs are ``y``'s width) defaults to the largest label (token) + 1;
    when given, every label (token) must be below it.
    """
    arrays = read_npz_arrays(path, task)
    return _from_arrays("npz", arrays, path, num_classes, test_fraction, seed)


def _from_arrays(
    name: str,
    arrays: dict[str, np.ndarray],
    source: str,
    num_classes: int | None,
    test_fraction: float | None,
    seed: int,
) -> Dataset:
    """A :class:`Dataset` from checked arrays (:func:`~workloads.formats.check_arrays`,
    their task under its key), holding out ``test_fraction`` when they have no test split."""
    task = str(arrays[_TASK_KEY])
    if task == REGRESSION and num_classes is not None:
        raise DataFileError(
            f"{source}: num_classes applies to classification and language-model data; a "
            "regression's outputs per sample are y's width; allowed: leave it out"
        )
    if "x_test" in arrays:
        if test_fraction is not None:
            raise DataFileError(
                f"{source}: test_fraction applies only to arrays without x_test, y_test; "
                "allowed: leave it out, or drop the test keys"
            )
    else:
        fraction = 0.2 if test_fraction is None else test_fraction
        if not 0.0 < fraction < 1.0:
            raise DataFileError(f"{source}: test_fraction must lie in (0, 1), got {fraction}")
        count = len(arrays["y"])
        held = round(count * fraction)
        if held < 1 or held >= count:
            raise DataFileError(
                f"{source}: {count} samples cannot be split into train and test with "
                f"test_fraction={fraction}; allowed: at least 2 samples and both splits non-empty"
            )
        order = np.random.default_rng(seed).permutation(count)
        test, train = order[:held], order[held:]
        arrays = {
            "x": arrays["x"][train],
            "y": arrays["y"][train],
            "x_test": arrays["x"][test],
            "y_test": arrays["y"][test],
        }
    if task == REGRESSION:
        return _targets_from_numpy(
            name, arrays["x"], arrays["y"], arrays["x_test"], arrays["y_test"]
        )
    language = task == LANGUAGE_MODEL
    keys = ("x", "y", "x_test", "y_test") if language else ("y", "y_test")
    tops = {key: int(arrays[key].max(initial=0)) for key in keys}
    largest = max(tops.values())
    if num_classes is None:
        num_classes = max(largest + 1, 2)
    elif largest >= num_classes:
        key = next(key for key, top in tops.items() if top == largest)
        what = "token" if language else "label"
        raise DataFileError(
            f"{source}: key {key!r} holds {what} {largest}, outside 0..{num_classes - 1} "
            f"(num_classes={num_classes})"
        )
    if language:
        return _tokens_from_numpy(
            name, arrays["x"], arrays["y"], arrays["x_test"], arrays["y_test"], num_classes
        )
    return _from_numpy(
        name, arrays["x"], arrays["y"], arrays["x_test"], arrays["y_test"], num_classes
    )


def _user_dataset(code: CodeSpec, params: Mapping[str, Any]) -> Dataset:
    """Call the user's data set factory and check what it returned: a :class:`Dataset` as
    it is, a mapping of arrays (numpy or torch) as an ``.npz`` file's keys."""
    factory = load_factory(code, "dataset")
    result = call_factory(factory, code, "dataset", **params)
    if isinstance(result, Dataset):
        return result
    if isinstance(result, Mapping):
        arrays = {
            str(key): value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value
            for key, value in result.items()
        }
        try:
            checked = check_arrays(arrays, str(code))
            return _from_arrays(str(code), checked, str(code), None, None, 0)
        except ValueError as error:
            raise UserCodeError("dataset", str(error)) from None
    raise UserCodeError(
        "dataset",
        f"{code} returned a value of type {type(result).__name__}; allowed: a workloads.Dataset, or a "
        "mapping of arrays x_train, y_train, x_test, y_test (or x, y alone)",
    )


def _find_idx(folder: Path, split: str, kind: str, rank: int) -> Path:
    names = [f"{split}-{kind}-idx{rank}-ubyte", f"{split}-{kind}.idx{rank}-ubyte"]
    for name in names:
        for candidate in (folder / name, folder / f"{name}.gz"):
            if candidate.is_file():
                return candidate
    raise DataFileError(
        f"{folder}: missing {names[0]} (or {names[0]}.gz / {names[1]}); an MNIST folder holds "
        "train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and "
        "t10k-labels-idx1-ubyte, each optionally gzipped"
    )


def mnist(path: str, num_classes: int = 10) -> Dataset:
    """MNIST-format IDX files from a local folder (MNIST, Fashion-MNIST, ...), pixels scaled to [0, 1].

    Images become ``[N, 1, H, W]`` float32; labels int64. Gzipped files are
    recognised by their magic bytes.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise DataFileError(f"mnist: path {folder} is not a folder")
    splits: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for split in ("train", "t10k"):
        image_file = _find_idx(folder, split, "images", 3)
        label_file = _find_idx(folder, split, "labels", 1)
        images, labels = read_idx(image_file), read_idx(label_file)
        if images.ndim != 3:
            raise DataFileError(f"{image_file}: images must be [N, H, W], got shape {images.shape}")
        if labels.ndim != 1 or labels.dtype.kind not in "iu":
            raise DataFileError(f"{label_file}: labels must be a 1-D integer IDX array")
        if len(labels) != len(images):
            raise DataFileError(
                f"{label_file}: {len(labels)} labels for {len(images)} images in {image_file.name}"
            )
        if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
            raise DataFileError(
                f"{label_file}: labels must lie in 0..{num_classes - 1}, found {labels.max()}"
            )
        scale = 255.0 if images.dtype == np.uint8 else 1.0
        splits[split] = (images[:, None].astype(np.float32) / scale, labels.astype(np.int64))
    if splits["train"][0].shape[1:] != splits["t10k"][0].shape[1:]:
        raise DataFileError(f"{folder}: train and t10k images have different sizes")
    return _from_numpy("mnist", *splits["train"], *splits["t10k"], num_classes)


def cifar10(path: str) -> Dataset:
    """CIFAR-10 from a local folder, binary (``*.bin``) or python version (restricted unpickler).

    Images become ``[N, 3, 32, 32]`` float32 in [0, 1]. All ``data_batch_<k>``
    files present are concatenated in order of ``k``.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise DataFileError(f"cifar10: path {folder} is not a folder")
    version, train_files, test_file = cifar10_batch_files(folder)
    reader = read_cifar10_binary_batch if version == "binary" else read_cifar10_python_batch
    train = [reader(p) for p in train_files]
    x_test, y_test = reader(test_file)
    x_train = np.concatenate([x for x, _ in train])
    y_train = np.concatenate([y for _, y in train])
    return _from_numpy(
        "cifar10",
        x_train.astype(np.float32) / 255.0,
        y_train,
        x_test.astype(np.float32) / 255.0,
        y_test,
        10,
    )


# --------------------------------------------------------------------------- registry

DATASETS: dict[str, Entry[Dataset]] = {
    "mnist1d": Entry(
        "mnist1d",
        mnist1d,
        {
            "num_samples": Param(int, 5000, "samples generated (rounded down to a multiple of 10)"),
            "seed": Param(int, 42, "generator seed"),
            "train_split": Param(float, 0.8, "fraction of samples used for training"),
            "shuffle_seq": Param(
                bool, False, "permute the 40 positions (a spatial-prior ablation)"
            ),
            "cache_dir": Param(str, None, "folder for an .npz cache of generated data", True),
        },
        "MNIST-1D (Greydanus 2020) generated locally; 40 features, 10 classes",
    ),
    "synthetic": Entry(
        "synthetic",
        synthetic,
        {
            "num_samples": Param(int, 2000, "samples in total (train + test)"),
            "num_features": Param(int, 20, "input dimension"),
            "num_classes": Param(int, 10, "number of Gaussian clusters / classes"),
            "noise": Param(float, 1.0, "standard deviation around each class mean"),
            "test_fraction": Param(float, 0.2, "fraction of samples held out for testing"),
            "seed": Param(int, 0, "generator seed"),
        },
        "seeded Gaussian-mixture classification",
    ),
    "npz": Entry(
        "npz",
        npz,
        {
            "path": Param(str, REQUIRED, ".npz file with x, y, x_test, y_test (or x, y)"),
            "num_classes": Param(int, None, "number of classes (default: largest label + 1)", True),
            "test_fraction": Param(
                float, None, "held out for testing when the file has no x_test, y_test (0.2)", True
            ),
            "seed": Param(int, 0, "seed of that held-out split"),
            "task": Param(
                str,
                None,
                "classification, language-model or regression (default: the file's task "
                "entry, else what y says)",
                True,
            ),
        },
        "your own arrays from an .npz file (classification, language-model or regression)",
    ),
    "mnist": Entry(
        "mnist",
        mnist,
        {
            "path": Param(str, REQUIRED, "folder with the four MNIST IDX files (optionally .gz)"),
            "num_classes": Param(int, 10, "number of classes"),
        },
        "MNIST / Fashion-MNIST IDX files from a local folder",
    ),
    "cifar10": Entry(
        "cifar10",
        cifar10,
        {"path": Param(str, REQUIRED, "folder with CIFAR-10 batches (binary or python version)")},
        "CIFAR-10 batches from a local folder",
    ),
}


@dataclass(frozen=True)
class DatasetConfig:
    """A data set by name and parameters, validated at construction (``ValueError`` naming the field)."""

    name: str = DEFAULT_DATASET
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        entry = lookup(DATASETS, self.name, "dataset")
        object.__setattr__(self, "params", entry.resolve(self.params))

    @classmethod
    def from_spec(cls, spec: str) -> DatasetConfig:
        """``DatasetConfig`` from ``"name:key=value,..."`` (or ``"FILE.npz"``)."""
        name, params = _registry_spec(spec)
        return cls(name, params)


def _registry_spec(spec: str) -> tuple[str, dict[str, str]]:
    """Name and parameters of a registry spec; ``FILE.npz`` is ``npz:path=FILE.npz``."""
    if (
        isinstance(spec, str)
        and spec.strip().lower().endswith(".npz")
        and spec.partition(":")[0].strip() not in DATASETS
    ):
        return "npz", {"path": spec.strip()}
    return parse_spec(spec, "dataset")


def load_dataset(spec: str | DatasetConfig = DEFAULT_DATASET, **params: Any) -> Dataset:
    """Load a data set by spec string (``"mnist1d:num_samples=2000"``, ``"data.npz"``,
    ``"mydata.py:load"``) or :class:`DatasetConfig`.

    Keyword ``params`` override the spec's. Unknown names raise ``ValueError``
    listing the choices; unknown or ill-typed parameters name the parameter. A
    ``MODULE:FACTORY`` spec calls your factory with ``params``
    (:class:`~workloads.user_code.UserCodeError` if it fails or returns something else
    than a data set).
    """
    if isinstance(spec, str):
        code = parse_code_spec(spec, DATASETS)
        if code is not None:
            return _user_dataset(code, params)
        name, given = _registry_spec(spec)
        config = DatasetConfig(name, {**given, **params})
    elif isinstance(spec, DatasetConfig):
        config = DatasetConfig(spec.name, {**spec.params, **params}) if params else spec
    else:
        raise ValueError(f"dataset spec must be a str or DatasetConfig, got {type(spec).__name__}")
    return DATASETS[config.name].factory(**config.params)


def check_dataset_spec(spec: str) -> None:
    """Check a data set spec without loading any data: a registered name with known, well
    typed parameters (and, for ``FILE.npz`` or ``npz:path=FILE``, an existing file), or
    ``MODULE:FACTORY`` whose module imports and whose factory is callable. Raises
    ``ValueError`` (a :class:`~workloads.user_code.UserCodeError` for user code)."""
    code = parse_code_spec(spec, DATASETS)
    if code is not None:
        load_factory(code, "dataset")
        return
    config = DatasetConfig.from_spec(spec)
    path = config.params.get("path")
    if path is not None and config.name == "npz" and not Path(path).is_file():
        raise DataFileError(f"{path}: no such file; allowed: an existing .npz file")
    if path is not None and config.name == "text" and not Path(path).exists():
        raise DataFileError(f"text: path {path} is neither a file nor a folder")
    if path is not None and config.name not in ("npz", "text") and not Path(path).is_dir():
        raise DataFileError(f"{config.name}: path {path} is not a folder")
