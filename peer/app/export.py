"""``gossipnet export``: write the model a user takes home from checkpoints or model files.

The command reads one or several sources and writes one model file
(:func:`~peer.app.model_average.average_models`: several sources are averaged into the
swarm's averaged model). This module is also the import path of the model-file API that
docs/models.md shows: the names in ``__all__`` are the same objects as in
:mod:`peer.node.model_file` (the format, :func:`save_model`, :func:`load_model`),
:mod:`peer.node.recipe` (:class:`ModelRecipe`) and :mod:`peer.app.model_average`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from peer.app.model_average import average_models
from peer.app.usage import OneLineParser
from peer.node.model_file import MODEL_FORMAT, ExportError, load_model, save_model, sidecar_path
from peer.node.recipe import RECIPE_KEY, ModelRecipe
from workloads import MODELS, load_dataset
from workloads.user_code import parse_code_spec

__all__ = [
    "MODEL_FORMAT",
    "RECIPE_KEY",
    "ExportError",
    "ModelRecipe",
    "average_models",
    "load_model",
    "main",
    "save_model",
    "sidecar_path",
]


def _parser(prog: str) -> argparse.ArgumentParser:
    return OneLineParser(
        prog=prog,
        usage="%(prog)s CHECKPOINT [CHECKPOINT ...] --out FILE [--model FILE:FACTORY] "
        "[--dataset SPEC]",
        description=(
            "Write a trained model you can take home (FILE as safetensors plus FILE's .json) "
            "from a checkpoint file, a peer's checkpoint folder (its newest checkpoint; a "
            "running peer's is fine), a run folder (launch --dir: every peer's "
            "peer-N.safetensors, or its newest checkpoint), or a model file. Several sources "
            "are averaged: the swarm's averaged model."
        ),
        epilog="Load it in Python with gossipnet.load_model(FILE). Format: docs/models.md.",
    )


def main(argv: Sequence[str], prog: str = "gossipnet export") -> int:
    """``gossipnet export CHECKPOINT [CHECKPOINT ...] --out FILE``; returns the exit code
    (0 written, 2 a bad argument or source, as one line on stderr)."""
    parser = _parser(prog)
    parser.add_argument(
        "sources",
        nargs="+",
        metavar="CHECKPOINT",
        help="checkpoint file or folder, run folder of launch --dir, or model file",
    )
    parser.add_argument(
        "--out", required=True, metavar="FILE", help="model file to write (and FILE's .json)"
    )
    parser.add_argument(
        "--model",
        metavar="FILE:FACTORY",
        help="your model code, where it is now (mymodel.py:SpiralNet); default: the spec the "
        "sources record, imported from the current directory",
    )
    parser.add_argument(
        "--dataset",
        metavar="SPEC",
        help="evaluate the written model on this data set's test split (a workloads spec or "
        "FILE.npz) and record the figures; default: a single source's own, if any",
    )
    args = parser.parse_args(list(argv))
    if args.model is not None and parse_code_spec(args.model, MODELS) is None:
        parser.error(
            f"--model: must be your model code as FILE:FACTORY or MODULE:FACTORY "
            f"(mymodel.py:SpiralNet), got {args.model!r}"
        )
    dataset = None
    if args.dataset is not None:
        try:
            dataset = load_dataset(args.dataset)
        except (ValueError, ImportError, OSError) as error:
            parser.error(f"--dataset: {' '.join(str(error).split())}")
    try:
        written = average_models(
            [Path(s) for s in args.sources], Path(args.out), factory=args.model, dataset=dataset
        )
    except ExportError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2
    document = json.loads(sidecar_path(written).read_text())
    averaged = document["averaged_from"]
    origin = (
        f"the average of {len(averaged)} models"
        if averaged
        else f"peer {document['peer_id']} at step {document['step']}"
    )
    print(f"wrote {written} and {sidecar_path(written).name}: {origin}{_figures(document)}")
    return 0


def _figures(document: dict[str, object]) -> str:
    """``"; test accuracy 63.5%"`` (or the loss) from a model file's evaluation, or ``""``."""
    evaluation = document.get("evaluation")
    if not isinstance(evaluation, dict):
        return ""
    accuracy, loss = evaluation.get("test_accuracy"), evaluation.get("test_loss")
    if isinstance(accuracy, float):
        return f"; test accuracy {100 * accuracy:.1f}%"
    return f"; test loss {loss:.4f}" if isinstance(loss, float) else ""


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
