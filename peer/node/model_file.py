"""The model file a user takes home: its format, writing it, and reading it back as a module.

A trained model leaves gossipnet as two files written side by side (format
``gossipnet-model-1``; docs/models.md shows both)::

    model.safetensors   the module's state_dict (parameters and buffers), by name
    model.json          what rebuilds the module, and where the weights came from

The JSON names the ``workloads`` model spec, its seed, the data set, input shape and
number of classes (a :class:`ModelRecipe`), the step, the peer (or the peers averaged),
the test loss and accuracy if the peer evaluated, the gossipnet version and the SHA-256
of the tensors. The same document is in the safetensors header's metadata, so the
``.safetensors`` file alone is enough; when both are present they must agree (a pair
that was not written together is an error, not a silent mix). Readers ignore keys they
do not know; a change that older readers must not misread gets a new ``format``.

* :func:`save_model` writes the pair (each file atomically); ``gossipnet peer
  --save-model FILE`` calls it at the end of a run and on SIGINT/SIGTERM.
* :func:`load_model` reads a model file, a checkpoint file or a checkpoint folder and
  returns the rebuilt ``nn.Module`` in eval mode. Reading is safe for files from
  strangers: safetensors and bounded JSON only, never pickle. A registered
  ``workloads`` model is built by name; a model of your own code (``--model
  mymodel.py:SpiralNet``) is imported again only from the current directory
  (``peer.node.recipe.user_code_spec``: never an absolute path, ``..`` or a module found
  elsewhere), or built by the ``factory`` you pass. The module is first built on the
  ``meta`` device, so shapes are checked before any memory is allocated.
* :func:`read_sources` and :func:`build_module` are the two steps of :func:`load_model`,
  for a caller that combines several sources first (``peer.app.model_average``).

Example::

    >>> import tempfile, pathlib
    >>> recipe = ModelRecipe("mlp:hidden=8", input_shape=(4,), num_classes=3)
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "model.safetensors"
    >>> _ = save_model(path, recipe.build(), recipe, step=0)
    >>> type(load_model(path)).__name__
    'MLP'
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as safetensors_load
from safetensors.torch import save as safetensors_save
from torch import nn

from peer.node import checkpoint
from peer.node.recipe import RECIPE_KEY, ModelFactory, ModelRecipe
from peer.node.training_state import module_state
from peer.protocol import strict_json
from peer.protocol.errors import ProtocolError

__all__ = [
    "MODEL_FORMAT",
    "ExportError",
    "ModelSource",
    "build_module",
    "load_model",
    "read_sources",
    "save_model",
    "sidecar_path",
]

MODEL_FORMAT = "gossipnet-model-1"
"""The ``format`` of a model file's JSON document."""
_DOCUMENT_KEY = "gossipnet_model"
_MAX_JSON_BYTES = 1 << 20


class ExportError(ValueError):
    """A model file, checkpoint or output that cannot be used; the message is one line that
    names the file (or the argument) and what is wrong with it."""


def _version() -> str:
    try:
        return importlib.metadata.version("gossipnet")
    except importlib.metadata.PackageNotFoundError:  # a source tree that is not installed
        return "0.0.0+unknown"


def sidecar_path(path: str | os.PathLike[str]) -> Path:
    """A model file's JSON document: the same path with suffix ``.json``."""
    return Path(path).with_suffix(".json")


# --------------------------------------------------------------------------- writing


