"""Crash-safe checkpoints: atomic safetensors files with step, round and peer id.

A checkpoint is one ``checkpoint-<step>.safetensors`` file holding named tensors
(the Peer stores its flat parameter buffer, module buffers and optimizer state)
and string metadata: ``step``, ``round``, ``peer_id``, ``sha256`` (over every
tensor's bytes in key order, so a flipped bit is caught, not just a truncation)
and any extra keys the caller adds.

Writing is atomic (:func:`write_atomically`: write a temporary
``.checkpoint-XXXXXXXX.tmp`` in the same directory, fsync it, rename it over the
final name, fsync the directory), so a crash leaves either the old or the new
file, never half of one. A process killed in the middle of a write leaves its
temporary file behind; :func:`remove_stale_temporaries` deletes exactly those
(``.checkpoint-*.tmp``, nothing else) when a peer starts. Reading goes through
safetensors only, never pickle. :func:`load_latest` walks back from the newest
file to the first one that loads and verifies, logging why each newer one was
skipped. A checkpoint directory belongs to one peer process at a time.

Example::

    >>> import tempfile, torch
    >>> d = tempfile.mkdtemp()
    >>> _ = save_checkpoint(d, {"flat": torch.zeros(4)}, step=10, round=2, peer_id="a")
    >>> load_latest(d).step
    10
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load as safetensors_load
from safetensors.torch import save as safetensors_save

logger = logging.getLogger(__name__)

_NAME = re.compile(r"checkpoint-(\d{12})\.safetensors")
TEMPORARY_PREFIX = ".checkpoint-"
TEMPORARY_SUFFIX = ".tmp"
_TEMPORARY = re.compile(r"\.checkpoint-[A-Za-z0-9_]+\.tmp")
"""The names :func:`save_checkpoint`'s temporary files get (``tempfile.mkstemp``'s random
part between :data:`TEMPORARY_PREFIX` and :data:`TEMPORARY_SUFFIX`)."""
_RESERVED = frozenset({"step", "round", "peer_id", "sha256", "format"})
FORMAT = "gossipnet-checkpoint-1"


class CheckpointError(Exception):
    """A checkpoint file that cannot be read or fails its checksum (names the file)."""


@dataclass(frozen=True)
class Checkpoint:
    """What a checkpoint holds: tensors plus step, round, peer id and extra metadata."""

    path: Path
    tensors: dict[str, torch.Tensor]
    step: int
    round: int
    peer_id: str
    metadata: dict[str, str] = field(default_factory=dict)


def checkpoint_path(directory: str | os.PathLike[str], step: int) -> Path:
    return Path(directory) / f"checkpoint-{step:012d}.safetensors"


def tensor_digest(tensors: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 over every tensor's name, dtype, shape and bytes, in name order (CPU tensors)."""
    sha = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name]
        sha.update(name.encode())
        sha.update(str(t.dtype).encode() + str(list(t.shape)).encode())
        if t.numel():
            sha.update(t.contiguous().reshape(-1).view(torch.uint8).numpy().data)
    return sha.hexdigest()


def _fsync_directory(directory: Path) -> None:
    with contextlib.suppress(OSError):  # some filesystems cannot fsync a directory
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def save_checkpoint(
    directory: str | os.PathLike[str],
    tensors: Mapping[str, torch.Tensor],
    *,
    step: int,
    round: int,
    peer_id: str,
    metadata: Mapping[str, str] | None = None,
    keep: int = 3,
) -> Path:
    """Write ``tensors`` atomically as ``checkpoint-<step>.safetensors``; keep the newest ``keep``.

    Tensors must be on the CPU and must not share memory with each other
    (safetensors' rule); they are written as they are, without an extra copy
    beyond the serialized bytes.
    """
    if step < 0 or round < 0:
        raise ValueError(f"step and round must be >= 0, got step={step}, round={round}")
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    extra = dict(metadata or {})
    clash = sorted(_RESERVED & set(extra))
    if clash:
        raise ValueError(
            f"metadata keys {clash} are reserved; reserved keys are {sorted(_RESERVED)}"
        )
    contiguous = {name: t.detach().contiguous() for name, t in tensors.items()}
    header = {
        **extra,
        "format": FORMAT,
        "step": str(step),
        "round": str(round),
        "peer_id": peer_id,
        "sha256": tensor_digest(contiguous),
    }
    data = safetensors_save(contiguous, metadata=header)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = write_atomically(checkpoint_path(directory, step), data, prefix=TEMPORARY_PREFIX)
    for old in list_checkpoints(directory)[:-keep]:
        with contextlib.suppress(FileNotFoundError):
            old.unlink()
    return final


