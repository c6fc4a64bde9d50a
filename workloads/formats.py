"""Readers for data files a user already has on disk: IDX (MNIST), CIFAR-10 batches, ``.npz``.

Nothing here downloads, and nothing here unpickles freely. CIFAR-10's "python
version" batches are pickles; they go through :class:`CifarUnpickler`, whose
``find_class`` admits only what numpy needs to rebuild an array and refuses
every other global (``os.system``, ``builtins.eval``, ...) with
:class:`UnsafePickleError` before anything runs.
"""

from __future__ import annotations

import codecs
import gzip
import io
import pickle
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from workloads.task import CLASSIFICATION, LANGUAGE_MODEL, REGRESSION, TASKS

__all__ = [
    "CIFAR10_RECORD_BYTES",
    "TARGETS",
    "TASK_KEY",
    "CifarUnpickler",
    "DataFileError",
    "UnsafePickleError",
    "check_arrays",
    "declared_task",
    "infer_task",
    "read_cifar10_binary_batch",
    "read_cifar10_python_batch",
    "read_idx",
    "read_npz_arrays",
]


class DataFileError(ValueError):
    """A data file is missing, truncated or holds the wrong shapes/dtypes; the message names it."""


class UnsafePickleError(DataFileError):
    """A pickle asked for a global that a CIFAR-10 batch never needs; nothing was executed."""


# --------------------------------------------------------------------------- IDX (MNIST)

# IDX type byte -> big-endian numpy dtype (LeCun's MNIST page).
_IDX_DTYPES: dict[int, str] = {
    0x08: ">u1",
    0x09: ">i1",
    0x0B: ">i2",
    0x0C: ">i4",
    0x0D: ">f4",
    0x0E: ">f8",
}


def _read_bytes(path: Path) -> bytes:
    if not path.is_file():
        raise DataFileError(f"{path}: no such file")
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":  # gzip magic, whatever the suffix says
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError) as error:
            raise DataFileError(f"{path}: corrupt gzip stream ({error})") from None
    return raw


