"""A trainer's state in a checkpoint and back: the flat model and the optimizer's state.

:mod:`peer.checkpoint` writes and reads the files (atomic safetensors, checksums);
this module decides what goes in them for a :class:`~peer.trainer.Trainer`:

* ``flat``: the model's flat parameter buffer;
* ``optimizer.<param index>.<key>``: every tensor of the optimizer's per-parameter
  state (momentum buffers, Adam's moments, ...);
* metadata ``optimizer``: JSON of the optimizer's ``param_groups`` and the non-tensor
  entries of its state (``"<param index>.<key>": value``);
* the step (the trainer's), the round and the peer id (the caller's).

Restoring checks that ``flat`` fits the model (dtype and length) before it loads
anything, so a checkpoint of another model is an error that names the file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from peer import checkpoint
from peer.trainer import Trainer


def save_training_state(
    trainer: Trainer,
    directory: str | os.PathLike[str],
    *,
    round: int,
    peer_id: str,
    keep: int,
) -> Path:
    """Write ``trainer``'s model and optimizer state as a checkpoint of its step; the
    caller holds ``trainer.lock``. Returns the file written (older ones beyond ``keep``
    are removed, as :func:`peer.checkpoint.save_checkpoint` does)."""
    state = trainer.optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {"flat": trainer.flat.vector}
    scalars: dict[str, Any] = {}
    for index, entries in state["state"].items():
        for key, value in entries.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optimizer.{index}.{key}"] = value
            else:
                scalars[f"{index}.{key}"] = value
    metadata = {
        "optimizer": json.dumps({"param_groups": state["param_groups"], "scalars": scalars})
    }
    return checkpoint.save_checkpoint(
        directory,
        tensors,
        step=trainer.step,
        round=round,
        peer_id=peer_id,
        metadata=metadata,
        keep=keep,
    )


def load_training_state(
    trainer: Trainer, directory: str | os.PathLike[str]
) -> checkpoint.Checkpoint | None:
    """Restore ``trainer``'s model, optimizer state and step from the newest valid
    checkpoint in ``directory`` (under ``trainer.lock``); returns it (its round and path
    are the caller's to use), or None if there is none.

    Raises:
        peer.checkpoint.CheckpointError: ``flat`` is missing or does not fit the model.
    """
    loaded = checkpoint.load_latest(directory)
    if loaded is None:
        return None
    vector = trainer.flat.vector
    flat = loaded.tensors.get("flat")
    if flat is None or flat.shape != vector.shape or flat.dtype != vector.dtype:
        raise checkpoint.CheckpointError(
            f"{loaded.path}: 'flat' must be {vector.dtype} of shape ({vector.numel()},) "
            f"for this model, got {None if flat is None else (flat.dtype, tuple(flat.shape))}"
        )
    saved = json.loads(loaded.metadata.get("optimizer", "{}") or "{}")
    state: dict[int, dict[str, Any]] = {}
    for name, tensor in loaded.tensors.items():
        if name.startswith("optimizer."):
            _, index, key = name.split(".", 2)
            state.setdefault(int(index), {})[key] = tensor
    for name, value in saved.get("scalars", {}).items():
        index, key = name.split(".", 1)
        state.setdefault(int(index), {})[key] = value
    with trainer.lock:
        trainer.flat.load_(flat)
        if "param_groups" in saved:
            trainer.optimizer.load_state_dict(
                {"state": state, "param_groups": saved["param_groups"]}
            )
    trainer.step = loaded.step
    return loaded
