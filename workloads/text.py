"""A byte-level text data set from local files, for language models (no download).

``text`` (spec ``text:path=...,context=128,val_fraction=0.1,max_bytes=1000000,seed=0``):

- **Files.** ``path`` is a file or a folder (every file under it, recursively, hidden ones
  and ``__pycache__`` left out); by default the Python standard library sources of the
  running interpreter (``sysconfig.get_paths()["stdlib"]``, its ``*.py`` files without
  ``site-packages``/``dist-packages``), which every machine that runs gossipnet has. Files
  are listed in sorted order, so the list does not depend on the file system.
- **Split by file.** A permutation of the files drawn from ``seed`` orders them; files are
  read in that order until ``max_bytes`` bytes are read (the last one cut). The first files
  of that order whose bytes make up ``val_fraction`` of the total (at least one file) are the
  validation split, the rest train: no file contributes to both, and the same seed gives
  the same split. When the bytes read come from one file (a single file, or a
  ``max_bytes`` smaller than the first file of the order) that file is split by position
  instead: its last ``val_fraction`` of bytes validate.
- **Samples.** Each split's files are concatenated into one byte stream ``s`` and cut into
  non-overlapping contexts of ``L = context`` bytes: sample ``i`` is ``x = s[iL : iL + L]``,
  ``y = s[iL + 1 : iL + L + 1]`` (the next byte of every position), both int64. The
  vocabulary is the 256 byte values (``num_classes = 256``).

Reading the default 1 MB takes a few tens of milliseconds, so nothing is cached.

    >>> from workloads import load_dataset
    >>> data = load_dataset("text:context=64,max_bytes=20000")
    >>> data.task, data.num_classes, data.input_shape
    ('language-model', 256, (64,))
    >>> bool((data.x_train[0, 1:] == data.y_train[0, :-1]).all())
    True
"""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

import numpy as np
import torch

from workloads._registry import Entry, Param
from workloads.datasets import DATASETS, Dataset
from workloads.formats import DataFileError
from workloads.task import LANGUAGE_MODEL

__all__ = ["VOCABULARY", "default_text_files", "text", "text_files"]

VOCABULARY = 256
"""A byte-level model's vocabulary: the 256 byte values."""

_SKIPPED_FOLDERS = {"site-packages", "dist-packages", "__pycache__"}


def default_text_files() -> list[Path]:
    """The running interpreter's standard library ``*.py`` sources, sorted."""
    root = sysconfig.get_paths()["stdlib"]
    files = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [name for name in subfolders if name not in _SKIPPED_FOLDERS]
        files += [Path(folder, name) for name in names if name.endswith(".py")]
    return sorted(files)


def text_files(path: str | None) -> list[Path]:
    """The files of ``path`` (a file, or every non-hidden file under a folder), sorted; the
    standard library's sources when ``path`` is None. A ``DataFileError`` when there are none."""
    if path is None:
        files = default_text_files()
        if not files:
            raise DataFileError(
                "text: the interpreter's standard library has no .py sources here; "
                "allowed: give path=FILE or path=FOLDER"
            )
        return files
    root = Path(path)
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise DataFileError(f"text: path {root} is neither a file nor a folder")
    files = sorted(
        file
        for file in root.rglob("*")
        if file.is_file()
        and not any(
            part.startswith(".") or part in _SKIPPED_FOLDERS
            for part in file.relative_to(root).parts
        )
    )
    if not files:
        raise DataFileError(f"text: folder {root} holds no files")
    return files


def _contexts(stream: bytes, context: int, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-overlapping contexts ``x [N, L]`` of a byte stream and their next bytes ``y``."""
    count = (len(stream) - 1) // context
    if count < 1:
        raise DataFileError(
            f"text: the {split} split has {len(stream)} bytes, fewer than context + 1 = "
            f"{context + 1}; allowed: a larger max_bytes or val_fraction, or a smaller context"
        )
    tokens = torch.from_numpy(np.frombuffer(stream, dtype=np.uint8).astype(np.int64))
    x = tokens[: count * context].reshape(count, context)
    y = tokens[1 : count * context + 1].reshape(count, context)
    return x.contiguous(), y.contiguous()


def text(
    path: str | None = None,
    context: int = 128,
    val_fraction: float = 0.1,
    max_bytes: int = 1_000_000,
    seed: int = 0,
) -> Dataset:
    """Byte-level contexts of local text, split into training and validation by file (see the
    module docstring). Same arguments, same tensors."""
    if isinstance(context, bool) or not isinstance(context, int) or context < 1:
        raise ValueError(f"text: context must be an integer >= 1, got {context!r}")
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"text: val_fraction must lie in (0, 1), got {val_fraction}")
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 2:
        raise ValueError(f"text: max_bytes must be an integer >= 2, got {max_bytes!r}")
    files = text_files(path)
    order = np.random.default_rng(seed).permutation(len(files))
    chunks: list[bytes] = []
    total = 0
    for index in order:  # stops at max_bytes: a few hundred files of the stdlib's ~2,000
        data = files[index].read_bytes()[: max_bytes - total]
        if data:
            chunks.append(data)
            total += len(data)
        if total >= max_bytes:
            break
    if total == 0:
        raise DataFileError(f"text: the files of {path or 'the standard library'} are empty")
    if len(chunks) == 1:
        held = max(1, round(total * val_fraction))
        validation, training = chunks[0][-held:], chunks[0][:-held]
    else:
        sizes = np.cumsum([len(chunk) for chunk in chunks])
        first = int(np.searchsorted(sizes, val_fraction * total))  # last validation file
        held = min(first + 1, len(chunks) - 1)
        validation, training = b"".join(chunks[:held]), b"".join(chunks[held:])
    x_train, y_train = _contexts(training, context, "training")
    x_test, y_test = _contexts(validation, context, "validation")
    return Dataset(
        name="text",
        x_train=x_train,
        y_train=y_train,
        x_test=x_test,
        y_test=y_test,
        num_classes=VOCABULARY,
        input_shape=(context,),
        task=LANGUAGE_MODEL,
    )


DATASETS["text"] = Entry(
    "text",
    text,
    {
        "path": Param(
            str, None, "a text file or folder (default: the standard library's .py sources)", True
        ),
        "context": Param(int, 128, "bytes per context L (the model's sequence length)"),
        "val_fraction": Param(float, 0.1, "share of the bytes, whole files, that validate"),
        "max_bytes": Param(int, 1_000_000, "bytes read at most, files in seeded order"),
        "seed": Param(int, 0, "seed of the file order, hence of the split"),
    },
    "byte-level text from local files, split by file (a language model's data)",
)