def read_idx(path: str | Path) -> np.ndarray:
    """Read one IDX file (optionally gzipped) into a native-endian numpy array.

    Layout: two zero bytes, a type byte (0x08 uint8 ... 0x0E float64), the number
    of dimensions, one big-endian int32 per dimension, then the data.
    """
    path = Path(path)
    raw = _read_bytes(path)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise DataFileError(f"{path}: not an IDX file (magic must start with two zero bytes)")
    type_code, ndim = raw[2], raw[3]
    if type_code not in _IDX_DTYPES:
        codes = ", ".join(f"0x{c:02X}" for c in _IDX_DTYPES)
        raise DataFileError(f"{path}: unknown IDX type byte 0x{type_code:02X}; allowed: {codes}")
    if ndim == 0:
        raise DataFileError(f"{path}: IDX header declares 0 dimensions")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataFileError(f"{path}: truncated IDX header ({len(raw)} bytes, need {header})")
    shape = tuple(int(s) for s in np.frombuffer(raw, dtype=">i4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_DTYPES[type_code])
    expected = int(np.prod(shape)) * dtype.itemsize
    if len(raw) - header != expected:
        raise DataFileError(
            f"{path}: IDX header says shape {shape} ({expected} data bytes) but the file holds "
            f"{len(raw) - header}"
        )
    data = np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
    return data.astype(dtype.newbyteorder("="))


# --------------------------------------------------------------------------- CIFAR-10

CIFAR10_RECORD_BYTES = 1 + 3 * 32 * 32  # one label byte, then R, G and B planes of 32x32


def read_cifar10_binary_batch(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Read ``data_batch_N.bin`` / ``test_batch.bin``: records of 1 label byte + 3072 pixel bytes.

    Returns ``(images uint8 [N, 3, 32, 32], labels int64 [N])``.
    """
    path = Path(path)
    raw = _read_bytes(path)
    if not raw or len(raw) % CIFAR10_RECORD_BYTES:
        raise DataFileError(
            f"{path}: CIFAR-10 binary batch must be a non-empty multiple of "
            f"{CIFAR10_RECORD_BYTES} bytes (1 label + 3072 pixels per image), got {len(raw)}"
        )
    records = np.frombuffer(raw, dtype=np.uint8).reshape(-1, CIFAR10_RECORD_BYTES)
    labels = records[:, 0].astype(np.int64)
    if labels.max() > 9:
        raise DataFileError(f"{path}: label {int(labels.max())} out of range 0..9")
    return records[:, 1:].reshape(-1, 3, 32, 32).copy(), labels


def _latin1_encode(text: str, encoding: str = "utf-8") -> bytes:
    """What protocol-2 pickles written by Python 3 use for ``bytes``; only latin-1 is admitted."""
    if codecs.lookup(encoding).name != "iso8859-1":
        raise UnsafePickleError(f"refusing _codecs.encode with codec {encoding!r} (only latin-1)")
    return text.encode("latin-1")


def _numpy_globals() -> dict[tuple[str, str], Callable[..., Any] | type]:
    try:  # numpy >= 2
        from numpy._core.multiarray import _reconstruct  # type: ignore[attr-defined]
        from numpy._core.numeric import _frombuffer  # type: ignore[attr-defined]
    except ImportError:  # pragma: no cover - numpy 1.x
        from numpy.core.multiarray import _reconstruct  # type: ignore[attr-defined,no-redef]
        from numpy.core.numeric import _frombuffer  # type: ignore[attr-defined,no-redef]
    allowed: dict[tuple[str, str], Callable[..., Any] | type] = {}
    for core in ("numpy.core", "numpy._core"):
        allowed[(f"{core}.multiarray", "_reconstruct")] = _reconstruct
        allowed[(f"{core}.numeric", "_frombuffer")] = _frombuffer
    allowed[("numpy", "ndarray")] = np.ndarray
    allowed[("numpy", "dtype")] = np.dtype
    # Inert builtins containers; protocol 2+ normally uses opcodes for them.
    for name, obj in [("list", list), ("dict", dict), ("tuple", tuple), ("bytes", bytes)]:
        allowed[("builtins", name)] = obj
        allowed[("__builtin__", name)] = obj
    allowed[("_codecs", "encode")] = _latin1_encode
    return allowed


class CifarUnpickler(pickle.Unpickler):
    """A pickle reader that only rebuilds numpy arrays, dtypes and plain containers.

    ``find_class`` is the only way a pickle can reach code; this one answers
    from a fixed allow-list (numpy's array reconstructors, ``numpy.ndarray``,
    ``numpy.dtype``, ``list``/``dict``/``tuple``/``bytes``, and latin-1
    ``_codecs.encode``) and raises :class:`UnsafePickleError` for anything
    else, so a crafted file cannot call ``os.system`` or ``eval``.
    """

    _ALLOWED = _numpy_globals()

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._ALLOWED[(module, name)]
        except KeyError:
            raise UnsafePickleError(
                f"refusing to unpickle global {module}.{name}: a CIFAR-10 batch only needs numpy "
                "arrays, dtypes and builtin containers"
            ) from None


def read_cifar10_python_batch(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Read a "python version" batch (``data_batch_N``, ``test_batch``) with :class:`CifarUnpickler`.

    The pickle holds a dict with ``data`` (uint8 [N, 3072]) and ``labels``
    (N ints); keys may be ``bytes`` (the original Python 2 files) or ``str``.
    Returns ``(images uint8 [N, 3, 32, 32], labels int64 [N])``.
    """
    path = Path(path)
    raw = _read_bytes(path)
    try:
        batch = CifarUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except UnsafePickleError as error:
        raise UnsafePickleError(f"{path}: {error}") from None
    except Exception as error:  # malformed stream: EOFError, UnpicklingError, TypeError, ...
        raise DataFileError(f"{path}: not a readable CIFAR-10 python batch ({error})") from None
    if not isinstance(batch, dict):
        raise DataFileError(f"{path}: expected a dict, got {type(batch).__name__}")
    entries = {
        (k.decode("latin-1") if isinstance(k, bytes) else str(k)): v for k, v in batch.items()
    }
    for key in ("data", "labels"):
        if key not in entries:
            raise DataFileError(
                f"{path}: missing key {key!r}; found: {', '.join(sorted(entries)) or '(none)'}"
            )
    data = entries["data"]
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2:
        raise DataFileError(f"{path}: 'data' must be a uint8 array [N, 3072]")
    if data.shape[1] != 3 * 32 * 32:
        raise DataFileError(f"{path}: 'data' rows must have 3072 values, got {data.shape[1]}")
    try:
        labels = np.asarray(entries["labels"], dtype=np.int64)
    except (TypeError, ValueError):
        raise DataFileError(f"{path}: 'labels' must be a list of integers") from None
    if labels.shape != (data.shape[0],):
        raise DataFileError(
            f"{path}: 'labels' has shape {labels.shape}, expected ({data.shape[0]},) to match 'data'"
        )
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise DataFileError(f"{path}: labels must lie in 0..9")
    return data.reshape(-1, 3, 32, 32).copy(), labels


def cifar10_batch_files(folder: Path) -> tuple[str, list[Path], Path]:
    """Find CIFAR-10 batches in ``folder`` (or its ``cifar-10-batches-bin``/``-py`` subfolder).

    Returns ``(version, training batch paths in order, test batch path)`` with
    version ``"binary"`` or ``"python"``; the binary version wins when both exist.
    """
    candidates = [folder, folder / "cifar-10-batches-bin", folder / "cifar-10-batches-py"]
    for version, suffix in (("binary", ".bin"), ("python", "")):
        pattern = re.compile(rf"data_batch_(\d+){re.escape(suffix)}")
        for place in candidates:
            test = place / f"test_batch{suffix}"
            if not place.is_dir() or not test.is_file():
                continue
            train = sorted(
                (int(m.group(1)), p)
                for p in place.iterdir()
                if (m := pattern.fullmatch(p.name)) is not None
            )
            if train:
                return version, [p for _, p in train], test
    raise DataFileError(
        f"{folder}: no CIFAR-10 batches found; expected data_batch_1.bin ... and test_batch.bin "
        "(binary version) or data_batch_1 ... and test_batch (python version), directly inside "
        "or in a cifar-10-batches-bin / cifar-10-batches-py subfolder"
    )


# --------------------------------------------------------------------------- npz

NPZ_KEYS = ("x", "y", "x_test", "y_test")
"""The keys of a complete data set in an ``.npz``; ``x_train``/``y_train`` may stand for ``x``/``y``,
and ``x_test``/``y_test`` may be left out (then the caller holds out a split)."""
TASK_KEY = "task"
"""The optional entry that declares the data set's task (:data:`workloads.task.TASKS`): a
string in an ``.npz`` (``np.savez(..., task="regression")``) or a user factory's mapping."""
_TRAIN_NAMES = {"x_train": "x", "y_train": "y"}
LAYOUTS = "x, y, x_test, y_test; x_train, y_train, x_test, y_test; or x, y alone"
"""The key layouts :func:`check_arrays` accepts, as an error message lists them."""
TARGETS = (
    "1-D integer labels [N] (classification), integer next tokens [N, L] of x's shape "
    "(language-model), or float targets [N, ...] (regression)"
)
"""What ``y`` may hold, as an error message lists it."""


def read_npz_arrays(path: str | Path, task: str | None = None) -> dict[str, np.ndarray]:
    """Load a data set's arrays from an ``.npz`` with ``allow_pickle=False``.

    Returns ``x, y`` and, when the file has a test split, ``x_test, y_test``, and the
    task under :data:`TASK_KEY`: ``task`` when given, else the file's entry, else what
    ``y`` says; the file may spell
    the training keys ``x_train, y_train``. :func:`check_arrays` lists the checks. Each
    error names the file and the key.
    """
    path = Path(path)
    if not path.is_file():
        raise DataFileError(f"{path}: no such file")
    try:
        archive = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as error:
        raise DataFileError(f"{path}: not a readable .npz file ({error})") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise DataFileError(f"{path}: expected an .npz archive with keys {LAYOUTS}")
    with archive:
        arrays: dict[str, np.ndarray] = {}
        for key in archive.files:
            if key not in (*NPZ_KEYS, *_TRAIN_NAMES, TASK_KEY):
                continue  # other arrays in the file are not ours to read
            try:
                arrays[key] = archive[key]
            except ValueError:
                raise DataFileError(
                    f"{path}: key {key!r} holds an object array, which would need pickle; "
                    "store a numeric array"
                ) from None
        found = archive.files
    if task is not None:
        arrays[TASK_KEY] = np.array(task)
    return check_arrays(arrays, str(path), found=found)


def declared_task(value: object, source: str) -> str:
    """The task named by a data set's :data:`TASK_KEY` entry: a string (or a numpy string
    scalar or one-element array) among :data:`workloads.task.TASKS`."""
    text = value
    if isinstance(value, np.ndarray) and value.size == 1 and value.dtype.kind in "US":
        text = value.reshape(()).item()
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not isinstance(text, str) or text not in TASKS:
        shown = text if isinstance(text, str) else f"a {type(value).__name__}"
        raise DataFileError(
            f"{source}: key {TASK_KEY!r} is {shown!r}; allowed: a string, one of {', '.join(TASKS)}"
        )
    return text


def infer_task(x: np.ndarray, y: np.ndarray) -> str | None:
    """The task the arrays' ``y`` says, or None when it says none: float ``y`` is
    regression, 1-D integer ``y`` classification, integer ``y`` of ``x``'s 2-D shape a
    language model's next tokens (``x`` must then be integer tokens too)."""
    if y.dtype.kind == "f":
        return REGRESSION
    if y.dtype.kind in "iu" and y.ndim == 1:
        return CLASSIFICATION
    if y.dtype.kind in "iu" and y.ndim == 2 and y.shape == x.shape:
        return LANGUAGE_MODEL
    return None


def check_arrays(
    arrays: dict[str, np.ndarray], source: str, found: list[str] | None = None
) -> dict[str, np.ndarray]:
    """The arrays of one data set under the keys ``x, y`` (and ``x_test, y_test`` when
    given), checked, and its task under :data:`TASK_KEY` (a 0-d string array).

    ``x``/``x_test`` numeric with at least 2 dimensions and equal per-sample shapes, ``x``
    not empty; no object arrays; ``x_train``/``y_train`` are accepted for ``x``/``y``. The
    task is the :data:`TASK_KEY` entry when given, else what ``y`` says
    (:func:`infer_task`), and ``y``/``y_test`` must suit it, one per sample: 1-D
    non-negative integer labels (``classification``), non-negative integer next tokens of
    ``x``'s shape with ``x`` integer tokens too (``language-model``), or finite numbers
    ``[N, ...]`` (``regression``; integers are allowed when declared). ``source`` names the
    file (or factory) in errors; ``found`` lists every key it had."""
    for train, short in _TRAIN_NAMES.items():
        if train in arrays and short in arrays:
            raise DataFileError(
                f"{source}: keys {short!r} and {train!r} both given; allowed: one of them"
            )
    declared = declared_task(arrays[TASK_KEY], source) if arrays.get(TASK_KEY) is not None else None
    arrays = {_TRAIN_NAMES.get(key, key): value for key, value in arrays.items()}
    test = [key for key in ("x_test", "y_test") if key in arrays]
    wanted = NPZ_KEYS if test else NPZ_KEYS[:2]
    missing = [key for key in wanted if key not in arrays]
    if missing:
        keys = ", ".join(found if found is not None else arrays) or "none"
        raise DataFileError(
            f"{source}: missing key(s) {', '.join(missing)} (found: {keys}); allowed: {LAYOUTS}"
        )
    arrays = {key: arrays[key] for key in wanted}
    for key, value in arrays.items():
        if not isinstance(value, np.ndarray) or value.dtype.kind == "O":
            raise DataFileError(
                f"{source}: key {key!r} holds an object array, which would need pickle; "
                "store a numeric array"
            )
    pairs = (("x", "y"), ("x_test", "y_test"))[: len(wanted) // 2]
    for key, _ in pairs:
        kind = arrays[key].dtype.kind
        if kind not in "fiu" or arrays[key].ndim < 2:
            raise DataFileError(
                f"{source}: key {key!r} must be a numeric (float or integer) array [N, ...] "
                f"with at least 2 dimensions, got dtype {arrays[key].dtype} shape "
                f"{arrays[key].shape}"
            )
    task = declared or infer_task(arrays["x"], arrays["y"])
    if task is None:
        y = arrays["y"]
        raise DataFileError(
            f"{source}: key 'y' (dtype {y.dtype}, shape {y.shape}) says no task; allowed: "
            f"{TARGETS}; or declare one in a {TASK_KEY!r} entry"
        )
    for x_key, key in pairs:
        _check_targets(task, arrays[x_key], arrays[key], x_key, key, source)
    if test and arrays["y"].shape[1:] != arrays["y_test"].shape[1:]:
        raise DataFileError(
            f"{source}: key 'y_test' has shape {arrays['y_test'].shape} but 'y' has "
            f"{arrays['y'].shape}; a sample's targets must have one shape in both splits"
        )
    for x_key, y_key in pairs:
        if len(arrays[x_key]) != len(arrays[y_key]):
            raise DataFileError(
                f"{source}: key {y_key!r} has {len(arrays[y_key])} targets but {x_key!r} has "
                f"{len(arrays[x_key])} samples"
            )
    if test and arrays["x"].shape[1:] != arrays["x_test"].shape[1:]:
        raise DataFileError(
            f"{source}: key 'x_test' has sample shape {arrays['x_test'].shape[1:]} but 'x' "
            f"has {arrays['x'].shape[1:]}"
        )
    if len(arrays["x"]) == 0:
        raise DataFileError(f"{source}: key 'x' is empty")
    return {**arrays, TASK_KEY: np.array(task)}


def _check_targets(
    task: str, inputs: np.ndarray, target: np.ndarray, x_key: str, key: str, source: str
) -> None:
    """``target`` (key ``key``) suits ``task`` beside ``inputs`` (key ``x_key``)."""
    integer = target.dtype.kind in "iu"
    if task == REGRESSION:
        if target.dtype.kind not in "fiu" or target.ndim < 1:
            raise DataFileError(
                f"{source}: key {key!r} must hold numbers [N, ...] for the regression task, "
                f"got dtype {target.dtype} shape {target.shape}"
            )
        if target.size and not np.isfinite(target).all():
            raise DataFileError(f"{source}: key {key!r} holds NaN or infinite targets")
        return
    if task == CLASSIFICATION and not (integer and target.ndim == 1):
        raise DataFileError(
            f"{source}: key {key!r} must be 1-D integer labels [N] for the classification "
            f"task, got dtype {target.dtype} shape {target.shape}; allowed: {TARGETS}"
        )
    if task == LANGUAGE_MODEL:
        if not (integer and target.ndim == 2 and target.shape == inputs.shape):
            raise DataFileError(
                f"{source}: key {key!r} must be integer next tokens [N, L] of {x_key!r}'s "
                f"shape {inputs.shape} for the language-model task, got dtype {target.dtype} "
                f"shape {target.shape}"
            )
        if inputs.dtype.kind not in "iu":
            raise DataFileError(
                f"{source}: key {x_key!r} must hold integer tokens for the language-model "
                f"task, got dtype {inputs.dtype}"
            )
        if inputs.size and inputs.min() < 0:
            raise DataFileError(f"{source}: key {x_key!r} holds a negative token {inputs.min()}")
    if target.size and target.min() < 0:
        raise DataFileError(f"{source}: key {key!r} holds a negative label {target.min()}")
