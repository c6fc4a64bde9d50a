"""File formats read from a local folder: IDX (MNIST), CIFAR-10 binary and python, .npz.

Every file here is written by the test itself with struct/gzip/pickle/numpy,
independently of the readers under test.
"""

from __future__ import annotations

import gzip
import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from workloads import DataFileError, UnsafePickleError, load_dataset, read_idx
from workloads.formats import read_cifar10_python_batch

# --------------------------------------------------------------------------- IDX


def write_idx(path: Path, array: np.ndarray, type_code: int, compress: bool = False) -> None:
    big_endian = array.astype(array.dtype.newbyteorder(">"))
    header = bytes([0, 0, type_code, array.ndim]) + struct.pack(f">{array.ndim}i", *array.shape)
    payload = header + big_endian.tobytes()
    path.write_bytes(gzip.compress(payload) if compress else payload)


@pytest.mark.parametrize(
    ("dtype", "code"),
    [
        (np.uint8, 0x08),
        (np.int8, 0x09),
        (np.int16, 0x0B),
        (np.int32, 0x0C),
        (np.float32, 0x0D),
        (np.float64, 0x0E),
    ],
)
@pytest.mark.parametrize("compress", [False, True])
def test_idx_round_trip_every_type(tmp_path: Path, dtype: type, code: int, compress: bool) -> None:
    rng = np.random.default_rng(0)
    array = (rng.standard_normal((3, 4, 5)) * 50).astype(dtype)
    path = tmp_path / "array.idx"
    write_idx(path, array, code, compress)
    loaded = read_idx(path)
    assert loaded.dtype == np.dtype(dtype)
    assert loaded.dtype.isnative
    np.testing.assert_array_equal(loaded, array)


def test_idx_errors_name_the_file_and_problem(tmp_path: Path) -> None:
    good = tmp_path / "good"
    write_idx(good, np.arange(12, dtype=np.uint8).reshape(3, 4), 0x08)
    truncated = tmp_path / "truncated"
    truncated.write_bytes(good.read_bytes()[:-1])
    with pytest.raises(DataFileError, match=r"truncated.*shape \(3, 4\) \(12 data bytes\).*11"):
        read_idx(truncated)
    bad_magic = tmp_path / "bad_magic"
    bad_magic.write_bytes(b"\x01\x00\x08\x01" + good.read_bytes()[4:])
    with pytest.raises(DataFileError, match="bad_magic: not an IDX file"):
        read_idx(bad_magic)
    bad_type = tmp_path / "bad_type"
    bad_type.write_bytes(b"\x00\x00\x07\x02" + good.read_bytes()[4:])
    with pytest.raises(DataFileError, match=r"unknown IDX type byte 0x07; allowed: 0x08"):
        read_idx(bad_type)
    bad_gzip = tmp_path / "bad.gz"
    bad_gzip.write_bytes(b"\x1f\x8b" + b"garbage")
    with pytest.raises(DataFileError, match="corrupt gzip"):
        read_idx(bad_gzip)
    with pytest.raises(DataFileError, match="no such file"):
        read_idx(tmp_path / "missing")


def write_mnist_folder(
    folder: Path, compress: bool, n_train: int = 12, n_test: int = 5
) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": rng.integers(0, 10, n_train, dtype=np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test, dtype=np.uint8),
    }
    folder.mkdir(exist_ok=True)
    for name, array in arrays.items():
        write_idx(folder / (name + (".gz" if compress else "")), array, 0x08, compress)
    return arrays


@pytest.mark.parametrize("compress", [False, True])
def test_mnist_folder_round_trip(tmp_path: Path, compress: bool) -> None:
    arrays = write_mnist_folder(tmp_path / "mnist", compress)
    data = load_dataset(f"mnist:path={tmp_path / 'mnist'}")
    assert data.input_shape == (1, 28, 28)
    assert data.num_classes == 10
    assert data.x_train.dtype == torch.float32
    expected = arrays["train-images-idx3-ubyte"].astype(np.float32)[:, None] / 255
    np.testing.assert_array_equal(data.x_train.numpy(), expected)
    np.testing.assert_array_equal(data.y_train.numpy(), arrays["train-labels-idx1-ubyte"])
    np.testing.assert_array_equal(data.y_test.numpy(), arrays["t10k-labels-idx1-ubyte"])
    assert float(data.x_test.max()) <= 1.0


