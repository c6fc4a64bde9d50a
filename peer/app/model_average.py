"""The swarm's averaged model: one model file from several models or checkpoints.

:func:`average_models` (``gossipnet export``, ``gossipnet launch --save-model``) turns one
or several sources into one model file: the swarm's averaged model
``x_bar = (1/n) sum_i x_i`` of its peers' latest checkpoints (D-PSGD's consensus point;
Lian et al., NeurIPS 2017, evaluate this average). Checkpoints are written atomically, so
it reads a running swarm's. The file format is :mod:`peer.node.model_file`'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from gossip.flat import averageable
from peer.node.model_file import ExportError, ModelSource, build_module, read_sources, save_model
from peer.node.recipe import ModelFactory
from workloads import Dataset, evaluate

__all__ = ["average_models", "evaluation_of"]


def average_models(
    paths: Sequence[Path],
    out: Path,
    *,
    factory: ModelFactory | None = None,
    dataset: Dataset | None = None,
) -> Path:
    """Write the average of the models in ``paths`` to ``out`` (and ``out``'s ``.json``).

    Each path is a model file, a checkpoint file, a checkpoint folder (its newest valid
    checkpoint) or a run folder (``gossipnet launch --dir``: every peer's model file, or
    its newest checkpoint). Floating-point tensors are averaged (in float64, stored in
    their own dtype): ``x_bar = (1/n) sum_i x_i``; integer buffers (counters such as
    BatchNorm's ``num_batches_tracked``) keep the largest value; a tensor holding ``-inf``
    or NaN (a causal mask: not ``gossip.flat.averageable``) is a constant kept as the first
    source has it. One source is simply converted.

    Args:
        factory: rebuilds a model of your own code (a callable ``factory(input_shape,
            num_classes)`` or a ``MODULE:FACTORY`` spec, which the file then records);
            without it the recorded spec is used (your code imported from the current
            directory: ``peer.node.recipe.user_code_spec``).
        dataset: evaluate the result on its test split (:func:`evaluation_of`) and record
            the figures (``"evaluation"``); without it a single source keeps its own.

    Returns:
        ``out``.

    Raises:
        ExportError: a source cannot be read, or the sources are of different models
            (they must share the model spec, input shape and number of classes), or the
            model cannot be rebuilt, or ``out``'s folder does not exist (one line naming
            the file).
    """
    if not paths:
        raise ExportError("paths: give at least one model file, checkpoint or checkpoint folder")
    out = Path(out)
    if not out.parent.is_dir():
        raise ExportError(f"{out}: folder {out.parent} does not exist")
    sources: list[ModelSource] = []
    total: dict[str, torch.Tensor] = {}
    constants: set[str] = set()
    shapes: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
    for path in paths:
        for source in read_sources(Path(path)):
            if sources:
                _check_same_model(sources[0], source, shapes)
            else:
                shapes = {name: (tuple(t.shape), t.dtype) for name, t in source.state.items()}
            _accumulate(total, source.state, constants)
            # keep the record, drop the tensors: memory stays at the sum plus one model
            sources.append(dataclasses.replace(source, state={}))
    first = sources[0]
    state = {
        name: value
        if name in constants or not value.is_floating_point()
        else (value / len(sources)).to(shapes[name][1])
        for name, value in total.items()
    }
    recipe = first.recipe
    if isinstance(factory, str):  # the code's new place: recorded, so the file finds it
        recipe = dataclasses.replace(recipe, model=factory.strip())
    module = build_module(dataclasses.replace(first, state=state), factory=factory)
    scores = evaluation_of(module, dataset) if dataset is not None else None
    if len(sources) == 1:
        return save_model(
            out,
            module,
            recipe,
            step=first.step,
            peer_id=first.peer_id,
            evaluation=first.evaluation if scores is None else scores,
        )
    steps = [s.step for s in sources if s.step is not None]
    return save_model(
        out,
        module,
        recipe,
        step=max(steps) if steps else None,
        evaluation=scores,
        averaged_from=[
            {"path": _recorded(s.path, out), "peer_id": s.peer_id, "step": s.step} for s in sources
        ],
    )


def evaluation_of(module: torch.nn.Module, dataset: Dataset) -> dict[str, Any]:
    """``module``'s figures on ``dataset``'s test split, named as a peer's ``--eval-out``
    names them: ``test_<metric>`` for each metric of the data set's task
    (``workloads.evaluate``: ``test_accuracy``, ``test_loss``, ...) and ``test_samples``."""
    scores = evaluate(module, dataset.x_test, dataset.y_test, dataset.task)
    return {
        **{f"test_{name}": value for name, value in scores.items()},
        "test_samples": int(dataset.y_test.shape[0]),
    }


def _recorded(path: Path, out: Path) -> str:
    """A source's path as the output records it: relative to ``out``'s folder when inside
    it, else its folder's name and its own (never the machine's absolute path)."""
    try:
        return path.resolve().relative_to(out.parent.resolve()).as_posix()
    except ValueError:
        return Path(path.resolve().parent.name, path.name).as_posix()


def _accumulate(
    total: dict[str, torch.Tensor], state: Mapping[str, torch.Tensor], constants: set[str]
) -> None:
    """Add ``state`` into ``total``: float64 sums of the tensors the first source holds
    :func:`~gossip.flat.averageable` (finite floats); integer tensors keep the maximum; a
    float tensor that holds a non-finite value in the first source (a ``-inf`` mask) is a
    constant of the model, named in ``constants`` and kept as the first source has it."""
    for name, tensor in state.items():
        if name in constants:
            continue
        if name not in total:
            if tensor.is_floating_point() and not averageable(tensor):
                constants.add(name)
                total[name] = tensor.clone()
            else:
                total[name] = (
                    tensor.to(torch.float64) if tensor.is_floating_point() else tensor.clone()
                )
        elif tensor.is_floating_point():
            total[name] += tensor.to(torch.float64)
        else:
            total[name] = torch.maximum(total[name], tensor)


def _check_same_model(
    first: ModelSource,
    other: ModelSource,
    shapes: Mapping[str, tuple[tuple[int, ...], torch.dtype]],
) -> None:
    """``other`` is the same model as ``first`` (recipe, tensor names, shapes and kinds)."""
    if first.recipe.architecture() != other.recipe.architecture():
        raise ExportError(
            f"{other.path}: model {other.recipe.model!r} on input {list(other.recipe.input_shape)} "
            f"with {other.recipe.num_classes} classes differs from {first.path}'s "
            f"{first.recipe.model!r} on {list(first.recipe.input_shape)} with "
            f"{first.recipe.num_classes} classes; only the same model can be averaged"
        )
    found = {name: (tuple(t.shape), t.dtype) for name, t in other.state.items()}
    for name in sorted(set(found) | set(shapes)):
        a, b = shapes.get(name), found.get(name)
        if (
            a is None
            or b is None
            or a[0] != b[0]
            or a[1].is_floating_point != b[1].is_floating_point
        ):
            raise ExportError(
                f"{other.path}: tensor {name!r} is {b and b[0]} there but {a and a[0]} in "
                f"{first.path}; only the same model can be averaged"
            )