def write_atomically(path: str | os.PathLike[str], data: bytes, *, prefix: str) -> Path:
    """Write ``data`` to ``path`` so that a reader (or a crash) sees the old file or the new
    one, never half of one: a temporary ``<prefix>XXXXXXXX.tmp`` in the same directory,
    fsynced, renamed over ``path``, then the directory fsynced. Returns ``path``."""
    final = Path(path)
    fd, temp_name = tempfile.mkstemp(prefix=prefix, suffix=TEMPORARY_SUFFIX, dir=final.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp_name, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_name)
        raise
    _fsync_directory(final.parent)
    return final


def remove_stale_temporaries(directory: str | os.PathLike[str]) -> int:
    """Delete the temporary files that interrupted checkpoint writes left in ``directory``.

    Only files named like :func:`save_checkpoint`'s temporaries (``.checkpoint-*.tmp``)
    directly in ``directory`` are removed; nothing else is touched. Call it when the
    directory's one writer starts (a running writer's temporary would go too). Logs one
    warning with the count if it removed any; returns the count.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return 0
    removed = 0
    for entry in directory.iterdir():
        if _TEMPORARY.fullmatch(entry.name) and entry.is_file() and not entry.is_symlink():
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()
                removed += 1
    if removed:
        logger.warning(
            "removed %d stale temporary checkpoint file(s) (%s*%s, left by interrupted "
            "writes) from %s",
            removed,
            TEMPORARY_PREFIX,
            TEMPORARY_SUFFIX,
            directory,
        )
    return removed


def list_checkpoints(directory: str | os.PathLike[str]) -> list[Path]:
    """Checkpoint files in ``directory``, oldest step first (temp files are ignored)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m[1]), p) for p in directory.iterdir() if (m := _NAME.fullmatch(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(directory: str | os.PathLike[str]) -> Path | None:
    """The newest checkpoint file in ``directory`` by step, or ``None``."""
    files = list_checkpoints(directory)
    return files[-1] if files else None


def load_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Read and verify one checkpoint; raise :class:`CheckpointError` naming the file if bad."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise CheckpointError(f"{path}: cannot read: {error}") from error
    try:
        tensors = safetensors_load(data)
        header = safetensors_metadata(data)
    except (SafetensorError, ValueError, KeyError, OSError) as error:
        raise CheckpointError(f"{path}: not a valid safetensors file ({error})") from error
    if header.get("format") != FORMAT:
        raise CheckpointError(
            f"{path}: metadata format must be {FORMAT!r}, got {header.get('format')!r}"
        )
    try:
        step, round_ = int(header["step"]), int(header["round"])
        peer_id, digest = header["peer_id"], header["sha256"]
    except (KeyError, ValueError) as error:
        raise CheckpointError(
            f"{path}: metadata lacks step/round/peer_id/sha256 ({error})"
        ) from error
    if tensor_digest(tensors) != digest:
        raise CheckpointError(f"{path}: checksum mismatch (file corrupted)")
    extra = {k: v for k, v in header.items() if k not in _RESERVED}
    return Checkpoint(path, tensors, step, round_, peer_id, extra)


def safetensors_metadata(data: bytes) -> dict[str, str]:
    """The ``__metadata__`` map of serialized safetensors bytes (from its JSON header).

    Call it on bytes that ``safetensors`` has already loaded (their header is valid);
    raises ``ValueError`` if the map is not one."""
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + size])
    metadata = header.get("__metadata__") or {}
    if not isinstance(metadata, dict):
        raise ValueError("__metadata__ is not a map")
    return {str(k): str(v) for k, v in metadata.items()}


def load_latest(directory: str | os.PathLike[str]) -> Checkpoint | None:
    """The newest checkpoint that loads and verifies, falling back past corrupt ones (a
    warning for each one skipped).

    Returns ``None`` if the directory has no checkpoint files. Raises
    :class:`CheckpointError` if it has files but none is valid.
    """
    files = list_checkpoints(directory)
    errors = []
    for path in reversed(files):
        try:
            checkpoint = load_checkpoint(path)
        except CheckpointError as error:
            errors.append(str(error))
            continue
        for skipped in errors:  # said only when falling back; else the error says it all
            logger.warning("skipping checkpoint: %s", skipped)
        return checkpoint
    if files:
        raise CheckpointError(f"no valid checkpoint in {directory}: " + "; ".join(errors))
    return None