def _finite(value: Any) -> Any:
    """JSON has no NaN: a non-finite float becomes null."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def save_model(
    path: str | os.PathLike[str],
    module: nn.Module,
    recipe: ModelRecipe,
    *,
    step: int | None = None,
    peer_id: str | None = None,
    evaluation: Mapping[str, float | None] | None = None,
    averaged_from: Sequence[Mapping[str, Any]] | None = None,
    byzantine: str | None = None,
) -> Path:
    """Write ``module``'s ``state_dict`` to ``path`` (safetensors) and its description to
    :func:`sidecar_path` (JSON), each atomically; returns ``path``.

    Args:
        path: the model file; its folder must exist and its suffix must not be ``.json``.
        module: the trained module (any device; the tensors are copied to the CPU).
        recipe: how to rebuild it (:class:`ModelRecipe`).
        step, peer_id: where the weights come from (recorded).
        evaluation: e.g. ``{"test_loss": ..., "test_accuracy": ..., "test_samples": ...}``
            (``test_accuracy`` None for a model that is not a classifier: JSON null).
        averaged_from: for an average, one ``{"path", "peer_id", "step"}`` per source.
        byzantine: the attack the peer sent (``--byzantine``; evaluation only), or None:
            a run folder's average leaves such a peer's model out.

    Raises:
        ExportError: ``path`` ends in ``.json`` or its folder does not exist.
    """
    path = Path(path)
    if path.suffix == ".json":
        raise ExportError(
            f"{path}: a model file must not end in .json (that name is its description)"
        )
    if not path.parent.is_dir():
        raise ExportError(f"{path}: folder {path.parent} does not exist")
    tensors = {
        name: tensor.detach().to("cpu", copy=True).contiguous()
        for name, tensor in module.state_dict().items()
    }
    document = {
        "format": MODEL_FORMAT,
        **recipe.to_json(),
        "step": step,
        "peer_id": peer_id,
        "averaged_from": None if averaged_from is None else [dict(s) for s in averaged_from],
        **({} if byzantine is None else {"byzantine": byzantine}),
        "evaluation": None
        if evaluation is None
        else {key: _finite(value) for key, value in evaluation.items()},
        "gossipnet_version": _version(),
        "sha256": checkpoint.tensor_digest(tensors),
    }
    text = json.dumps(document, allow_nan=False)
    data = safetensors_save(tensors, metadata={"format": MODEL_FORMAT, _DOCUMENT_KEY: text})
    checkpoint.write_atomically(path, data, prefix=f".{path.name}-")
    pretty = json.dumps(document, indent=2, allow_nan=False) + "\n"
    sidecar = sidecar_path(path)
    checkpoint.write_atomically(sidecar, pretty.encode(), prefix=f".{sidecar.name}-")
    return path


# --------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class ModelSource:
    """One model read from a model file or a checkpoint: its state_dict and its record."""

    path: Path
    state: dict[str, torch.Tensor]
    recipe: ModelRecipe
    step: int | None
    peer_id: str | None
    evaluation: dict[str, Any] | None = None
    averaged: bool = False
    """The model file is itself an average of several (``averaged_from``), not one peer's."""
    byzantine: bool = False
    """The model file is a Byzantine peer's (``--byzantine``, evaluation only)."""


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())[:300]


def _parse_json(data: bytes, what: str) -> Any:
    try:
        return strict_json.loads(data, what=what, max_bytes=_MAX_JSON_BYTES)
    except ProtocolError as error:
        raise ExportError(error.detail) from None


def _read_safetensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ExportError(f"{path}: cannot read ({_one_line(error)})") from None
    try:
        tensors = safetensors_load(data)
        metadata = checkpoint.safetensors_metadata(data)
    except (SafetensorError, ValueError, KeyError, OSError, RecursionError) as error:
        raise ExportError(f"{path}: not a valid safetensors file ({_one_line(error)})") from None
    return tensors, metadata


