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

__all__ = [
    "CIFAR10_RECORD_BYTES",
    "CifarUnpickler",
    "DataFileError",
    "UnsafePickleError",
    "check_arrays",
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
_TRAIN_NAMES = {"x_train": "x", "y_train": "y"}
LAYOUTS = "x, y, x_test, y_test; x_train, y_train, x_test, y_test; or x, y alone"
"""The key layouts :func:`check_arrays` accepts, as an error message lists them."""


def read_npz_arrays(path: str | Path) -> dict[str, np.ndarray]:
    """Load a data set's arrays from an ``.npz`` with ``allow_pickle=False``.

    Returns ``x, y`` and, when the file has a test split, ``x_test, y_test``; the file may
    spell the training keys ``x_train, y_train``. :func:`check_arrays` lists the checks.
    Each error names the file and the key.
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
            if key not in (*NPZ_KEYS, *_TRAIN_NAMES):
                continue  # other arrays in the file are not ours to read
            try:
                arrays[key] = archive[key]
            except ValueError:
                raise DataFileError(
                    f"{path}: key {key!r} holds an object array, which would need pickle; "
                    "store a numeric array"
                ) from None
        found = archive.files
    return check_arrays(arrays, str(path), found=found)


def check_arrays(
    arrays: dict[str, np.ndarray], source: str, found: list[str] | None = None
) -> dict[str, np.ndarray]:
    """The arrays of one data set under the keys ``x, y`` (and ``x_test, y_test`` when given),
    checked: ``x``/``x_test`` numeric with at least 2 dimensions and equal per-sample shapes,
    ``y``/``y_test`` integer and non-negative, either 1-D labels ``[N]`` (classification) or
    next tokens ``[N, L]`` of ``x``'s shape (a language model: ``x`` integer tokens too), one
    per sample, ``x`` not empty; no object
    arrays. ``x_train``/``y_train`` are accepted for ``x``/``y``. ``source`` names the file
    (or factory) in errors; ``found`` lists every key it had."""
    for train, short in _TRAIN_NAMES.items():
        if train in arrays and short in arrays:
            raise DataFileError(
                f"{source}: keys {short!r} and {train!r} both given; allowed: one of them"
            )
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
    for key in ("x", "x_test")[: len(wanted) // 2]:
        kind = arrays[key].dtype.kind
        if kind not in "fiu" or arrays[key].ndim < 2:
            raise DataFileError(
                f"{source}: key {key!r} must be a numeric (float or integer) array [N, ...] "
                f"with at least 2 dimensions, got dtype {arrays[key].dtype} shape "
                f"{arrays[key].shape}"
            )
    for x_key, key in (("x", "y"), ("x_test", "y_test"))[: len(wanted) // 2]:
        target, inputs = arrays[key], arrays[x_key]
        language = target.ndim == 2 and target.shape == inputs.shape
        if target.dtype.kind not in "iu" or not (target.ndim == 1 or language):
            raise DataFileError(
                f"{source}: key {key!r} must be integer, either 1-D labels [N] "
                f"(classification) or next tokens [N, L] of {x_key!r}'s shape (a language "
                f"model), got dtype {target.dtype} shape {target.shape}"
            )
        if language and inputs.dtype.kind not in "iu":
            raise DataFileError(
                f"{source}: key {x_key!r} must hold integer tokens when {key!r} holds next "
                f"tokens [N, L], got dtype {inputs.dtype}"
            )
        if target.size and target.min() < 0:
            raise DataFileError(f"{source}: key {key!r} holds a negative label {target.min()}")
        if language and inputs.size and inputs.min() < 0:
            raise DataFileError(f"{source}: key {x_key!r} holds a negative token {inputs.min()}")
    if len(wanted) == 4 and (arrays["y"].ndim == 1) != (arrays["y_test"].ndim == 1):
        raise DataFileError(
            f"{source}: key 'y_test' has shape {arrays['y_test'].shape} but 'y' has "
            f"{arrays['y'].shape}; both 1-D labels (classification) or both next tokens [N, L]"
        )
    for x_key, y_key in (("x", "y"), ("x_test", "y_test"))[: len(wanted) // 2]:
        if len(arrays[x_key]) != len(arrays[y_key]):
            raise DataFileError(
                f"{source}: key {y_key!r} has {len(arrays[y_key])} labels but {x_key!r} has "
                f"{len(arrays[x_key])} samples"
            )
    if test and arrays["x"].shape[1:] != arrays["x_test"].shape[1:]:
        raise DataFileError(
            f"{source}: key 'x_test' has sample shape {arrays['x_test'].shape[1:]} but 'x' "
            f"has {arrays['x'].shape[1:]}"
        )
    if len(arrays["x"]) == 0:
        raise DataFileError(f"{source}: key 'x' is empty")
    return arrays
