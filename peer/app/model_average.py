"""The swarm's averaged model: one model file from several models or checkpoints.

:func:`average_models` (``gossipnet export``, ``gossipnet launch --save-model``) turns one
or several sources into one model file: the swarm's averaged model
``x_bar = (1/n) sum_i x_i`` of its peers' latest checkpoints (D-PSGD's consensus point;
Lian et al., NeurIPS 2017, evaluate this average). Checkpoints are written atomically, so
it reads a running swarm's. The file format is :mod:`peer.node.model_file`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from peer.node.model_file import ExportError, ModelSource, build_module, read_sources, save_model

__all__ = ["average_models"]


def average_models(paths: Sequence[Path], out: Path) -> Path:
    """Write the average of the models in ``paths`` to ``out`` (and ``out``'s ``.json``).

    Each path is a model file, a checkpoint file, a checkpoint folder (its newest valid
    checkpoint) or a folder of checkpoint folders (``gossipnet launch --dir``: every
    peer's newest). Floating-point tensors are averaged (in float64, stored in their own
    dtype): ``x_bar = (1/n) sum_i x_i``; integer buffers (counters such as BatchNorm's
    ``num_batches_tracked``) keep the largest value. One source is simply converted.

    Returns:
        ``out``.

    Raises:
        ExportError: a source cannot be read, or the sources are of different models
            (they must share the model spec, input shape and number of classes), or
            ``out``'s folder does not exist (one line naming the file).
    """
    if not paths:
        raise ExportError("paths: give at least one model file, checkpoint or checkpoint folder")
    out = Path(out)
    if not out.parent.is_dir():
        raise ExportError(f"{out}: folder {out.parent} does not exist")
    sources: list[ModelSource] = []
    total: dict[str, torch.Tensor] = {}
    shapes: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
    for path in paths:
        for source in read_sources(Path(path)):
            if sources:
                _check_same_model(sources[0], source, shapes)
            else:
                shapes = {name: (tuple(t.shape), t.dtype) for name, t in source.state.items()}
            _accumulate(total, source.state)
            # keep the record, drop the tensors: memory stays at the sum plus one model
            sources.append(
                ModelSource(
                    source.path, {}, source.recipe, source.step, source.peer_id, source.evaluation
                )
            )
    first = sources[0]
    state = {
        name: (value / len(sources)).to(shapes[name][1]) if value.is_floating_point() else value
        for name, value in total.items()
    }
    module = build_module(ModelSource(first.path, state, first.recipe, first.step, first.peer_id))
    if len(sources) == 1:
        return save_model(
            out,
            module,
            first.recipe,
            step=first.step,
            peer_id=first.peer_id,
            evaluation=first.evaluation,
        )
    steps = [s.step for s in sources if s.step is not None]
    return save_model(
        out,
        module,
        first.recipe,
        step=max(steps) if steps else None,
        averaged_from=[
            {"path": str(s.path), "peer_id": s.peer_id, "step": s.step} for s in sources
        ],
    )


def _accumulate(total: dict[str, torch.Tensor], state: Mapping[str, torch.Tensor]) -> None:
    """Add ``state`` into ``total`` (float64 sums; integer tensors keep the maximum)."""
    for name, tensor in state.items():
        if tensor.is_floating_point():
            value = tensor.to(torch.float64)
            total[name] = value if name not in total else total[name] + value
        else:
            total[name] = (
                tensor.clone() if name not in total else torch.maximum(total[name], tensor)
            )


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