def test_mnist_folder_errors(tmp_path: Path) -> None:
    folder = tmp_path / "mnist"
    write_mnist_folder(folder, compress=False)
    (folder / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(DataFileError, match="missing t10k-labels-idx1-ubyte"):
        load_dataset(f"mnist:path={folder}")
    write_idx(folder / "t10k-labels-idx1-ubyte", np.zeros(4, dtype=np.uint8), 0x08)
    with pytest.raises(DataFileError, match="4 labels for 5 images"):
        load_dataset(f"mnist:path={folder}")
    write_idx(folder / "t10k-labels-idx1-ubyte", np.full(5, 12, dtype=np.uint8), 0x08)
    with pytest.raises(DataFileError, match=r"labels must lie in 0..9"):
        load_dataset(f"mnist:path={folder}")
    with pytest.raises(DataFileError, match="is not a folder"):
        load_dataset(f"mnist:path={tmp_path / 'nowhere'}")
    with pytest.raises(ValueError, match="parameter 'path' is required"):
        load_dataset("mnist")


# --------------------------------------------------------------------------- CIFAR-10


def cifar_arrays(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 3072), dtype=np.uint8), rng.integers(0, 10, n).astype(np.int64)


def write_cifar_binary(
    folder: Path, batches: list[tuple[np.ndarray, np.ndarray]], test: tuple[np.ndarray, np.ndarray]
) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    files = [(f"data_batch_{i + 1}.bin", b) for i, b in enumerate(batches)] + [
        ("test_batch.bin", test)
    ]
    for name, (pixels, labels) in files:
        records = np.concatenate([labels.astype(np.uint8)[:, None], pixels], axis=1)
        (folder / name).write_bytes(records.tobytes())


def write_cifar_python(
    folder: Path,
    batches: list[tuple[np.ndarray, np.ndarray]],
    test: tuple[np.ndarray, np.ndarray],
    protocol: int,
) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    files = [(f"data_batch_{i + 1}", b) for i, b in enumerate(batches)] + [("test_batch", test)]
    for name, (pixels, labels) in files:
        # Like the original files: bytes keys, a list of ints, extra metadata.
        batch = {
            b"batch_label": b"training batch",
            b"labels": labels.tolist(),
            b"data": pixels,
            b"filenames": [b"img%d.png" % i for i in range(len(labels))],
        }
        (folder / name).write_bytes(pickle.dumps(batch, protocol=protocol))