def _read_model_file(
    path: Path, tensors: dict[str, torch.Tensor], metadata: Mapping[str, str]
) -> ModelSource:
    embedded = metadata.get(_DOCUMENT_KEY)
    sidecar = sidecar_path(path)
    if sidecar.is_file():
        try:
            if sidecar.stat().st_size > _MAX_JSON_BYTES:
                raise ExportError(f"{sidecar}: larger than {_MAX_JSON_BYTES} bytes")
            raw = sidecar.read_bytes()
        except OSError as error:
            raise ExportError(f"{sidecar}: cannot read ({_one_line(error)})") from None
        document = _parse_json(raw, str(sidecar))
        if embedded is not None and _parse_json(embedded.encode(), str(path)) != document:
            raise ExportError(
                f"{sidecar} does not describe {path} (the pair was not written together); "
                f"delete {sidecar.name} to use the description inside {path.name}"
            )
        where = sidecar
    elif embedded is not None:
        document, where = _parse_json(embedded.encode(), f"{path} (its description)"), path
    else:
        raise ExportError(f"{path}: no model description (no {sidecar.name}, none inside)")
    if not isinstance(document, dict) or document.get("format") != MODEL_FORMAT:
        found = document.get("format") if isinstance(document, dict) else type(document).__name__
        raise ExportError(f"{where}: format must be {MODEL_FORMAT!r}, got {found!r:.60}")
    try:
        recipe = ModelRecipe.from_json(document)
    except ValueError as error:
        raise ExportError(f"{where}: {error}") from None
    if document.get("sha256") != checkpoint.tensor_digest(tensors):
        raise ExportError(
            f"{path}: its tensors do not match the sha256 in {where.name} (corrupted, or not "
            "the file that description was written with)"
        )
    step, peer_id, evaluation = (
        document.get("step"),
        document.get("peer_id"),
        document.get("evaluation"),
    )
    return ModelSource(
        path,
        tensors,
        recipe,
        step if isinstance(step, int) and not isinstance(step, bool) else None,
        peer_id if isinstance(peer_id, str) else None,
        evaluation if isinstance(evaluation, dict) else None,
        averaged=bool(document.get("averaged_from")),
        byzantine=bool(document.get("byzantine")),
    )


def _read_checkpoint(loaded: checkpoint.Checkpoint) -> ModelSource:
    text = loaded.metadata.get(RECIPE_KEY)
    if text is None:
        raise ExportError(
            f"{loaded.path}: the checkpoint does not record its model (written by an older "
            "gossipnet, or by a Peer built without a recipe); resume it once with this "
            "version to write one that does"
        )
    try:
        recipe = ModelRecipe.from_json(_parse_json(text.encode(), f"{loaded.path} recipe"))
        state = module_state(loaded)
    except (ValueError, checkpoint.CheckpointError) as error:
        raise ExportError(_one_line(error)) from None
    return ModelSource(loaded.path, state, recipe, loaded.step, loaded.peer_id)


def _checkpoint_folders(folder: Path) -> list[Path]:
    """Sub-folders of ``folder`` that hold checkpoints (``gossipnet launch --dir``'s
    ``peer-N.checkpoints``), sorted by name."""
    return sorted(
        entry for entry in folder.iterdir() if entry.is_dir() and checkpoint.list_checkpoints(entry)
    )


def _peer_models(folder: Path) -> list[ModelSource]:
    """The model files one peer wrote in ``folder`` (``gossipnet launch --dir``'s
    ``peer-N.safetensors``, from ``--save-model``), sorted by name: safetensors files in
    gossipnet's model format with a peer id; an average (``averaged_from``) is not a peer's,
    and of two files of one peer the first is kept."""
    found: dict[str, ModelSource] = {}
    for path in sorted(folder.glob("*.safetensors")):
        if not path.is_file():
            continue
        try:
            tensors, metadata = _read_safetensors(path)
        except ExportError:
            continue  # not a model file: a stray file in the folder
        if metadata.get("format") != MODEL_FORMAT:
            continue
        source = _read_model_file(path, tensors, metadata)
        if source.peer_id is not None and not source.averaged and source.peer_id not in found:
            found[source.peer_id] = source
    return list(found.values())


