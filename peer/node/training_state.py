"""A trainer's state in a checkpoint and back: the flat model, its buffers, the optimizer.

:mod:`peer.node.checkpoint` writes and reads the files (atomic safetensors, checksums);
this module decides what goes in them for a :class:`~peer.node.trainer.Trainer`:

* ``flat``: the model's flat parameter buffer;
* ``buffer.<name>``: every entry of the model's ``state_dict`` that is not in ``flat``
  (buffers such as BatchNorm's running statistics and ``num_batches_tracked``), so a
  checkpoint alone holds the whole ``state_dict``;
* ``optimizer.<param index>.<key>``: every tensor of the optimizer's per-parameter
  state (momentum buffers, Adam's moments, ...);
* metadata ``optimizer``: JSON of the optimizer's ``param_groups`` and the non-tensor
  entries of its state (``"<param index>.<key>": value``);
* metadata ``layout``: JSON ``[[name, shape], ...]``, which ``state_dict`` entry lies
  where in ``flat`` (``gossip.flat.ParameterLayout``'s order), so :func:`module_state`
  can rebuild the ``state_dict`` without the peer that wrote it;
* ``algorithm.<key>``: the rule's own state beyond the model, where it has some (an outer
  optimizer's slow weights and buffers, ``gossip.outer.CheckpointedState``), given by the
  caller and returned by :func:`algorithm_tensors`;
* the step (the trainer's), the round, the peer id and any extra metadata (the caller's).

Restoring checks that ``flat`` fits the model (dtype and length, and the layout when the
checkpoint records one) before it loads anything, so a checkpoint of another model is an
error that names the file. Checkpoints written before ``buffer.*`` and ``layout`` existed
still resume (their model has no buffers to restore).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from peer.node import checkpoint
from peer.node.trainer import Trainer

BUFFER_PREFIX = "buffer."
ALGORITHM_PREFIX = "algorithm."
LAYOUT_KEY = "layout"


def _layout_json(trainer: Trainer) -> str:
    return json.dumps([[e.name, list(e.shape)] for e in trainer.flat.layout.entries])


def save_training_state(
    trainer: Trainer,
    directory: str | os.PathLike[str],
    *,
    round: int,
    peer_id: str,
    keep: int,
    metadata: Mapping[str, str] | None = None,
    algorithm: Mapping[str, torch.Tensor] | None = None,
) -> Path:
    """Write ``trainer``'s model, buffers and optimizer state as a checkpoint of its step;
    the caller holds ``trainer.lock``. ``metadata`` adds string entries (the peer's model
    recipe and membership), ``algorithm`` the rule's own tensors. Returns the file written
    (older ones beyond ``keep`` are removed, as :func:`peer.node.checkpoint.save_checkpoint`
    does)."""
    state = trainer.optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {"flat": trainer.flat.vector.detach().cpu()}
    for key, value in (algorithm or {}).items():
        tensors[ALGORITHM_PREFIX + key] = value.detach().cpu().clone()
    in_flat = set(trainer.flat.layout.names)
    for name, value in trainer.model.state_dict().items():
        if name not in in_flat:  # a buffer, or a second name of a tied parameter
            tensors[BUFFER_PREFIX + name] = value.detach().cpu().clone()
    scalars: dict[str, Any] = {}
    for index, entries in state["state"].items():
        for key, value in entries.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optimizer.{index}.{key}"] = value.detach().cpu()
            else:
                scalars[f"{index}.{key}"] = value
    extra = {
        **(metadata or {}),
        "optimizer": json.dumps({"param_groups": state["param_groups"], "scalars": scalars}),
        LAYOUT_KEY: _layout_json(trainer),
    }
    return checkpoint.save_checkpoint(
        directory,
        tensors,
        step=trainer.step,
        round=round,
        peer_id=peer_id,
        metadata=extra,
        keep=keep,
    )


def load_training_state(
    trainer: Trainer, directory: str | os.PathLike[str]
) -> checkpoint.Checkpoint | None:
    """Restore ``trainer``'s model, buffers, optimizer state and step from the newest valid
    checkpoint in ``directory`` (under ``trainer.lock``); returns it (its round, path and
    metadata are the caller's to use), or None if there is none.

    Raises:
        peer.node.checkpoint.CheckpointError: ``flat`` is missing or does not fit the model.
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
    layout = loaded.metadata.get(LAYOUT_KEY)
    if layout is not None and layout != _layout_json(trainer):
        raise checkpoint.CheckpointError(
            f"{loaded.path}: its layout (names and shapes in 'flat') is not this model's; "
            "it is a checkpoint of another model"
        )
    buffers = _buffers_to_restore(trainer, loaded)
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
        with torch.no_grad():
            for target, value in buffers:
                target.copy_(value)
        if "param_groups" in saved:
            trainer.optimizer.load_state_dict(
                {"state": state, "param_groups": saved["param_groups"]}
            )
    trainer.step = loaded.step
    return loaded


def algorithm_tensors(loaded: checkpoint.Checkpoint) -> dict[str, torch.Tensor]:
    """The rule's own tensors a checkpoint holds (``algorithm.<key>``, prefix removed)."""
    return {
        name.removeprefix(ALGORITHM_PREFIX): tensor
        for name, tensor in loaded.tensors.items()
        if name.startswith(ALGORITHM_PREFIX)
    }


def _buffers_to_restore(
    trainer: Trainer, loaded: checkpoint.Checkpoint
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(model buffer, saved value) pairs for every buffer the checkpoint holds, checked
    first: a saved buffer whose shape differs from the model's is an error naming it."""
    pairs = []
    for name, target in trainer.model.named_buffers():
        value = loaded.tensors.get(BUFFER_PREFIX + name)
        if value is None:
            continue
        if value.shape != target.shape:
            raise checkpoint.CheckpointError(
                f"{loaded.path}: buffer {name!r} has shape {tuple(value.shape)}, the model's "
                f"is {tuple(target.shape)}"
            )
        pairs.append((target, value))
    return pairs


def module_state(loaded: checkpoint.Checkpoint) -> dict[str, torch.Tensor]:
    """The ``state_dict`` of the model that wrote ``loaded``: ``flat`` cut by the recorded
    ``layout``, plus the ``buffer.*`` entries (each tensor its own copy).

    Raises:
        peer.node.checkpoint.CheckpointError: the checkpoint records no layout (written before
            gossipnet kept one), or ``flat`` does not match it.
    """
    text = loaded.metadata.get(LAYOUT_KEY)
    if text is None:
        raise checkpoint.CheckpointError(
            f"{loaded.path}: records no layout of its model (written by an older gossipnet); "
            "resume a peer from it and let it write a new checkpoint"
        )
    try:
        entries = [(str(name), tuple(int(s) for s in shape)) for name, shape in json.loads(text)]
    except (ValueError, TypeError, RecursionError) as error:
        raise checkpoint.CheckpointError(f"{loaded.path}: malformed layout ({error})") from None
    if any(s < 0 for _, shape in entries for s in shape):
        raise checkpoint.CheckpointError(f"{loaded.path}: malformed layout (a negative size)")
    flat = loaded.tensors.get("flat")
    total = sum(math.prod(shape) for _, shape in entries)
    if flat is None or flat.dim() != 1 or flat.numel() != total:
        raise checkpoint.CheckpointError(
            f"{loaded.path}: 'flat' must be a vector of {total} values for its layout, got "
            f"{None if flat is None else tuple(flat.shape)}"
        )
    state: dict[str, torch.Tensor] = {}
    offset = 0
    for name, shape in entries:
        size = math.prod(shape)
        state[name] = flat[offset : offset + size].reshape(shape).clone()
        offset += size
    for name, tensor in loaded.tensors.items():
        if name.startswith(BUFFER_PREFIX):
            state[name.removeprefix(BUFFER_PREFIX)] = tensor.clone()
    return state