def expected_cifar(batches: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    pixels = np.concatenate([p for p, _ in batches]).reshape(-1, 3, 32, 32).astype(np.float32) / 255
    return pixels, np.concatenate([lab for _, lab in batches])


def test_cifar10_binary_round_trip(tmp_path: Path) -> None:
    batches = [cifar_arrays(4, 0), cifar_arrays(3, 1)]
    test = cifar_arrays(2, 2)
    write_cifar_binary(tmp_path / "cifar-10-batches-bin", batches, test)
    data = load_dataset(f"cifar10:path={tmp_path}")  # finds the subfolder
    pixels, labels = expected_cifar(batches)
    assert data.input_shape == (3, 32, 32)
    np.testing.assert_array_equal(data.x_train.numpy(), pixels)
    np.testing.assert_array_equal(data.y_train.numpy(), labels)
    np.testing.assert_array_equal(data.x_test.numpy(), expected_cifar([test])[0])
    # The red plane of image 0 is the first 1024 bytes after its label.
    assert data.x_train[0, 0, 0, :4].mul(255).round().tolist() == batches[0][0][0, :4].tolist()


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_cifar10_python_round_trip(tmp_path: Path, protocol: int) -> None:
    batches = [cifar_arrays(4, 0), cifar_arrays(3, 1)]
    test = cifar_arrays(2, 2)
    write_cifar_python(tmp_path, batches, test, protocol)
    data = load_dataset(f"cifar10:path={tmp_path}")
    pixels, labels = expected_cifar(batches)
    np.testing.assert_array_equal(data.x_train.numpy(), pixels)
    np.testing.assert_array_equal(data.y_train.numpy(), labels)
    np.testing.assert_array_equal(data.y_test.numpy(), test[1])


def test_cifar10_python_batch_with_str_keys(tmp_path: Path) -> None:
    pixels, labels = cifar_arrays(3, 5)
    path = tmp_path / "data_batch_1"
    path.write_bytes(pickle.dumps({"data": pixels, "labels": labels.tolist()}, protocol=4))
    images, read_labels = read_cifar10_python_batch(path)
    np.testing.assert_array_equal(images, pixels.reshape(-1, 3, 32, 32))
    np.testing.assert_array_equal(read_labels, labels)


class _RunsShell:
    """What an attacker would put into a batch file: unpickling calls os.system."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


class _RunsEval:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (eval, ("1 + 1",))


def test_malicious_python_batch_is_refused_before_anything_runs(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    pixels, labels = cifar_arrays(2, 0)
    (tmp_path / "data_batch_1").write_bytes(
        pickle.dumps(
            {b"data": pixels, b"labels": labels.tolist(), b"x": _RunsShell(marker)}, protocol=2
        )
    )
    (tmp_path / "test_batch").write_bytes(
        pickle.dumps({b"data": pixels, b"labels": labels.tolist()})
    )
    with pytest.raises(
        UnsafePickleError, match=r"data_batch_1: refusing to unpickle global (posix|os|nt)\.system"
    ):
        load_dataset(f"cifar10:path={tmp_path}")
    assert not marker.exists()
    # Sanity check of the test itself: the stock unpickler would have run the command.
    pickle.loads(pickle.dumps(_RunsShell(marker)))
    assert marker.exists()


def test_eval_and_other_codecs_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "batch"
    path.write_bytes(pickle.dumps({"data": _RunsEval()}, protocol=4))
    with pytest.raises(UnsafePickleError, match=r"builtins\.eval"):
        read_cifar10_python_batch(path)
    # _codecs.encode is admitted only for latin-1 (what protocol 2 uses for bytes).
    crafted = b"\x80\x02c_codecs\nencode\nq\x00X\x03\x00\x00\x00abcq\x01X\x05\x00\x00\x00rot13q\x02\x86q\x03Rq\x04."
    path.write_bytes(crafted)
    with pytest.raises(UnsafePickleError, match="only latin-1"):
        read_cifar10_python_batch(path)


def test_cifar10_bad_files(tmp_path: Path) -> None:
    folder = tmp_path / "bin"
    write_cifar_binary(folder, [cifar_arrays(2, 0)], cifar_arrays(2, 1))
    (folder / "test_batch.bin").write_bytes(b"\x00" * 3000)
    with pytest.raises(
        DataFileError,
        match=r"test_batch.bin: CIFAR-10 binary batch must be a non-empty multiple of 3073",
    ):
        load_dataset(f"cifar10:path={folder}")
    with pytest.raises(DataFileError, match="no CIFAR-10 batches found"):
        load_dataset(f"cifar10:path={tmp_path}")
    python = tmp_path / "py"
    python.mkdir()
    (python / "data_batch_1").write_bytes(
        pickle.dumps({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]})
    )
    (python / "test_batch").write_bytes(pickle.dumps({b"data": np.zeros((2, 3072), np.uint8)}))
    with pytest.raises(DataFileError, match="rows must have 3072 values"):
        load_dataset(f"cifar10:path={python}")
    (python / "data_batch_1").write_bytes(b"not a pickle at all")
    with pytest.raises(DataFileError, match="not a readable CIFAR-10 python batch"):
        load_dataset(f"cifar10:path={python}")
    (python / "data_batch_1").write_bytes(
        pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 1]})
    )
    with pytest.raises(DataFileError, match="test_batch: missing key 'labels'; found: data"):
        load_dataset(f"cifar10:path={python}")


# --------------------------------------------------------------------------- npz


def test_npz_round_trip(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    arrays: dict[str, np.ndarray] = {
        "x": rng.standard_normal((20, 2, 3)),
        "y": rng.integers(0, 4, 20),
        "x_test": rng.standard_normal((6, 2, 3)),
        "y_test": rng.integers(0, 4, 6).astype(np.uint8),
    }
    np.savez(tmp_path / "data.npz", **arrays)
    data = load_dataset(f"npz:path={tmp_path / 'data.npz'},num_classes=5")
    assert data.input_shape == (2, 3)
    assert data.num_classes == 5
    assert data.x_train.dtype == torch.float32 and data.y_test.dtype == torch.int64
    np.testing.assert_allclose(data.x_train.numpy(), arrays["x"].astype(np.float32))
    np.testing.assert_array_equal(data.y_test.numpy(), arrays["y_test"])
    inferred = load_dataset("npz", path=tmp_path / "data.npz")  # a Path works too
    assert inferred.num_classes == int(max(arrays["y"].max(), arrays["y_test"].max())) + 1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"y_test": None}, r"missing key\(s\) y_test"),
        (
            {"y": np.zeros(10, dtype=np.complex64)},
            r"key 'y' \(dtype complex64, shape \(10,\)\) says no task; allowed: 1-D integer "
            r"labels \[N\] \(classification\), integer next tokens \[N, L\] of x's shape "
            r"\(language-model\), or float targets \[N, ...\] \(regression\); or declare one",
        ),
        (
            {"y": np.zeros((10, 1), dtype=np.int64)},
            r"key 'y' \(dtype int64, shape \(10, 1\)\) says",
        ),
        ({"y": np.zeros(9, dtype=np.int64)}, r"key 'y' has 9 targets but 'x' has 10 samples"),
        ({"y": np.full(10, -1)}, r"key 'y' holds a negative label"),
        ({"x_test": np.zeros((4, 5))}, r"key 'x_test' has sample shape \(5,\) but 'x' has \(3,\)"),
        ({"x": np.array(["a"] * 10)}, r"key 'x' must be a numeric"),
        ({"x": np.empty((10, 3), dtype=object)}, r"key 'x' holds an object array"),
        ({"y": np.full(10, 7)}, r"key 'y' holds label 7, outside 0..4 \(num_classes=5\)"),
    ],
)
def test_npz_errors_name_the_key(
    tmp_path: Path, change: dict[str, np.ndarray | None], message: str
) -> None:
    arrays: dict[str, np.ndarray | None] = {
        "x": np.zeros((10, 3)),
        "y": np.zeros(10, dtype=np.int64),
        "x_test": np.zeros((4, 3)),
        "y_test": np.zeros(4, dtype=np.int64),
        **change,
    }
    present = {k: v for k, v in arrays.items() if v is not None}
    np.savez(tmp_path / "bad.npz", allow_pickle=True, **present)  # type: ignore[arg-type]
    with pytest.raises(DataFileError, match=message):
        load_dataset(f"npz:path={tmp_path / 'bad.npz'},num_classes=5")


def test_npz_not_an_archive(tmp_path: Path) -> None:
    (tmp_path / "junk.npz").write_bytes(b"junk")
    with pytest.raises(DataFileError, match=r"not a readable \.npz"):
        load_dataset(f"npz:path={tmp_path / 'junk.npz'}")
    np.save(tmp_path / "single.npy", np.zeros(3))
    with pytest.raises(DataFileError, match=r"expected an \.npz archive"):
        load_dataset(f"npz:path={tmp_path / 'single.npy'}")