def read_sources(path: Path) -> list[ModelSource]:
    """The models ``path`` holds: a model file or checkpoint file (one), a checkpoint folder
    (its newest valid checkpoint), or a run folder (``gossipnet launch --dir``): each
    honest peer's model file (``peer-N.safetensors``; a Byzantine peer's is left out, as
    ``launch --save-model`` leaves it out) and, for a peer without one, its checkpoint
    folder's newest checkpoint.
    Raises :class:`ExportError` (one line naming the file) for one that cannot be used."""
    if path.is_dir():
        if checkpoint.list_checkpoints(path):
            try:
                loaded = checkpoint.load_latest(path)
            except checkpoint.CheckpointError as error:
                raise ExportError(_one_line(error)) from None
            if loaded is None:  # removed since they were listed
                raise ExportError(f"{path}: its checkpoints disappeared while being read")
            return [_read_checkpoint(loaded)]
        found = _peer_models(path)
        peers = {source.peer_id for source in found}
        models = [source for source in found if not source.byzantine]  # as launch averages
        checkpoints = [
            source
            for folder in _checkpoint_folders(path)
            for source in read_sources(folder)
            if source.peer_id is None or source.peer_id not in peers
        ]
        if not models and not checkpoints:
            raise ExportError(
                f"{path}: no checkpoint-*.safetensors nor a peer's model file "
                "(peer-N.safetensors) in this folder or its sub-folders"
            )
        return [*models, *checkpoints]
    if not path.exists():
        raise ExportError(f"{path}: no such file or folder")
    tensors, metadata = _read_safetensors(path)
    kind = metadata.get("format")
    if kind == checkpoint.FORMAT:
        try:
            return [_read_checkpoint(checkpoint.load_checkpoint(path))]
        except checkpoint.CheckpointError as error:
            raise ExportError(_one_line(error)) from None
    return [_read_model_file(path, tensors, metadata)]


def build_module(
    source: ModelSource,
    device: torch.device | str = "cpu",
    factory: ModelFactory | None = None,
) -> nn.Module:
    """``source``'s recipe built and loaded with its tensors (strictly), in eval mode on
    ``device``. The shapes are checked against a ``meta``-device build first, so a hostile
    spec (a huge width) is refused, as an :class:`ExportError`, before anything is allocated."""
    where = source.path
    try:
        skeleton = source.recipe.build(device="meta", factory=factory)
    except ValueError as error:
        raise ExportError(f"{where}: {_one_line(error)}") from None
    expected = skeleton.state_dict()
    missing = sorted(set(expected) - set(source.state))
    unexpected = sorted(set(source.state) - set(expected))
    if missing or unexpected:
        raise ExportError(
            f"{where}: tensors do not match model {source.recipe.model!r} (missing "
            f"{missing[:3]}{'...' if len(missing) > 3 else ''}, unexpected "
            f"{unexpected[:3]}{'...' if len(unexpected) > 3 else ''})"
        )
    for name, tensor in expected.items():
        if tuple(source.state[name].shape) != tuple(tensor.shape):
            raise ExportError(
                f"{where}: tensor {name!r} has shape {tuple(source.state[name].shape)}, model "
                f"{source.recipe.model!r} needs {tuple(tensor.shape)}"
            )
    try:
        module = source.recipe.build(factory=factory)
    except ValueError as error:
        raise ExportError(f"{where}: {_one_line(error)}") from None
    try:
        module.load_state_dict(source.state, strict=True)
    except (RuntimeError, ValueError) as error:
        raise ExportError(f"{where}: {_one_line(error)}") from None
    return module.to(device).eval()


def load_model(
    path: str | os.PathLike[str],
    device: str | torch.device = "cpu",
    *,
    factory: ModelFactory | None = None,
) -> nn.Module:
    """The trained module in ``path``, rebuilt through ``workloads``, in eval mode on ``device``.

    ``path`` is a model file (``--save-model``, ``gossipnet export``; its ``.json`` is read
    when present), a checkpoint file, or a checkpoint folder (its newest valid checkpoint).
    Nothing is unpickled; the weights are loaded strictly (every tensor, no extra). A model
    of your own code is rebuilt from the spec it records (``mymodel.py:SpiralNet``),
    imported from the current directory only; ``factory`` (a callable
    ``factory(input_shape, num_classes)`` or a ``MODULE:FACTORY`` spec) rebuilds it from
    elsewhere.

    Raises:
        ExportError: the file is unreadable, truncated, not gossipnet's, names a model that
            is not registered nor your code in the current directory, or holds tensors that
            do not fit the model (one line).
        ValueError: ``device`` is not a torch device.
    """
    try:
        target = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(
            f"device must be a torch device such as 'cpu' or 'cuda:0', got {device!r}"
        ) from error
    sources = read_sources(Path(path))
    if len(sources) != 1:
        raise ExportError(
            f"{path}: holds {len(sources)} peers' checkpoints; average them with "
            "average_models (gossipnet export) or pass one peer's folder"
        )
    return build_module(sources[0], target, factory)
